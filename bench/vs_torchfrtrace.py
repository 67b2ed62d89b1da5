"""Side by side with PyTorch's analyzer on the correctness sweep's jobs: same dumps, both scored against the
generator's ground truth.

    python -m bench.vs_torchfrtrace [--jobs 100] [--seed 0] [--workers 2] [--torchfrtrace PATH] [--out F.jsonl]

The jobs are `bench.sweep`'s draws (same seed, same jobs) of the kinds `torchfrtrace` is built for, hangs and
mismatches, on NCCL (it can't read Gloo's dumps at all: `tests/test_vs_torchfrtrace.py`), written as it reads
them: pickles in one folder, the default file prefix. Damage (innocent dumps deleted or cut short) is drawn
as in the sweep. flightrec gets the ranks per host, as a user would pass it; torchfrtrace has no notion of
hosts. torch is never imported here: `torchfrtrace` runs as a command (e.g. from a venv with torch 2.13).

torchfrtrace prints a report per mismatch it finds (ranks missing from a collective, or a "culprit rank"). It
is scored on what it names: right (its first report names exactly the culprit ranks), among others (the
culprit is in a later report, or with other ranks: a reader must pick it out of the symptoms), undecided (it
only says it can't decide, for dumps are missing), nothing (no report), no hosts (a dead link or NIC: it can
name ranks only), WRONG (it names ranks, never the culprit), crash (a traceback). It refuses any dump set with
a rank missing unless `--allow-incomplete-ranks` is given: then it is run again with the flag, as a user
would, and `refused` is kept in the results. flightrec is scored by `bench.sweep.score`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from flightrec import analyze, synth

from .sweep import HANGS, _damage, draw, score

PREFIX = "nccl_trace_rank_"
THEIRS = ("right", "among others", "undecided", "nothing", "no hosts", "WRONG", "crash")
OURS = ("right", "right+damaged", "inconclusive", "ambiguous", "partial", "WRONG", "ERROR")
_LINK_KINDS = ("dead_link", "nic_down")


def cases(seed: int, jobs: int) -> list[dict]:
    """The sweep's jobs for `seed`, in order, of the kinds and backend torchfrtrace takes, written its way."""
    out, index = [], 0
    while len(out) < jobs:
        case = draw(seed, index)
        index += 1
        if case["fault"]["kind"] in HANGS and case["job"].get("backend", "nccl") != "gloo":
            out.append(dict(case, written={}, hosts="per_host"))
    return out


def reports(text: str) -> list[dict]:
    """torchfrtrace's reports in the order printed: {"ranks": [...]} for a collective some ranks didn't join
    ("missing ranks") or one with an error ("Culprit rank"), {"undecided": [...]} for one it can't judge for
    missing dumps."""
    out = []
    for line in text.splitlines():
        if line.startswith(("Not all ranks joining collective", "Collective sequence number:")):
            out.append({"ranks": []})
        elif line.startswith("missing ranks:") and out:
            out[-1]["ranks"] = sorted(int(r) for r in re.findall(r"\d+", line))
        elif "Culprit rank" in line and out:   # (one error message may name several)
            out[-1]["ranks"] = sorted({int(r) for r in re.findall(r"Culprit rank (\d+)", line)})
        elif line.startswith("We cannot decide"):
            found = re.search(r"ranks \(\{([\d, ]+)\}\)", line)
            out.append({"undecided": sorted(int(r) for r in found.group(1).split(","))} if found else {"undecided": []})
    return out


def score_theirs(kind: str, truth: dict, returncode: int, text: str) -> tuple[str, str]:
    """(result, why) for one torchfrtrace run, by the rules in the module's docstring."""
    if returncode != 0 or "Traceback" in text:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit code {returncode}"]
        return "crash", last[0][:200]
    found = reports(text)
    named = [r["ranks"] for r in found if r.get("ranks")]
    if not named:
        return ("undecided", "") if any("undecided" in r for r in found) else ("nothing", "")
    if kind in _LINK_KINDS:
        return "no hosts", f"first names ranks {named[0]}"
    if named[0] == truth["ranks"]:
        return "right", ""
    if any(set(truth["ranks"]) <= set(ranks) for ranks in named):
        return "among others", f"first names ranks {named[0]}"
    return "WRONG", f"names ranks {sorted({r for ranks in named for r in ranks})[:20]}"


def _torchfrtrace(command: str, folder: Path, *flags: str) -> tuple[int, str, float]:
    start = time.perf_counter()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        done = subprocess.run([command, str(folder), "-p", PREFIX, *flags], capture_output=True, text=True,
                              timeout=600, env=env)
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        return -1, "Traceback: timed out after 600 s", time.perf_counter() - start


def run(case: dict, workdir: str, command: str) -> dict:
    """Generate and damage one job, then analyse it both ways; the job's files are removed after."""
    out = Path(workdir) / f"job{case['index']}"
    try:
        job = synth.Job(**case["job"], fault=synth.Fault(**{**case["fault"], "hosts": tuple(case["fault"]["hosts"])}))
        truth = synth.generate(job, out, prefix=PREFIX)
        damaged = _damage(out, job, truth, case)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(out, use_cache=False, ranks_per_host=job.ranks_per_host)
        ours, ours_why = score(case["fault"]["kind"], truth, report, damaged)
        ours_s = time.perf_counter() - start
        code, text, theirs_s = _torchfrtrace(command, out)
        refused = code != 0 and "Missing dump files" in text
        if refused:
            code, text, again = _torchfrtrace(command, out, "--allow-incomplete-ranks")
            theirs_s += again
        theirs, theirs_why = score_theirs(case["fault"]["kind"], truth, code, text)
        return dict(case, ours=ours, ours_why=ours_why, theirs=theirs, theirs_why=theirs_why, refused=refused,
                    damaged=damaged, truth_ranks=truth["ranks"], ours_s=round(ours_s, 2), theirs_s=round(theirs_s, 2),
                    summary=report.summary[:200])
    except Exception as exc:  # noqa: BLE001 - one job's failure is reported, the rest go on
        return dict(case, ours="ERROR", ours_why=f"{type(exc).__name__}: {exc}", theirs="crash", theirs_why="",
                    refused=False, damaged=[], ours_s=0.0, theirs_s=0.0)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def table(rows: list[dict], key, column: str, results: tuple[str, ...]) -> str:
    counts = collections.defaultdict(collections.Counter)
    for row in rows:
        counts[key(row)][row[column]] += 1
    lines = ["| | " + " | ".join(results) + " | jobs |", "|---" * (len(results) + 2) + "|"]
    for name in sorted(counts):
        c = counts[name]
        lines.append(f"| {name} | " + " | ".join(str(c[r]) for r in results) + f" | {sum(c.values())} |")
    total = collections.Counter(row[column] for row in rows)
    lines.append("| **all** | " + " | ".join(f"**{total[r]}**" for r in results) + f" | **{len(rows)}** |")
    return "\n".join(lines)


def _damage_label(row: dict) -> str:
    return "no damage" if not row["damage"] else f"{row['damage'][0]} {row['damage'][1]}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--torchfrtrace", default=shutil.which("torchfrtrace"),
                    help="the torchfrtrace command (default: the one on PATH)")
    ap.add_argument("--out", default=None, help="write every job's description and both results here (JSON lines)")
    args = ap.parse_args(argv)
    if not args.torchfrtrace:
        ap.error("no torchfrtrace found: install torch (e.g. in a venv) and pass --torchfrtrace PATH")
    todo = cases(args.seed, args.jobs)
    with tempfile.TemporaryDirectory(prefix="flightrec-vs-") as workdir, ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(run, todo, [workdir] * len(todo), [args.torchfrtrace] * len(todo)))
    if args.out:
        Path(args.out).write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
    # (by pipeline too: torchfrtrace's matching of sends and receives is where most of its wrong answers are)
    for title, key in (("fault", lambda row: row["fault"]["kind"]), ("damage", _damage_label),
                       ("pipeline", lambda row: "pp > 1" if row["job"]["pp"] > 1 else "pp = 1")):
        print(f"flightrec, by {title}:\n{table(rows, key, 'ours', OURS)}\n")
        print(f"torchfrtrace, by {title}:\n{table(rows, key, 'theirs', THEIRS)}\n")
    refused = sum(row["refused"] for row in rows)
    print(f"torchfrtrace refused {refused} of {len(rows)} dump sets (a rank's dump missing) until run again with "
          "--allow-incomplete-ranks")
    seconds = sorted(row["theirs_s"] for row in rows), sorted(row["ours_s"] for row in rows)
    print(f"median seconds a job: torchfrtrace {seconds[0][len(rows) // 2]:.2f} (with torch's import), "
          f"flightrec {seconds[1][len(rows) // 2]:.2f} (in process)")
    for row in rows:
        if row["ours"] in ("WRONG", "ERROR"):
            print(f"flightrec {row['ours']} job {row['index']}: {row['fault']['kind']}, damage {row['damage']}: "
                  f"{row['ours_why']}")


if __name__ == "__main__":
    main()
