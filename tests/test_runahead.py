"""Jobs with the CPU running ahead of the GPU and one NCCL stream per group (flightrec.testing.runahead): each
scenario reads as its answer says. These are models of real jobs: what they check is a hypothesis until a real
dump shows it (docs/findings.md)."""

import shutil
import warnings

import pytest

from flightrec import analyze
from flightrec.ingest.safe_read import read_dump
from flightrec.testing import runahead, runahead_scenarios

SCENARIOS = {s.name: s for s in runahead_scenarios.scenarios()}


def _analyze(path, trigger="auto"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(path, use_cache=False, trigger=trigger)


def _check(report, want: dict) -> None:
    assert report.verdict == want["verdict"], report.summary
    if "kind" in want:
        assert report.root_causes[0].kind == want["kind"], report.summary
    for key in ("ranks", "hosts"):
        if key in want:
            assert report.culprits[key] == want[key], report.summary
    if "links" in want:
        assert [list(x) for x in report.culprits["links"]] == want["links"], report.summary
    if "stuck_ranks" in want:
        stuck = [f for f in report.findings if f.kind == "stuck_in_flight"]
        assert stuck and stuck[0].ranks == want["stuck_ranks"], report.summary
    if want["verdict"] == "healthy":
        assert report.culprits["ranks"] == [] and report.culprits["links"] == []


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_reads_as_its_answer(name, tmp_path):
    s = SCENARIOS[name]
    runahead_scenarios.write_scenario(s, tmp_path)
    _check(_analyze(tmp_path, s.expect.get("trigger", "auto")), s.expect)


def test_the_cpu_runs_ahead_of_the_gpu():
    """The model's point: at a hang, ranks hold several unfinished ops, most of them `scheduled` run-ahead."""
    s = SCENARIOS["moe_cpu_stops"]
    run = runahead.Run(s.job)
    for rank in (0, 2):
        unfinished = [i for (r, i) in run.enq if r == rank and (r, i) not in run.done]
        assert len(unfinished) >= 3


@pytest.mark.parametrize("name", ["moe_cpu_stops", "moe_gpu_error", "tp_peer_died_without_a_dump",
                                  "interleaved_1f1b_cpu_stops"])
def test_with_no_hosts_known_the_same_ranks_are_named(name, tmp_path):
    s = SCENARIOS[name]
    runahead_scenarios.write_scenario(s, tmp_path / "hosts")
    flat = tmp_path / "flat"
    flat.mkdir()
    for path in (tmp_path / "hosts").rglob("nccl_trace_rank_*"):
        shutil.copy2(path, flat / path.name)
    report = _analyze(flat, s.expect.get("trigger", "auto"))
    assert report.verdict == s.expect["verdict"] and report.culprits["ranks"] == s.expect["ranks"], report.summary


@pytest.mark.parametrize("name", ["moe_cpu_stops", "moe_gpu_error", "tp_peer_died_without_a_dump"])
def test_written_with_only_unfinished_entries_the_same_ranks_are_named(name, tmp_path):
    s = SCENARIOS[name]
    s.job.only_active = True
    try:
        runahead_scenarios.write_scenario(s, tmp_path)
    finally:
        s.job.only_active = False
    first = read_dump(next(tmp_path.rglob("nccl_trace_rank_0")))[0]
    assert all(e["state"] != "completed" for e in first["entries"])
    report = _analyze(tmp_path, s.expect.get("trigger", "auto"))
    assert report.verdict == s.expect["verdict"] and report.culprits["ranks"] == s.expect["ranks"], report.summary


def test_the_generator_imports_nothing_of_the_analyser():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(runahead))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and (m.startswith("flightrec") or m.startswith("."))}, imported
