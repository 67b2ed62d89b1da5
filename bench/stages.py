"""Stage timings (issues 3, 4, 8): ingest, matching, wait-for graph + root cause, timing, in one process.

    python -m bench.stages [--sizes 4096x200,16384x200] [--repeat 3] [--rounds 3] [--against REV]

--against REV also runs the stages on the code at git revision REV (a temporary worktree reading the same
data, with the compiled reader copied in), the two checkouts' fresh processes taken in turn: a change's
before and after under the same noise.

Timing is measured alone, as a stage after matching (`timing / match`), and as `analyze` runs it, on a second
thread beside the wait analysis and the diagnosis (`api.diagnose_matched`), where what it adds is the whole minus
the waits and diagnosis without timing: in --rounds warm rounds per run, in turn, and the first time in a
process (runs of another kind, reading the dumps from the cache, without and with timing in turn: the difference
of their medians).

Targets: matching adds <= 25% to ingest; the wait-for analysis adds <= 2 s to matching at 16,384 ranks;
timing adds <= 20% to matching.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from .data import dataset
from .ingest import parse_sizes
from .measure import gib, medians, run, runs_alternated

ROOT = Path(__file__).resolve().parent.parent

# Put before STAGES: import flightrec from another checkout (a worktree of --against), and say so if it did not.
FROM_CHECKOUT = """
import sys
sys.path.insert(0, {root!r})
import flightrec
assert flightrec.__file__.startswith({root!r}), f"flightrec imported from {{flightrec.__file__}}, not {root}"
"""

STAGES = """
import json, time, warnings
warnings.simplefilter("ignore")
import flightrec
from flightrec.api import run_match
from flightrec.analysis.wait_graph import build_waits
from flightrec.analysis.localize import locate
from flightrec.diagnosis.verdict import diagnose
from flightrec.analysis.timing.stragglers import analyze_timing
from flightrec.model.topology import resolve
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
# What timing adds to analyze, which runs it beside the waits and the diagnosis (api.diagnose_matched): those
# without timing and the whole, warm, in turn ({rounds} rounds, the order swapped each round), each against a
# match of its round.
{diagnose_matched}
added = []
for i in range({rounds}):
    t = time.perf_counter(); m = run_match(trace); match_s = time.perf_counter() - t
    took = {{}}
    for what in (("alone", "beside") if i % 2 == 0 else ("beside", "alone")):
        t = time.perf_counter()
        if what == "alone":
            without_timing(trace, m, topo)
        else:
            diagnose_matched(trace, m, topo)
        took[what] = time.perf_counter() - t
    added.append((took["beside"] - took["alone"]) / match_s)
out["timing_added_over_match"] = sorted(added)[len(added) // 2]
out["summary"] = summary
out["culprits"] = sorted({{r for f in findings if f.role == "root_cause" for r in f.ranks}})
print(json.dumps(out))
"""

# What analyze does after matching, as it does it; and without timing. (A revision before
# `api.diagnose_matched`, for --against: one after the other, as its analyze did.)
DIAGNOSE_MATCHED = """
from flightrec.diagnosis.verdict import diagnose
from flightrec.diagnosis.stragglers import straggler_findings as timing_findings
try:
    from flightrec.api import diagnose_matched
except ImportError:
    def diagnose_matched(trace, m, topo):
        w = build_waits(m, trace.entries, trace.groups, trace.missing_ranks)
        loc = locate(m, topo, exclude=set(w.waiting))
        timing = analyze_timing(m, trace.groups, topo, entries=trace.entries)
        return diagnose(trace, m, w, loc, topo, timing), timing_findings(timing, trace.groups, topo)
def without_timing(trace, m, topo):
    w = build_waits(m, trace.entries, trace.groups, trace.missing_ranks)
    return diagnose(trace, m, w, locate(m, topo, exclude=set(w.waiting)), topo)
"""

# The same, in a fresh process, the first time: (the dumps read from the cache) matching, then what follows it
# without timing (`beside` False) or with. What timing adds is the difference of the two kinds of runs, each
# against its run's match.
FIRST_TIME = """
import json, time, warnings
warnings.simplefilter("ignore")
import flightrec
from flightrec.api import run_match
from flightrec.analysis.wait_graph import build_waits
from flightrec.analysis.localize import locate
from flightrec.analysis.timing.stragglers import analyze_timing
from flightrec.model.topology import resolve
{diagnose_matched}
trace = flightrec.load({d!r})
topo = resolve(world_size=trace.world_size, from_dumps=trace.hosts, ranks_per_host=8)
t = time.perf_counter(); m = run_match(trace); match_s = time.perf_counter() - t
t = time.perf_counter()
if {beside}:
    diagnose_matched(trace, m, topo)
else:
    without_timing(trace, m, topo)
took = time.perf_counter() - t
print(json.dumps({{"s": took, "over_match": took / match_s}}))
"""


def measure(ranks: int, entries: int, repeat: int, others: dict[str, Path] | None = None,
            rounds: int = 3) -> list[dict]:
    """A row for this checkout, and one per other checkout in `others` (label -> its root), runs in turn."""
    d, truth = dataset(ranks, entries)
    heads = {"": ""} | {label: FROM_CHECKOUT.format(root=str(root)) for label, root in (others or {}).items()}
    codes = {label: head + STAGES.format(d=str(d), rounds=rounds, diagnose_matched=DIAGNOSE_MATCHED)
             for label, head in heads.items()}
    firsts = [head + FIRST_TIME.format(d=str(d), beside=beside, diagnose_matched=DIAGNOSE_MATCHED)
              for head in heads.values() for beside in (False, True)]
    runs = runs_alternated(list(codes.values()), repeat)
    # (the first-time runs read the dumps from the cache: written here, once)
    run(f"import json, flightrec; flightrec.load({str(d)!r}); print(json.dumps({{'s': 0}}))")
    first = runs_alternated(firsts, 2 * repeat)   # (a difference of two noisy medians: twice the runs)
    rows = []
    for i, (label, done) in enumerate(zip(codes, runs)):
        r = medians(done)
        alone, beside = (statistics.median(x["over_match"] for x in first[2 * i + k]) for k in (0, 1))
        r["timing_added_first_time"] = beside - alone
        # (the spread of the per-run ratios: on a shared machine one run's match can take 30% longer than another's)
        ratios = [x["timing_over_match"] for x in done]
        r["timing_over_match_range"] = (min(ratios), max(ratios))
        added = [x["timing_added_over_match"] for x in done]
        r["timing_added_range"] = (min(added), max(added))
        r["size"] = f"{ranks:,} x {entries:,}" + (f" ({label})" if label else "")
        r["correct"] = r["culprits"] == truth["ranks"]
        rows.append(r)
    return rows


@contextmanager
def checkout(rev: str):
    """A temporary worktree of this repository at `rev`, removed after. (Its fast reader fills numba's cache
    beside its own source on its first run: compare the runs after it.)"""
    folder = Path(tempfile.mkdtemp(prefix="flightrec-against-"))
    tree = folder / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), rev], check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def table(rows: list[dict]) -> str:
    lines = ["| size | ingest | match | match / ingest | waits + root cause | timing | timing / match (median of per-run ratios; their range) | timing added beside the waits and diagnosis / match: warm rounds (range); first time | peak RSS | culprit right |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['ingest']:.2f} s | {r['match']:.2f} s | {r['match'] / r['ingest']:.0%} | "
                     f"{r['waits_and_root_cause']:.2f} s | {r['timing']:.2f} s | {r['timing_over_match']:.0%} "
                     f"({r['timing_over_match_range'][0]:.0%}-{r['timing_over_match_range'][1]:.0%}) | "
                     f"{r['timing_added_over_match']:.0%} ({r['timing_added_range'][0]:.0%}-{r['timing_added_range'][1]:.0%}); "
                     f"{r['timing_added_first_time']:.0%} | "
                     f"{gib(r['peak_rss'])} | {'yes' if r['correct'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4096x200,16384x200")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", metavar="REV", help="also measure the code at this git revision, runs in turn")
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds per run measuring what timing adds beside "
                    "the waits and the diagnosis")
    args = ap.parse_args(argv)
    with checkout(args.against) if args.against else nullcontext() as tree:
        others = {args.against: tree} if args.against else {}
        rows = [row for r, e in parse_sizes(args.sizes) for row in measure(r, e, args.repeat, others, args.rounds)]
    print(table(rows))
    print(f"(median of {args.repeat} runs; each run is a fresh process" + (", the checkouts' in turn)" if args.against
                                                                            else ")"))
    print(rows[0]["summary"])


if __name__ == "__main__":
    main()
