"""Dumps nobody here wrote: NVIDIA's real GPU dumps (fixtures/nvrx), each named as NVIDIA's own attribution names it."""

import json
import re
import warnings

import pytest

from flightrec import analyze

from .conftest import FIXTURES

NVRX = sorted(p.parent.name for p in (FIXTURES / "nvrx").glob("*/expected.json"))


def _analyze(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(path, use_cache=False, **kwargs)


def test_the_four_nvidia_sets_are_here():
    assert NVRX == ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"]
    assert (FIXTURES / "nvrx" / "LICENSE.txt").read_text().count("Apache") >= 1


@pytest.mark.parametrize("case", NVRX)
def test_first_root_cause_names_nvidias_reference(case):
    truth = json.loads((FIXTURES / "nvrx" / case / "expected.json").read_text())["fault"]
    report = _analyze(FIXTURES / "nvrx" / case)
    assert report.verdict == "fault", report.summary
    first = report.root_causes[0]
    # NVIDIA's reference ranks, and at most the other rank a fault was injected on
    assert set(truth["reference_ranks"]) <= set(first.ranks) <= set(truth["injected_ranks"]), first.message
    assert set(report.culprits["ranks"]) <= set(truth["injected_ranks"])
    assert set(report.culprits["ranks"]) >= set(truth["reference_ranks"])
    # the collective NVIDIA names is the one the headline names, where the culprit never joined one
    ref = truth["nvrx_reference"][0]
    if first.collective_seq_id is not None:
        assert first.process_group.name == ref["pg_name"] and first.op == "all_to_all"


@pytest.mark.parametrize("case", ["gpu_error_1st", "gpu_error_2nd"])
def test_a_gpu_error_reads_as_a_stopped_gpu(case):
    # the injected ranks' peers finished collectives with them that their own recorder never saw finish
    truth = json.loads((FIXTURES / "nvrx" / case / "expected.json").read_text())["fault"]
    report = _analyze(FIXTURES / "nvrx" / case)
    stalled = [f for f in report.root_causes if f.kind == "gpu_stalled"]
    assert sorted(r for f in stalled for r in f.ranks) == truth["injected_ranks"]
    assert sorted(report.matching.gpu_stalls["rank"].unique().to_list()) == truth["injected_ranks"]
    # (run-ahead: the other ranks' later collectives are in flight everywhere, behind the stopped GPUs; they are
    # no hang below the collectives)
    assert not [f for f in report.findings if f.kind == "stuck_in_flight"]


@pytest.mark.parametrize("case", ["lock_gil_1st", "lock_gil_2nd"])
def test_a_held_gil_reads_as_a_process_stopped_in_host_code(case):
    truth = json.loads((FIXTURES / "nvrx" / case / "expected.json").read_text())["fault"]
    report = _analyze(FIXTURES / "nvrx" / case)
    assert report.matching.gpu_stalls.height == 0   # its watchdog still saw its GPU work finish
    for f in report.root_causes:
        assert f.kind == "not_joined"
        assert set(f.ranks) <= set(truth["injected_ranks"])
        assert "host code" in f.evidence["note"]


_UNREADABLE = [re.compile(p) for p in (r"\bNone\b", r"shape\s*(,|;|$| where| in )", r"ranks\s+(used|never|left)",
                                         r"\bnan\b", r"\[\]")]


def unreadable_text(report) -> list[str]:
    """Lines of a report a person can't act on: a root cause naming nobody, `None`, an empty shape or list."""
    bad = []
    for f in report.findings:
        if f.role == "root_cause" and not (f.ranks or f.hosts or f.links):
            bad.append(f"names nobody: {f.message}")
        for pattern in _UNREADABLE:
            if pattern.search(f.message):
                bad.append(f"{pattern.pattern!r} in: {f.message}")
    return bad


def all_fixture_folders() -> list[str]:
    # every folder holding dumps: the Gloo cases, their JSON twins and NVIDIA's sets
    return sorted(str(p.parent.relative_to(FIXTURES)) for p in FIXTURES.glob("**/expected.json")) + sorted(
        p.name for p in FIXTURES.iterdir() if p.name.endswith("_json") or p.name == "writer_sharing")


@pytest.mark.parametrize("case", all_fixture_folders())
def test_no_finding_names_nobody_or_prints_none(case):
    report = _analyze(FIXTURES / case)
    assert unreadable_text(report) == []


@pytest.mark.parametrize("fault", [
    dict(kind="host_down", rank=5, hosts=("node00002",)), dict(kind="dead_link", rank=2, hosts=("node00001", "node00002")),
    dict(kind="nic_down", rank=2, hosts=("node00001",)), dict(kind="not_joined", rank=3), dict(kind="missing_dump", rank=3),
    dict(kind="size_mismatch", rank=1), dict(kind="dtype_mismatch", rank=6, phase="dp"),
    dict(kind="type_mismatch", rank=5), dict(kind="deadlock", rank=2, phase="dp"), dict(kind="straggler", rank=4),
    dict(kind="wrong_peer", rank=2, phase="p2p"), dict(kind="late_arrival", rank=1, delay_ms=700_000.0),
])
@pytest.mark.parametrize("variant", [dict(), dict(timing=False), dict(only_active=True), dict(backend="gloo")])
def test_no_finding_on_a_generated_job_names_nobody_or_prints_none(make_job, fault, variant):
    from flightrec.testing import synth

    if variant.get("backend") == "gloo" and fault["kind"] == "wrong_peer":
        pytest.skip("Gloo records no send or receive")
    job = synth.Job(tp=2, pp=3, dp=2, ranks_per_host=2, steps=3, fault=synth.Fault(**fault), **variant)
    out, _ = make_job(job, per_host_folders=True)
    assert unreadable_text(_analyze(out)) == []
