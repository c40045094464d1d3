"""BENCHMARKS.md as committed: its links resolve, its summary's figures are those of the sections
it links to, and the sections the tools write are what the tools write from the committed
results."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "BENCHMARKS.md"
LINK = re.compile(r"\]\(#([^)\s]+)\)")
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)*")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(text: str) -> dict[str, str]:
    """Each heading's anchor (repeats numbered as GitHub does) -> its text, up to the next
    heading of the same or a higher level."""
    lines = text.splitlines()
    heads = [(i, len(m.group(1)), m.group(2)) for i, line in enumerate(lines) if (m := re.match(r"(#+) (.*)", line))]
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for k, (i, level, title) in enumerate(heads):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        end = next((j for j, lv, _ in heads[k + 1:] if lv <= level), len(lines))
        out[base if n == 0 else f"{base}-{n}"] = "\n".join(lines[i:end])
    return out


def summary_claims(text: str) -> list[tuple[str, list[str]]]:
    """The summary's lines with figures, each with the anchors it draws on: its own links, or for
    a table row, those of the line that introduces the table."""
    body = sections(text)["summary"].splitlines()[1:]
    out, links = [], []
    for line in body:
        own = LINK.findall(line)
        if own:
            links = own
        if own or (line.startswith("|") and not line.startswith("|---")):
            out.append((LINK.sub("]", re.sub(r"\[[^\]]*\]\(#[^)]*\)", "", line)), links))
    return out


def test_every_link_resolves() -> None:
    text = DOC.read_text(encoding="utf-8")
    anchors = sections(text)
    missing = sorted({a for a in LINK.findall(text) if a not in anchors})
    assert not missing, missing


def test_summary_is_short_and_each_figure_is_in_a_section_it_links_to() -> None:
    text = DOC.read_text(encoding="utf-8")
    anchors = sections(text)
    assert text.startswith("# Benchmarks\n\n## Summary\n") and len(anchors["summary"].splitlines()) <= 45
    claims = summary_claims(text)
    assert len(claims) >= 10
    bad = []
    for line, links in claims:
        assert links, line
        source = "\n".join(anchors[a] for a in links)
        for number in NUMBER.findall(line):
            pattern = rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)"
            if not re.search(pattern, source):
                bad.append(f"{number} (in: {line[:60]}...) is not in {links}")
    assert not bad, bad


# (tool, arguments) that rewrite one section of --report from the committed results, measuring nothing
RENDERS = [
    ("bench.py", ["--from-json", "tools/bench_results.json", "--out", "{report}"]),
    ("bench_scale.py", ["--from-json", "tools/bench_scale_results.json", "--notes", "tools/bench_scale_notes.md", "--report", "{report}"]),
    ("crosscheck.py", ["--from-json", "tools/crosscheck_results.json", "--report", "{report}"]),
    ("tc_interop.py", ["--render-only", "--json", "tools/tc_interop_results.json", "--report", "{report}"]),
    ("bench_gpu.py", ["--render", "tools/bench_gpu_results.json", "--notes", "tools/bench_gpu_notes.md", "--report", "{report}"]),
    ("bench_entropy.py", ["--from-json", "tools/bench_entropy_results.json", "--notes", "tools/bench_entropy_notes.md", "--report", "{report}"]),
    ("bench_read.py", ["--from-json", "tools/bench_read_results.json", "--notes", "tools/bench_read_notes.md", "--report", "{report}"]),
    ("bench_host.py", ["--from-json", "tools/bench_host_results.json", "--notes", "tools/bench_host_notes.md", "--report", "{report}"]),
    ("bench_plain.py", ["--from-json", "tools/bench_plain_results.json", "--notes", "tools/bench_plain_notes.md", "--report", "{report}"]),
    ("bench_readahead.py", ["--from-json", "tools/bench_readahead_results.json", "--notes", "tools/bench_readahead_notes.md", "--report", "{report}"]),
    ("bench_load.py", ["--from-json", "tools/bench_load_results.json", "--notes", "tools/bench_load_notes.md", "--report", "{report}"]),
    ("bench_budget.py", ["--from-json", "tools/bench_budget_results.json", "--notes", "tools/bench_budget_notes.md", "--report", "{report}"]),
    ("bench_scaling.py", ["--from-json", "tools/bench_scaling_results.json", "--notes", "tools/bench_scaling_notes.md", "--report", "{report}"]),
]


@pytest.mark.parametrize("tool,args", RENDERS, ids=[t for t, _ in RENDERS])
def test_tool_sections_render_byte_identically(tmp_path: Path, tool: str, args: list[str]) -> None:
    report = tmp_path / "BENCHMARKS.md"
    shutil.copyfile(DOC, report)
    r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), *[a.format(report=report) for a in args]],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert report.read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8")
