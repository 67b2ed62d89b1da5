"""Past one machine (issue #50): the distributed path on Dask's local cluster, worker memory capped.

    python -m bench.distributed [--size 131072x2000] [--slice 4096] [--workers 2] [--worker-memory 6GiB]
                                [--window 200] [--repeat 1] [--compare 8192x200]

--size: the job's shards, made as `bench.sharded` makes them (generated, converted and deleted a slice of
ranks at a time: 131,072 x 2,000 would be ~170 GiB of pickles); then `analyze_shards` on a LocalCluster of
--workers processes, each capped at --worker-memory, in a fresh process. Reported: wall time, per-rank cost, the
driver's peak RSS (its own process) and each worker's, and whether the culprit is the generator's.

--compare: a size both paths can run, generated in one folder per host: `flightrec.analyze` of the dumps on
one machine beside `convert_hosts` (a task per host on the cluster) then `analyze_shards`, each in a fresh
process, and whether they say the same (verdict, culprits, each finding's kind, ranks and action).
"""

from __future__ import annotations

import argparse
import json
import shutil

from flightrec.testing import synth

from .data import job_dir, job_for
from .ingest import parse_sizes
from .measure import gib, run
from .sharded import shard_dataset

# The driver, in a fresh process: a LocalCluster, the analysis, and every process's peak RSS (ru_maxrss).
DRIVER = """
import json, resource, time, warnings
warnings.simplefilter("ignore")
from distributed import Client, LocalCluster
from flightrec.distributed.conversion import convert_hosts, host_jobs
from flightrec.distributed.driver import analyze_shards
from flightrec.distributed.runner import OnDask

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

if __name__ == "__main__":
    with LocalCluster(n_workers={workers}, threads_per_worker=1, processes=True, memory_limit={memory!r},
                      dashboard_address=None) as cluster, Client(cluster) as client:
        runner = OnDask(client)
        t = time.perf_counter()
        converted = None
        if {dumps!r}:
            done = convert_hosts(host_jobs({dumps!r}, {shards!r}), runner)
            converted = time.perf_counter() - t
            assert not done.failed, done.failed[:3]
        t = time.perf_counter()
        report = analyze_shards({shards!r}, keep={window}, runner=runner)
        s = time.perf_counter() - t
        workers = sorted(client.run(peak).values())
    print(json.dumps({{"s": s, "convert_s": converted, "driver_peak": peak(), "worker_peaks": workers,
                       "said": [report.verdict, report.culprits["ranks"],
                                [[f.kind, sorted(f.ranks), f.action] for f in report.findings]],
                       "summary": report.summary, "culprits": report.culprits["ranks"],
                       "loaded": report.dumps.loaded, "unreadable": len(report.dumps.unreadable),
                       "left_out": report.dumps.window["entries_left_out"]}}))
"""

ONE_MACHINE = """
import json, resource, time, warnings
warnings.simplefilter("ignore")
import flightrec
t = time.perf_counter()
report = flightrec.analyze({dumps!r}, use_cache=False)
print(json.dumps({{"s": time.perf_counter() - t, "summary": report.summary,
                   "said": [report.verdict, report.culprits["ranks"],
                            [[f.kind, sorted(f.ranks), f.action] for f in report.findings]]}}))
"""


def _distributed(shards: str, workers: int, memory: str, window: int, dumps: str = "") -> dict:
    return run(DRIVER.format(workers=workers, memory=memory, window=window, shards=shards, dumps=dumps))


def scale(args) -> None:
    [(ranks, entries)] = parse_sizes(args.size)
    stats, truth = shard_dataset(ranks, entries, args.slice)
    shards = str(job_dir(ranks, entries, "_shards"))
    runs = [_distributed(shards, args.workers, args.worker_memory, args.window) for _ in range(args.repeat)]
    r = sorted(runs, key=lambda x: x["s"])[len(runs) // 2]
    n = sum(s["entries"] for s in stats["slices"])
    print("| ranks x entries | entries in the shards | shards | workers x memory cap | window | analyze | per rank "
          "| driver peak RSS | worker peak RSS | whole tree peak | culprit right |")
    print("|" + "---|" * 11)
    print(f"| {ranks:,} x {entries:,} | {n:,} | {len(stats['slices'])} | {args.workers} x {args.worker_memory} | "
          f"{args.window} | {r['s']:.1f} s | {r['s'] / ranks * 1e3:.3f} ms | {gib(r['driver_peak'])} | "
          f"{gib(max(r['worker_peaks']))} | {gib(r['peak_rss'])} | "
          f"{'yes' if r['culprits'] == truth['ranks'] else 'NO'} |")
    print(f"(runs {[round(x['s'], 1) for x in runs]}; {r['loaded']:,} ranks loaded, {r['unreadable']} shards "
          f"unreadable, {r['left_out']:,} older entries left out; conversion, a slice at a time: "
          f"{sum(s['s'] for s in stats['slices']):.0f} s in all; verdict: {r['summary'][:160]})")


def compare(args) -> None:
    [(ranks, entries)] = parse_sizes(args.compare)
    dumps = job_dir(ranks, entries, "_hosts")
    if not synth.truth_path(dumps).exists():
        shutil.rmtree(dumps, ignore_errors=True)
        synth.generate(job_for(ranks, entries), dumps, per_host_folders=True)
    truth = json.loads(synth.truth_path(dumps).read_text())
    shards = str(dumps) + "_shards"
    shutil.rmtree(shards, ignore_errors=True)
    one = run(ONE_MACHINE.format(dumps=str(dumps)))
    dist = _distributed(shards, args.workers, args.worker_memory, args.window, dumps=str(dumps))
    shutil.rmtree(shards, ignore_errors=True)
    same = one["said"] == dist["said"]
    print("| ranks x entries | one machine: analyze | its peak | cluster: convert a task per host | analyze "
          f"--window {args.window} | driver peak | culprit right | the same findings |")
    print("|" + "---|" * 8)
    print(f"| {ranks:,} x {entries:,} | {one['s']:.1f} s | {gib(one['peak_rss'])} | {dist['convert_s']:.1f} s | "
          f"{dist['s']:.1f} s | {gib(dist['driver_peak'])} | "
          f"{'yes' if one['said'][1] == dist['culprits'] == truth['ranks'] else 'NO'} | {'yes' if same else 'NO'} |")
    if not same:
        print(f"one machine: {one['summary'][:200]}\ncluster:     {dist['summary'][:200]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="131072x2000")
    ap.add_argument("--slice", type=int, default=4096, help="ranks per slice (generated, converted, deleted)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worker-memory", default="6GiB")
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--compare", help="a size both paths run (e.g. 8192x200), instead of --size")
    args = ap.parse_args(argv)
    compare(args) if args.compare else scale(args)


if __name__ == "__main__":
    main()
