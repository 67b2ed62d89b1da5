"""The incident log at a fleet's scale (issue #51).

    python -m bench.history [--incidents 1000] [--folders 8] [--repeat 5]

- Query: `--incidents` reports recorded (real reports of the bundled fixtures, each given its own folder name,
  time and hosts over a 512-host fleet), then `offenders` and `incidents` over a 30-day window: median seconds.
- Backfill: `--folders` copies of a synthetic 64-rank incident, `flightrec history --scan` as a whole process
  against `flightrec analyze` of each folder in turn (whole processes, with the cache off both ways): the cost
  per incident of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

from flightrec import analyze
from flightrec.history import History, incidents, offenders
from flightrec.testing import synth

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fleet_reports(n: int) -> list[dict]:
    """`n` reports: the fixtures' real reports, each as if from another job, day and pair of hosts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = [analyze(p.parent, use_cache=False).to_dict() for p in sorted(FIXTURES.glob("*/expected.json"))]
    start = datetime(2026, 11, 1, tzinfo=UTC)
    out = []
    for i in range(n):
        report = json.loads(json.dumps(base[i % len(base)]))
        report["dumps"]["folder"] = f"job{i:05d}"
        report["dumps"]["last_entry_at"] = (start + timedelta(minutes=43 * i)).isoformat(timespec="seconds")
        host = f"node{(i * 7919) % 512:04d}" if i % 10 else "node0042"   # (one host in every tenth incident)
        for f in report["findings"]:
            f["hosts"] = [host] if f["hosts"] else []
        out.append(report)
    return out


def query_seconds(n: int, repeat: int) -> tuple[float, float, int]:
    folder = Path(tempfile.mkdtemp(prefix="flightrec-history-"))
    try:
        with History(folder / "h.sqlite") as log:
            start = time.perf_counter()
            for report in fleet_reports(n):
                log.record(report)
            record_s = time.perf_counter() - start
            times, found = [], None
            for _ in range(repeat):
                start = time.perf_counter()
                found = offenders(log, "2026-11-01")
                incidents(log, "2026-11-01")
                times.append(time.perf_counter() - start)
            flagged = found.filter(found["repeat"] & (found["what"] == "host"))["name"].to_list()
            assert flagged[0] == "node0042", flagged[:3]
            return statistics.median(times), record_s / n, incidents(log).height
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def backfill_vs_analyze(folders: int, repeat: int) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix="flightrec-backfill-"))
    try:
        one = root / "template"
        synth.generate(synth.Job(tp=4, pp=4, dp=4, steps=6, ranks_per_host=8,
                                 fault=synth.Fault(kind="host_down", rank=9)), one, per_host_folders=True)
        scan = root / "incidents"
        for i in range(folders):
            shutil.copytree(one, scan / f"incident{i:02d}")
        python = [sys.executable, "-m", "flightrec"]
        back, each = [], []
        for _ in range(repeat):
            db = root / "h.sqlite"
            db.unlink(missing_ok=True)
            start = time.perf_counter()
            subprocess.run([*python, "history", "--scan", str(scan), "--db", str(db), "--no-cache", "-q"],
                           check=True, capture_output=True)
            back.append((time.perf_counter() - start) / folders)
            start = time.perf_counter()
            for folder in sorted(scan.iterdir()):
                subprocess.run([*python, "analyze", str(folder), "--no-cache", "-q"], capture_output=True)
            each.append((time.perf_counter() - start) / folders)
        return statistics.median(back), statistics.median(each)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--incidents", type=int, default=1000)
    ap.add_argument("--folders", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    query, per_record, n = query_seconds(args.incidents, args.repeat)
    print(f"| query of {n:,} recorded incidents (offenders + incidents, 30 days) | {query * 1e3:.0f} ms |")
    print(f"| recording one report | {per_record * 1e3:.1f} ms |")
    back, each = backfill_vs_analyze(args.folders, max(1, args.repeat // 2))
    print(f"| backfill per incident (`history --scan`, {args.folders} folders of 128 ranks) / `analyze` of each "
          f"| {back:.2f} s / {each:.2f} s = {back / each:.2f}x |")


if __name__ == "__main__":
    main()
