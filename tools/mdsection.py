"""The one markdown-section writer of the benchmark tools: each tool owns one level-2 section of
BENCHMARKS.md, found by its exact heading line; every other line of the file is kept."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable


def replace_section(text: str, section: str, heading: str) -> str:
    """TEXT with the section HEADING (its heading line up to the next '## ' line) replaced by
    SECTION, or SECTION appended at the end."""
    section = section.rstrip("\n") + "\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip("\n") == heading), None)
    if start is None:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return text + sep + section
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    return "".join(lines[:start]) + section + ("\n" + tail if tail else "")


def write_section(path: Path, section: str, heading: str) -> None:
    """Replace (or append) the section HEADING of the markdown file at PATH."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    path.write_text(replace_section(text, section, heading), encoding="utf-8")


def publish(text: str, heading: str, report: Path | None = None, notes: Path | None = None) -> str:
    """A tool's section: `notes` (markdown) appended, printed, and written into `report` (the
    section `heading`) where one is given. Returns the text as printed."""
    if notes is not None:
        text += "\n" + notes.read_text()
    print(text)
    if report is not None:
        write_section(report, text, heading)
    return text


def section_args(ap: argparse.ArgumentParser) -> None:
    """The options every tool that owns a section shares: --json (write the run's
    measurements), --report (the markdown file whose section to write), --notes (markdown
    appended to the section) and --from-json (render the section from an earlier --json,
    measuring nothing)."""
    ap.add_argument("--json", type=Path, default=None, help="write the run's measurements here")
    ap.add_argument("--report", type=Path, default=None, help="write the section into this markdown file (BENCHMARKS.md)")
    ap.add_argument("--notes", type=Path, default=None, help="markdown appended to the section (what the run shows)")
    ap.add_argument("--from-json", type=Path, default=None, help="render the section from an earlier run's --json, measuring nothing")


def section_results(a: argparse.Namespace, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The results a tool's section is rendered from (section_args' options): an earlier run's,
    read from --from-json, or measure()'s, written to --json where one is given."""
    if a.from_json is not None:
        res: dict[str, Any] = json.loads(a.from_json.read_text())
        return res
    res = measure()
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return res
