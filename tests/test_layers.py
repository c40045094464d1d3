"""The package's import graph, read statically: layers import one way, and an import inside a
function is there only to keep torch (and other heavy, optional libraries) out of start-up."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "bbformat"
# third-party libraries loaded only when they are used: torch and what needs it, or test-only
LAZY_LIBRARIES = {"torch", "transformers", "safetensors", "scipy", "tokenizers"}
# Layers, lowest first: a module may import its own layer and the ones below, never above.
LAYERS = [
    {"constants", "errors", "zstdframe", "fsutil", "bytecursor"},
    {"container"},
    {"codec"},
    {"checkpoint", "adapters", "compat", "tensors", "stream_writers", "hfdir", "plaindir"},
    {"reader", "writer"},
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(mod: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = mod.split(".")
    if node.level:
        base = base[: len(base) - node.level + (1 if _is_package(mod) else 0)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if node.module is None:  # from . import x
        return [f"{target}.{a.name}" for a in node.names]
    return [target]


def _is_package(mod: str) -> bool:
    return (PKG.parent / Path(*mod.split(".")) / "__init__.py").exists()


def _imports() -> dict[str, tuple[set[str], list[tuple[str, int]]]]:
    """module -> (what it imports at load time, [(what it imports inside a function, line)])."""
    out: dict[str, tuple[set[str], list[tuple[str, int]]]] = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        top: set[str] = set()
        local: list[tuple[str, int]] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        local += [(t, inner.lineno) for t in _resolve(mod, inner)]
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                top.update(_resolve(mod, node))
        out[mod] = (top, local)
    return out


def _torch_backed(graph: dict[str, tuple[set[str], list[tuple[str, int]]]]) -> set[str]:
    """bbformat modules whose load imports torch, directly or through another module."""
    backed = {m for m, (top, _) in graph.items() if any(t.split(".")[0] == "torch" for t in top)}
    while True:
        more = {m for m, (top, _) in graph.items() if m not in backed and any(_owner(t, graph) in backed for t in top)}
        if not more:
            return backed
        backed |= more


def _owner(target: str, graph: dict[str, tuple[set[str], list[tuple[str, int]]]]) -> str:
    """The bbformat module an import names (for `from pkg import name`, pkg.name if a module)."""
    return target if target in graph else target.rsplit(".", 1)[0]


def _layer(mod: str) -> int | None:
    parts = mod.split(".")
    if parts[0] != "bbformat" or len(parts) < 2:
        return None
    for i, names in enumerate(LAYERS):
        if parts[1] in names:
            return i
    return None


def test_function_local_imports_only_defer_heavy_libraries() -> None:
    graph = _imports()
    backed = _torch_backed(graph)
    bad = []
    for mod, (_, local) in graph.items():
        for target, line in local:
            root = target.split(".")[0]
            if root in LAZY_LIBRARIES or _owner(target, graph) in backed:
                continue
            if mod == "bbformat" and target == "bbformat.loader":
                continue  # __getattr__: load_model's module needs torch
            bad.append(f"{mod}:{line} imports {target} inside a function")
    assert not bad, "\n".join(bad)


def test_import_bbformat_loads_no_torch_backed_module() -> None:
    graph = _imports()
    backed = _torch_backed(graph)
    assert "bbformat.loader" in backed and "bbformat.checkpoint.files" in backed  # the check can fail
    seen, todo = set(), ["bbformat"]
    while todo:
        m = todo.pop()
        if m in seen or m not in graph:
            continue
        seen.add(m)
        todo += [_owner(t, graph) for t in graph[m][0] if t.startswith("bbformat")]
    assert not seen & backed, sorted(seen & backed)


def test_layers_import_one_way() -> None:
    graph = _imports()
    bad = []
    for mod, (top, _) in graph.items():
        own = _layer(mod)
        if own is None:
            continue
        for t in top:
            other = _layer(t)
            if other is not None and other > own:
                bad.append(f"{mod} (layer {own}) imports {t} (layer {other})")
    assert not bad, "\n".join(bad)
