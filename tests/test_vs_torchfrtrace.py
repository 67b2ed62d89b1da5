"""Differential test against PyTorch's analyzer (torchfrtrace, torch 2.13), from its recorded output on the
same fixtures (fixtures/<case>/torchfrtrace.txt; tests don't need torch).

Section 1 of each golden is torchfrtrace on the unmodified dumps; section 2 on a copy whose Gloo pg_config
was rebuilt by hand (it can't read Gloo's). Where it is right we must agree; where it crashes or is wrong
we must be right."""

import re
import warnings
from pathlib import Path

import pytest

from flightrec import analyze

from .conftest import FIXTURES, expected, recorded_cases


def golden(case: str) -> tuple[str, str]:
    text = (FIXTURES / case / "torchfrtrace.txt").read_text()
    first, _, second = text.partition("## 2.")
    return first, second


def _analyze(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(FIXTURES / case)


@pytest.mark.parametrize("case", [c for c in recorded_cases()] + ["healthy_json", "skip_collective_json"])
def test_torchfrtrace_crashes_on_every_unmodified_gloo_dump_we_read(case):
    first, _ = golden(case)
    assert "Traceback" in first and "[exit code: 1]" in first
    report = _analyze(case)  # ours reads them as they are
    assert report.dumps.loaded > 0


@pytest.mark.parametrize("case", ["skip_collective", "skip_collective_after_error"])
def test_agree_where_it_is_right_not_joined(case):
    _, second = golden(case)
    seq = int(re.search(r"Not all ranks joining collective, sequence number: (\d+)", second)[1])
    missing = sorted(int(x) for x in re.search(r"missing ranks: \{([\d, ]+)\}", second)[1].split(","))
    report = _analyze(case)
    root = report.root_causes[0]
    assert (root.kind, root.ranks, root.collective_seq_id) == ("not_joined", missing, seq)


@pytest.mark.parametrize("case", ["type_mismatch", "size_mismatch", "dtype_mismatch"])
def test_agree_where_it_is_right_mismatch(case):
    _, second = golden(case)
    culprit = int(re.search(r"Culprit rank (\d+)", second)[1])
    assert _analyze(case).culprits["ranks"] == [culprit] == expected(case)["fault"]["ranks"]


def test_subgroups_it_reports_symptoms_first_we_name_the_root():
    _, second = golden("subgroups_per_host")
    groups_reported = re.findall(r"group info: (\S+)", second)
    assert groups_reported[0].endswith(":dp")               # its first word is a symptom (dp waits)
    report = _analyze("subgroups_per_host")
    assert report.culprits["ranks"] == [5] and report.root_causes[0].process_group.desc == "tp"


def test_dead_rank_it_cannot_decide_we_name_the_missing_rank():
    _, second = golden("dead_rank")
    assert "cannot decide" in second and "Culprit" not in second
    assert _analyze("dead_rank").culprits["ranks"] == [3]


def test_straggler_it_does_not_see():
    _, second = golden("straggler")
    run = second[second.index("$ torchfrtrace"):]
    output = [ln for ln in run.splitlines() if ln and not ln.startswith(("$", "#", "[exit", "tabulate"))]
    assert output == []  # silent: it has no notion of lateness
    assert [f.ranks for f in _analyze("straggler").findings if f.kind == "straggler"] == [[2]]


def test_late_rank_it_calls_clean_we_name_the_rank_that_made_it_time_out():
    _, second = golden("late_rank")
    run = second[second.index("$ torchfrtrace"):]
    output = [ln for ln in run.splitlines() if ln and not ln.startswith(("$", "#", "[exit", "tabulate"))]
    assert output == [] and "[exit code: 0]" in run  # every rank enqueued seq 8: nothing wrong for it
    report = _analyze("late_rank")
    assert (report.verdict, report.culprits["ranks"], report.root_causes[0].kind) == ("fault", [2], "straggler")


@pytest.mark.parametrize("case", ["rolled_past_dp", "rolled_past_default"])
def test_rolled_past_it_names_rank_5_once_given_the_real_layout(case):
    """With pg_config rebuilt it reports rank 5 missing from the collective it skipped (for rolled_past_dp after
    the tp symptom on node0), whether or not rank 5 still has entries of that group: it reads membership from
    pg_config. flightrec's side of it: tests/test_fixtures.py::test_rolled_past_rank_5_is_named_from_its_pg_status."""
    _, second = golden(case)
    fault = expected(case)["fault"]
    reports = second.split("Not all ranks joining collective, sequence number: ")[1:]
    group = f"group info: {fault['process_group_name']}:{fault['process_group_desc']}\n"
    hits = [b for b in reports if b.startswith(f"{fault['collective_seq_id']}\n") and group in b]
    assert len(hits) == 1 and "missing ranks: {5}\n" in hits[0]


def test_rolled_past_dp_it_lists_every_wait_of_the_cycle_we_name_the_rank_that_broke_it():
    """Rank 5 skipped its dp all_reduce (seq 3) and its ring rolled the group out. With the layout repaired,
    torchfrtrace lists each wait of the cycle that followed as its own missing rank, a tp wait for rank 1
    first; we name rank 5, from its pg_status and the order of the two collectives every other rank shows."""
    _, second = golden("rolled_past_dp")
    missing = [sorted(int(x) for x in m.split(",")) for m in re.findall(r"missing ranks: \{([\d, ]+)\}", second)]
    assert missing[0] == [1] and [5] in missing and len(missing) > 2
    root = _analyze("rolled_past_dp").root_causes[0]
    assert (root.kind, root.ranks, root.collective_seq_id, root.process_group.desc) == ("not_joined", [5], 3, "dp")


def test_rolled_past_default_agree_where_it_is_right():
    _, second = golden("rolled_past_default")
    seq = int(re.search(r"Not all ranks joining collective, sequence number: (\d+)", second)[1])
    missing = sorted(int(x) for x in re.search(r"missing ranks: \{([\d, ]+)\}", second)[1].split(","))
    root = _analyze("rolled_past_default").root_causes[0]
    assert (root.kind, root.ranks, root.collective_seq_id) == ("not_joined", missing, seq) == ("not_joined", [5], 4)


def test_order_swap_it_reports_the_victim_first_we_name_the_rank_that_broke_the_order():
    """Rank 6 ran the default_pg grad-norm all_reduce (seq 4) before its dp all_reduce (dp '5' seq 3). With the
    layout repaired, torchfrtrace reports both waits of the cycle, unranked, and the first one names rank 2 (the
    dp partner held in dp seq 3, a victim) missing from default_pg seq 4; rank 6 comes second, missing from dp seq
    3. We name rank 6 alone, with the cycle as evidence."""
    first, second = golden("order_swap")
    assert "KeyError" in first
    found = [(int(q), g, sorted(int(x) for x in m.split(",")))
             for q, g, m in re.findall(r"sequence number: (\d+)\n.*?group info: (\S+)\n.*?missing ranks: \{([\d, ]+)\}",
                                       second, re.S)]
    assert found == [(4, "0:default_pg", [2]), (3, "5:dp", [6])]
    report = _analyze("order_swap")
    root = report.root_causes[0]
    assert report.culprits["ranks"] == [6] == expected("order_swap")["fault"]["ranks"]
    assert (root.kind, root.collective_seq_id, root.process_group.name) == ("not_joined", 3, "5")
    assert sorted(root.evidence["deadlock"]["ranks"]) == [2, 6]


def _recorded_runs(case: str) -> dict[str, list[tuple[int, str]]]:
    """Each torchfrtrace command in the case's golden, by section ("1", "2"), in order: (exit code, output)."""
    runs: dict[str, list[tuple[int, str]]] = {}
    section, output = "", None
    for line in (FIXTURES / case / "torchfrtrace.txt").read_text().splitlines():
        heading = re.match(r"## (\d+)\.", line)
        if heading:
            section = heading[1]
        elif line.startswith("$ torchfrtrace"):
            output = []
        elif output is not None and (code := re.match(r"\[exit code: (-?\d+)\]", line)):
            runs.setdefault(section, []).append((int(code[1]), "\n".join(output)))
            output = None
        elif output is not None:
            output.append(line)
    return runs


def _as_a_user_would(runs: list[tuple[int, str]]) -> tuple[int, str]:
    """A refusal for missing dumps followed by its rerun with --allow-incomplete-ranks, read as one answer (as
    `bench.vs_torchfrtrace` does)."""
    code, output = runs[0]
    if code != 0 and "Missing dump files" in output and len(runs) > 1:
        return runs[1][0], output + "\n" + runs[1][1]
    return code, output


def test_the_side_by_side_bench_scores_torchfrtraces_real_output():
    """`bench.vs_torchfrtrace` scores torchfrtrace by what it prints, read here on its recorded output: a crash is
    a crash; a refusal names the ranks whose dumps are missing, then its rerun's reports follow; the first report
    that names ranks is its answer."""
    from bench.vs_torchfrtrace import score_theirs

    scored = {}
    for case in recorded_cases():
        fault = expected(case).get("fault") or {}
        truth = {"ranks": fault.get("ranks", [])}
        runs = _recorded_runs(case)
        assert runs["1"] and all(score_theirs("", truth, code, out)[0] == "crash" for code, out in runs["1"]), case
        scored[case] = score_theirs(fault.get("kind", ""), truth, *_as_a_user_would(runs["2"]))[0]
    assert scored["skip_collective"] == scored["type_mismatch"] == "right"
    assert scored["healthy"] == "nothing"
    assert scored["dead_rank"] == "right"          # (refused, naming rank 3, the one that left no dump)
    # its first report is a data-parallel symptom; the culprit, rank 5, comes later
    assert scored["subgroups_per_host"] == "among others"
    # (the hand-repaired dtype_mismatch copy lacked rank 0's dump: the refusal names it first)
    assert scored["dtype_mismatch"] == "among others"


def test_the_side_by_side_bench_reads_a_refusal_and_its_rerun_on_a_pipeline_job():
    """Recorded on a synthetic pipeline-parallel job whose host went down: the refusal names the host's ranks,
    as does every "cannot decide" after it; later reports name data-parallel symptoms. Right, as flightrec is
    when it names the ranks that left no dump."""
    from bench.vs_torchfrtrace import reports, score_theirs

    text = (Path(__file__).parent / "data" / "torchfrtrace_host_down_pipeline.txt").read_text()
    named = [r["ranks"] for r in reports(text) if r["ranks"]]
    assert named[0] == [14, 15] and [12] in named and [13] in named
    assert score_theirs("host_down", {"ranks": [14, 15]}, 0, text) == ("right", "")
    assert score_theirs("host_down", {"ranks": [12]}, 0, text)[0] == "among others"
    # links and NICs by the hosts of the ranks named: one report must hold both ends of a link
    host_of = lambda rank: f"node{rank // 2:05d}"  # noqa: E731
    assert score_theirs("nic_down", {"hosts": ["node00007"], "links": []}, 0, text, host_of)[0] == "right"
    assert score_theirs("dead_link", {"hosts": [], "links": [["node00006", "node00007"]]}, 0, text, host_of)[0] == "WRONG"


def test_the_side_by_side_bench_tells_an_inverted_answer():
    """When its reference rank is the culprit, torchfrtrace names every other member: inverted, not wrong."""
    from bench.vs_torchfrtrace import reports, score_theirs

    text = ("Collective sequence number: 0 has errors\nexpected ranks: {43, 35, 51, 59}\n"
            "error msg: Culprit rank 43; Error type: SIZE_OR_SYNTAX_MISMATCH, Culprit rank 35; Error type: "
            "SIZE_OR_SYNTAX_MISMATCH, Culprit rank 51; Error type: SIZE_OR_SYNTAX_MISMATCH")
    assert reports(text) == [{"ranks": [35, 43, 51], "expected": [35, 43, 51, 59]}]
    assert score_theirs("size_mismatch", {"ranks": [59]}, 0, text)[0] == "inverted"
    assert score_theirs("size_mismatch", {"ranks": [7]}, 0, text)[0] == "WRONG"
    assert score_theirs("size_mismatch", {"ranks": [59]}, 1, "Traceback (most recent call last)\nEOFError")[0] == "crash"
