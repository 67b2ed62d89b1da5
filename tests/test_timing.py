"""Stragglers, slow links and clock offsets, on synthetic NCCL jobs and the real Gloo straggler fixture."""

import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flightrec import analyze, load
from flightrec.analysis.timing.options import TimingOptions
from flightrec.analysis.timing.stragglers import _threshold, _window, analyze_timing
from flightrec.api import run_match
from flightrec.cli import main
from flightrec.model.schema import Op
from flightrec.model.topology import Topology, resolve
from flightrec.testing import synth

from .conftest import FIXTURES, recorded_cases


def _timing_findings(report):
    return [(f.kind, f.ranks, f.hosts, [list(x) for x in f.links]) for f in report.findings
            if f.kind in ("straggler", "slow_link")]


def _run(make_job, kind, rank=0, hosts=(), phase="tp", delay_ms=150.0, **job):
    layout = dict(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2) | job
    fault = synth.Fault(kind=kind, rank=rank, hosts=hosts, offset_ms=500, phase=phase, delay_ms=delay_ms)
    out, _ = make_job(synth.Job(**layout, fault=fault), per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(out)


def test_straggler_rank(make_job):
    report = _run(make_job, "straggler", rank=3)
    assert _timing_findings(report) == [("straggler", [3], ["node00001"], [])]
    assert report.verdict == "healthy" and "straggles" in report.summary
    finding = next(f for f in report.findings if f.kind == "straggler")
    assert finding.role == "warning" and 140 < finding.evidence["median_late_ms"]


def test_straggler_host(make_job):
    report = _run(make_job, "straggler_host", hosts=("node00001",))
    assert _timing_findings(report) == [("straggler", [2, 3], ["node00001"], [])]
    finding = next(f for f in report.findings if f.kind == "straggler")
    # (what is known of its clock, said as it is: here its offset was estimated and found within the noise)
    assert "its clock agrees with the other hosts' within the watchdog's 100 ms polling noise" in finding.message
    assert finding.evidence["clock_offset_ms"] == 0


def test_a_flat_folder_says_hosts_are_not_judged(make_job):
    """A host 150 ms late on every collective, its dumps in one flat folder and no host map: its ranks wait on
    each other at the same pace, so rank by rank they read on time, and the job reads healthy. The report and
    the timing table say hosts were not judged and how to give them; with --ranks-per-host the host is named."""
    fault = synth.Fault(kind="straggler_host", hosts=("node00001",))
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2, fault=fault))
    flat = analyze(out)
    assert flat.dumps.host_source == "none" and not _timing_findings(flat)
    assert "hosts unknown: pass --hosts FILE or --ranks-per-host N" in flat.to_text().splitlines()[2]
    table = CliRunner().invoke(main, ["timing", str(out), "-q"]).output
    assert "Hosts: hosts unknown" in table
    placed = analyze(out, ranks_per_host=2)
    assert _timing_findings(placed) == [("straggler", [2, 3], ["host1"], [])]
    assert "hosts unknown" not in placed.to_text() + CliRunner().invoke(
        main, ["timing", str(out), "-q", "--ranks-per-host", "2"]).output


@pytest.mark.parametrize("layout, offset_ms, ahead", [
    (dict(tp=2, pp=2, dp=2, ranks_per_host=1), 500, [1]),
    (dict(tp=1, pp=2, dp=4, ranks_per_host=2), 500, [2, 3]),
    # behind: the others read late against its ranks, the first to enqueue (sweep seed 31 job 18, no hosts)
    (dict(tp=8, pp=2, dp=2, ranks_per_host=2, microbatches=1, seed=864092), -500, None),
])
def test_a_clock_running_ahead_is_no_straggler_where_no_host_is_known(make_job, layout, offset_ms, ahead):
    """A host whose clock runs 500 ms ahead, its dumps in one flat folder: with no host to estimate the offset
    for, its ranks read 500 ms late on every collective and were named stragglers (9 of 20 clock-offset jobs of a
    sweep without host placement). Their completions read as late as their enqueues against the member they are
    late against, on the collectives they were late in: a collective ends at one instant on every member, so it
    is their clocks."""
    fault = synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=offset_ms)
    out, _ = make_job(synth.Job(**layout, steps=6, fault=fault))
    report = analyze(out)
    assert report.dumps.host_source == "none" and _timing_findings(report) == []
    found = [f for f in report.findings if f.kind == "clock_offset"]
    assert len(found) == 1 and "completions read as late" in found[0].message
    assert found[0].evidence["median_late_ms"] > 400
    if ahead is None:
        return
    assert sorted(r for f in found for r in f.ranks) == ahead
    # and a rank late by itself is still one: its completions are its peers'
    fault = synth.Fault(kind="straggler", rank=ahead[0], delay_ms=500)
    out, _ = make_job(synth.Job(**layout, steps=6, fault=fault))
    assert [(f.kind, f.ranks) for f in analyze(out).findings if f.kind in ("straggler", "clock_offset")] == [
        ("straggler", [ahead[0]])]


def test_a_late_host_without_completion_times_is_not_said_to_have_its_clock_corrected(make_job):
    """Without completion times (Gloo records none) a host whose clock runs ahead can't be told from a late
    one, and the finding says so instead of "clock offset removed". (A synthetic straggler host, its dumps'
    completion times erased.)"""
    import pickle

    from flightrec.ingest.safe_read import read_dump

    fault = synth.Fault(kind="straggler_host", hosts=("node00001",))
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2, fault=fault), per_host_folders=True)
    for path in out.rglob("nccl_trace_rank_*"):
        dump, _ = read_dump(path)
        for entry in dump["entries"]:
            entry["time_discovered_completed_ns"] = None
        path.write_bytes(pickle.dumps(dump, protocol=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    host = next(f for f in report.findings if f.kind == "straggler" and f.hosts == ["node00001"])
    assert "its clock offset can't be told apart (no completion times in these dumps" in host.message
    assert host.evidence["clock_offset_ms"] is None


def test_a_straggler_beside_a_host_whose_clock_runs_ahead_is_still_named(tmp_path):
    """fixtures/straggler_pipeline with node1's clock 500 ms ahead (Gloo: no completion times to measure it).
    Rank 1 (node0) is 150 ms late beside its tp peer, but in its dp group, with rank 5 on node1, it now looks
    on time, and node1's ranks look late everywhere across hosts. Judged within their hosts, where no clock
    differs, rank 1 is the straggler and node1's ranks are not."""
    import pickle
    import shutil

    from flightrec.ingest.safe_read import read_dump

    out = tmp_path / "shifted"
    shutil.copytree(FIXTURES / "straggler_pipeline", out)
    for path in (out / "node1").iterdir():
        dump, _ = read_dump(path)
        for entry in dump["entries"]:
            entry["time_created_ns"] += 500_000_000
        path.write_bytes(pickle.dumps(dump, protocol=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [("straggler", [1], ["node0"], [])]
    assert "judged within its host" in report.findings[0].message


def test_slow_link(make_job):
    report = _run(make_job, "slow_link", hosts=("node00000", "node00002"))
    assert _timing_findings(report) == [("slow_link", [], [], [["node00000", "node00002"]])]


@pytest.mark.parametrize("kind, fault, want", [
    ("straggler", dict(rank=3), [("straggler", [3], ["node00000"], [])]),
    ("straggler_host", dict(hosts=("node00001",)), [("straggler", [4, 5, 6, 7], ["node00001"], [])]),
    # the last stage: the first stage, three hosts away, was named as well before
    ("straggler_host", dict(hosts=("node00003",)), [("straggler", [12, 13, 14, 15], ["node00003"], [])]),
])
def test_ranks_waiting_on_a_straggler_are_not_named(make_job, kind, fault, want):
    """4 x 4 x 2, a host per tensor-parallel group: the straggler's tensor-parallel peers and its pipeline
    neighbours reach their data-parallel collectives hundreds of ms late, waiting on it. Only it is named
    (before: rank 7 as well; for the slow host, the hosts of stages 0 and 2 as well)."""
    report = _run(make_job, kind, tp=4, pp=4, dp=2, steps=10, ranks_per_host=4, **fault)
    assert _timing_findings(report) == want


def test_a_straggler_whose_only_peer_in_a_group_left_no_dump_is_still_named(make_job):
    """Rank 7 is rank 3's only data-parallel peer: without its dump rank 3 is alone in those collectives, 0 ms
    late against itself. They say nothing about it (before, they cleared it and named an innocent host)."""
    fault = synth.Fault(kind="straggler", rank=3, delay_ms=150.0)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2, fault=fault), per_host_folders=True)
    for dump in out.rglob("*_7"):
        dump.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [("straggler", [3], ["node00001"], [])]


@pytest.mark.parametrize("layout, fault, want", [
    (dict(tp=1, pp=1, dp=2, ranks_per_host=1), dict(kind="straggler", rank=1), [("straggler", [1], ["node00001"], [])]),
    (dict(tp=1, pp=4, dp=2, ranks_per_host=1, timing=False), dict(kind="straggler", rank=6),
     [("straggler", [6], ["node00006"], [])]),
    (dict(tp=1, pp=2, dp=4, ranks_per_host=4, timing=False), dict(kind="straggler_host", hosts=("node00001",)),
     [("straggler", [4, 5, 6, 7], ["node00001"], [])]),
])
def test_a_straggler_that_is_a_large_share_of_a_small_job_stands_out(make_job, layout, fault, want):
    """One rank per stage (tp 1) and 2-8 ranks: the straggler, and the pipeline neighbours that wait on it,
    are a quarter to half of all lateness rows. Their own rows widened the spread they were judged against,
    and nothing was named. The spread is now the punctual members' (each collective's latest left out)."""
    out, _ = make_job(synth.Job(**layout, steps=10, fault=synth.Fault(delay_ms=150.0, **fault)), per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == want
    assert report.timing.threshold_ms < 150


@pytest.mark.parametrize("layout, seed, want", [
    (dict(pp=4, dp=2, steps=10, ranks_per_host=4), 590691, [4, 5, 6, 7]),
    (dict(pp=4, dp=4, steps=6, ranks_per_host=8), 567436, [8, 9, 10, 11, 12, 13, 14, 15]),
])
def test_a_slow_host_holding_whole_pipelines_of_a_two_host_job_is_named(make_job, layout, seed, want):
    """tp 1, two hosts, each holding whole pipelines: the slow one falls 1.3-1.7 s behind within each step (its
    waits pile up across the microbatches). Half of every world collective is its ranks, so they were in the
    punctual spread and widened it past their own lateness: nothing was named (2 of 100 random straggler jobs).
    Hosts are now judged against the other hosts' rows: without the last host of each collective."""
    fault = synth.Fault(kind="straggler_host", hosts=("node00001",), delay_ms=150.0)
    job = synth.Job(tp=1, microbatches=4, timing=False, fault=fault, seed=seed, **layout)
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [("straggler", want, ["node00001"], [])]


@pytest.mark.parametrize("layout, host, seed, want", [
    (dict(pp=2, dp=4, layers=3), "node00000", 791955, [0, 1]),
    (dict(pp=4, dp=2, layers=1), "node00008", 848698, [16, 17]),
])
def test_no_slow_link_is_named_beside_a_slow_host(make_job, layout, host, seed, want):
    """tp 4 over two hosts: the slow host's tensor-parallel peers send to the next stage only after the
    collective that waits for it (a GPU runs its stream in order), so their pair with the next stage reads
    slow at both ends, like a slow link (ends 93-145 ms over a ~70 ms baseline; 3 of 50 random slow-host jobs
    named a link beside the host). Pairs behind a named straggler are its echo, and a pair must be slower than
    the baseline by a watchdog poll."""
    fault = synth.Fault(kind="straggler_host", hosts=(host,), delay_ms=150.0)
    job = synth.Job(tp=4, steps=10, microbatches=1, ranks_per_host=2, timing=False, fault=fault, seed=seed, **layout)
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [("straggler", want, [host], [])]


def test_a_large_clock_offset_is_removed_in_full_when_hosts_meet_in_pairs(make_job):
    """Three hosts, whose data-parallel collectives each join two of them: the median of two clocks is their
    midpoint, so each round of the offset estimate halves the error. Two fixed rounds left 312 ms of a 5 s
    offset, and the host was named a straggler; the rounds now go on until no host moves by 1 ms."""
    fault = synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=5000)
    job = synth.Job(tp=4, pp=3, dp=2, steps=6, microbatches=2, ranks_per_host=8, timing=True, fault=fault, seed=104593)
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    offsets = dict(report.timing.clock_offsets.iter_rows())
    # (to within the noise of the watchdog's 100 ms polls, which stamp the completion times)
    assert offsets["node00001"] - offsets["node00000"] == pytest.approx(5000, abs=10)
    assert _timing_findings(report) == [] and report.verdict == "healthy"


@pytest.mark.parametrize("job", [
    synth.Job(tp=2, pp=2, dp=4, steps=10, microbatches=4, ranks_per_host=1, timing=False, seed=33372),
    synth.Job(tp=2, pp=2, dp=2, steps=10, microbatches=4, ranks_per_host=4, timing=True, seed=494493),
    synth.Job(tp=2, pp=3, dp=2, steps=6, microbatches=1, ranks_per_host=2, timing=True, seed=857106,
              fault=synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=100)),
    synth.Job(tp=1, pp=1, dp=2, steps=6, microbatches=4, ranks_per_host=1, timing=True, seed=261442,
              fault=synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=100)),
    # estimated 122 ms: node00003, which meets node00001 in data-parallel groups, read 22 ms late
    synth.Job(tp=2, pp=2, dp=2, steps=10, microbatches=3, ranks_per_host=2, timing=True, seed=898653,
              fault=synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=100)),
    # untimed: slow groups from the last arrival to the completion mixed hosts' clocks and one watchdog's lag
    synth.Job(tp=2, pp=2, dp=4, steps=10, microbatches=3, ranks_per_host=2, timing=False, seed=509319,
              fault=synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=1000)),
])
def test_the_watchdogs_coarse_completion_times_make_no_straggler(make_job, job):
    """Completion times are stamped by each group's watchdog at its next 100 ms poll, by the phase of its
    polls. The median of two hosts' deviations is off by up to 50 ms (their lags differ by d or d - 100 ms);
    taken as clock offsets and removed, they named healthy hosts 20-35 ms late (the first two jobs). A real
    offset is only known to that noise (100 ms estimated as 91-97), and between two hosts it was halved around
    their midpoint and not removed (the last). Now: the mean near the median; offsets under half a poll or 3
    standard errors are none; centred on a host's own offset; once an offset was removed, every rank must be
    late by half a poll more; untimed slow groups are measured per member on its own clock and must be a whole
    poll slower. Without these, 51 of 160 random healthy, clock-offset and slow-link jobs named a straggler."""
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [] and report.verdict == "healthy"


@pytest.mark.parametrize("job, want", [
    # the straggler's tensor-parallel peer (8) and that peer's pipeline neighbour (10) both wait on it: their
    # sends and receives are slow at both ends, and were reported as a slow link beside the straggler
    (synth.Job(tp=2, pp=3, dp=4, steps=10, microbatches=1, layers=2, ranks_per_host=1, timing=True, seed=347094,
               fault=synth.Fault(kind="straggler", rank=9, delay_ms=400)), [("straggler", [9], ["node00009"], [])]),
    # untimed: watchdog lag read as slow groups 9 and 10 (90 ms against 29) and a slow link node00000 <-> 2
    (synth.Job(tp=2, pp=2, dp=2, steps=10, microbatches=3, layers=2, ranks_per_host=2, timing=False, seed=918227,
               fault=synth.Fault(kind="straggler", rank=0, delay_ms=150)), [("straggler", [0], ["node00000"], [])]),
])
def test_ranks_waiting_on_a_straggler_make_no_slow_link(make_job, job, want):
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == want


def test_slow_groups_are_judged_on_gpu_durations_when_timed():
    """With NCCL timing on, a collective's own time is its shortest member's `duration_ms` (GPU events), not
    the watchdog-stamped span: here the spans say group b is slow (a late poll), the durations say group c."""
    from flightrec.analysis.timing.stragglers import group_speeds

    rows, opts = [], TimingOptions(window=8)
    for block, (g, span_ms, dur_ms) in enumerate([("a", 10, 10.0), ("b", 110, 10.0), ("c", 10, 160.0),
                                                  ("d", 10, 10.0)]):
        for seq in range(6):   # (as `_window` lays them out: a group's collectives in one block of slots)
            for rank in range(2):
                t0 = seq * 10**9
                rows.append({"_slot": block * opts.window + seq, "group": g, "op": "all_reduce",
                             "input_sizes": "[[8]]", "time_created_ns": t0, "time_completed_ns": t0 + span_ms * 10**6,
                             "duration_ms": dur_ms})
    units = pl.DataFrame(rows).with_columns(pl.col("group", "input_sizes").cast(pl.Categorical), pl.col("op").cast(Op),
                                            pl.col("duration_ms").cast(pl.Float32), pl.col("_slot").cast(pl.UInt32))
    groups = pl.DataFrame({"group": ["a", "b", "c", "d"], "pg_desc": ["dp"] * 4}).with_columns(
        pl.col("group").cast(pl.Categorical))
    timed = group_speeds(units, groups, opts, groups["group"])
    assert timed.filter(pl.col("slow"))["group"].cast(pl.String).to_list() == ["c"]
    untimed = group_speeds(units.with_columns(pl.lit(None, pl.Float32).alias("duration_ms")), groups, opts,
                           groups["group"])
    assert untimed.filter(pl.col("slow"))["group"].cast(pl.String).to_list() == ["b"]
    # a member without shapes (the last one of each of c's collectives) doesn't stand for the others: c keeps
    # its shapes, and so its peers
    shapeless = units.with_columns(pl.when((pl.col("group") == "c") & (pl.int_range(pl.len()) % 2 == 1))
                                   .then(None).otherwise(pl.col("input_sizes")).alias("input_sizes"))
    assert shapeless["input_sizes"].null_count() == 6
    assert group_speeds(shapeless, groups, opts, groups["group"]).equals(timed)
    # no collective in the window (a job with no entries): no group, nothing judged
    assert group_speeds(units.clear(), groups, opts, groups["group"].clear()).height == 0


def test_late_hosts_without_traffic_between_them_are_each_named():
    from flightrec.analysis.timing.waiting_not_late import drop_pipeline_echoes

    per_host = pl.DataFrame({"host": ["a", "b", "c", "d", "x"], "median_late_ms": [100.0, 200.0, 50.0, 90.0, 5.0],
                             "straggler": [True, True, True, True, False]})
    topo = Topology({0: "a", 1: "b", 2: "c", 3: "d", 4: "x"})
    # a <-> b directly; b <-> x <-> d: d is joined to b through x, a host that is not late; c talks to no one
    sends = pl.DataFrame({"rank": [0, 1, 1, 4, 2], "peer": [1, 0, 4, 3, None], "is_p2p": [True, True, True, True, False]})
    per_rank = per_host.select(pl.lit(0).alias("rank"), "median_late_ms", pl.lit(False).alias("straggler")).head(1)
    kept = drop_pipeline_echoes(per_rank, per_host, sends, topo)[1].filter(pl.col("straggler"))["host"].to_list()
    assert kept == ["b", "c"]
    assert drop_pipeline_echoes(per_rank, per_host, None, topo)[1]["straggler"].to_list() == [True] * 4 + [False]
    # a neighbour within 5% of the latest can't be told from it: both named, each with the other as its tie
    tied = per_host.with_columns(pl.when(pl.col("host") == "a").then(195.0).otherwise("median_late_ms")
                                 .alias("median_late_ms"))
    out = drop_pipeline_echoes(per_rank, tied, sends, topo)[1].filter(pl.col("straggler"))
    assert out.select("host", "tied_with").rows() == [("a", ["b"]), ("b", ["a"]), ("c", [])]


@pytest.mark.parametrize("hosts", [("node00004", "node00005"), ("node00002", "node00003")])
def test_slow_link_between_pipeline_stages_is_a_link_not_late_hosts(make_job, hosts):
    """tp 2 x pp 4 x dp 4, a host per two stages: a slow link between two stages' hosts carries only sends and
    receives. The stages behind it arrive late at their data-parallel collectives; before, one end (or both,
    or hosts further up the pipeline) was named a straggler host. Its sends and receives are slow at both
    ends: named as the link."""
    report = _run(make_job, "slow_link", hosts=hosts, tp=2, pp=4, dp=4, ranks_per_host=4 if hosts[0] == "node00004" else 2)
    assert _timing_findings(report) == [("slow_link", [], [], [sorted(hosts)])]


def test_timing_command_lists_slow_host_pairs(make_job, tmp_path):
    fault = synth.Fault(kind="slow_link", hosts=("node00004", "node00005"))
    out, _ = make_job(synth.Job(tp=2, pp=4, dp=4, steps=6, ranks_per_host=4, fault=fault), per_host_folders=True)
    result = CliRunner().invoke(main, ["timing", str(out)])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("Host pairs whose sends and receives"))
    assert lines[title + 2].split()[:2] == ["node00004", "node00005"]


def test_a_slow_p2p_link_is_slow_at_both_ends():
    from flightrec.analysis.timing.waiting_not_late import slow_p2p_links

    ends = {("a", "b"): 5.0, ("b", "a"): 5.0, ("c", "d"): 160.0, ("d", "c"): 158.0,   # c <-> d: slow both ways
            ("e", "f"): 300.0, ("f", "e"): 5.0,                                       # e waits on a late f
            ("g", "h"): 6.0, ("h", "g"): 5.0}
    speeds = pl.DataFrame({"host": [a for a, _ in ends], "peer_host": [b for _, b in ends],
                           "ms": list(ends.values()), "n": [10] * len(ends)})
    slow = slow_p2p_links(speeds, TimingOptions())
    assert slow.select("a", "b").rows() == [("c", "d")] and slow["baseline_ms"][0] == 5.0


def test_a_slow_host_is_one_host_not_links_to_its_neighbours(make_job):
    """Every send and receive of node00004 is slow: its pairs are slow at both ends, but it is the host (found
    by the collective groups too), not a link to each pipeline neighbour."""
    report = _run(make_job, "slow_link", hosts=("node00004",), tp=2, pp=4, dp=4, ranks_per_host=4)
    assert _timing_findings(report) == [("slow_link", [], ["node00004"], [])]


def test_a_host_later_than_a_slow_link_is_still_a_straggler():
    """Hosts waiting on a slow link a <-> b are no later than its ends; x, later than both, joined to them only
    through late hosts, is a straggler of its own (when hosts hold stages of several pipelines)."""
    from flightrec.analysis.timing.waiting_not_late import drop_link_echoes, waiting_on_links

    per_host = pl.DataFrame({"host": ["a", "b", "c", "x", "y"], "median_late_ms": [500.0, 300.0, 400.0, 1300.0, 1.0],
                             "straggler": [True, False, True, True, False]})
    speeds = pl.DataFrame({"host": ["a", "b", "c", "x", "y"], "peer_host": ["b", "c", "x", "y", "a"]})
    slow = pl.DataFrame({"a": ["a"], "b": ["b"], "a_ms": [155.0], "b_ms": [155.0], "baseline_ms": [5.0]})
    waiting = waiting_on_links(per_host, speeds, slow, threshold=20.0)
    assert waiting == ["a", "b", "c"]
    assert drop_link_echoes(per_host, waiting).filter(pl.col("straggler"))["host"].to_list() == ["x"]


def test_ranks_at_the_ends_of_a_slow_link_are_not_stragglers(make_job):
    """tp 1 x pp 3 x dp 4, four ranks a host: one pipeline's stage boundary crosses the slow link
    node00000 <-> node00001. Its two ends (ranks 3 and 4) wait on it and are the latest of the job; only the
    link is named, not them as tied stragglers (no host is late, so the link check ran for hosts only)."""
    fault = synth.Fault(kind="slow_link", hosts=("node00000", "node00001"))
    job = synth.Job(tp=1, pp=3, dp=4, steps=6, microbatches=2, ranks_per_host=4, timing=True, fault=fault, seed=68256)
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert _timing_findings(report) == [("slow_link", [], [], [["node00000", "node00001"]])]


def test_a_slow_link_whose_ends_are_not_stragglers_is_still_named(make_job):
    """tp 2 x pp 4 x dp 2, a rank a host: the slow link node00008 <-> node00010 joins two pipeline stages, and no
    group but the world spans both hosts. Its ends are late on 59% of their collectives, under the straggler
    rule's 60%, so no straggler was named and the sends and receives were never read: the job read healthy
    (sweep seed 29, job 122). Late ends whose sends and receives are slow at both ends are the link."""
    fault = synth.Fault(kind="slow_link", rank=8, hosts=("node00008", "node00010"), step=1, delay_ms=1000.0)
    job = synth.Job(tp=2, pp=4, dp=2, steps=6, microbatches=4, ranks_per_host=1, version="2.4", timing=True,
                    seed=662949, fault=fault)
    out, _ = make_job(job, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    assert not report.timing.per_rank["straggler"].any()
    assert _timing_findings(report) == [("slow_link", [], [], [["node00008", "node00010"]])]


@pytest.mark.parametrize("late_hosts, want", [
    (["node00008", "node00010"], [("node00008", "node00010")]),   # both ends hold a late rank: the link
    (["node00008", "node00003"], []),   # one end of the slow pair, and a host of no slow pair
    (["node00008"], []),                # one late host: its sends and receives are not read
    (["node00003", "node00005"], []),   # late hosts whose pairs are not slow
])
def test_late_p2p_links_needs_a_late_rank_at_both_ends_of_a_slow_pair(make_job, late_hosts, want):
    """`echoes.late_p2p_links` on the slow link node00008 <-> node00010 above, with the late ranks chosen: only a
    pair slow at both ends whose two hosts each hold a late rank is a link (a stage that waits on its own compute
    is slow to talk to, and late, at one end only)."""
    from flightrec.analysis.timing.waiting_not_late import late_p2p_links
    from flightrec.model.topology import resolve

    fault = synth.Fault(kind="slow_link", rank=8, hosts=("node00008", "node00010"), step=1, delay_ms=1000.0)
    job = synth.Job(tp=2, pp=4, dp=2, steps=6, microbatches=4, ranks_per_host=1, version="2.4", timing=True,
                    seed=662949, fault=fault)
    out, _ = make_job(job, per_host_folders=True)
    trace = load(out)
    topo = resolve(world_size=trace.world_size, from_dumps=trace.hosts)
    opts = TimingOptions()
    per_rank = topo.frame().select(
        "rank", "host", pl.lit(10).alias("n"),
        pl.when(pl.col("host").cast(pl.String).is_in(late_hosts)).then(500.0).otherwise(1.0).alias("median_late_ms"))
    found = late_p2p_links(per_rank, trace.entries, topo, 20.0, opts)
    assert sorted(tuple(sorted(pair)) for pair in found.select("a", "b").iter_rows()) == want


def test_clock_offset_is_not_a_straggler(make_job):
    report = _run(make_job, "clock_offset", hosts=("node00001",))
    assert _timing_findings(report) == []
    offsets = dict(report.timing.clock_offsets.iter_rows())
    assert 400 < offsets["node00001"] - offsets["node00000"] < 600


@pytest.mark.parametrize("timing", [True, False])
def test_healthy_job_has_no_timing_findings(make_job, timing):
    assert _timing_findings(_run(make_job, "none", timing=timing, tp=4, dp=3)) == []


def test_real_gloo_straggler_fixture():
    report = analyze(FIXTURES / "straggler")
    stragglers = [f for f in report.findings if f.kind == "straggler"]
    assert [f.ranks for f in stragglers] == [[2]]
    assert 100 < stragglers[0].evidence["median_late_ms"] < 250


def test_real_gloo_late_rank_fixture_is_the_root_cause():
    """Rank 2 stalled 5.5 s, then joined: every rank enqueued the all_reduce, so nobody is missing; the others
    had timed out after 4 s. Only enqueue times tell it (Gloo has no completion states)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(FIXTURES / "late_rank")
    root = report.root_causes[0]
    assert (report.verdict, root.kind, root.role, root.ranks, root.collective_seq_id) == (
        "fault", "straggler", "root_cause", [2], 8)
    assert root.evidence["timeout_ms"] == 4000 and 5000 < root.evidence["late_ms"] < 6500
    assert len(report.root_causes) == 1


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("phase", ["tp", "dp"])
def test_late_arrival_past_the_timeout_is_the_root_cause(make_job, timing, phase):
    report = _run(make_job, "late_arrival", rank=5, timing=timing, phase=phase, delay_ms=605_000, tp=2, pp=2, dp=2,
                  steps=3)
    root = report.root_causes[0]
    assert (report.verdict, root.kind, root.ranks, root.hosts) == ("fault", "straggler", [5], ["node00002"])
    assert root.process_group.desc == phase and root.evidence["timeout_ms"] == 600_000
    assert [f.kind for f in report.findings if f.role == "symptom"].count("stuck_in_flight") == 0


def test_late_arrival_within_the_timeout_is_not_blamed(make_job):
    """Late by 5 minutes of a 10 minute timeout, and still stuck: the lateness did not fire the timeout, so the
    hang stays a collective stuck on every member (here on one host: the tp group lives on node00002)."""
    report = _run(make_job, "late_arrival", rank=5, delay_ms=300_000, tp=2, pp=2, dp=2, steps=3)
    assert not [f for f in report.findings if f.kind == "straggler"]
    assert [(f.kind, f.hosts) for f in report.root_causes] == [("stuck_in_flight", ["node00002"])]


def test_real_gloo_pipeline_straggler_fixture():
    """Recorded with torch 2.13 (fixtures/straggler_pipeline): tp 2 x pp 2 x dp 2, rank 1 sleeps 150 ms before
    each collective. Its tensor-parallel peer, rank 0, waits for it and reaches the dp and loss all_reduces
    late: on its own statistics it passes every threshold. Beside rank 1 it is on time, so only rank 1 is named."""
    report = analyze(FIXTURES / "straggler_pipeline")
    assert _timing_findings(report) == [("straggler", [1], ["node0"], [])]
    peer = report.timing.per_rank.filter(pl.col("rank") == 0).row(0, named=True)
    assert peer["median_late_ms"] > report.timing.threshold_ms and peer["late_fraction"] >= 0.6
    assert not peer["straggler"]
    # Its waits add up along a step (451 ms median over all its groups): split by kind of group, the least late
    # is its own 150 ms delay.
    by_group = next(f for f in report.findings if f.kind == "straggler").evidence["median_late_ms_by_group"]
    assert 140 < by_group["tp"] < 170 and min(by_group.values()) == by_group["tp"] and by_group["dp"] > 300


@pytest.mark.parametrize("case", [c for c in recorded_cases() if c not in ("straggler", "late_rank", "straggler_pipeline")])
def test_no_false_positive_on_any_other_fixture(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _timing_findings(analyze(FIXTURES / case)) == []


def test_timing_command(make_job, tmp_path):
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2,
                                fault=synth.Fault(kind="straggler", rank=3)), per_host_folders=True)
    result = CliRunner().invoke(main, ["timing", str(out)])
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    first_rank_row = lines[lines.index("Ranks, latest first:") + 2]
    assert first_rank_row.split()[0] == "3" and first_rank_row.split()[-2:] == ["True", "False"]   # (not an echo)


def test_the_timing_table_says_which_late_ones_are_echoes():
    """fixtures/straggler_pipeline: rank 0 and host node0 are late only because they wait on rank 1. The
    table shows them late, not named, and why (`only_waits`)."""
    result = CliRunner().invoke(main, ["timing", str(FIXTURES / "straggler_pipeline"), "--no-cache", "-q"])
    assert result.exit_code == 0
    rows = {tuple(line.split()[:2]): line.split() for line in result.stdout.splitlines() if line[:1].isdigit()}
    assert rows[("1", "node0")][-2:] == ["True", "False"]    # the straggler
    assert rows[("0", "node0")][-2:] == ["False", "True"]    # waits on it
    node0 = next(line.split() for line in result.stdout.splitlines() if line.startswith("node0 "))
    assert node0[-2:] == ["False", "True"]
    assert "only_waits: late enough to be named, but it only waits on a straggler" in result.stdout


def test_window_reads_hosts_and_groups_by_position_like_a_join(make_job):
    """The window reads each row's host (as a dense index into `host_ids`) and its group's frontier and span
    from small tables by position (gather) instead of joining: same answer as the joins, including ranks no
    host is known for."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=40, ranks_per_host=2))
    trace = load(out)
    m = run_match(trace)
    topo = Topology({0: "a", 1: "a", 2: "b", 3: "b", 5: "c"})   # ranks 4, 6, 7: unknown host
    opts = TimingOptions(window=8)
    units, host_ids, block_groups = _window(m, trace.groups, topo.frame(), opts)

    hosts = topo.frame()
    top = m.progress.group_by("group").agg(pl.col("frontier").max().alias("_top"))
    span = (trace.groups.select("group", pl.col("ranks").alias("rank")).explode("rank").join(hosts, on="rank")
            .group_by("group").agg((pl.col("host").n_unique() > 1).alias("cross")))
    want = (m.units.join(trace.groups.filter(pl.col("size") >= 2).select("group"), on="group", how="semi")
            .join(top, on="group").filter(pl.col("collective_seq_id") > pl.col("_top") - opts.window)
            .join(hosts, on="rank", how="left").join(span, on="group", how="left")
            .select("group", "collective_seq_id", "rank", "host", pl.col("cross").fill_null(False)))
    key = ["group", "collective_seq_id", "rank"]
    got = units.join(host_ids, on="_h", how="left").select(*key, "host", "cross")
    assert got.sort(key).equals(want.sort(key))
    assert got.filter(pl.col("rank").is_in([4, 6, 7]))["host"].null_count() == got.filter(
        pl.col("rank").is_in([4, 6, 7])).height > 0
    assert units["rank"].is_sorted()   # the units' rank order is kept: per-rank statistics rely on it
    assert sorted(host_ids["host"].to_list()) == ["a", "b", "c"]
    # the window is each group's last 8 collectives, each group's in a block of 8 slots, a slot per collective
    assert units.group_by("group").agg(pl.col("collective_seq_id").n_unique())["collective_seq_id"].max() == 8
    assert units["group"].to_physical().equals(block_groups.gather(units["_slot"] // opts.window), check_names=False)
    per_slot = units.group_by("_slot").agg(pl.col("group", "collective_seq_id").n_unique())
    assert per_slot["group"].max() == per_slot["collective_seq_id"].max() == 1


def test_clock_offsets_go_on_past_a_small_first_round():
    """Eleven hosts in a chain, each meeting only its neighbours, clocks 18 ms apart host to host (180 ms end
    to end): in pairs the median is the midpoint, so the first round moves each host by 9 ms at most, yet the
    rounds add up to far more. An early stop after a small first round (tried) read no offsets at all."""
    from flightrec.analysis.timing.lateness import clock_offsets

    rows, slot = [], 0
    for _ in range(60):
        for left in range(10):
            rows += [{"_slot": slot, "_h": h, "op": "all_reduce", "cross": True,
                      "time_completed_ns": (1_700_000_000_000 + slot * 1000 + 18 * h) * 10**6} for h in (left, left + 1)]
            slot += 1
    units = pl.DataFrame(rows).with_columns(pl.col("_h", "_slot").cast(pl.UInt32))
    offsets = clock_offsets(units, 11).to_list()
    assert offsets[0] < -50 and offsets[-1] > 50   # the ends, past the half poll an offset needs to count


def test_clock_offsets_ignore_sends_and_receives():
    """A send completes before its receive, every time: read as one instant, the pipeline's stages would get
    offsets growing along it (here +-75 ms on three hosts whose clocks agree). Offsets come from collectives."""
    from flightrec.analysis.timing.lateness import clock_offsets

    rows, inst = [], 0
    for _ in range(10):   # an all_reduce over the three hosts, ending at one instant
        inst += 1
        rows += [{"_slot": inst, "_h": h, "op": "all_reduce", "time_completed_ns": inst * 10**9} for h in range(3)]
    for src in (0, 1):    # host 0 sends to 1, 1 to 2: the receiving end completes 150 ms after the sending one
        for _ in range(30):
            inst += 1
            rows += [{"_slot": inst, "_h": src, "op": "coalesced", "time_completed_ns": inst * 10**9},
                     {"_slot": inst, "_h": src + 1, "op": "coalesced", "time_completed_ns": inst * 10**9 + 150 * 10**6}]
    units = pl.DataFrame(rows).with_columns(pl.lit(True).alias("cross"), pl.col("_h").cast(pl.UInt32))
    assert clock_offsets(units, 3).to_list() == [0.0, 0.0, 0.0]
    # (read as collectives, the stages get offsets: the test can fail)
    as_collectives = clock_offsets(units.with_columns(pl.lit("all_reduce").alias("op")), 3).to_list()
    assert max(as_collectives) - min(as_collectives) > 100


@pytest.mark.parametrize("placement, host_sorted", [
    ({r: "ab"[r // 4] for r in range(8)}, True),           # hosts hold runs of ranks
    ({r: "ab"[r % 2] for r in range(8)}, False),           # interleaved
    ({0: "a", 1: "a", 2: "b", 3: "b", 5: "c"}, False),     # some ranks on no known host
])
def test_window_flags_rank_and_host_order_only_where_it_holds(make_job, placement, host_sorted):
    """Per-rank and per-host statistics group slices when the window says its rank and host index columns are
    sorted (flags, not checked again): flagged exactly when true."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=40, ranks_per_host=4))
    trace = load(out)
    units, _, _ = _window(run_match(trace), trace.groups, Topology(placement).frame(), TimingOptions(window=8))
    ranks, hosts = units["rank"].to_numpy(), units["_h"].to_numpy()
    assert units["rank"].flags["SORTED_ASC"] and (np.diff(ranks) >= 0).all()
    assert units["_h"].flags["SORTED_ASC"] is host_sorted
    if host_sorted:
        assert (np.diff(hosts) >= 0).all()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-5, 60).map(float), min_size=1, max_size=12), st.sampled_from([1.0, 5.0, 20.0]),
       st.sampled_from([0.5, 1.0, 5.0]))
@example([0.0, 3.0, 15.0, 18.0], 20.0, 1.0)   # half the deviations reach the bound, and the spread is past it
@example([0.0, 0.0, 3.0, 3.0, 3.0, 40.0, 40.0], 20.0, 5.0)   # most past v = 20 / 8.4: medians, spread 25.2 ms
@example([0.0, 0.0, 0.0, 2.0, 3.0], 20.0, 5.0)   # two of five past v: the count decides
@example([-30.0, -30.0, 0.0], 20.0, 5.0)   # (lateness is never negative, but a negative value takes no shortcut)
def test_threshold_shortcut_is_the_full_spread(late, min_late_ms, spread_factor):
    """`_threshold` skips the medians when counts show the floor decides: the answer is the formula's."""
    opts = TimingOptions(min_late_ms=min_late_ms, spread_factor=spread_factor)
    series = pl.Series(late)
    med = series.median()
    want = max(min_late_ms, med + spread_factor * 1.4826 * (series - med).abs().median())
    assert _threshold(series, opts) == pytest.approx(want)


def test_a_late_host_whose_clock_is_off_says_by_how_much_it_was_corrected(make_job):
    """A straggler host whose clock also runs 300 ms behind: the offset is estimated from completion times,
    removed, and given in the finding."""
    import pickle

    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, steps=4,
                    fault=synth.Fault(kind="straggler_host", hosts=("node00001",)))
    out, _ = make_job(job, per_host_folders=True)
    for path in (out / "node00001").iterdir():
        dump = pickle.loads(path.read_bytes())   # (our own synthetic file)
        for entry in dump["entries"]:
            for key in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
                if entry.get(key):
                    entry[key] -= 300_000_000
        path.write_bytes(pickle.dumps(dump, protocol=2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False)
    host = next(f for f in report.findings if f.kind == "straggler" and f.hosts == ["node00001"])
    assert -330 < host.evidence["clock_offset_ms"] < -270
    assert f", after removing its clock offset of {host.evidence['clock_offset_ms']:+,.0f} ms" in host.message


def _shift_clock(src, out, ranks, ms):
    """Copy of fixture `src` with `ranks`' enqueue times moved `ms` later: their host's clock running ahead."""
    import pickle
    import shutil

    from flightrec.ingest.safe_read import read_dump

    shutil.copytree(FIXTURES / src, out)
    for path in out.rglob("nccl_trace_rank_*"):
        if int(path.name.rsplit("_", 1)[1]) in ranks:
            dump, _ = read_dump(path)
            for entry in dump["entries"]:
                entry["time_created_ns"] += int(ms * 1e6)
            path.write_bytes(pickle.dumps(dump, protocol=2))
    return out


def test_real_gloo_a_rank_whose_clock_runs_ahead_is_no_straggler_beside_the_real_one(tmp_path):
    """fixtures/straggler (rank 2 sleeps 150 ms before every collective) with rank 3's clock 500 ms ahead,
    each rank its own host. Rank 3 reads 500 ms late on every collective, but its peers enqueue their next
    entry ~150 ms after each one (they waited for rank 2, not for rank 3): it can't have been late, its clock
    is. Rank 2, whose peers' gaps are as long as its lateness, stays the straggler."""
    out = _shift_clock("straggler", tmp_path / "ahead", {3}, 500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(out, use_cache=False, ranks_per_host=1)
    stragglers = [f for f in report.findings if f.kind == "straggler"]
    assert [f.ranks for f in stragglers] == [[2]], report.summary
    clock = [f for f in report.findings if f.kind == "clock_offset"]
    assert [(f.role, f.ranks) for f in clock] == [("warning", [3])]
    assert "none of its peers waits for it" in clock[0].message and clock[0].evidence["median_late_ms"] > 400


@pytest.mark.parametrize("offset_ms", [500.0, -500.0])
def test_gloo_a_host_clock_off_names_no_straggler(make_job, offset_ms):
    """Gloo dumps carry no completion times, so a host whose clock is off can't be aligned: ahead, its ranks
    read as a straggling host; behind, their peers read late. Nobody waited on the late-looking ones, so none
    is a straggler: a clock_offset warning says so."""
    fault = synth.Fault(kind="clock_offset", hosts=("node00001",), offset_ms=offset_ms)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2, backend="gloo", timing=False,
                                fault=fault), per_host_folders=True)
    report = analyze(out, use_cache=False)
    assert [f for f in report.findings if f.kind == "straggler"] == [], report.summary
    assert [f.role for f in report.findings if f.kind == "clock_offset"] == ["warning"]


def test_gloo_a_straggling_host_is_still_named(make_job):
    """Its peers wait for it: their next entries come as late as it does. Not taken for a clock."""
    fault = synth.Fault(kind="straggler_host", hosts=("node00001",))
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, steps=6, ranks_per_host=2, backend="gloo", timing=False,
                                fault=fault), per_host_folders=True)
    report = analyze(out, use_cache=False)
    assert [(f.kind, f.hosts) for f in report.findings if f.kind in ("straggler", "clock_offset")] == [
        ("straggler", ["node00001"])], report.summary


def test_an_error_on_timings_second_thread_reaches_the_caller(monkeypatch):
    """analyze_timing works out the slow groups on a second thread: a failure there is raised, not lost or hung."""
    trace = load(FIXTURES / "straggler")
    m = run_match(trace)

    def broken(*_):
        raise RuntimeError("group speeds broke")

    monkeypatch.setattr("flightrec.analysis.timing.stragglers.group_speeds", broken)
    with pytest.raises(RuntimeError, match="group speeds broke"):
        analyze_timing(m, trace.groups, resolve(world_size=trace.world_size, from_dumps=trace.hosts),
                       entries=trace.entries)


def test_analyze_reads_timestamps_beside_the_waits_with_the_same_result_and_errors(monkeypatch):
    """analyze runs the timing analysis on a second thread while it follows the waits and diagnoses, which waits
    for it only where a finding needs it: on the straggler fixture the result is what each step gives in turn,
    and a failure in timing reaches the caller."""
    from flightrec.analysis.localize import locate
    from flightrec.analysis.wait_graph import build_waits
    from flightrec.api import diagnose_matched
    from flightrec.diagnosis.stragglers import straggler_findings as timing_findings
    from flightrec.diagnosis.verdict import diagnose

    trace = load(FIXTURES / "straggler")
    m = run_match(trace)
    topo = resolve(world_size=trace.world_size, from_dumps=trace.hosts)
    got = diagnose_matched(trace, m, topo)
    timing = analyze_timing(m, trace.groups, topo, entries=trace.entries)
    w = build_waits(m, trace.entries, trace.groups, trace.missing_ranks)
    loc = locate(m, topo, exclude=set(w.waiting))
    assert got.timing.per_rank.filter(pl.col("straggler"))["rank"].to_list() == [2]
    assert got.timing.per_rank.equals(timing.per_rank) and got.timing.lateness.equals(timing.lateness)
    assert got.waits.waiting == w.waiting and got.location == loc
    assert (got.verdict, got.summary, got.findings) == diagnose(trace, m, w, loc, topo, timing)
    assert got.timing_findings == timing_findings(timing, trace.groups, topo) != []

    def broken(*_, **__):
        raise RuntimeError("timing broke")

    monkeypatch.setattr("flightrec.api.analyze_timing", broken)
    with pytest.raises(RuntimeError, match="timing broke"):
        analyze(FIXTURES / "straggler", use_cache=False)


def test_nothing_analyze_runs_beside_timing_calls_back_into_python_from_polars():
    """analyze runs timing on a second thread beside the waits and the diagnosis: a Polars expression that calls
    Python (map_elements, map_batches) in any of them could deadlock the two threads on the GIL."""
    import flightrec

    root = Path(flightrec.__file__).parent
    # (the tables for notebooks may call Python: nothing in analyze uses them)
    sources = [p for sub in ("analysis", "diagnosis", "model", "report") for p in (root / sub).rglob("*.py")
               if p.name != "tables.py"]
    assert len(sources) > 20, sources
    for path in sources:
        source = path.read_text()
        assert "map_elements" not in source and "map_batches" not in source, path
    assert "map_batches" in (root / "report" / "tables.py").read_text()   # (the check can see one)
