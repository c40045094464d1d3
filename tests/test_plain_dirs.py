"""pack / unpack of plain Hugging Face directories (bbformat.plaindir): tiny stock models made
here from transformers' config classes with random weights (nothing from a hub), packed with
scheme none and given back byte for byte; every refusal one line, nothing written."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import save_file

import bbformat
from bbformat.cli import main
from bbformat.errors import BBFormatError, FormatError, InputError

transformers = pytest.importorskip("transformers")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under root by relative POSIX path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _save(model: Any, d: Path, **kw: Any) -> Path:
    model.save_pretrained(d, **kw)
    (d / "tokenizer_config.json").write_text('{"model_max_length": 64}\n')
    (d / "tokenizer.model").write_bytes(bytes(range(256)) * 3)  # not UTF-8: bytes, not text
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (d / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (d / "README.md").write_text("# tiny\n")
    return d


def _llama_gqa(d: Path) -> Path:
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    return _save(transformers.LlamaForCausalLM(cfg), d, max_shard_size="20KB")  # sharded, with its index


def _qwen2_tied(d: Path) -> Path:
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return _save(transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16), d)


def _mistral_sliding(d: Path) -> Path:
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    return _save(transformers.MistralForCausalLM(cfg).to(torch.float16), d)


def _gpt2(d: Path) -> Path:
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    return _save(transformers.GPT2LMHeadModel(cfg), d)


def _bert(d: Path) -> Path:
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=32)
    return _save(transformers.BertModel(cfg), d)


def _sentence_transformers(d: Path) -> Path:
    """A sentence-transformers layout: a BERT at the top, module folders beside it."""
    _bert(d)
    (d / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "Transformer"},
                                                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text('{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}')
    (d / "2_Dense").mkdir()
    (d / "2_Dense" / "config.json").write_text('{"in_features": 32, "out_features": 8}')
    save_file({"linear.weight": torch.randn(8, 32)}, str(d / "2_Dense" / "model.safetensors"))
    return d


def _mixed(d: Path) -> Path:
    """One safetensors file of bf16, fp16 and fp32 tensors, an empty one and a scalar, with
    __metadata__ (safetensors' own save_file)."""
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "custom", "architectures": ["Custom"]}\n')
    g = torch.Generator().manual_seed(5)
    save_file({"encoder.layer.0.w": torch.randn(16, 24, generator=g).to(torch.bfloat16),
               "encoder.layer.0.scale": torch.randn(24, generator=g),
               "encoder.layer.1.w": torch.randn(16, 24, generator=g).to(torch.float16),
               "head.bias": torch.zeros(0),
               "temperature": torch.tensor(0.5)}, str(d / "model.safetensors"), metadata={"format": "pt", "note": "mixed"})
    return d


MODELS: dict[str, Callable[[Path], Path]] = {"llama-gqa-sharded": _llama_gqa, "qwen2-tied-bf16": _qwen2_tied,
                                             "mistral-sliding-fp16": _mistral_sliding, "gpt2": _gpt2, "bert": _bert,
                                             "sentence-transformers": _sentence_transformers, "mixed-dtypes": _mixed}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_pack_unpack_gives_the_directory_back_byte_for_byte(kind: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    src = MODELS[kind](tmp_path / "src")
    before = _tree(src)
    rep = bbformat.pack(src, tmp_path / "m.bb", verify=True)
    assert rep.scheme == "none" and _tree(src) == before
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "back")
    after = _tree(tmp_path / "back")
    assert sorted(after) == sorted(before)
    assert [k for k in after if after[k] != before[k]] == []


def test_what_the_tiny_models_hold(tmp_path: Path) -> None:
    """The fixtures are what they claim: shards with an index, a tied head saved once, subfolders."""
    llama = _tree(_llama_gqa(tmp_path / "l"))
    assert "model.safetensors.index.json" in llama and sum(k.endswith(".safetensors") for k in llama) > 1
    qwen = _qwen2_tied(tmp_path / "q")
    assert json.loads((qwen / "config.json").read_text())["tie_word_embeddings"] is True
    assert b"lm_head" not in _header(qwen / "model.safetensors")
    st = _tree(_sentence_transformers(tmp_path / "s"))
    assert {"1_Pooling/config.json", "2_Dense/model.safetensors", "README.md", ".gitattributes"} <= set(st)


def _header(path: Path) -> bytes:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data[: 8 + n]


def test_container_metadata_and_names(tmp_path: Path) -> None:
    src = _sentence_transformers(tmp_path / "src")
    bbformat.pack(src, tmp_path / "m.bb")
    with bbformat.open_container(tmp_path / "m.bb") as r:
        meta, names = r.metadata, set(r.tensor_entries())
    assert meta["scheme"] == "none" and meta["architecture"] == "bert" and "stem" not in meta
    st = meta["directory"]["safetensors"]
    assert [f["path"] for f in st] == ["model.safetensors", "2_Dense/model.safetensors"]
    import base64

    assert base64.b64decode(st[0]["header"]) == _header(src / "model.safetensors")
    assert st[1]["tensors"] == ["2_Dense/model.safetensors/linear.weight"]
    assert "embeddings.word_embeddings.weight" in names and "2_Dense/model.safetensors/linear.weight" in names
    assert set(meta["files"]) == {p for p in _tree(src) if not p.endswith(".safetensors")}
    assert base64.b64decode(meta["files"]["config.json"]) == (src / "config.json").read_bytes()


def test_chunks_follow_layers_and_data_order(tmp_path: Path) -> None:
    src = _mixed(tmp_path / "src")
    bbformat.pack(src, tmp_path / "m.bb")
    header = json.loads(_header(src / "model.safetensors")[8:])
    order = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
    # save_file puts the data in this order; a chunk ends at each layer change (none: the root)
    assert order == ["encoder.layer.0.scale", "head.bias", "temperature", "encoder.layer.0.w", "encoder.layer.1.w"]
    with bbformat.open_container(tmp_path / "m.bb") as r:
        blocks = [(b.name, set(b.tensors)) for b in r.iter_blocks()]
    assert blocks == [("encoder.layer.0", {"encoder.layer.0.scale"}), ("head.bias", {"head.bias", "temperature"}),
                      ("encoder.layer.0", {"encoder.layer.0.w"}), ("encoder.layer.1", {"encoder.layer.1.w"})]


def test_inspect_verify_and_unpack_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _llama_gqa(tmp_path / "src")
    capsys.readouterr()  # save_pretrained's progress bar
    assert main(["pack", str(src), str(tmp_path / "m.bb"), "--quiet"]) == 0
    assert main(["inspect", str(tmp_path / "m.bb")]) == 0
    out = capsys.readouterr()
    assert "architecture llama  scheme none" in out.out and "a plain Hugging Face directory: 5 safetensors files" in out.out
    assert out.err == ""  # no TransformerCompression warnings for a plain directory
    assert main(["verify", str(tmp_path / "m.bb")]) == 0
    assert "exact: all" in capsys.readouterr().out
    assert main(["unpack", str(tmp_path / "m.bb"), str(tmp_path / "one"), "--format", "safetensors", "--quiet"]) == 0
    one = _tree(tmp_path / "one")
    assert set(one) == {p for p in _tree(src) if not p.startswith("model")} | {"model.safetensors"}
    from safetensors.torch import load_file

    whole = load_file(str(tmp_path / "one" / "model.safetensors"))
    parts = {k: v for p in src.glob("model-*.safetensors") for k, v in load_file(str(p)).items()}
    assert sorted(whole) == sorted(parts) and all(torch.equal(whole[k], parts[k]) for k in parts)


def test_the_unpacked_model_loads_with_transformers(tmp_path: Path) -> None:
    src = _qwen2_tied(tmp_path / "src")
    bbformat.pack(src, tmp_path / "m.bb")
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "back")
    a = transformers.AutoModelForCausalLM.from_pretrained(src)
    b = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(a(ids).logits, b(ids).logits)


# ----------------------------------------------------------------------------- refusals


def _refused(src: Path, tmp_path: Path, *fragments: str, cls: type[BBFormatError] = InputError, **kw: Any) -> str:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    with pytest.raises(cls) as info:
        bbformat.pack(src, out / "m.bb", **kw)
    msg = str(info.value)
    assert "\n" not in msg and info.value.code == "E_INPUT", msg
    for f in fragments:
        assert f in msg, (f, msg)
    assert list(out.iterdir()) == []
    return msg


def _st_file(path: Path, header: dict[str, Any] | bytes, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _plain(tmp_path: Path, header: dict[str, Any] | bytes, data: bytes) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "config.json").write_text("{}")
    _st_file(d / "model.safetensors", header, data)
    return d


LIES: dict[str, tuple[dict[str, Any] | bytes, bytes, str]] = {
    "size-vs-shape": ({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, bytes(20), "needs 24"),
    "overlap": ({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
                 "b": {"dtype": "F16", "shape": [4], "data_offsets": [4, 12]}}, bytes(12), "overlapping"),
    "gap": ({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
             "b": {"dtype": "F16", "shape": [2], "data_offsets": [8, 12]}}, bytes(12), "a gap"),
    "past-end": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "which has 8"),
    "trailing": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(8), "which has 8"),
    "duplicate": (b'{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}, '
                  b'"a": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}}', bytes(4), "duplicate name 'a'"),
    "not-json": (b'{"a": [', bytes(4), "not valid JSON"),
    "unknown-dtype": ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "dtype 'C64'"),
    "bad-shape": ({"a": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}}, bytes(2), "shape [-1]"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lying_safetensors_header_is_refused(lie: str, tmp_path: Path) -> None:
    header, data, fragment = LIES[lie]
    _refused(_plain(tmp_path, header, data), tmp_path, "model.safetensors", fragment)


def test_header_length_beyond_the_file_is_refused_unread(tmp_path: Path) -> None:
    d = _plain(tmp_path, {}, b"")
    (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    _refused(d, tmp_path, "header length 1,152,921,504,606,846,976 runs past the file")
    (d / "model.safetensors").write_bytes(b"\x01\x02")
    _refused(d, tmp_path, "shorter than a safetensors header")


@pytest.mark.parametrize("dtype", ["I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL", "F64", "F8_E4M3", "F8_E5M2"])
def test_integer_bool_and_other_float_tensors(dtype: str, tmp_path: Path) -> None:
    width = {"I64": 8, "U64": 8, "F64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2}.get(dtype, 1)
    data = bytes((7 * k + 3) % 256 for k in range(3 * width))  # BOOL too: bytes other than 0/1 come back as they were
    d = _plain(tmp_path, {"a": {"dtype": dtype, "shape": [3], "data_offsets": [0, 3 * width]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [3 * width, 3 * width + 8]}},
               data + bytes(8))
    bbformat.pack(d, tmp_path / "m.bb")
    assert bbformat.inspect(tmp_path / "m.bb")["version"] == "1.6"
    bbformat.unpack(tmp_path / "m.bb", tmp_path / "back")
    assert _tree(tmp_path / "back") == _tree(d)
    with pytest.raises(bbformat.InputError, match="only format 1.6 stores"):
        bbformat.pack(d, tmp_path / "old.bb", format_version="1.5")
    assert not (tmp_path / "old.bb").exists()


def test_a_float_only_directory_stays_format_1_5(tmp_path: Path) -> None:
    d = _plain(tmp_path, {"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, bytes(range(4)))
    bbformat.pack(d, tmp_path / "m.bb")
    assert bbformat.inspect(tmp_path / "m.bb")["version"] == "1.5"


def _sharded(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "x"}')
    save_file({"a": torch.ones(2)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(3)}, str(d / "model-00002-of-00002.safetensors"))
    _index(d, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    return d


def _index(d: Path, weight_map: dict[str, str]) -> None:
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 20}, "weight_map": weight_map}))


@pytest.mark.parametrize("shard, fragment", [("model-00003-of-00003.safetensors", "which is missing"),
                                             ("../model-00001-of-00002.safetensors", "not a .safetensors file in"),
                                             ("/abs/model.safetensors", "not a .safetensors file in"),
                                             ("sub/model-00002-of-00002.safetensors", "not a .safetensors file in")])
def test_index_naming_a_bad_shard_is_refused(shard: str, fragment: str, tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    _index(d, {"a": "model-00001-of-00002.safetensors", "b": shard})
    _refused(d, tmp_path, fragment)


def test_index_that_disagrees_with_its_shards_is_refused(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    bbformat.pack(d, tmp_path / "ok.bb")  # as written, accepted
    _index(d, {"a": "model-00002-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    _refused(d, tmp_path, "does not match its shards", "'a'")
    _index(d, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})
    _refused(d, tmp_path, "does not match its shards", "'c'")


def test_two_weight_formats_and_bin_only_are_refused(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not read")
    _refused(d, tmp_path, "two formats", "model-00001-of-00002.safetensors", "pytorch_model.bin")
    for p in d.glob("model*"):
        p.unlink()
    _refused(d, tmp_path, "pytorch_model.bin", "pickle", "convert the model to safetensors")
    (d / "pytorch_model.bin").rename(d / "tf_model.h5")
    _refused(d, tmp_path, "tf_model.h5", "safetensors only")
    (d / "tf_model.h5").unlink()
    _refused(d, tmp_path, "holds no .safetensors weights")


def test_side_files_over_the_metadata_budget_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bbformat.api

    d = _sharded(tmp_path)
    (d / "sub").mkdir()
    (d / "sub" / "big.bin").write_bytes(bytes(5000))
    (d / "small.txt").write_bytes(bytes(100))
    monkeypatch.setattr(bbformat.api, "SIDE_FILES_MAX_BYTES", 4096)
    _refused(d, tmp_path, "over the 4,096 bytes", "the biggest is sub/big.bin (5,000 bytes)")


@pytest.mark.parametrize("scheme", ["symmetric", "paper"])
def test_rotation_schemes_need_a_sliced_checkpoint(scheme: str, tmp_path: Path) -> None:
    _refused(_sharded(tmp_path), tmp_path, f"scheme {scheme!r} needs SliceGPT's rotation sites", scheme=scheme)


def test_calibration_and_format_1_1_are_refused(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    _refused(d, tmp_path, "rotates nothing", calibration=str(d / "config.json"))
    _refused(d, tmp_path, "needs format 1.2", format_version="1.1")


def _cli_error(capsys: pytest.CaptureFixture[str], args: list[str], status: int, code: str, *fragments: str) -> None:
    assert main(args) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bbformat: error [{code}]: "), err
    for f in fragments:
        assert f in err[0], (f, err[0])


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _sharded(tmp_path)
    out = tmp_path / "m.bb"
    _cli_error(capsys, ["pack", str(d), str(out), "--scheme", "symmetric"], 2, "E_INPUT", "rotation sites")
    (d / "pytorch_model.bin").write_bytes(b"x")
    _cli_error(capsys, ["pack", str(d), str(out)], 2, "E_INPUT", "two formats", "pytorch_model.bin")
    (d / "pytorch_model.bin").unlink()
    _st_file(d / "model-00002-of-00002.safetensors", {"b": {"dtype": "I4", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    _cli_error(capsys, ["pack", str(d), str(out)], 2, "E_INPUT", "dtype 'I4'")
    assert not out.exists()
    (tmp_path / "ok").mkdir()
    _sharded(tmp_path / "ok")
    assert main(["pack", str(tmp_path / "ok" / "src"), str(out), "--quiet"]) == 0
    _cli_error(capsys, ["unpack", str(out), str(tmp_path / "pt"), "--format", "pt"], 2, "E_INPUT", "unpacks as hf")
    _cli_error(capsys, ["unpack", str(out), str(tmp_path / "b"), "--max-shard-size", "1M"], 2, "E_INPUT", "as they were packed")
    assert not (tmp_path / "pt").exists() and not (tmp_path / "b").exists()


def test_output_inside_the_directory_and_symlinks(tmp_path: Path) -> None:
    d = _sharded(tmp_path)
    bbformat.pack(d, d / "m.bb")  # OUT inside SRC: written, not read back as an input file
    with pytest.raises(InputError, match="would replace the input file"):
        bbformat.pack(d, d / "m.bb", overwrite=True)  # now it is one of SRC's files
    (d / "m.bb").unlink()
    (tmp_path / "elsewhere").mkdir()
    (d / "linked").symlink_to(tmp_path / "elsewhere")
    _refused(d, tmp_path, "symbolic link to a folder")


def test_unpack_refuses_lying_directory_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container whose `directory` does not match its tensors: E_METADATA, nothing written."""
    from bbformat import plaindir

    d = _sharded(tmp_path)
    real = plaindir.directory_metadata

    def lying(x: Any) -> dict[str, Any]:
        meta = real(x)
        meta["safetensors"][1]["path"] = "../escape.safetensors"
        return meta

    monkeypatch.setattr(plaindir, "directory_metadata", lying)
    bbformat.pack(d, tmp_path / "m.bb")
    with pytest.raises(FormatError) as info:
        bbformat.unpack(tmp_path / "m.bb", tmp_path / "back")
    assert info.value.code == "E_METADATA" and "not a relative path" in str(info.value)
    assert not (tmp_path / "back").exists() and not (tmp_path / "escape.safetensors").exists()


def test_unpack_into_a_directory_that_holds_files(tmp_path: Path) -> None:
    """--force into a non-empty DST: the files are staged inside it and moved over their names,
    subfolders made; another model's shards left there are refused, nothing written."""
    src = _sentence_transformers(tmp_path / "src")
    bbformat.pack(src, tmp_path / "m.bb")
    back = tmp_path / "back"
    back.mkdir()
    (back / "keep.txt").write_text("mine")
    with pytest.raises(BBFormatError, match="refusing to replace|not empty"):
        bbformat.unpack(tmp_path / "m.bb", back)
    bbformat.unpack(tmp_path / "m.bb", back, overwrite=True)
    assert _tree(back) == {**_tree(src), "keep.txt": b"mine"}
    (back / "1_Pooling" / "config.json").write_text("changed")
    bbformat.unpack(tmp_path / "m.bb", back, overwrite=True)
    assert _tree(back) == {**_tree(src), "keep.txt": b"mine"}
    (back / "model-00001-of-00002.safetensors").write_bytes(b"old")
    with pytest.raises(BBFormatError, match="model-00001-of-00002.safetensors of another model"):
        bbformat.unpack(tmp_path / "m.bb", back, overwrite=True)
    assert sorted(p.name for p in back.iterdir() if p.name.startswith(".")) == [".gitattributes"]  # no staging left


def test_chunks_are_cut_by_the_byte_budget(tmp_path: Path) -> None:
    from bbformat import plaindir

    src = _gpt2(tmp_path / "src")
    with plaindir.read_plain_dir(src, 1 << 20) as d:
        names = json.loads(_header(src / "model.safetensors")[8:])
        count = len([k for k in names if k != "__metadata__"])
        assert [len(c.tensors) for c in plaindir.plain_layout(d, chunk_bytes=1).chunks] == [1] * count
        chunks = plaindir.plain_layout(d).chunks
    assert sum(len(c.tensors) for c in chunks) == count
    for c in chunks:  # one layer per chunk: h.0. and h.1. never together
        assert len({n.split(".")[1] for n in c.tensors if n.startswith("h.")}) <= 1, c


def _directory(header: bytes, tensors: list[str]) -> dict[str, Any]:
    import base64

    return {"safetensors": [{"path": "model.safetensors", "header": base64.b64encode(header).decode(), "tensors": tensors}]}


@pytest.mark.parametrize("case, fragment", [
    ("dtype", "in the container"), ("shape", "in the container"), ("count", "2 tensor names for 1 header entries"),
    ("base64", "not base64"), ("clash", "both a file and a folder"), ("twice", "named twice"), ("path", "not a relative path"),
    ("not-a-list", "no list of safetensors files"),
])
def test_unpack_plan_checks_the_directory_metadata(case: str, fragment: str) -> None:
    from bbformat import plaindir

    raw = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header = struct.pack("<Q", len(raw)) + raw
    entries: dict[str, tuple[str, tuple[int, ...]]] = {"w": ("float32", (2,))}
    directory, files = _directory(header, ["w"]), {"config.json": b"{}"}
    if case == "dtype":
        entries["w"] = ("float16", (2,))
    elif case == "shape":
        entries["w"] = ("float32", (1, 2))
    elif case == "count":
        directory["safetensors"][0]["tensors"] = ["w", "v"]
    elif case == "base64":
        directory["safetensors"][0]["header"] = "not base64!"
    elif case == "clash":
        files["model.safetensors/x"] = b""
    elif case == "twice":
        files["model.safetensors"] = b""
    elif case == "path":
        directory["safetensors"][0]["path"] = "/etc/model.safetensors"
    else:
        directory = {"safetensors": "model.safetensors"}
    assert plaindir.unpack_plan(_directory(header, ["w"]), {"config.json": b"{}"}, {"w": ("float32", (2,))})  # as made, fine
    with pytest.raises(FormatError) as info:
        plaindir.unpack_plan(directory, files, entries)
    assert info.value.code == "E_METADATA" and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("files", [[], {"config.json": 3}, {"config.json": "no base64!"}])
def test_decode_files_refuses_what_is_not_base64_by_path(files: Any) -> None:
    from bbformat import plaindir

    assert plaindir.decode_files({"a/b.txt": "aGk="}) == {"a/b.txt": b"hi"}
    with pytest.raises(FormatError) as info:
        plaindir.decode_files(files)
    assert info.value.code == "E_METADATA"
