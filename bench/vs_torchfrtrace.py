"""Side by side with PyTorch's analyzer on the correctness sweep's jobs: same dumps, both scored against the
generator's ground truth.

    python -m bench.vs_torchfrtrace [--jobs 100] [--seed 0] [--workers 2] [--torchfrtrace PATH] [--out F.jsonl]

The jobs are `bench.sweep`'s draws (same seed, same jobs) of the kinds `torchfrtrace` is built for, hangs and
mismatches, on NCCL (it can't read Gloo's dumps at all: `tests/test_vs_torchfrtrace.py`), written as it reads
them: pickles in one folder, the default file prefix. Damage (innocent dumps deleted or cut short) is drawn
as in the sweep. flightrec gets the ranks per host, as a user would pass it; torchfrtrace has no notion of
hosts. torch is never imported here: `torchfrtrace` runs as a command (e.g. from a venv with torch 2.13).

torchfrtrace takes the first dump file the folder lists as its reference rank, and its answers change with it
(a review found 39 of 103 jobs scored differently under other listing orders): it is run twice per job, with
its file listing sorted by rank ascending and descending (a wrapper sorts `os.walk`'s names and runs the
command's script), and both are reported. As a user would, it is run again with `--allow-incomplete-ranks`
when it refuses a dump set with a rank missing, and, when it crashes on a dump cut short, again without the
cut files. Both first reactions are kept (`refused`, `crashed`) and the answer after them is scored.

It prints a report per mismatch, in order: the ranks missing from a collective, the "culprit rank(s)" of one
with an error, the ranks whose dumps are missing when it can't decide, and, refusing, the ranks whose dumps
are missing (the evidence flightrec is credited for when it names a lost rank): the first report is its
answer. For a rank fault: right (the first report names exactly the culprit ranks), inverted (the first
report names every other member of the collective: its reference rank was the culprit, which a reader can
infer in a group of three or more), among others (the culprit is in a later report, or with other ranks),
nothing (no report), WRONG (it never names the culprit), crash (a traceback even after the workarounds). A
dead link or a NIC down is scored by the hosts of the ranks it names (ranks per host as flightrec was
given): right when the first report's hosts are exactly the link's two or the NIC's one. flightrec is scored
by `bench.sweep.score`; a job whose dumps or flightrec fail scores flightrec ERROR and torchfrtrace `not run`.
"""

from __future__ import annotations

import argparse
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

from flightrec import analyze
from flightrec.testing import synth

from .sweep import HANGS, _damage, damage_label, draw, score, table

PREFIX = "nccl_trace_rank_"
THEIRS = ("right", "inverted", "among others", "nothing", "WRONG", "crash", "not run")
OURS = ("right", "right+damaged", "inconclusive", "ambiguous", "partial", "WRONG", "ERROR")
ORDERS = ("ascending", "descending")
_LINK_KINDS = ("dead_link", "nic_down")

# Runs a torchfrtrace script with the dump files listed in rank order (its reference rank is the first listed).
_ORDERED = """
import os, re, runpy, sys
_walk = os.walk
def _rank(name):
    found = re.search(r"(\\d+)$", name)
    return int(found.group(1)) if found else -1
def _sorted_walk(*args, **kwargs):
    for root, dirs, files in _walk(*args, **kwargs):
        yield root, dirs, sorted(files, key=_rank, reverse={reverse})
os.walk = _sorted_walk
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def cases(seed: int, jobs: int) -> list[dict]:
    """The sweep's jobs for `seed`, in order, of the kinds and backend torchfrtrace takes, written its way."""
    out, index = [], 0
    while len(out) < jobs:
        case = draw(seed, index)
        index += 1
        if case["fault"]["kind"] in HANGS and case["job"].get("backend", "nccl") != "gloo":
            out.append(dict(case, written={}, hosts="per_host"))
    return out


def _rank_set(text: str) -> list[int]:
    return sorted(int(r) for r in re.findall(r"\d+", text))


def reports(text: str) -> list[dict]:
    """torchfrtrace's reports in the order printed, each {"ranks": [...]} (what it names) and, where it says,
    {"expected": [...]} (the collective's members): a collective some ranks didn't join ("missing ranks"), one
    with an error ("Culprit rank", one or several), one it can't judge for missing dumps ("cannot decide ...
    ranks ({...})"), and its refusal of a dump set with ranks missing ("Missing dump files from ranks {...}")."""
    out: list[dict] = []
    for line in text.splitlines():
        if line.startswith(("Not all ranks joining collective", "Collective sequence number:")):
            out.append({"ranks": []})
        elif line.startswith("missing ranks:") and out:
            out[-1]["ranks"] = _rank_set(line)
        elif line.startswith("expected ranks:") and out:
            out[-1]["expected"] = _rank_set(line)
        elif "Culprit rank" in line and out:   # (one error message may name several)
            out[-1]["ranks"] = sorted({int(r) for r in re.findall(r"Culprit rank (\d+)", line)})
        elif line.startswith("We cannot decide"):
            found = re.search(r"ranks \(\{([\d, ]+)\}\)", line)
            out.append({"ranks": _rank_set(found.group(1)) if found else []})
        elif line.startswith("AssertionError: Missing dump files from ranks"):
            out.append({"ranks": _rank_set(line.split("ranks", 1)[1])})
    return out


def score_theirs(kind: str, truth: dict, returncode: int, text: str, host_of=None) -> tuple[str, str]:
    """(result, why) for torchfrtrace's output `text` (the refusal's output first, where it refused), by the
    rules in the module's docstring. `host_of(rank)` names hosts, for links and NICs."""
    if returncode != 0 or "Traceback (most recent call last)" in text.split("Missing dump files")[-1]:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit code {returncode}"]
        return "crash", last[0][:200]
    found = [r for r in reports(text) if r["ranks"]]
    if not found:
        return "nothing", ""
    if kind in _LINK_KINDS:
        want = set(truth["hosts"]) | {h for link in truth["links"] for h in link}
        named = [{host_of(r) for r in report["ranks"]} for report in found]
        if named[0] == want:
            return "right", f"first names ranks {found[0]['ranks']} on hosts {sorted(named[0])}"
        if any(want <= hosts for hosts in named):
            return "among others", f"first names hosts {sorted(named[0])}"
        return "WRONG", f"names hosts {sorted(set().union(*named))[:10]}"
    first, culprit = found[0], set(truth["ranks"])
    if first["ranks"] == truth["ranks"]:
        return "right", ""
    members = set(first.get("expected", []))
    if culprit and culprit <= members and set(first["ranks"]) == members - culprit:
        return "inverted", f"first names the other members {first['ranks']}"
    if any(culprit <= set(report["ranks"]) for report in found):
        return "among others", f"first names ranks {first['ranks']}"
    return "WRONG", f"names ranks {sorted({r for report in found for r in report['ranks']})[:20]}"


def _interpreter(command: str) -> str:
    """The Python that runs the `torchfrtrace` script (its #! line)."""
    with open(command, "rb") as script:
        line = script.readline().decode(errors="replace")
    if not line.startswith("#!") or "python" not in line:
        raise SystemExit(f"{command}: not a Python script; pass the torchfrtrace that pip installed")
    return line[2:].strip().split()[0]


def _torchfrtrace(command: str, folder: Path, order: str, *flags: str) -> tuple[int, str, float]:
    start = time.perf_counter()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    code = _ORDERED.format(reverse=order == "descending")
    try:
        done = subprocess.run([_interpreter(command), "-c", code, command, str(folder), "-p", PREFIX, *flags],
                              capture_output=True, text=True, timeout=600, env=env)
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired:
        return -1, "Traceback (most recent call last)\ntimed out after 600 s", time.perf_counter() - start


def _as_a_user_would(command: str, folder: Path, order: str) -> tuple[int, str, float, bool]:
    """torchfrtrace, and again with `--allow-incomplete-ranks` if it refuses for a missing dump: (exit code,
    output (the refusal's first), seconds, refused)."""
    code, text, seconds = _torchfrtrace(command, folder, order)
    refused = code != 0 and "Missing dump files" in text
    if refused:
        code, again, more = _torchfrtrace(command, folder, order, "--allow-incomplete-ranks")
        text, seconds = text + "\n" + again, seconds + more
    return code, text, seconds, refused


def run(case: dict, workdir: str, command: str) -> dict:
    """Generate and damage one job, then analyse it both ways; the job's files are removed after."""
    out = Path(workdir) / f"job{case['index']}"
    row = dict(case, theirs={o: "not run" for o in ORDERS}, theirs_why={}, refused=False, crashed=False,
               damaged=[], theirs_s=0.0, ours_s=0.0)
    try:
        job = synth.Job(**case["job"], fault=synth.Fault(**{**case["fault"], "hosts": tuple(case["fault"]["hosts"])}))
        truth = synth.generate(job, out, prefix=PREFIX)
        damaged = _damage(out, job, truth, case)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(out, use_cache=False, ranks_per_host=job.ranks_per_host)
        ours, ours_why = score(case["fault"]["kind"], truth, report, damaged)
        row.update(ours=ours, ours_why=ours_why, damaged=damaged, truth_ranks=truth["ranks"],
                   ours_s=round(time.perf_counter() - start, 2), summary=report.summary[:200])
    except Exception as exc:  # noqa: BLE001 - one job's failure is reported, the rest go on
        shutil.rmtree(out, ignore_errors=True)
        return dict(row, ours="ERROR", ours_why=f"{type(exc).__name__}: {exc}")
    try:
        runs = {order: _as_a_user_would(command, out, order) for order in ORDERS}
        row["refused"] = any(r[3] for r in runs.values())
        row["crashed"] = any(r[0] != 0 for r in runs.values())
        if row["crashed"] and case["damage"] and case["damage"][0] == "truncate":
            # (its traceback names no file: a user finds the ones that fail to load and removes them)
            for rank in damaged:
                (out / f"{PREFIX}{rank}").unlink(missing_ok=True)
            runs = {order: _as_a_user_would(command, out, order) for order in ORDERS}
        for order, (code, text, seconds, _) in runs.items():
            row["theirs"][order], row["theirs_why"][order] = score_theirs(case["fault"]["kind"], truth, code, text,
                                                                          job.host_of)
            row["theirs_s"] += seconds
        row["theirs_s"] = round(row["theirs_s"] / len(ORDERS), 2)
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)


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
    for title, key in (("fault", lambda row: row["fault"]["kind"]), ("damage", damage_label),
                       ("pipeline", lambda row: "pp > 1" if row["job"]["pp"] > 1 else "pp = 1")):
        print(f"flightrec, by {title}:\n{table(rows, key, lambda row: row['ours'], OURS)}\n")
        for order in ORDERS:
            print(f"torchfrtrace, files listed by rank {order}, by {title}:\n"
                  f"{table(rows, key, lambda row, o=order: row['theirs'][o], THEIRS)}\n")
    same = sum(len(set(row["theirs"].values())) == 1 for row in rows)
    print(f"torchfrtrace's answer is scored the same under both orders in {same} of {len(rows)} jobs. It refused "
          f"{sum(row['refused'] for row in rows)} dump sets (a rank's dump missing) until run with "
          f"--allow-incomplete-ranks, and crashed on {sum(row['crashed'] for row in rows)} (on a dump cut short, "
          "then run without the cut files)")
    seconds = sorted(row["theirs_s"] for row in rows), sorted(row["ours_s"] for row in rows)
    print(f"median seconds a job: torchfrtrace {seconds[0][len(rows) // 2]:.2f} a run, with torch's import and "
          f"its second run where it refused; flightrec {seconds[1][len(rows) // 2]:.2f} in process")
    for row in rows:
        if row["ours"] in ("WRONG", "ERROR"):
            print(f"flightrec {row['ours']} job {row['index']}: {row['fault']['kind']}, damage {row['damage']}: "
                  f"{row['ours_why']}")


if __name__ == "__main__":
    main()
