"""Properties over random synthetic jobs: healthy means no finding, one fault is found exactly, and the answer
does not depend on how ranks are labelled."""

import random
import tempfile
import warnings
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightrec import analyze
from flightrec.testing import synth

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def layouts(draw, min_tp=1, min_pp=1):
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if t >= min_tp]))
    pp = draw(st.sampled_from([p for p in (1, 2, 3) if p >= min_pp]))
    dp = draw(st.sampled_from([1, 2, 3] if tp * pp > 1 else [2, 3]))
    return dict(tp=tp, pp=pp, dp=dp, steps=draw(st.integers(1, 3)), microbatches=draw(st.integers(1, 2)),
                timing=draw(st.booleans()), buffer_size=draw(st.sampled_from([2000, 30])),
                seed=draw(st.integers(0, 10**6)))


def _analyze(job):
    with tempfile.TemporaryDirectory() as tmp:
        synth.generate(job, Path(tmp) / "d")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return analyze(Path(tmp) / "d", use_cache=False)


@SETTINGS
@given(layouts())
def test_healthy_job_is_healthy(layout):
    report = _analyze(synth.Job(**layout))
    assert report.verdict == "healthy", report.summary
    assert [f.kind for f in report.findings if f.role != "warning"] == []
    assert set(report.matching.collectives["status"].to_list()) <= {"matched"}


@SETTINGS
@given(layouts(min_tp=4), st.data())
def test_one_injected_fault_is_found_exactly(layout, data):
    job = synth.Job(**layout)
    kind = data.draw(st.sampled_from(["not_joined", "missing_dump", "size_mismatch", "type_mismatch",
                                      "dtype_mismatch", "late_arrival"]))
    rank = data.draw(st.integers(0, job.world_size - 1))
    # late_arrival: the rank joins 5 s past the 600 s timeout
    job = synth.Job(**layout, fault=synth.Fault(kind=kind, rank=rank, phase="tp", delay_ms=605_000))
    report = _analyze(job)
    assert report.verdict == "fault"
    assert report.culprits["ranks"] == [rank], report.summary
    expected_kind = {"late_arrival": "straggler"}.get(kind, "mismatch" if kind.endswith("mismatch") else kind)
    assert report.root_causes[0].kind == expected_kind


def test_the_first_backward_receive_of_a_pipeline_is_no_peer_mismatch():
    """Found by the property above: one step of one microbatch, tp 4 x pp 3, rank 8 (last stage) never joins a tp
    collective; rank 5 (the middle stage) waits in its first backward receive, from rank 9, a peer it had only
    sent to. That is a pipeline's ordinary traffic, in no cycle of waits: the rank that stopped is named."""
    layout = {"tp": 4, "pp": 3, "dp": 1, "steps": 1, "microbatches": 1, "timing": False, "buffer_size": 2000, "seed": 0}
    report = _analyze(synth.Job(**layout, fault=synth.Fault(kind="not_joined", rank=8, phase="tp", delay_ms=605_000)))
    assert report.culprits["ranks"] == [8], report.summary
    assert [f for f in report.findings if "never_traded_with" in f.evidence] == []


@SETTINGS
@given(layouts(min_tp=2), st.data())
def test_relabelling_ranks_relabels_the_answer(layout, data):
    world = layout["tp"] * layout["pp"] * layout["dp"]
    perm = list(range(world))
    random.Random(data.draw(st.integers(0, 10**6))).shuffle(perm)
    logical = data.draw(st.integers(0, world - 1))
    plain = _analyze(synth.Job(**layout, fault=synth.Fault(kind="not_joined", rank=logical)))
    relabelled = _analyze(synth.Job(**layout, relabel=tuple(perm),
                                    fault=synth.Fault(kind="not_joined", rank=perm[logical])))
    assert plain.culprits["ranks"] == [logical]
    assert relabelled.culprits["ranks"] == [perm[r] for r in plain.culprits["ranks"]]
    assert plain.root_causes[0].collective_seq_id == relabelled.root_causes[0].collective_seq_id


@SETTINGS
@given(st.data())
def test_a_straggler_is_named_not_the_ranks_that_wait_on_it(data):
    """Any 3D layout with tensor parallelism, hosts of 2-8 ranks, timing on or off: one slow rank is named
    alone, and a slow host is named (with at most one pipeline neighbour as late as it), never the ranks and
    hosts that only wait on them. (With one rank per pipeline stage and a handful of ranks, everyone is late
    and no straggler stands out: not drawn.)"""
    tp, pp, dp = data.draw(st.sampled_from([2, 4])), data.draw(st.integers(1, 4)), data.draw(st.integers(2, 4))
    world = tp * pp * dp
    per_host = data.draw(st.sampled_from([r for r in (2, 4, 8) if world % r == 0 and r <= world // 2]))
    kind = data.draw(st.sampled_from(["straggler", "straggler_host"]))
    fault = (synth.Fault(kind=kind, rank=data.draw(st.integers(0, world - 1))) if kind == "straggler" else
             synth.Fault(kind=kind, hosts=(f"node{data.draw(st.integers(0, world // per_host - 1)):05d}",)))
    job = synth.Job(tp=tp, pp=pp, dp=dp, steps=data.draw(st.sampled_from([3, 6])),
                    microbatches=data.draw(st.sampled_from([1, 2, 4])), ranks_per_host=per_host,
                    timing=data.draw(st.booleans()), fault=fault, seed=data.draw(st.integers(0, 10**6)))
    with tempfile.TemporaryDirectory() as tmp:
        truth = synth.generate(job, Path(tmp) / "d", per_host_folders=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(Path(tmp) / "d", use_cache=False)
    named = [(f.ranks, f.hosts) for f in report.findings if f.kind == "straggler"]
    if kind == "straggler":
        assert named == [(truth["ranks"], truth["hosts"])], report.summary
    else:
        assert truth["hosts"] in [hosts for _, hosts in named] and len(named) <= 2, report.summary


@SETTINGS
@given(st.data())
def test_healthy_and_skewed_jobs_name_no_straggler(data):
    """Completion times are stamped at each watchdog's 100 ms polls: from them, clock offsets are estimated
    only to that noise. Any layout (tp 1-4, 1-8 ranks a host, timing on or off), healthy or with one host's
    clock 100 ms to 5 s off: no straggler and no slow link is named."""
    with tempfile.TemporaryDirectory() as tmp:
        synth.generate(_healthy_or_skewed_job(data), Path(tmp) / "d", per_host_folders=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = analyze(Path(tmp) / "d", use_cache=False)
    assert [f.kind for f in report.findings if f.kind in ("straggler", "slow_link")] == [], report.summary


def _healthy_or_skewed_job(data) -> synth.Job:
    """Any layout (tp 1-4, pp 1-4, dp 2-4, 1-8 ranks a host, timing on or off), healthy or with one host's
    clock 100 ms, 500 ms or 5 s off."""
    tp, pp, dp = data.draw(st.sampled_from([1, 2, 4])), data.draw(st.integers(1, 4)), data.draw(st.integers(2, 4))
    world = tp * pp * dp
    per_host = data.draw(st.sampled_from([r for r in (1, 2, 4, 8) if world % r == 0 and r <= world // 2] or [1]))
    n_hosts = world // per_host
    skewed = n_hosts >= 2 and data.draw(st.booleans())
    fault = (synth.Fault(kind="clock_offset", hosts=(f"node{data.draw(st.integers(0, n_hosts - 1)):05d}",),
                         offset_ms=data.draw(st.sampled_from([100, 500, 5000]))) if skewed else synth.Fault(kind="none"))
    return synth.Job(tp=tp, pp=pp, dp=dp, steps=data.draw(st.sampled_from([3, 6, 10])),
                     microbatches=data.draw(st.sampled_from([1, 2, 4])), ranks_per_host=per_host,
                     timing=data.draw(st.booleans()), fault=fault, seed=data.draw(st.integers(0, 10**6)))
