"""Dumps written with `TORCH_INCLUDE_ONLY_ACTIVE` (`onlyActive`): NCCL's writer leaves out every entry it saw
complete, so a dump holds only what was in flight, and its pg_status says how far the rank got elsewhere."""

import json
import pickle
import warnings
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from flightrec import LoadOptions, analyze, load
from flightrec.ingest.safe_read import loads_plain_pickle, parse_dump_bytes
from flightrec.testing import synth

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _analyze(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(path, use_cache=False)
    jsonschema.validate(report.to_dict(), SCHEMA)
    return report


def test_the_generator_leaves_out_what_completed(make_job):
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, only_active=True))
    full, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2))
    kept = loads_plain_pickle((out / "nccl_trace_rank_0").read_bytes())["entries"]
    every = loads_plain_pickle((full / "nccl_trace_rank_0").read_bytes())["entries"]
    assert kept == [e for e in every if e["time_discovered_completed_ns"] is None]
    assert 0 < len(kept) < len(every)


@pytest.mark.parametrize("timing", [True, False])
def test_a_healthy_pipeline_job_reads_healthy(make_job, timing):
    # Batched sends and receives read `scheduled` forever; their closers, which say the batch finished, are
    # left out: those transfers are unknown, not in flight. And a group with no entry left is no group the
    # rank never joined.
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, timing=timing, only_active=True))
    report = _analyze(out)
    assert report.verdict == "healthy", report.summary
    assert report.trace.dumps["only_active"].all()
    assert report.trace.dumps["wrapped"].all()
    assert report.matching.p2p.filter(pl.col("status") != "matched").height == 0
    assert report.to_dict()["dumps"]["only_active"] is True
    assert "TORCH_INCLUDE_ONLY_ACTIVE" in report.to_text()


FAULTS = [
    # a tensor-parallel collective the rank never joined: its peers' entry ties the group to its pg_status key
    dict(kind="not_joined", rank=5, phase="tp"),
    # the first data-parallel collective: the rank's counter there is still -1 (nothing enqueued)
    dict(kind="not_joined", rank=5, phase="dp", step=0),
    dict(kind="host_down", rank=5, hosts=("node00002",)),
]


@pytest.mark.parametrize("timing", [True, False])
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f"{f['kind']}-{f.get('phase', '')}{f.get('step', '')}")
def test_the_culprit_is_named_from_unfinished_entries_and_pg_status(make_job, fault, timing):
    job = synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, timing=timing, only_active=True,
                    fault=synth.Fault(**fault))
    out, truth = make_job(job)
    report = _analyze(out)
    assert report.verdict == "fault", report.summary
    assert report.culprits["ranks"] == truth["ranks"]


def test_a_rank_with_nothing_in_flight_is_read_from_its_pg_status(make_job):
    # Every dp collective rank 5 should have joined completed nowhere (it never came), and its other work
    # finished: its dump may hold no entry at all, which says nothing is in flight on it, not that it is lost.
    job = synth.Job(tp=1, pp=1, dp=4, ranks_per_host=1, only_active=True,
                    fault=synth.Fault(kind="not_joined", rank=3, phase="dp"))
    out, truth = make_job(job)
    assert loads_plain_pickle((out / "nccl_trace_rank_3").read_bytes())["entries"] == []
    report = _analyze(out)
    assert report.culprits["ranks"] == truth["ranks"] == [3]
    assert [f.kind for f in report.root_causes] == ["not_joined"]


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_whole_dumps_are_not_taken_for_only_active_ones(make_job, backend):
    # (Gloo's writer never sees an entry complete: the setting leaves its dumps whole)
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, backend=backend, only_active=backend == "gloo",
                                fault=synth.Fault(kind="not_joined", rank=5)))
    trace = load(out, LoadOptions(use_cache=False))
    assert not trace.dumps["only_active"].any()
    assert not trace.dumps["wrapped"].any()


@pytest.mark.parametrize("case", ["healthy", "straggler_pipeline", "rolled_past_dp"])
def test_recorded_dumps_are_whole_or_rolled_never_only_active(case):
    trace = load(FIXTURES / case, LoadOptions(use_cache=False))
    assert not trace.dumps["only_active"].any()
    assert trace.dumps["wrapped"].all() == (case == "rolled_past_dp")


def test_a_recorded_dump_with_an_entry_left_out_holds_part_of_its_history(tmp_path):
    # A gap in the record ids: the writer left an entry out, so a group with nothing left is no proof
    src = FIXTURES / "subgroups_per_host"
    for path in src.rglob("nccl_trace_rank_*"):
        target = tmp_path / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    path = next(tmp_path.rglob("nccl_trace_rank_1"))
    dump = loads_plain_pickle(path.read_bytes())
    dump["entries"] = dump["entries"][:2] + dump["entries"][3:]
    path.write_bytes(pickle.dumps(dump, protocol=2))
    trace = load(tmp_path, LoadOptions(use_cache=False))
    assert trace.dumps.filter(pl.col("wrapped"))["rank"].to_list() == [1]


def test_a_pickle_cut_before_its_entries_keeps_its_pg_status():
    data = (FIXTURES / "skip_collective" / "nccl_trace_rank_0").read_bytes()
    whole = loads_plain_pickle(data)
    cut = data[:data.index(b"entries") + 40]   # (inside the first entry)
    dump, _ = parse_dump_bytes(cut, "nccl_trace_rank_0")
    assert dump["entries"] == [] and dump["_truncated"]
    assert dump["pg_status"] == whole["pg_status"]


def test_dumps_written_without_entries_say_what_their_counters_can(tmp_path):
    # `includeCollectives=False`: the writer leaves the `entries` key out. Recorded dumps (rank 2 skipped the
    # all_reduce at seq 8) with it taken out: nothing can be matched, so no rank is named, but the counters
    # still show rank 2 a collective short and the others with theirs in flight; never "healthy".
    for path in (FIXTURES / "skip_collective").glob("nccl_trace_rank_*"):
        dump = loads_plain_pickle(path.read_bytes())
        del dump["entries"]
        (tmp_path / path.name).write_bytes(pickle.dumps(dump, protocol=2))
    report = _analyze(tmp_path)
    assert report.verdict == "inconclusive"
    assert report.culprits["ranks"] == []
    (finding,) = [f for f in report.findings if f.kind == "no_entries"]
    assert finding.evidence == {"default_group": {"ranks_behind": [2], "enqueued_up_to": 8},
                                "ranks_in_flight": [0, 1, 3], "idle": False}
    assert "includeCollectives=False" in finding.message and "no entry" in report.summary
    assert finding.action == "recollect_dumps"


def test_only_active_dumps_of_a_job_with_nothing_in_flight_hold_no_entry(make_job):
    # Every collective completed: nothing is left to write. The counters say every rank is done: healthy.
    out, _ = make_job(synth.Job(tp=1, pp=1, dp=4, ranks_per_host=1, only_active=True))
    assert all(loads_plain_pickle(p.read_bytes())["entries"] == [] for p in out.glob("nccl_trace_rank_*"))
    report = _analyze(out)
    assert report.verdict == "healthy"
    assert [f.evidence["idle"] for f in report.findings if f.kind == "no_entries"] == [True]


def test_local_ids_are_tied_to_groups_by_the_order_they_were_made(make_job):
    from flightrec.analysis.progress import _ids_in_creation_order

    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2))
    trace = load(out, LoadOptions(use_cache=False))
    by_order = _ids_in_creation_order(trace.groups, trace.members, trace.pg_status, trace.entries)
    shown = trace.entries.select("rank", "pg_id", "group").unique()
    assert by_order.height == trace.pg_status.height
    assert shown.join(by_order, on=["rank", "pg_id"], suffix="_by_order").filter(
        pl.col("group") != pl.col("group_by_order")).height == 0
    # groups made in another order than their names say: the entries contradict it, and nothing is paired
    renamed = trace.groups.with_columns(pl.col("pg_name").cast(pl.Int64).rank("ordinal", descending=True)
                                        .cast(pl.String).alias("pg_name"))
    assert _ids_in_creation_order(renamed, trace.members, trace.pg_status, trace.entries).height == 0


def test_the_timing_command_says_why_it_has_little_to_time(make_job):
    from click.testing import CliRunner

    from flightrec.cli import main

    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, only_active=True))
    result = CliRunner().invoke(main, ["timing", str(out), "--no-cache", "-q"])
    assert result.exit_code == 0, result.output
    assert "TORCH_INCLUDE_ONLY_ACTIVE" in result.output


def _unbatched(src: Path, out: Path) -> None:
    """`src`'s dumps as a pipeline that sends and receives one op at a time (isend/irecv, no batch) writes them
    with TORCH_INCLUDE_ONLY_ACTIVE: each op its own work (its own p2p seq, its own state, no closer), the
    group's counters holding the latest op's seq enqueued and completed, finished ops left out."""
    out.mkdir()
    for path in src.iterdir():
        dump = loads_plain_pickle(path.read_bytes())
        closers = {(e["process_group"][0], e["p2p_seq_id"]): e for e in dump["entries"]
                   if e["profiling_name"].endswith("coalesced")}
        kept, seq = [], {}
        for e in dump["entries"]:
            if e["profiling_name"].endswith("coalesced"):
                continue
            if e["is_p2p"]:
                closer = closers[(e["process_group"][0], e["p2p_seq_id"])]
                seq[e["pg_id"]] = seq.get(e["pg_id"], 0) + 1
                e = dict(e, p2p_seq_id=seq[e["pg_id"]], state=closer["state"],
                         time_discovered_completed_ns=closer["time_discovered_completed_ns"])
                status = dump["pg_status"].setdefault(str(e["pg_id"]), {"last_started_collective": -1,
                                                                         "last_completed_collective": -1})
                status["last_enqueued_collective"] = e["p2p_seq_id"]
                if e["state"] == "completed":
                    status["last_completed_collective"] = e["p2p_seq_id"]
            kept.append(e)
        dump["entries"] = [e for e in kept if e["time_discovered_completed_ns"] is None]
        (out / path.name).write_bytes(pickle.dumps(dump, protocol=2))


@pytest.mark.parametrize("fault", [None, dict(kind="not_joined", rank=2, phase="p2p")])
def test_unbatched_sends_and_receives_in_flight_are_told_from_finished_batches(make_job, tmp_path, fault):
    # With timing off an op in flight reads `scheduled`, as a finished batch's ops do: the counters tell them
    # apart. Rank 2 never posts its transfer: its peers' ops are past their completed seq, and it is named.
    job = synth.Job(tp=1, pp=4, dp=1, ranks_per_host=1, timing=False,
                    fault=synth.Fault(**fault) if fault else synth.Fault())
    src, truth = make_job(job)
    _unbatched(src, tmp_path / "unbatched")
    report = _analyze(tmp_path / "unbatched")
    # (healthy, every op finished and was left out: no entry is left, and the counters say all is done)
    assert report.trace.dumps["only_active"].all() == bool(fault)
    assert report.verdict == ("fault" if fault else "healthy"), report.summary
    assert report.culprits["ranks"] == truth["ranks"]


def test_entries_that_never_complete_on_their_own_are_finished_where_the_counters_say_so(make_job):
    # A coalesced batch of collectives: its members never complete (its closer carries the state), so with
    # only-active they stay on every member while their closer is left out once the batch is done. Ranks 0
    # and 1's old tp collective is written back as such a member, still `scheduled`: "in flight on every
    # member" unless the counters, which show it completed, are read.
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, only_active=True))
    whole, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2))
    for rank in (0, 1):
        every = loads_plain_pickle((whole / f"nccl_trace_rank_{rank}").read_bytes())["entries"]
        member = next(e for e in every if e["process_group"][1] == "tp" and e["collective_seq_id"] == 5)
        member = dict(member, state="scheduled", time_discovered_completed_ns=None, duration_ms=None)
        path = out / f"nccl_trace_rank_{rank}"
        dump = loads_plain_pickle(path.read_bytes())
        dump["entries"] = sorted(dump["entries"] + [member], key=lambda e: e["record_id"])
        path.write_bytes(pickle.dumps(dump, protocol=2))
    report = _analyze(out)
    assert report.verdict == "healthy", report.summary


def test_a_pipeline_group_with_every_transfer_finished_is_not_read_as_collectives(make_job, tmp_path):
    # Unbatched sends and receives all finished leave their pipeline groups with no entry on any rank, and
    # counters holding p2p seqs: read as collectives, they made stages 'behind' in them and a deadlock across
    # the default and pipeline groups. A dead link under a dp collective: in flight there, as on whole dumps.
    job = synth.Job(tp=2, pp=4, dp=8, ranks_per_host=4, steps=6, microbatches=1, buffer_size=200, seed=717053,
                    fault=synth.Fault(kind="dead_link", rank=15, step=2, phase="dp",
                                      hosts=("node00003", "node00015")))
    src, _ = make_job(job)
    whole = _analyze(src)
    _unbatched(src, tmp_path / "unbatched")
    report = _analyze(tmp_path / "unbatched")
    assert report.trace.dumps["only_active"].all()
    assert report.verdict == whole.verdict == "inconclusive", report.summary
    assert [f.kind for f in report.findings if f.role == "root_cause"] == []
