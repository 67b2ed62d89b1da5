"""Hangs beside lost dumps, as at scale: a few percent of the ranks leave no dump for reasons of their own.

    python -m bench.lost_dumps [--jobs 100] [--seed 1] [--kinds host_down,dead_link,nic_down,not_joined]

Each job: a generated NCCL 3D job (tp 1-8 x pp 1-4 x dp 2-8, up to 256 ranks, 2-8 ranks a host, per-host
folders, timing on or off), one hang (a host down, a dead link, a NIC down, a rank that never joins; in tp, the
pipeline or dp, at a random step), and 2-10% of the other ranks' dumps deleted (off the fault's hosts). Scored
with `bench.sweep.score` against the generator's truth, the deleted ranks as its damage, and by whether the
headline (the first root cause) names the fault: the dead link itself; the NIC's host, or a link of it; a rank of
the host down, or the rank that never joined. A job is the same for a seed and index.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import tempfile
import warnings
from pathlib import Path

from flightrec import analyze
from flightrec.testing import synth

from .sweep import RESULTS, _group_peers, score, table

KINDS = ("host_down", "dead_link", "nic_down", "not_joined")


def draw(seed: int, index: int, kinds: tuple[str, ...]) -> tuple[synth.Job, float]:
    """One job and the share of the other ranks' dumps to lose."""
    rng = random.Random(seed * 7919 + index)
    kind = rng.choice(kinds)
    while True:
        tp, pp, dp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4]), rng.choice([2, 4, 8])
        per_host = rng.choice([2, 4, 8])
        world = tp * pp * dp
        if world % per_host == 0 and world // per_host >= 3 and world <= 256:
            break
    job = synth.Job(tp=tp, pp=pp, dp=dp, ranks_per_host=per_host)
    rank = rng.randrange(world)
    hosts: tuple[str, ...] = ()
    if kind == "dead_link":
        peers = sorted({job.host_of(r) for r in _group_peers(job, rank)} - {job.host_of(rank)})
        if not peers:
            return draw(seed, index + 1_000_000, kinds)
        hosts = (job.host_of(rank), rng.choice(peers))
    elif kind in ("host_down", "nic_down"):
        hosts = (job.host_of(rank),)
    phases = [p for p, on in (("tp", tp > 1), ("p2p", pp > 1), ("dp", True)) if on]
    fault = synth.Fault(kind=kind, rank=rank, hosts=hosts, phase=rng.choice(phases), step=rng.choice([-1, 0, 1]))
    job = synth.Job(tp=tp, pp=pp, dp=dp, ranks_per_host=per_host, steps=3, timing=rng.random() < 0.6,
                    seed=rng.randrange(10**6), fault=fault)
    return job, rng.uniform(0.02, 0.10)


def run(seed: int, index: int, kinds: tuple[str, ...], workdir: Path) -> dict | None:
    job, share = draw(seed, index, kinds)
    out = workdir / f"job{index}"
    try:
        truth = synth.generate(job, out, per_host_folders=True)
    except ValueError:   # (the fault's phase has no op at that step on that rank)
        return None
    try:
        rng = random.Random(seed * 104729 + index)
        named_hosts = set(truth["hosts"]) | {h for link in truth["links"] for h in link} | set(job.fault.hosts)
        innocent = [r for r in range(job.world_size) if r not in truth["ranks"] and r not in truth["missing_ranks"]
                    and job.host_of(r) not in named_hosts]
        lost = sorted(rng.sample(innocent, min(len(innocent), max(1, round(job.world_size * share)))))
        files = {int(p.name.rsplit("_", 1)[1]): p for p in out.rglob("*_*") if p.is_file()}
        for r in lost:
            files[r].unlink()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(out, use_cache=False)
        result, why = score(job.fault.kind, truth, report, lost)
        first = report.root_causes[0] if report.root_causes else None
        headline = first is not None and (
            any(set(link) == set(truth["links"][0]) for link in first.links) if job.fault.kind == "dead_link" else
            bool(set(first.hosts) & named_hosts or any(set(link) & named_hosts for link in first.links))
            if job.fault.kind == "nic_down" else bool(set(first.ranks) & set(truth["ranks"])))
        return dict(index=index, kind=job.fault.kind, world=job.world_size, lost=len(lost), result=result, why=why,
                    headline=bool(headline), root_causes=len(report.root_causes), summary=report.summary[:200])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="flightrec-lost-") as work:
        for index in range(args.jobs):
            row = run(args.seed, index, kinds, Path(work))
            if row is not None:
                rows.append(row)
    print(table(rows, lambda row: row["kind"], results=RESULTS))
    by_kind = collections.defaultdict(list)
    for row in rows:
        by_kind[row["kind"]].append(row)
    print("\n| fault | jobs | headline names the fault | root causes, median | most |\n|---|---|---|---|---|")
    for kind, kind_rows in sorted(by_kind.items()):
        counts = sorted(r["root_causes"] for r in kind_rows)
        print(f"| {kind} | {len(kind_rows)} | {sum(r['headline'] for r in kind_rows)} | "
              f"{counts[len(counts) // 2]} | {counts[-1]} |")
    for row in rows:
        if row["result"] == "WRONG":
            print(f"WRONG job {row['index']}: {row['kind']}, {row['lost']} of {row['world']} lost: {row['why']}")


if __name__ == "__main__":
    main()
