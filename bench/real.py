"""Scorecard on dumps nobody here generated: every real fixture, scored against its known answer, with PyTorch's
`torchfrtrace` beside it on the same folders where torch is installed.

    python -m bench.real [--torchfrtrace PATH] [--out real.jsonl]

The fixtures: the Gloo dumps recorded with torch 2.13 (`fixtures/*/expected.json`: the injected fault, or none),
NVIDIA's real GPU dumps (`fixtures/nvrx`: their reference culprits, and the other injected rank allowed), and
PyTorch's own analyzer test cases written as the real writers dump them (`fixtures/torch_cases`: the right
answer each `expected.json` states). flightrec runs as the CLI does with no option (`trigger` auto); torchfrtrace
as a user would: on a copy of the folder, its files' prefix given, and again with `--allow-incomplete-ranks` when it
refuses a set with a rank's dump missing.

A result: right (the culprits, or healthy where nothing is wrong; for a tie the dumps can't break, both members
named and said ambiguous), WRONG (another culprit, healthy called faulty, a fault called healthy), crash (an
exception or a refusal), and for torchfrtrace "nothing" (it printed no culprit where there is one) and "one side"
(it named one member of a tie the dumps can't break: by the order it read the files).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from flightrec import analyze

from .vs_torchfrtrace import _interpreter, reports

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def cases() -> list[dict]:
    """Every real fixture folder with a known answer: {"case", "source", "truth": {"verdict", "ranks", ...}}."""
    out = []
    for path in sorted(FIXTURES.glob("*/expected.json")):
        fault = json.loads(path.read_text()).get("fault") or {}
        if fault.get("needs_world_size"):
            # (the numbered groups skip the lost host's: more ranks than read, nobody to name; --world-size
            # names the missing ones)
            truth = {"verdict": "inconclusive", "suspects": [], "note": "a host's dumps missing, the world size unknown"}
        elif fault.get("indistinguishable_from"):
            truth = {"verdict": "inconclusive", "suspects": sorted(fault["ranks"] + fault["indistinguishable_from"])}
        elif fault.get("kind") in ("not_joined", "missing_dump", "mismatch") or (
                fault.get("kind") == "straggler" and fault.get("collective_seq_id")):
            truth = {"verdict": "fault", "ranks": fault["ranks"]}
        else:
            truth = {"verdict": "healthy"}
        out.append({"case": path.parent.name, "source": "Gloo, torch 2.13", "truth": truth})
    for path in sorted(FIXTURES.glob("nvrx/*/expected.json")):
        fault = json.loads(path.read_text())["fault"]
        out.append({"case": f"nvrx/{path.parent.name}", "source": "NVIDIA GPU dumps",
                    "truth": {"verdict": "fault", "ranks": fault["reference_ranks"],
                              "allowed": fault["injected_ranks"]}})
    for path in sorted(FIXTURES.glob("torch_cases/*/expected.json")):
        expect = json.loads(path.read_text())["expect"]
        truth = {"verdict": expect["verdict"], **({"ranks": expect["ranks"]} if "ranks" in expect else {}),
                 **({"ambiguous": True} if expect.get("ambiguous") else {})}
        out.append({"case": f"torch_cases/{path.parent.name}", "source": "PyTorch's test cases", "truth": truth})
    return out


def score_ours(truth: dict, report) -> tuple[str, str]:
    if truth["verdict"] != report.verdict:
        return "WRONG", f"{report.verdict}: {report.summary[:120]}"
    if truth["verdict"] == "healthy":
        return "right", ""
    if truth["verdict"] == "inconclusive":
        named = sorted(report.findings[0].ranks) if report.findings else []
        return ("right", "") if named == truth["suspects"] else ("WRONG", f"suspects {named}")
    first = report.root_causes[0]
    if "allowed" in truth:
        ok = set(truth["ranks"]) <= set(first.ranks) <= set(truth["allowed"])
    else:
        ok = first.ranks == truth["ranks"] and bool(first.evidence.get("ambiguous")) == truth.get("ambiguous", False)
    return ("right", "") if ok else ("WRONG", f"names {first.ranks}: {first.message[:120]}")


def score_theirs(truth: dict, code: int, text: str) -> tuple[str, str]:
    if code != 0 or "Traceback (most recent call last)" in text.split("Missing dump files")[-1]:
        last = [line for line in text.splitlines() if line.strip()][-1:] or [f"exit code {code}"]
        return "crash", last[0][:160]
    found = [r for r in reports(text) if r["ranks"]]
    if truth["verdict"] == "healthy":
        return ("right", "") if not found and not reports(text) else ("WRONG", f"names {found[0]['ranks'] if found else '?'}")
    if truth["verdict"] == "inconclusive":
        # (nobody can be named: naming someone outside the suspects is wrong)
        named = sorted({r for f in found for r in f["ranks"]})
        return ("right", "") if set(named) <= set(truth["suspects"]) else ("WRONG", f"names {named}")
    if not found:
        return "nothing", ""
    first = found[0]["ranks"]
    if truth.get("ambiguous") and set(first) < set(truth["ranks"]):
        return "one side", f"names {first} of a tie the dumps can't break"
    ok = (set(truth["ranks"]) <= set(first) <= set(truth.get("allowed", truth["ranks"])))
    return ("right", "") if ok else ("WRONG", f"names {first}")


def _prefix(folder: Path) -> str:
    names = sorted(p.name for p in folder.rglob("*") if p.is_file() and re.search(r"\d+$", p.name))
    return re.sub(r"\d+$", "", names[0]) if names else ""


def run_theirs(command: str, folder: Path) -> tuple[int, str]:
    """torchfrtrace on a copy of `folder` (its dumps only), as a user would, refusal and retry included."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="flightrec-real-") as tmp:
        copy = Path(tmp) / "dumps"
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.json", "*.txt", "*.md", "*.log"))
        args = [_interpreter(command), command, str(copy), "-p", _prefix(folder)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
        text = done.stdout + done.stderr
        if done.returncode != 0 and "Missing dump files" in text:
            again = subprocess.run([*args, "--allow-incomplete-ranks"], capture_output=True, text=True, timeout=600,
                                   env=env)
            return again.returncode, text + "\n" + again.stdout + again.stderr
        return done.returncode, text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torchfrtrace", help="PyTorch's torchfrtrace script (e.g. a venv's bin/torchfrtrace)")
    ap.add_argument("--out", help="every case's row, as JSON lines")
    args = ap.parse_args(argv)
    rows = []
    for case in cases():
        folder = FIXTURES / case["case"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(folder, use_cache=False)
        ours, why = score_ours(case["truth"], report)
        row = dict(case, ours=ours, ours_why=why, summary=report.summary[:200])
        if args.torchfrtrace:
            code, text = run_theirs(args.torchfrtrace, folder)
            row["theirs"], row["theirs_why"] = score_theirs(case["truth"], code, text)
        rows.append(row)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    theirs = bool(args.torchfrtrace)
    print("| case | source | answer | flightrec | " + ("torchfrtrace 2.13 |" if theirs else ""))
    print("|---|---|---|---|" + ("---|" if theirs else ""))
    for r in rows:
        t = r["truth"]
        answer = t["verdict"] + (f" {t['ranks']}" if t.get("ranks") else "") + (" (tie)" if t.get("ambiguous") else "")
        print(f"| {r['case']} | {r['source']} | {answer} | {r['ours']} |" + (f" {r['theirs']} |" if theirs else ""))
    print()
    for source in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == source]
        line = f"{source}: flightrec right on {sum(r['ours'] == 'right' for r in mine)} of {len(mine)}"
        if theirs:
            line += f"; torchfrtrace right on {sum(r['theirs'] == 'right' for r in mine)}"
            for kind in ("one side", "WRONG", "nothing", "crash"):
                n = sum(r["theirs"] == kind for r in mine)
                line += f", {kind} {n}" if n else ""
        print(line)
    total = len(rows)
    line = f"all: flightrec right on {sum(r['ours'] == 'right' for r in rows)} of {total}"
    if theirs:
        line += f"; torchfrtrace right on {sum(r['theirs'] == 'right' for r in rows)} of {total}"
    print(line)
    for r in rows:
        if r["ours"] != "right":
            print(f"flightrec {r['ours']} on {r['case']}: {r['ours_why']}")


if __name__ == "__main__":
    main()
