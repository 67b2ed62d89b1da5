"""Golden reports: `python -m tests.golden` rewrites fixtures/<case>/report.txt and report.json;
`python -m tests.golden --check` exits non-zero when any differs (the test suite runs the check)."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path

from flightrec import analyze

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def cases() -> list[str]:
    """Every fixture folder of one job: those with an expected answer (the recorded Gloo cases, NVIDIA's sets,
    PyTorch's test cases), and the top-level ones holding dumps without one (the JSON twins, writer_sharing)."""
    found = {p.parent for p in FIXTURES.rglob("expected.json")}
    found |= {p for p in FIXTURES.iterdir()
              if p.is_dir() and any(f.is_file() and re.search(r"\d+$", f.name) for f in p.iterdir())}
    return sorted(str(p.relative_to(FIXTURES)) for p in found)


def render(case: str) -> dict[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(FIXTURES / case, use_cache=False)
    return {"report.txt": report.to_text(), "report.json": json.dumps(report.to_dict(), indent=2) + "\n"}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for case in cases():
        for name, text in render(case).items():
            path = FIXTURES / case / name
            if check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path.relative_to(FIXTURES.parent)))
            else:
                path.write_text(text)
    if stale:
        print("golden reports differ (run `python -m tests.golden` and review the diff):\n  " + "\n  ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
