"""Stage timings (issues 3, 4, 8): ingest, matching, wait-for graph + root cause, timing, in one process.

    python -m bench.stages [--sizes 4096x200,16384x200] [--repeat 3]

Targets: matching adds <= 25% to ingest; the wait-for analysis adds <= 2 s to matching at 16,384 ranks;
timing adds <= 20% to matching.
"""

from __future__ import annotations

import argparse

from .data import dataset
from .ingest import parse_sizes
from .measure import gib, medians, run

STAGES = """
import json, time, warnings
warnings.simplefilter("ignore")
import flightrec
from flightrec.api import run_match
from flightrec.waits import build_waits
from flightrec.locate import locate
from flightrec.rootcause import diagnose
from flightrec.timing import analyze_timing
from flightrec.topology import resolve
out = {{}}
t = time.perf_counter()
trace = flightrec.load({d!r}, flightrec.LoadOptions(use_cache=False))
out["ingest"] = time.perf_counter() - t
t = time.perf_counter(); m = run_match(trace); out["match"] = time.perf_counter() - t
topo = resolve(world_size=trace.world_size, from_dumps=trace.hosts, ranks_per_host=8)
t = time.perf_counter(); timing = analyze_timing(m, trace.groups, topo, entries=trace.entries); out["timing"] = time.perf_counter() - t
t = time.perf_counter()
w = build_waits(m, trace.entries, trace.groups, trace.missing_ranks)
loc = locate(m, topo, exclude=set(w.waiting))
verdict, summary, findings = diagnose(trace, m, w, loc, topo, timing)
out["waits_and_root_cause"] = time.perf_counter() - t
out["s"] = sum(v for v in out.values())
out["timing_over_match"] = out["timing"] / out["match"]   # per run: the median of ratios, not a ratio of medians
out["summary"] = summary
out["culprits"] = sorted({{r for f in findings if f.role == "root_cause" for r in f.ranks}})
print(json.dumps(out))
"""


def measure(ranks: int, entries: int, repeat: int) -> dict:
    d, truth = dataset(ranks, entries)
    runs = [run(STAGES.format(d=str(d))) for _ in range(repeat)]
    r = medians(runs)
    # (the spread of the per-run ratios: on a shared machine one run's match can take 30% longer than another's)
    ratios = [x["timing_over_match"] for x in runs]
    r["timing_over_match_range"] = (min(ratios), max(ratios))
    r["size"] = f"{ranks:,} x {entries:,}"
    r["correct"] = r["culprits"] == truth["ranks"]
    return r


def table(rows: list[dict]) -> str:
    lines = ["| size | ingest | match | match / ingest | waits + root cause | timing | timing / match (median of per-run ratios; their range) | peak RSS | culprit right |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['ingest']:.2f} s | {r['match']:.2f} s | {r['match'] / r['ingest']:.0%} | "
                     f"{r['waits_and_root_cause']:.2f} s | {r['timing']:.2f} s | {r['timing_over_match']:.0%} "
                     f"({r['timing_over_match_range'][0]:.0%}-{r['timing_over_match_range'][1]:.0%}) | "
                     f"{gib(r['peak_rss'])} | {'yes' if r['correct'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096x200,16384x200")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = [measure(r, e, args.repeat) for r, e in parse_sizes(args.sizes)]
    print(table(rows))
    print(f"(median of {args.repeat} runs; each run is a fresh process)")
    print(rows[-1]["summary"])


if __name__ == "__main__":
    main()
