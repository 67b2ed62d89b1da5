"""flightrec at scale (issue 7): one table per size, every figure measured in this run.

    python -m bench [--sizes 1024x2000,4096x200,8192x200,16384x200,16384x2000,131072x200] [--repeat 3]
                    [--vs-torchfrtrace [--torchfrtrace PATH]] [--without-built-reader | --vs-jit-start]

Columns: cold = `flightrec.analyze` from pickles (no cache; timed from after `import flightrec`), warm = the
same from the cache, floor = a plain single-process `pickle.load` of every file (the floor for any pickle
reader), peak RSS of the whole process tree, and the cost per rank. Each cell is the median of --repeat fresh processes. Where numba
is installed the reader is first built ahead of time (`flightrec build-reader`, once) unless
--without-built-reader. With --vs-torchfrtrace, torchfrtrace runs once (a whole process, from Python's start),
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
    WITHOUT_BUILT_READER,
    ensure_built_reader,
    gib,
    median_of,
    medians_alternated,
    run_command,
)

DEFAULT_SIZES = "1024x2000,4096x200,8192x200,16384x200,16384x2000,131072x200"


def measure(ranks: int, entries: int, repeat: int, torchfrtrace: str | None, prelude: str = "",
            vs_jit_start: bool = False) -> dict:
    d, truth = dataset(ranks, entries)
    cache_dir = tempfile.mkdtemp(prefix="flightrec-bench-cache-")
    try:
        floor = median_of(PICKLE_FLOOR.format(d=str(d)), repeat)
        cold_code = ANALYZE.format(d=str(d), cache=False, cache_dir=cache_dir)
        jit = process = None
        if vs_jit_start:
            cold, jit = medians_alternated([cold_code, WITHOUT_BUILT_READER + cold_code], repeat)
        elif torchfrtrace:
            # (torchfrtrace's time counts Python's start and its imports: flightrec's whole process too, in turn
            # with the `cold` runs, which start after `import flightrec`)
            cold, process = medians_alternated([prelude + cold_code, WHOLE_PROCESS.format(d=str(d))], repeat)
        else:
            cold = median_of(prelude + cold_code, repeat)
        median_of(ANALYZE.format(d=str(d), cache=True, cache_dir=cache_dir), 1)  # fill the cache
        warm = median_of(ANALYZE.format(d=str(d), cache=True, cache_dir=cache_dir), repeat)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    row = {"ranks": ranks, "entries_per_rank": entries, "entries": cold["entries"], "floor": floor["s"],
           "cold": cold["s"], "warm": warm["s"], "rss": max(cold["peak_rss"], warm["peak_rss"]),
           "cold_rss": cold["peak_rss"], "warm_rss": warm["peak_rss"],
           "right": cold["culprits"] == truth["ranks"], "summary": cold["summary"], "cold_runs": cold["runs"]}
    if jit is not None:
        row.update(cold_jit=jit["s"], cold_jit_rss=jit["peak_rss"], jit_right=jit["culprits"] == truth["ranks"])
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
            "cold per rank | RSS per rank | culprit right |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['ranks']:,} x {r['entries_per_rank']:,} | {r['entries']:,} | {r['floor']:.1f} s | {r['cold']:.1f} s | "
            f"{r['cold'] / r['floor']:.2f}x | {r['warm']:.1f} s | {gib(r['rss'])} | "
            f"{r['cold'] / r['ranks'] * 1e3:.2f} ms | {r['rss'] / r['ranks'] / 2**20:.2f} MiB | "
            f"{'yes' if r['right'] else 'NO'} |")
    if any("cold_jit" in r for r in rows):
        lines += ["", "| ranks x entries | cold, reader built (`flightrec build-reader`) | cold, reader started by numba's "
                  "JIT | speed-up | its peak RSS | culprit right |", "|---|---|---|---|---|---|"]
        for r in rows:
            if "cold_jit" in r:
                lines.append(f"| {r['ranks']:,} x {r['entries_per_rank']:,} | {r['cold']:.2f} s | {r['cold_jit']:.2f} s | "
                             f"{r['cold_jit'] / r['cold']:.2f}x | {gib(r['cold_jit_rss'])} | "
                             f"{'yes' if r['jit_right'] else 'NO'} |")
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
    ap.add_argument("--without-built-reader", action="store_true",
                    help="cold runs start the tape reader by numba's JIT, as before `flightrec build-reader`")
    ap.add_argument("--vs-jit-start", action="store_true",
                    help="also cold runs with the reader started by numba's JIT, taken in turn with the others")
    args = ap.parse_args(argv)
    if args.vs_jit_start and args.without_built_reader:
        ap.error("--vs-jit-start compares against the built reader: drop --without-built-reader")
    if args.vs_torchfrtrace and not args.torchfrtrace:
        ap.error("--vs-torchfrtrace: no torchfrtrace found; install torch or pass --torchfrtrace PATH")
    prelude = WITHOUT_BUILT_READER if args.without_built_reader else ""
    # flightrec's bytecode, as `pip install` compiles it (where PYTHONDONTWRITEBYTECODE is set, as on this
    # project's machine, each process would otherwise compile the package from source: ~0.15 s of its start)
    compileall.compile_dir(Path(tape.__file__).parent, quiet=1)
    built = not args.without_built_reader and ensure_built_reader()
    if args.vs_jit_start and not built:
        ap.error("--vs-jit-start compares the built reader with numba's JIT start: install the `fast` extra")
    reader = ("the tape reader built ahead of time" if built else
              "the tape reader started by numba's JIT from 128 MB of dumps, the unpickler below"
              if tape.available() else "the unpickler (no numba)")
    rows = []
    for ranks, entries in parse_sizes(args.sizes):
        rows.append(measure(ranks, entries, args.repeat, args.torchfrtrace if args.vs_torchfrtrace else None, prelude,
                            args.vs_jit_start))
        print(table(rows[-1:]), flush=True)
    print()
    print(table(rows))
    print(f"(median of {args.repeat} fresh processes per cell; cold runs read with {reader}; verdict at the largest "
          f"size: {rows[-1]['summary']})")


if __name__ == "__main__":
    main()
