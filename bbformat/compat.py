"""Side files that an older transformers would read differently from the current one, without
an error. TransformerCompression pins transformers 4.41 (tokenizers 0.19); checkpoints made
with today's versions can carry settings that 4.41 silently ignores. pack and inspect warn."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LEGACY = "transformers 4.41 (TransformerCompression's pin)"


def _json(files: Mapping[str, bytes], name: str) -> Any:
    try:
        return json.loads(files[name])
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


def legacy_reader_problems(files: Mapping[str, bytes]) -> list[str]:
    """One line per setting of config.json / tokenizer files that LEGACY would misread."""
    out = []
    cfg = _json(files, "config.json")
    if isinstance(cfg, dict):
        rp = cfg.get("rope_parameters")
        if isinstance(rp, dict) and "rope_theta" in rp and "rope_theta" not in cfg:
            out.append(f"config.json has rope_theta ({rp['rope_theta']}) only inside rope_parameters: {LEGACY} ignores it "
                       "and silently uses 10000; add a top-level rope_theta (tools/slice.py writes both)")
    tc = _json(files, "tokenizer_config.json")
    if isinstance(tc, dict) and tc.get("tokenizer_class") == "TokenizersBackend":
        out.append(f"tokenizer_config.json names tokenizer_class TokenizersBackend, which {LEGACY} does not know; "
                   "PreTrainedTokenizerFast reads the same tokenizer.json in both")
    tj = _json(files, "tokenizer.json")
    merges = (tj.get("model") or {}).get("merges") if isinstance(tj, dict) and isinstance(tj.get("model"), dict) else None
    if isinstance(merges, list) and merges and isinstance(merges[0], list):
        out.append("tokenizer.json stores BPE merges as pairs, which tokenizers 0.19 (with transformers 4.41) cannot "
                   "parse; \"a b\" strings read the same in both")
    return out
