"""Correctness sweep: random synthetic jobs with one injected fault each, some with innocent dumps lost or cut
short, analysed and scored against the generator's ground truth.

    python -m bench.sweep [--jobs 200] [--seed 0] [--workers 2] [--out sweep.jsonl] [--no-hosts]

Each job draws a 3D layout (tp 1-8, pp 1-4, dp 2-8, up to 128 ranks; 1-8 ranks a host), a fault (hangs:
host_down, dead_link, nic_down, not_joined, type/dtype/size mismatch; timing: straggler, straggler_host, slow_link,
clock_offset), dump variants (NCCL or Gloo, recorder 2.4-2.10, timing on or off, JSON, gzip, file prefixes, hosts from
per-host folders, a CSV or ranks per host) and damage (none, or one or two innocent ranks' dumps deleted or
cut to 50-95% of their bytes). A job is the same for a seed and index, whatever the code under test.

Results, per job: right; right+damaged (the culprit named, and a damaged innocent rank as a second root
cause); inconclusive (a hang the dumps can't narrow: e.g. a dead link under groups spanning 3+ hosts);
ambiguous (a slow link found, not narrowed to one host pair; a mismatch in a group of two, said to be
ambiguous, with the culprit among those named); partial (the straggler named with others; for
nic_down, a link of the host);
missed (a timing fault not seen); unseeable (a slow link not seen that no group can be compared across: every
group of each kind it slows is slowed, the world group alone for instance, and no send or receive it slows is
recorded); WRONG (a wrong culprit, a fault called healthy, a healthy job called
faulty); ERROR (an exception: a bug). Prints the table by fault kind and by damage.

With `--only-active` the same jobs are written as a recorder set to `TORCH_INCLUDE_ONLY_ACTIVE` writes them:
NCCL's dumps then hold only the entries it has not seen complete (timing faults leave nothing to see).

With `--healthy` the same jobs are written with no fault and no damage, and scored for false positives: right
when healthy with no straggler or slow link named, WRONG when anything is named.

With `--no-hosts` every job's dumps are one flat folder with no host map: only ranks are scored, and a link,
a NIC, a slow link or a whole host late as one (a tensor-parallel group inside it waits on itself at one pace)
scores unseeable unless a wrong rank is named.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import shutil
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from flightrec import analyze
from flightrec.testing import synth

HANGS = ("host_down", "dead_link", "nic_down", "not_joined", "type_mismatch", "dtype_mismatch", "size_mismatch")
TIMING = ("straggler", "straggler_host", "slow_link", "clock_offset")
RESULTS = ("right", "right+damaged", "inconclusive", "ambiguous", "partial", "missed", "unseeable", "WRONG", "ERROR")


def draw(seed: int, index: int) -> dict:
    """One job's description (plain data: it is written to the results)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = rng.choices(HANGS + TIMING, [10, 10, 6, 4, 10, 10, 4, 10, 10, 10, 8])[0]
    while True:
        tp, pp, dp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 3, 4]), rng.choice([2, 3, 4, 8])
        world = tp * pp * dp
        per_host = rng.choice([r for r in (1, 2, 4, 8) if world % r == 0 and world // r >= 2] or [1])
        if world <= 128 and (world // per_host >= 2 or kind not in ("host_down", "dead_link", "nic_down", "slow_link",
                                                                     "straggler_host", "clock_offset")):
            break
    job = synth.Job(tp=tp, pp=pp, dp=dp, ranks_per_host=per_host)
    rank = rng.randrange(world)
    phases = [p for p, on in (("tp", tp > 1), ("p2p", pp > 1), ("dp", True)) if on]
    if kind.endswith("mismatch"):
        phases = [p for p in phases if p != "p2p"]
    hosts: tuple[str, ...] = ()
    if kind in ("dead_link", "slow_link"):
        peers = sorted({job.host_of(r) for r in _group_peers(job, rank)} - {job.host_of(rank)})
        if not peers:
            return draw(seed, index + 1_000_000)
        hosts = (job.host_of(rank), rng.choice(peers))
    elif kind in ("straggler_host", "clock_offset", "nic_down") or (kind == "host_down" and rng.random() < 0.3):
        hosts = (job.host_of(rank),)
    fault = dict(kind=kind, rank=rank, step=rng.choice([-1, -1, rng.randrange(3)]), phase=rng.choice(phases),
                 hosts=hosts, delay_ms=rng.choice([150.0, 300.0, 1000.0]) if kind in TIMING else 150.0,
                 offset_ms=rng.choice([100.0, 500.0, 5000.0, -500.0]) if kind == "clock_offset" else 0.0)
    job_args = dict(tp=tp, pp=pp, dp=dp, steps=rng.choice([3, 4, 6]), ranks_per_host=per_host,
                    microbatches=rng.choice([1, 2, 4]), version=rng.choice(["2.10", "2.10", "2.9", "2.7", "2.4"]),
                    timing=rng.random() < 0.7, seed=rng.randrange(10**6), buffer_size=rng.choice([2000, 2000, 200]))
    if rng.random() < 0.25:   # (Gloo's recorder: no timing, no sends and receives, no group config)
        job_args.update(backend="gloo", timing=False)
    written = {k: v for k, v in (("fmt", "json"), ("compress", True), ("prefix", "dump-")) if rng.random() < 0.25}
    damage = rng.choice([None, None, ("delete", 1), ("delete", 2), ("truncate", 1), ("truncate", 2)])
    return dict(index=index, job=job_args, fault=fault, written=written,
                hosts=rng.choice(["folders", "folders", "csv", "per_host"]),
                damage=damage if world > 4 else None)


def _group_peers(job: synth.Job, rank: int) -> list[int]:
    d, p, t = job.coords(rank)
    return ([job.rank_of(x, p, t) for x in range(job.dp)] + [job.rank_of(d, x, t) for x in range(job.pp)]
            + [job.rank_of(d, p, x) for x in range(job.tp)])


def run(case: dict, workdir: str) -> dict:
    """Generate, damage, analyse and score one job; the job's files are removed after."""
    out = Path(workdir) / f"job{case['index']}"
    try:
        job = synth.Job(**case["job"], fault=synth.Fault(**{**case["fault"], "hosts": tuple(case["fault"]["hosts"])}))
        truth = synth.generate(job, out, per_host_folders=case["hosts"] == "folders", **case["written"])
        damaged = _damage(out, job, truth, case)
        options = {}
        if case["hosts"] == "csv":
            hosts_csv = out.parent / f"{out.name}_hosts.csv"
            hosts_csv.write_text("rank,host\n" + "".join(f"{r},{job.host_of(r)}\n" for r in range(job.world_size)))
            options["hosts_file"] = hosts_csv
        elif case["hosts"] == "per_host":
            options["ranks_per_host"] = job.ranks_per_host
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if case.get("window"):
                report = _windowed(out, case["window"], trigger=case.get("trigger", "auto"), **options)
            else:
                report = analyze(out, use_cache=False, trigger=case.get("trigger", "auto"), **options)
        if case["hosts"] == "none" and case["fault"]["kind"] == "straggler_host":   # (scored by its ranks)
            truth = dict(truth, ranks=[r for r in range(job.world_size) if job.host_of(r) in truth["hosts"]])
        result, why = score(case["fault"]["kind"], truth, report, damaged, hosts_known=case["hosts"] != "none")
        if result == "missed" and case["fault"]["kind"] == "slow_link" and not _comparable(job):
            result, why = "unseeable", "every group the link slows has no peer group it doesn't slow"
        return dict(case, result=result, why=why, summary=report.summary[:300], damaged=damaged,
                    seconds=round(time.perf_counter() - start, 2))
    except Exception as exc:  # noqa: BLE001 - a sweep reports every failure and goes on
        return dict(case, result="ERROR", why=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _windowed(out: Path, keep: int, **options):
    """The distributed path in this process: the job's dumps converted into shards (one per host folder, or one
    for a flat folder), each rank's newest `keep` entries read back (`flightrec.distributed`)."""
    from flightrec.api import AnalyzeOptions
    from flightrec.distributed.conversion import convert_hosts, host_jobs
    from flightrec.distributed.driver import analyze_shards
    from flightrec.distributed.tasks import ConvertJob

    shards = out.parent / f"{out.name}_shards"
    try:
        has_hosts = any(p.is_dir() for p in out.iterdir())
        jobs = host_jobs(str(out), str(shards)) if has_hosts else [ConvertJob(str(out), str(shards / "all"))]
        converted = convert_hosts(jobs)
        if converted.failed:
            raise RuntimeError(f"conversion failed: {converted.failed[0].failure}")
        return analyze_shards(str(shards), AnalyzeOptions(**options), keep=keep)
    finally:
        shutil.rmtree(shards, ignore_errors=True)


def _comparable(job: synth.Job) -> bool:
    """A slow link slows some groups of a kind and not others (group testing can see it), or slows sends and
    receives the recorder keeps (NCCL's; Gloo records none)."""
    reach = synth.link_reach(job, job.fault.hosts)
    p2p = reach.get("p2p", (0, 0))[0] > 0 and job.backend != "gloo"
    return p2p or any(0 < hit < of for kind, (hit, of) in reach.items() if kind not in ("p2p", "default_pg"))


def _damage(out: Path, job: synth.Job, truth: dict, case: dict) -> list[int]:
    """Delete or cut short the dumps of one or two innocent ranks (off the fault's hosts where there are others)."""
    if not case["damage"]:
        return []
    how, count = case["damage"]
    rng = random.Random(case["index"])
    innocent = [r for r in range(job.world_size) if r not in truth["ranks"] and r not in truth["missing_ranks"]]
    named_hosts = set(truth["hosts"]) | {h for link in truth["links"] for h in link} | set(case["fault"]["hosts"])
    innocent = [r for r in innocent if job.host_of(r) not in named_hosts] or innocent
    files = {int(re.search(r"(\d+)(\.json)?(\.gz)?$", p.name).group(1)): p for p in out.rglob("*") if p.is_file()}
    chosen = rng.sample(innocent, min(count, len(innocent)))
    for r in chosen:
        if how == "delete":
            files[r].unlink()
        else:
            data = files[r].read_bytes()
            files[r].write_bytes(data[: int(len(data) * rng.uniform(0.5, 0.95))])
    return chosen


def score(kind: str, truth: dict, report, damaged: list[int], hosts_known: bool = True) -> tuple[str, str]:
    """(result, why) against the generator's truth; host names compared by their number (the hosts file and
    --ranks-per-host name them differently). Without `hosts_known` (`--no-hosts`) only ranks are scored."""
    if kind == "none":
        return _score_healthy(report)
    if not hosts_known:
        return _score_ranks(kind, truth, report, damaged)
    def numbers(hosts):
        return sorted(int(re.search(r"(\d+)$", h).group(1)) for h in hosts)

    named = report.culprits
    ranks, links = named["ranks"], sorted(numbers(link) for link in named["links"])
    true_links = sorted(numbers(link) for link in truth["links"])
    if kind in HANGS:
        if report.verdict == "healthy":
            return "WRONG", "called healthy"
        if report.verdict == "inconclusive":
            return "inconclusive", ""
        if kind == "nic_down":   # (a link with the host at one end is as far as the first hangs may go)
            host = numbers(truth["hosts"])[0]
            if numbers(named["hosts"]) == [host] and not links:
                return "right", ""
            if links and all(host in link for link in links) and not named["hosts"]:
                return "partial", "a link of the host"
            return "WRONG", f"named hosts {named['hosts']}, links {links}"
        if ranks == truth["ranks"] and links == true_links:
            return "right", ""
        if any(f.evidence.get("ambiguous") for f in report.root_causes) and set(truth["ranks"]) <= set(ranks):
            return "ambiguous", "a mismatch no side of which can be blamed (a group of two)"
        extra = set(ranks) - set(truth["ranks"])
        if set(truth["ranks"]) <= set(ranks) and extra <= set(damaged) and links == true_links:
            return "right+damaged", ""
        return "WRONG", f"named ranks {ranks}, links {links}"
    wrong_roots = [f for f in report.root_causes if not set(f.ranks) <= set(damaged) or f.links]
    if wrong_roots:
        return "WRONG", f"root causes {[(f.kind, f.ranks, f.links) for f in wrong_roots]}"
    stragglers = [(f.ranks, numbers(f.hosts)) for f in report.findings if f.kind == "straggler"]
    slow = [sorted(numbers(link) for link in f.links) for f in report.findings if f.kind == "slow_link"]
    if kind == "clock_offset":
        return ("right", "") if not stragglers and not slow else ("WRONG", f"named {stragglers} {slow}")
    if kind == "slow_link":
        if slow == [true_links] and not stragglers:
            return "right", ""
        if not slow and not stragglers:
            return "missed", ""
        if any(true_links[0] in s for s in slow) or (slow and not any(slow) and not stragglers):
            return ("partial", "") if any(slow) else ("ambiguous", "not narrowed to one host pair")
        return "WRONG", f"named {stragglers} {slow}"
    want = (truth["ranks"], numbers(truth["hosts"]))
    found = [s if kind == "straggler" else s[1] for s in stragglers]
    target = want if kind == "straggler" else want[1]
    if found == [target] and not slow:
        return "right", ""
    if not stragglers and not slow:
        return "missed", ""
    return ("partial", "") if target in found else ("WRONG", f"named {stragglers} {slow}")


def _score_healthy(report) -> tuple[str, str]:
    """A job with no fault (`--healthy`): right when healthy with no straggler or slow link named; WRONG when
    anything is named (a root cause, a straggler, a slow link); else inconclusive."""
    named = [(f.kind, f.ranks, f.hosts, f.links) for f in report.findings
             if f.role == "root_cause" or f.kind in ("straggler", "slow_link")]
    if named:
        return "WRONG", f"named {named[:3]}"
    return ("right", "") if report.verdict == "healthy" else ("inconclusive", report.summary[:120])


def _score_ranks(kind: str, truth: dict, report, damaged: list[int]) -> tuple[str, str]:
    """`score` for dumps with no host placement: a link, a NIC, a slow link or a whole host late as one can't be
    named (the report says hosts are unknown), so those score `unseeable` unless a wrong rank is named."""
    ranks = report.culprits["ranks"]
    wrong_roots = [f for f in report.root_causes if not set(f.ranks) <= set(damaged)]
    if kind in HANGS:
        if report.verdict == "healthy":
            return "WRONG", "called healthy"
        if kind in ("dead_link", "nic_down"):
            return ("WRONG", f"named ranks {ranks}") if wrong_roots else ("unseeable", "a link needs hosts")
        if report.verdict == "inconclusive":
            return "inconclusive", ""
        if ranks == truth["ranks"]:
            return "right", ""
        if any(f.evidence.get("ambiguous") for f in report.root_causes) and set(truth["ranks"]) <= set(ranks):
            return "ambiguous", "a mismatch no side of which can be blamed (a group of two)"
        if set(truth["ranks"]) <= set(ranks) and set(ranks) - set(truth["ranks"]) <= set(damaged):
            return "right+damaged", ""
        return "WRONG", f"named ranks {ranks}"
    if wrong_roots:
        return "WRONG", f"root causes {[(f.kind, f.ranks) for f in wrong_roots]}"
    named = sorted(r for f in report.findings if f.kind == "straggler" for r in f.ranks)
    if kind in ("clock_offset", "slow_link"):
        return ("right" if kind == "clock_offset" else "unseeable", "") if not named else ("WRONG", f"named {named}")
    if named == truth["ranks"]:
        return "right", ""
    if not named:
        return ("unseeable", "a host late as one needs hosts") if kind == "straggler_host" else ("missed", "")
    return ("partial", "") if set(truth["ranks"]) <= set(named) else ("WRONG", f"named {named}")


def table(rows: list[dict], key, result=lambda row: row["result"], results: tuple[str, ...] = RESULTS) -> str:
    """Counts of each row's `result(row)` (one column per `results`) per `key(row)`, and a total."""
    counts = collections.defaultdict(collections.Counter)
    for row in rows:
        counts[key(row)][result(row)] += 1
    lines = ["| | " + " | ".join(results) + " | jobs |", "|---" * (len(results) + 2) + "|"]
    for name in sorted(counts):
        c = counts[name]
        lines.append(f"| {name} | " + " | ".join(str(c[r]) for r in results) + f" | {sum(c.values())} |")
    total = collections.Counter(result(row) for row in rows)
    lines.append("| **all** | " + " | ".join(f"**{total[r]}**" for r in results) + f" | **{len(rows)}** |")
    return "\n".join(lines)


def damage_label(row: dict) -> str:
    return "no damage" if not row["damage"] else f"{row['damage'][0]} {row['damage'][1]}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="write every job's description and result here (JSON lines)")
    ap.add_argument("--no-hosts", action="store_true",
                    help="withhold host placement (one flat folder, no hosts file): only ranks are scored")
    ap.add_argument("--healthy", action="store_true",
                    help="the same jobs with no fault and no damage: every verdict should be healthy, with no straggler "
                         "or slow link named (false positives)")
    ap.add_argument("--only-active", action="store_true",
                    help="the same jobs, their recorders set to keep only unfinished entries (TORCH_INCLUDE_ONLY_ACTIVE; "
                         "a no-op for Gloo's)")
    ap.add_argument("--trigger", choices=["auto", "timeout", "on-demand"], default="auto",
                    help="what the analysis is told wrote the dumps (the generator's are the watchdog's, on a timeout: "
                         "'timeout' is what a runbook that knows the job hung passes)")
    ap.add_argument("--window", type=int, metavar="N",
                    help="analyse through the distributed path: each job's dumps converted into per-host shards and "
                         "each rank's newest N entries read back (`flightrec analyze SHARDS --window N`)")
    args = ap.parse_args(argv)
    cases = [draw(args.seed, i) | ({"hosts": "none"} if args.no_hosts else {}) | {"trigger": args.trigger}
             | ({"window": args.window} if args.window else {}) for i in range(args.jobs)]
    if args.only_active:
        cases = [case | {"job": case["job"] | {"only_active": True}} for case in cases]
    if args.healthy:
        cases = [case | {"fault": case["fault"] | {"kind": "none", "hosts": []}, "damage": None} for case in cases]
    with tempfile.TemporaryDirectory(prefix="flightrec-sweep-") as workdir, \
            ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(run, cases, [workdir] * len(cases)))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    print(table(rows, lambda row: row["fault"]["kind"]))
    print()
    print(table(rows, damage_label))
    for row in rows:
        if row["result"] in ("WRONG", "ERROR"):
            print(f"{row['result']} job {row['index']}: {row['fault']['kind']}, damage {row['damage']}: {row['why']}")


if __name__ == "__main__":
    main()
