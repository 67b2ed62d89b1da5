"""Ingest benchmark (issue 2): our cold load beside a plain pickle.load of every file, same run.

    python -m bench.ingest [--sizes 4096x200,1024x2000] [--repeat 3]
"""

from __future__ import annotations

import argparse

from .data import dataset
from .measure import gib, median_of

PICKLE_FLOOR = """
import json, pickle, time, pathlib
files = sorted(p for p in pathlib.Path({d!r}).iterdir() if p.name.startswith("nccl_trace_rank_"))
t = time.perf_counter()
n = 0
for f in files:
    with open(f, "rb") as fh:
        n += len(pickle.load(fh)["entries"])  # trusted: we generated these files
print(json.dumps({{"s": time.perf_counter() - t, "entries": n}}))
"""

OURS_COLD = """
import json, time, warnings
warnings.simplefilter("ignore")
import flightrec
t = time.perf_counter()
trace = flightrec.load({d!r}, flightrec.LoadOptions(use_cache=False))
print(json.dumps({{"s": time.perf_counter() - t, "entries": trace.entries.height}}))
"""


def measure(ranks: int, entries: int, repeat: int) -> dict:
    d, _ = dataset(ranks, entries)
    floor = median_of(PICKLE_FLOOR.format(d=str(d)), repeat)
    ours = median_of(OURS_COLD.format(d=str(d)), repeat)
    assert ours["entries"] == floor["entries"], (ours, floor)
    return {"size": f"{ranks:,} x {entries:,}", "entries": ours["entries"], "floor_s": floor["s"],
            "ours_s": ours["s"], "ratio": ours["s"] / floor["s"], "floor_rss": floor["peak_rss"],
            "ours_rss": ours["peak_rss"], "runs": ours["runs"]}


def table(rows: list[dict]) -> str:
    head = "| size (ranks x entries) | entries | pickle.load floor | flightrec cold | ratio | peak RSS (ours) | peak RSS (floor) |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['entries']:,} | {r['floor_s']:.2f} s | {r['ours_s']:.2f} s | "
                     f"{r['ratio']:.2f}x | {gib(r['ours_rss'])} | {gib(r['floor_rss'])} |")
    return "\n".join(lines)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096x200,1024x2000")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = [measure(r, e, args.repeat) for r, e in parse_sizes(args.sizes)]
    print(table(rows))
    print(f"(median of {args.repeat} runs each; ratio = flightrec cold load / single-process pickle.load of every file)")


if __name__ == "__main__":
    main()
