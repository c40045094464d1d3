"""tools/bench: every table of BENCHMARKS.md in one run (`python tools/bench.py --help`).

    cli.py        options, which sections run, the results JSON (--json, --merge, --from-json)
    common.py     paths, the run's options, logging, timing, the machine line, the sliced models,
                  the plain compressors they are compared with, running child.py
    smollm2.py    section 1     table1.py     section 2     scaling.py    section 3
    entropy.py    section 4     speed.py      section 5     residuals.py  section 6
    report.py     BENCHMARKS.md: header, sections 1-6, goals; other tools' sections kept
    child.py      what runs in a fresh process (`python -m tools.bench.child TASK ARGS`)

Nothing is imported here: child.py's tasks import bbformat themselves (one of them from
another checkout).
"""
