"""Whole processes, as a user runs them (issue #50): from Python's start to exit, median of --repeat, in turn.

    python -m bench.startup [--sizes 8192x200] [--repeat 5]

- `flightrec --help`, and `flightrec analyze` of a 4-rank fixture (target: under 0.3 s and 1 s);
- per size, `flightrec analyze --no-cache` of a synthetic job beside a one-core `pickle.load` of the same files
  as a whole process too (target: at most 1.0x), the fast reader loaded from numba's cache;
- the fast reader's first-run compile (an empty numba cache, as after an install), once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .data import dataset
from .ingest import parse_sizes
from .measure import warm_numba_cache

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "healthy"

PICKLE_FLOOR = """
import pickle, pathlib
for f in sorted(p for p in pathlib.Path({d!r}).iterdir() if p.name.startswith("nccl_trace_rank_")):
    with open(f, "rb") as fh:
        pickle.load(fh)  # trusted: we generated these files
"""


def timed(argv: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    return time.perf_counter() - start


def in_turn(commands: dict[str, list[str]], repeat: int) -> dict[str, float]:
    """Median seconds of each command, their runs taken in turn (A B A B ...), after one unmeasured round."""
    for argv in commands.values():
        timed(argv)
    runs: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, argv in commands.items():
            runs[name].append(timed(argv))
    return {name: statistics.median(times) for name, times in runs.items()}


def first_compile() -> float:
    """The fast reader compiled into an empty numba cache, as the first large load after an install does."""
    folder = tempfile.mkdtemp(prefix="flightrec-numba-cache-")
    try:
        env = dict(os.environ, NUMBA_CACHE_DIR=folder)
        return timed([sys.executable, "-c", "from flightrec.ingest.fastpickle import walker; walker.warm()"], env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8192x200")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    flightrec = [sys.executable, "-m", "flightrec"]
    small = in_turn({"help": [*flightrec, "--help"],
                     "fixture": [*flightrec, "analyze", str(FIXTURE), "--no-cache", "-q"]}, args.repeat)
    print(f"| `flightrec --help` | {small['help']:.2f} s |")
    print(f"| `flightrec analyze` of a 4-rank fixture | {small['fixture']:.2f} s |")
    warm_numba_cache()
    for ranks, entries in parse_sizes(args.sizes):
        d, _ = dataset(ranks, entries)
        big = in_turn({"ours": [*flightrec, "analyze", str(d), "--no-cache", "-q"],
                       "floor": [sys.executable, "-c", PICKLE_FLOOR.format(d=str(d))]}, args.repeat)
        print(f"| {ranks:,} x {entries:,}: `flightrec analyze --no-cache` / one-core `pickle.load`, whole processes "
              f"| {big['ours']:.2f} s / {big['floor']:.2f} s = {big['ours'] / big['floor']:.2f}x |")
    print(f"| the fast reader's first compile (empty numba cache, once per install) | {first_compile():.1f} s |")


if __name__ == "__main__":
    main()
