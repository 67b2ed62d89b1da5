"""flightrec at scale (issue 7): one table per size, every figure measured in this run.

    python -m bench [--sizes 1024x2000,4096x200,8192x200,16384x200,16384x2000,131072x200] [--repeat 3]
                    [--vs-torchfrtrace [--torchfrtrace PATH]]

Columns: cold = `flightrec.analyze` from pickles (no cache; timed from after `import flightrec`), warm = the
same from the cache, floor = a plain single-process `pickle.load` of every file (the floor for any pickle
reader), peak RSS of the whole process tree, and the cost per rank. Each cell is the median of --repeat fresh
processes, after one run that fills numba's cache (a first run after an install compiles the fast reader:
`python -m bench.ingest` times that). With --vs-torchfrtrace, torchfrtrace runs once (a whole process, from Python's start),
and beside it `flightrec analyze --no-cache` as a whole process too (median of --repeat): the speed-up process
to process.
"""

from __future__ import annotations

import argparse
import compileall
import shutil
import tempfile
from pathlib import Path

from flightrec.ingest.fastpickle import walker as tape

from .data import dataset
from .ingest import PICKLE_FLOOR, parse_sizes
from .measure import (
    ANALYZE,
    gib,
    median_of,
    medians_alternated,
    run_command,
    warm_numba_cache,
)

DEFAULT_SIZES = "1024x2000,4096x200,8192x200,16384x200,16384x2000,131072x200"


def measure(ranks: int, entries: int, repeat: int, torchfrtrace: str | None) -> dict:
    d, truth = dataset(ranks, entries)
    cache_dir = tempfile.mkdtemp(prefix="flightrec-bench-cache-")
    try:
        floor = median_of(PICKLE_FLOOR.format(d=str(d)), repeat)
        cold_code = ANALYZE.format(d=str(d), cache=False, cache_dir=cache_dir)
        process = None
        if torchfrtrace:
            # (torchfrtrace's time counts Python's start and its imports: flightrec's whole process too, in turn
            # with the `cold` runs, which start after `import flightrec`)
            cold, process = medians_alternated([cold_code, WHOLE_PROCESS.format(d=str(d))], repeat)
        else:
            cold = median_of(cold_code, repeat)
        median_of(ANALYZE.format(d=str(d), cache=True, cache_dir=cache_dir), 1)  # fill the cache
        warm = median_of(ANALYZE.format(d=str(d), cache=True, cache_dir=cache_dir), repeat)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    row = {"ranks": ranks, "entries_per_rank": entries, "entries": cold["entries"], "floor": floor["s"],
           "cold": cold["s"], "warm": warm["s"], "rss": max(cold["peak_rss"], warm["peak_rss"]),
           "cold_rss": cold["peak_rss"], "warm_rss": warm["peak_rss"],
           "anon": max(cold["peak_anon"], warm["peak_anon"]),
           "right": cold["culprits"] == truth["ranks"], "summary": cold["summary"], "cold_runs": cold["runs"]}
    if torchfrtrace:
        t = run_command([torchfrtrace, str(d), "-p", "nccl_trace_rank_"], timeout=3 * 3600)
        row.update(tft=t["s"], tft_rss=t["peak_rss"], tft_rc=t["returncode"], cold_process=process["s"])
    return row


# `flightrec analyze --no-cache` timed as a whole process, from Python's start to its exit
WHOLE_PROCESS = """
import json, subprocess, sys, time
t = time.perf_counter()
subprocess.run([sys.executable, "-m", "flightrec", "analyze", {d!r}, "--no-cache", "-q"], stdout=subprocess.DEVNULL)
print(json.dumps({{"s": time.perf_counter() - t}}))
"""


def table(rows: list[dict]) -> str:
    head = ("| ranks x entries | entries | pickle.load floor | cold | cold / floor | warm | peak RSS | "
            "anonymous peak | cold per rank | RSS per rank | culprit right |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['ranks']:,} x {r['entries_per_rank']:,} | {r['entries']:,} | {r['floor']:.1f} s | {r['cold']:.1f} s | "
            f"{r['cold'] / r['floor']:.2f}x | {r['warm']:.1f} s | {gib(r['rss'])} | {gib(r['anon'])} | "
            f"{r['cold'] / r['ranks'] * 1e3:.2f} ms | {r['rss'] / r['ranks'] / 2**20:.2f} MiB | "
            f"{'yes' if r['right'] else 'NO'} |")
    if any("tft" in r for r in rows):
        lines += ["", "| ranks x entries | torchfrtrace (whole process) | its peak RSS | exit | flightrec cold | "
                  "speed-up | flightrec cold, whole process (`flightrec analyze --no-cache`) | speed-up, process to process |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "tft" in r:
                lines.append(f"| {r['ranks']:,} x {r['entries_per_rank']:,} | {r['tft']:.1f} s | {gib(r['tft_rss'])} | "
                             f"{r['tft_rc']} | {r['cold']:.1f} s | {r['tft'] / r['cold']:.0f}x | "
                             f"{r['cold_process']:.1f} s | {r['tft'] / r['cold_process']:.0f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vs-torchfrtrace", action="store_true", help="also time PyTorch's analyzer (needs torch)")
    ap.add_argument("--torchfrtrace", default=shutil.which("torchfrtrace"), help="path of the torchfrtrace script")
    args = ap.parse_args(argv)
    if args.vs_torchfrtrace and not args.torchfrtrace:
        ap.error("--vs-torchfrtrace: no torchfrtrace found; install torch or pass --torchfrtrace PATH")
    # flightrec's bytecode, as `pip install` compiles it (where PYTHONDONTWRITEBYTECODE is set, as on this
    # project's machine, each process would otherwise compile the package from source: ~0.15 s of its start)
    compileall.compile_dir(Path(tape.__file__).parent, quiet=1)
    warm_numba_cache()
    reader = ("the fast reader from 128 MB of dumps, the unpickler below" if tape.available()
              else "the unpickler (no numba)")
    rows = []
    for ranks, entries in parse_sizes(args.sizes):
        rows.append(measure(ranks, entries, args.repeat, args.torchfrtrace if args.vs_torchfrtrace else None))
        print(table(rows[-1:]), flush=True)
    print()
    print(table(rows))
    print(f"(median of {args.repeat} fresh processes per cell; cold runs read with {reader}; verdict at the largest "
          f"size: {rows[-1]['summary']})")


if __name__ == "__main__":
    main()
