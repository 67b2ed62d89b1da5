"""Synthetic NCCL jobs with one injected fault each: the culprits are exactly the injected ones."""

import json
import os
import warnings
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from flightrec import analyze
from flightrec.analysis import wait_graph
from flightrec.diagnosis.missing import all_with_a_dump_joined
from flightrec.model.topology import Topology
from flightrec.testing import synth, synth_schedule, synth_sim

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "report.schema.json").read_text())


def run(make_job, job, hosts_csv=False, trigger="auto", **gen):
    out, truth = make_job(job, **gen)
    kwargs = {"trigger": trigger}
    if hosts_csv:
        path = out.parent / f"{out.name}_hosts.csv"
        path.write_text("rank,host\n" + "".join(f"{r},{job.host_of(r)}\n" for r in range(job.world_size)))
        kwargs["hosts_file"] = path
    report = analyze(out, **kwargs)
    jsonschema.validate(report.to_dict(), SCHEMA)
    return report, truth


def culprits(report):
    c = report.culprits
    return c["ranks"], c["hosts"], [list(x) for x in c["links"]]


@pytest.mark.parametrize("timing", [True, False])
def test_healthy_3d_job(make_job, timing):
    report, _ = run(make_job, synth.Job(tp=4, pp=2, dp=2, timing=timing))
    assert report.verdict == "healthy"
    assert report.exit_code == 0
    assert culprits(report) == ([], [], [])
    assert [f for f in report.findings if f.role != "warning"] == []


@pytest.mark.parametrize("timing", [True, False])
def test_not_joined_in_tp_cascades_through_pp_and_dp(make_job, timing):
    job = synth.Job(tp=4, pp=4, dp=2, ranks_per_host=4, timing=timing,
                    fault=synth.Fault(kind="not_joined", rank=13, phase="tp"))
    report, truth = run(make_job, job, per_host_folders=True)
    assert report.verdict == "fault"
    assert culprits(report) == ([13], ["node00003"], [])
    root = report.root_causes[0]
    assert root.kind == "not_joined"
    assert (root.op, root.collective_seq_id, root.process_group.desc) == ("all_gather", truth["collective_seq_id"], "tp")
    assert report.summary.startswith("FAULT: rank 13 (node00003) never joined all_gather")
    waiting = sum(len(f.ranks) for f in report.findings if f.kind == "waiting")
    assert waiting == root.evidence["waiting_ranks"] > 20


def test_missing_culprit_dump(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, fault=synth.Fault(kind="missing_dump", rank=6))
    report, _ = run(make_job, job)
    assert culprits(report) == ([6], [], [])  # one flat folder: nothing says where rank 6 ran
    assert report.root_causes[0].kind == "missing_dump"
    assert report.to_dict()["dumps"]["missing_ranks"] == [6]


def test_missing_dump_host_from_its_neighbours_folder(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="missing_dump", rank=6))
    report, _ = run(make_job, job, per_host_folders=True)
    assert culprits(report) == ([6], ["node00001"], [])


def test_whole_host_down(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="host_down", rank=9))
    report, _ = run(make_job, job, hosts_csv=True)
    assert culprits(report) == ([8, 9, 10, 11], ["node00002"], [])
    assert report.summary.startswith("FAULT: host node00002 down")
    assert "host node00002 is down" in report.root_causes[0].message


def test_whole_host_down_named_from_per_host_folders(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="host_down", rank=9))
    report, _ = run(make_job, job, per_host_folders=True)
    assert culprits(report) == ([8, 9, 10, 11], ["node00002"], [])


@pytest.mark.parametrize("down, lost", [(0, None), (9, None), (6, 14)])
def test_a_two_host_job_with_one_host_down_names_it_from_the_one_folder_left(make_job, down, lost):
    """Two hosts of 8 ranks, per-host folders, one host down: its folder was never written, so one folder is
    left, and one folder was read as no host (a run's, maybe): 'ranks 0-7 left no dump', with hosts unknown.
    Its name ends in its block's number: it is the host left, and the other is named down (sweep seed 7, job 88).
    The host down is all its ranks, rank 6 too where its dp peer's dump was lost as well (no one is seen waiting
    on it). The dumps of a whole job in one such folder tell no placement (`resolve`)."""
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=8, fault=synth.Fault(kind="host_down", rank=down))
    out, truth = make_job(job, per_host_folders=True)
    if lost is not None:
        _damage(out, lost)
    report = analyze(out)
    jsonschema.validate(report.to_dict(), SCHEMA)
    assert culprits(report) == (truth["ranks"], truth["hosts"], []) and truth["hosts"] == [f"node0000{down // 8}"]
    assert truth["ranks"] == list(range(down // 8 * 8, down // 8 * 8 + 8))
    assert report.summary.startswith(f"FAULT: host {truth['hosts'][0]} down")
    whole, _ = make_job(synth.Job(tp=4, pp=2, dp=1, ranks_per_host=8), per_host_folders=True)
    assert {p.name for p in whole.iterdir() if p.is_dir()} == {"node00000"}
    # (said as such: no host placement is used, and no "pass --hosts" hint beside a lone host's folder)
    assert analyze(whole).dumps.host_source == "one host folder"
    _damage(whole, 5)   # (and with one of its dumps lost, the hole filled from the folder's block)
    assert analyze(whole).dumps.host_source == "one host folder"


@pytest.mark.parametrize("kind", ["size_mismatch", "type_mismatch", "dtype_mismatch"])
@pytest.mark.parametrize("phase", ["tp", "dp"])
def test_mismatch_minority(make_job, kind, phase):
    job = synth.Job(tp=4, pp=2, dp=4, fault=synth.Fault(kind=kind, rank=5, phase=phase))
    report, truth = run(make_job, job)
    assert culprits(report)[0] == [5]
    root = report.root_causes[0]
    assert root.kind == "mismatch" and root.collective_seq_id == truth["collective_seq_id"]
    assert root.process_group.desc == phase
    assert root.evidence["ambiguous"] is False


def test_two_member_mismatch_is_ambiguous_not_guessed(make_job):
    """tp 2 and one tp group: rank 1 against rank 0, and no other tp group to say which is usual."""
    job = synth.Job(tp=2, pp=1, dp=1, fault=synth.Fault(kind="dtype_mismatch", rank=1))
    report, _ = run(make_job, job)
    root = report.root_causes[0]
    assert root.evidence["ambiguous"] is True
    assert root.ranks == [0, 1]
    assert "can't be said which side" in root.message


@pytest.mark.parametrize("kind", ["dtype_mismatch", "size_mismatch", "type_mismatch"])
@pytest.mark.parametrize("phase", ["tp", "dp"])
def test_two_member_mismatch_is_settled_by_the_peer_groups(make_job, kind, phase):
    """One against one, but the other groups of the same kind ran the same collective at the same seq, all
    alike: the member that differs from them is the culprit (the ground truth's)."""
    job = synth.Job(tp=2, pp=2, dp=2, fault=synth.Fault(kind=kind, rank=5, phase=phase))
    report, truth = run(make_job, job)
    root = report.root_causes[0]
    assert (root.kind, root.ranks, root.evidence["ambiguous"]) == ("mismatch", truth["ranks"], False)
    # (the peers that got there: a tp group of the other pipeline stage may be held up before it)
    n = root.evidence["peer_groups"]
    assert n >= 2 and root.process_group.desc == phase
    assert f"as did every member of the {n} other '{phase}' groups at #{root.collective_seq_id}" in root.message


def test_deadlock_across_two_groups_names_the_rank_whose_order_is_the_odd_one(make_job):
    """Rank 2 runs the world all_reduce before its dp one; its dp peers 0, 4, 6 the other way round: they wait
    for each other. Rank 2 alone holds up the dp group, where the three wait on it: it is the odd one out (the
    ground truth's culprit), named as not joining, with the deadlock in the evidence."""
    job = synth.Job(tp=2, pp=1, dp=4, fault=synth.Fault(kind="deadlock", rank=2))
    report, truth = run(make_job, job)
    root = report.root_causes[0]
    assert culprits(report)[0] == truth["ranks"] == [2]
    assert (root.kind, root.process_group.desc, root.op) == ("not_joined", "dp", "all_reduce")
    assert root.evidence["deadlock"]["ranks"] == [0, 2, 4, 6]   # rank 2 and its data-parallel peers
    assert {"dp", "default_pg"} <= {report.trace.groups.filter(
        report.trace.groups["group"] == g)["pg_desc"][0] for g in root.evidence["deadlock"]["groups"]}
    assert "a deadlock of its order against everyone else's" in root.message


def test_a_deadlock_of_two_is_settled_by_the_ranks_that_ran_both(make_job):
    """With dp 2, rank 2 holds up the dp group {0, 2} and rank 0 the world group: one against one. Ranks 1 and
    3 (the other dp group) recorded their dp all_reduce before the world one, as rank 0 ran them: rank 2's
    order is the odd one."""
    job = synth.Job(tp=2, pp=1, dp=2, fault=synth.Fault(kind="deadlock", rank=2))
    report, truth = run(make_job, job)
    root = report.root_causes[0]
    assert (root.kind, root.ranks) == ("not_joined", truth["ranks"]) and truth["ranks"] == [2]
    assert root.evidence["deadlock"]["ranks"] == [0, 2]


def test_a_deadlock_where_stages_run_the_two_in_other_orders_blames_no_bystander(make_job, monkeypatch):
    """Pipeline stage 0 runs its dp all_reduce before the world one, stages 1-3 the other way (legitimate: dp
    groups are per stage). Rank 0 takes the other stages' order and deadlocks with its dp peer, rank 8. Twelve
    ranks of other stages show rank 0's order, so it is no odd one out, and neither is rank 8: the cycle is
    a deadlock of both (a review found rank 8 named alone)."""
    schedule = synth_sim.schedule

    def stages_differ(job, rank, by_rank, steps=None):
        ops = list(schedule(job, rank, by_rank, steps))
        if job.coords(rank)[1] != 0:
            for i in [i for i, o in enumerate(ops) if o.group.desc == "dp"]:
                ops[i], ops[i + 1] = ops[i + 1], ops[i]
        return ops

    monkeypatch.setattr(synth_sim, "schedule", stages_differ)
    job = synth.Job(tp=2, pp=4, dp=2, steps=3, fault=synth.Fault(kind="deadlock", rank=0, phase="dp"))
    report, _ = run(make_job, job)
    root = report.root_causes[0]
    assert (root.kind, root.ranks) == ("deadlock", [0, 8])


def test_a_deadlock_nobody_else_can_order_names_both_sides(make_job):
    """Two ranks, each the other's only peer in both groups: rank 1 runs them in the other order, and no third
    rank says which order is the program's. A deadlock of both, not a guess."""
    job = synth.Job(tp=1, pp=1, dp=2, fault=synth.Fault(kind="deadlock", rank=1, phase="dp"))
    report, _ = run(make_job, job)
    root = report.root_causes[0]
    assert (root.kind, root.ranks) == ("deadlock", [0, 1])
    assert report.summary.startswith("FAULT: deadlock: ranks 0-1")


def test_dead_link_between_two_hosts(make_job):
    """Pipeline stages on different hosts: the stuck transfers name both ends of the link."""
    job = synth.Job(tp=2, pp=4, dp=2, ranks_per_host=2,
                    fault=synth.Fault(kind="dead_link", rank=2, hosts=("node00001", "node00002")))
    report, _ = run(make_job, job, per_host_folders=True)
    assert culprits(report) == ([], [], [["node00001", "node00002"]])
    assert report.root_causes[0].kind == "stuck_in_flight"
    assert report.summary.startswith("FAULT: link node00001 <-> node00002")


def test_a_dead_link_under_the_pipeline_names_the_stuck_pairs(make_job):
    """The stuck tests are send/recv pairs, not groups: the message names each pair and its group."""
    job = synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, steps=4,
                    fault=synth.Fault(kind="dead_link", hosts=("node00000", "node00001"), phase="p2p"))
    report, _ = run(make_job, job, per_host_folders=True)
    assert culprits(report) == ([], [], [["node00000", "node00001"]])
    assert report.summary == "FAULT: link node00000 <-> node00001: 2 pipeline transfers stuck across it"
    assert report.root_causes[0].message == (
        "link node00000 <-> node00001: 2 pipeline send/recvs (ranks 0 -> 2 in group 5 (desc 'pp'), ranks 1 -> 3 "
        "in group 6 (desc 'pp')) are in flight at both ends and completed at neither; every stuck pair spans both "
        "hosts (or a GPU or NIC at either end)")


def test_dead_link_inside_groups_that_span_every_host_is_inconclusive(make_job):
    """Every stuck group spans the same four hosts: no test separates them, so no host is guessed."""
    job = synth.Job(tp=2, pp=1, dp=4, ranks_per_host=2,
                    fault=synth.Fault(kind="dead_link", rank=0, hosts=("node00000", "node00001")))
    report, _ = run(make_job, job, per_host_folders=True)
    assert report.verdict == "inconclusive"
    assert culprits(report) == ([], [], [])
    stuck = next(f for f in report.findings if f.kind == "stuck_in_flight")
    assert stuck.evidence["hosts_in_every_stuck_group"] == [f"node0000{i}" for i in range(4)]


@pytest.mark.parametrize("pp, rank", [(4, 2), (3, 4), (4, 7)])
def test_wrong_p2p_peer(make_job, pp, rank):
    job = synth.Job(tp=2, pp=pp, dp=2, fault=synth.Fault(kind="wrong_peer", rank=rank, phase="p2p"))
    report, _ = run(make_job, job)
    assert culprits(report)[0] == [rank]
    assert report.root_causes[0].kind == "p2p_unmatched"
    assert not any(f.kind == "deadlock" for f in report.findings)


@pytest.mark.parametrize("buffer_size", [2000, 20])
def test_a_wrong_peer_beside_both_directions_of_pipeline_waits(make_job, buffer_size):
    """Rank 4 (stage 2) sends to stage 0 instead of 6 while rank 2 sends forward to it and rank 0 waits for 2's
    backward send: two pending sends each have someone else waiting on their sender. The wrong one goes to a
    rank that never receives from the sender at all (with a 20-entry ring, no matched transfer is left to say
    which pairs the pipeline uses)."""
    job = synth.Job(tp=2, pp=4, dp=2, steps=4, ranks_per_host=2, buffer_size=buffer_size,
                    fault=synth.Fault(kind="wrong_peer", rank=4, phase="p2p"))
    report, truth = run(make_job, job)
    assert culprits(report)[0] == truth["ranks"] == [4]
    root = report.root_causes[0]
    assert (root.kind, root.evidence["sent_to"], root.evidence["expected_by"]) == ("p2p_unmatched", 0, 6)


def test_a_rank_whose_ring_holds_only_sends_and_receives_is_placed_by_its_peers_key(make_job):
    """tp 1, a 12-entry ring: rank 9 skipped its dp all_reduce and its ring holds nothing but pipeline sends and
    receives, so no counter of its can be checked against its entries, and two groups (dp, a one-rank tp) and
    two pg_status keys have no entry. Its dp peers record that group under local id 3: its counter there says
    it is one behind."""
    job = synth.Job(tp=1, pp=4, dp=4, steps=4, ranks_per_host=4, buffer_size=12,
                    fault=synth.Fault(kind="not_joined", rank=9, phase="dp"))
    report, truth = run(make_job, job)
    assert culprits(report)[0] == truth["ranks"] == [9]
    root = report.root_causes[0]
    assert (root.kind, root.process_group.desc) == ("not_joined", "dp")
    assert root.collective_seq_id == truth["collective_seq_id"]
    mine = report.trace.entries.filter(pl.col("rank") == 9)
    assert mine["is_p2p"].any() and mine.filter(~pl.col("is_p2p") & (pl.col("op") != "coalesced")).height == 0


def _opening_each_step(schedule, descs):
    """A synth schedule where each step opens with an all_reduce in each group `descs(job, rank, by_rank, step)`
    names (keys of by_rank[rank]), instance keys renumbered per group."""
    import copy
    from collections import defaultdict

    def opened(job, rank, by_rank, steps=None):
        out, counts, renumbered = [], defaultdict(int), []
        for op in schedule(job, rank, by_rank, steps):
            if not out or out[-1].step != op.step:
                for desc in descs(job, rank, by_rank, op.step):
                    new = copy.copy(op)
                    new.group, new.name, new.in_sizes, new.out_sizes = by_rank[rank][desc], "all_reduce", [[8]], [[8]]
                    new.is_p2p, new.parts, new.dtype, new.keys = False, [], "Float", [("c", new.group.name, 0)]
                    out.append(new)
            out.append(op)
        for op in out:   # (the ops are shared between ranks: copied before their keys change)
            if op.keys and op.keys[0][0] == "c":
                op = copy.copy(op)
                counts[op.group.name] += 1
                op.keys = [("c", op.group.name, counts[op.group.name])]
            renumbered.append(op)
        return renumbered
    return opened


def test_a_one_against_one_mismatch_is_not_settled_by_groups_running_another_program(make_job, monkeypatch):
    """Pipeline stage 0's tp group opens each step with an extra all_reduce (an embedding); rank 1 skips it in
    the last step and calls its all_gather. The other stages' tp groups at that seq ran another program (their
    ops before it differ): no peers, so the mismatch stays ambiguous, where a review found rank 0 blamed."""
    schedule = synth_sim.schedule

    def embedding(job, rank, by_rank, step):
        first_stage = job.coords(rank)[1] == 0
        return ["tp"] if first_stage and not (rank == 1 and step == job.steps - 1) else []

    monkeypatch.setattr(synth_sim, "schedule", _opening_each_step(schedule, embedding))
    report, _ = run(make_job, synth.Job(tp=2, pp=4, dp=1, steps=3))
    root = report.root_causes[0]
    assert (root.kind, root.ranks, root.evidence["ambiguous"]) == ("mismatch", [0, 1], True)
    assert not any(f.kind == "deadlock" for f in report.findings)


def test_a_peers_pg_status_key_is_not_borrowed_where_local_ids_shift(make_job, monkeypatch):
    """Only first-stage ranks are in a 'pos' group (Megatron's position embedding), made before the 'mp' group:
    their local ids for mp and dp are one higher than stage 1's. Rank 0's ring rolled its mp entries out, and
    its peer rank 1 records mp under id 3, which on rank 0 is pos. Borrowed, rank 0 read as behind in mp and a
    false deadlock of 0 and 1 was named (a review's reproducer); rank 1, which never sent its backward
    activations, is the culprit."""
    import pickle
    from collections import defaultdict

    from flightrec.ingest.safe_read import read_dump

    groups_of, schedule = synth_sim.process_groups, synth_sim.schedule

    def with_pos_and_mp(job):
        gs, _ = groups_of(job)
        made = [g for g in gs if g.desc in ("default_pg", "tp", "pp")]
        made += [synth_schedule.Group("", "pos", [job.rank_of(d, 0, 0)]) for d in range(job.dp)]
        made += [synth_schedule.Group("", "mp", sorted(job.rank_of(d, p, 0) for p in range(job.pp))) for d in range(job.dp)]
        made += [g for g in gs if g.desc == "dp"]
        by_rank = defaultdict(dict)
        for i, g in enumerate(made):
            g.name = str(i)
            for r in g.ranks:
                by_rank[r][g.desc] = g
        return made, by_rank

    def pos_and_mp(job, rank, by_rank, step):
        return (["pos"] if "pos" in by_rank[rank] and step == 0 else []) + ["mp"]

    monkeypatch.setattr(synth_sim, "process_groups", with_pos_and_mp)
    monkeypatch.setattr(synth_sim, "schedule", _opening_each_step(schedule, pos_and_mp))
    job = synth.Job(tp=1, pp=2, dp=2, steps=3, fault=synth.Fault(kind="not_joined", rank=1, phase="p2p"))
    out, truth = make_job(job, per_host_folders=True)
    path = next(out.rglob("nccl_trace_rank_0"))
    dump = read_dump(path)[0]
    last_mp = max(i for i, e in enumerate(dump["entries"]) if e["process_group"][1] == "mp")
    dump["entries"] = dump["entries"][last_mp + 1:]
    path.write_bytes(pickle.dumps(dump, protocol=2))
    report = analyze(out, use_cache=False)
    assert culprits(report)[0] == truth["ranks"] == [1]
    assert not any(f.kind == "deadlock" for f in report.findings)


def test_ring_buffer_wrap_still_finds_culprit(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, steps=6, buffer_size=40, fault=synth.Fault(kind="not_joined", rank=3))
    report, _ = run(make_job, job)
    assert report.trace.dumps["wrapped"].all()
    assert culprits(report)[0] == [3]


def test_json_dumps_give_the_same_answer(make_job):
    job = synth.Job(tp=4, pp=2, dp=2, fault=synth.Fault(kind="not_joined", rank=6))
    report, _ = run(make_job, job, fmt="json")
    assert culprits(report)[0] == [6]


def test_a_topology_frame_is_built_once_sorted_by_rank_and_equality_ignores_it():
    topo = Topology({3: "b", 0: "a", 1: "a"})
    frame = topo.frame()
    assert frame["rank"].to_list() == [0, 1, 3] and frame["host"].cast(pl.String).to_list() == ["a", "a", "b"]
    assert topo.frame() is frame
    assert topo == Topology({3: "b", 0: "a", 1: "a"}) and "_frame" not in repr(topo)


def test_topology_rolls_hosts_up_to_their_switch(make_job, tmp_path):
    """Two hosts under one leaf switch both gone: the switch is the suspect."""
    job = synth.Job(tp=4, pp=2, dp=4, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=9, phase="tp"))
    out, _ = make_job(job, per_host_folders=True)
    for host in ("node00002", "node00003"):
        for f in (out / host).iterdir():
            f.unlink()
        (out / host).rmdir()
    hosts = tmp_path / "hosts.csv"
    hosts.write_text("rank,host\n" + "".join(f"{r},{job.host_of(r)}\n" for r in range(job.world_size)))
    topo = tmp_path / "topo.csv"
    topo.write_text("host,switch\n" + "".join(f"node{i:05d},leaf{i // 2}\n" for i in range(8)))
    report = analyze(out, hosts_file=hosts, topology_file=topo)
    jsonschema.validate(report.to_dict(), SCHEMA)
    assert report.culprits["switches"] == ["leaf1"]
    assert report.culprits["hosts"] == ["node00002", "node00003"]
    switch = next(f for f in report.findings if f.kind == "switch")
    assert switch.role == "root_cause" and switch.ranks == list(range(8, 16))


@pytest.mark.parametrize("buffer_size, microbatches", [(10, 2), (200, 32)])
def test_a_rank_whose_ring_buffer_rolled_past_its_data_parallel_group(make_job, buffer_size, microbatches):
    """The ring buffer is one per rank across its groups: rank 5 ran so many tensor- and pipeline-parallel ops
    after its last data-parallel all_reduce that none of its dp entries is left. Its pg_status still says how
    far it got there (the key tied to the group by elimination, the default group's being 0): it is the rank
    that never joined, not a host whose collectives hang on every member."""
    job = synth.Job(tp=2, pp=2, dp=2, ranks_per_host=4, steps=6, buffer_size=buffer_size, microbatches=microbatches,
                    fault=synth.Fault(kind="not_joined", rank=5, phase="dp"))
    report, truth = run(make_job, job, per_host_folders=True)
    kept = report.trace.entries.filter(pl.col("rank") == 5).join(report.trace.groups, on="group")["pg_desc"]
    assert "dp" not in kept.to_list() and "default_pg" not in kept.to_list()   # (both rolled out: two keys)
    assert report.root_causes[0].ranks == [5]
    assert culprits(report) == ([5], ["node00001"], [])
    root = report.root_causes[0]
    want = ("not_joined", "dp", truth["collective_seq_id"])
    assert (root.kind, root.process_group.desc, root.collective_seq_id) == want


def test_the_op_a_culprit_missed_is_found_on_one_clock(make_job):
    """Rank 5 never joins a tensor-parallel all_gather; its host's clock runs 3 s ahead. The op named is the
    one it should have run first, in program order, not the one whose peers' raw enqueue time is earliest."""
    import pickle

    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, steps=4, fault=synth.Fault(kind="not_joined", rank=5))
    out, truth = make_job(job, per_host_folders=True)
    for path in (out / job.host_of(5)).iterdir():
        dump = pickle.loads(path.read_bytes())   # (our own synthetic file)
        for entry in dump["entries"]:
            for key in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"):
                if entry.get(key):
                    entry[key] += 3_000_000_000
        path.write_bytes(pickle.dumps(dump, protocol=2))
    report = analyze(out)
    root = report.root_causes[0]
    assert root.ranks == [5]
    want = ("all_gather", "tp", truth["collective_seq_id"])
    assert (root.op, root.process_group.desc, root.collective_seq_id) == want


def test_a_rank_that_left_no_dump_comes_after_the_one_whose_dump_proves_it_behind(make_job):
    """Rank 5 never joins a tensor-parallel all_gather; its tp peer rank 6 left no dump. How far rank 6 got is
    unknown: the headline names rank 5, whose own dump shows it behind."""
    job = synth.Job(tp=4, pp=2, dp=2, ranks_per_host=2, steps=3, fault=synth.Fault(kind="not_joined", rank=5))
    out, truth = make_job(job, per_host_folders=True)
    (out / job.host_of(6) / "nccl_trace_rank_6").unlink()
    report = analyze(out)
    first = report.root_causes[0]
    assert (first.kind, first.ranks, first.collective_seq_id) == ("not_joined", [5], truth["collective_seq_id"])
    assert report.summary.startswith("FAULT: rank 5 (node00002) never joined all_gather")


def test_a_rank_that_left_no_dump_is_a_warning_when_its_waiters_wait_on_a_proven_culprit(make_job):
    """One tensor-parallel group: rank 1 never joins; rank 2 left no dump. Everyone who waits on rank 2 waits
    on rank 1 too, whose dump proves it behind: rank 1 explains the hang, rank 2 is a warning."""
    job = synth.Job(tp=4, pp=1, dp=1, steps=3, fault=synth.Fault(kind="not_joined", rank=1))
    out, _ = make_job(job)
    (out / "nccl_trace_rank_2").unlink()
    report = analyze(out)
    assert culprits(report) == ([1], [], [])
    warning = next(f for f in report.findings if f.kind == "missing_dump")
    assert warning.role == "warning" and warning.ranks == [2]
    assert warning.message == ("rank 2 left no dump; the ranks waiting on it wait on rank 1 too, whose dump shows "
                               "it behind")


def _damage(out, rank, keep=None):
    """Delete `rank`'s dump (keep=None) or cut it to `keep` of its bytes."""
    path = next(p for p in out.rglob(f"*_{rank}") if p.is_file())
    if keep is None:
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


@pytest.mark.parametrize("rank", [2, 3])
def test_a_dump_cut_short_makes_up_no_hang(make_job, rank):
    """A healthy job with one dump cut to 70%: its last batch of sends lost the entry that says it finished,
    and read as 'link node00000 <-> node00001: a send in flight at both ends' (adversarial sweep)."""
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, steps=3), per_host_folders=True)
    _damage(out, rank, keep=0.7)
    with pytest.warns(UserWarning, match="truncated"):
        report = analyze(out, use_cache=False)
    assert report.verdict == "healthy" and not report.root_causes, report.summary
    assert [f.kind for f in report.findings if f.role == "warning"] == ["dump_problem"]


@pytest.mark.parametrize("rank, keep", [(15, None), (15, 0.7), (8, None), (8, 0.7)])
def test_a_bystanders_lost_dump_takes_no_blame_for_a_dead_link(make_job, rank, keep):
    """A dead link between node00000 and node00002 hangs two dp groups in flight on every member: inconclusive,
    no single link stands out. With an innocent rank's dump lost or cut, it read 'FAULT: rank 15 left no dump,
    and 7 ranks wait on it' (rank 15 is in no hung group; rank 8 is in one, beside its twin stuck group)."""
    job = synth.Job(tp=4, pp=1, dp=4, ranks_per_host=2, steps=3,
                    fault=synth.Fault(kind="dead_link", rank=0, phase="dp", hosts=("node00000", "node00002")))
    out, _ = make_job(job, per_host_folders=True)
    _damage(out, rank, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the cut file's)
        report = analyze(out, use_cache=False)
    assert report.verdict == "inconclusive" and not report.root_causes, report.summary
    assert "in flight on every member" in report.summary


def _hosts_of_groups_that_kept_completing(report, desc: str | None = None) -> list[set[str]]:
    """The hosts of each group (of `desc`, none stuck) that completed a collective after the first collective
    stuck on all its members was enqueued: the situation some pinned-seed tests are about (a seed that no
    longer builds it would let them pass idly)."""
    units, colls = report.matching.units, report.matching.collectives
    stuck = colls.filter((pl.col("status") == "in_flight") & (pl.col("n_completed") == 0))
    since = units.join(stuck.select("group", "collective_seq_id"), on=["group", "collective_seq_id"])[
        "time_created_ns"].min()
    kept = (units.filter((pl.col("state") == "completed") & (pl.col("time_completed_ns") > since))
            .join(stuck.select("group"), on="group", how="anti")
            .join(report.trace.groups.select("group", "pg_desc"), on="group")
            .filter(pl.lit(desc is None) | (pl.col("pg_desc") == desc))
            .group_by("group").agg(pl.col("rank").unique()))
    return [set(report.topology.hosts(ranks)) for ranks in kept["rank"].to_list()]

def test_a_dead_link_under_every_group_with_timing_off_names_no_bystander_host(make_job):
    """16 ranks, dp 8 across 8 hosts: the link node00001 <-> node00004 dies under both dp groups, NCCL timing
    off, so no completion time says which group kept going. The sweep once built one dp group that kept
    completing (its ring not using that pair) and host node00005 was named; the generator now hangs every op
    spanning both hosts, so that situation is `test_a_dead_link_in_one_stuck_group_names_no_bystander_host`'s.
    Here both groups stick, and nothing narrows it to a host: none is named."""
    job = synth.Job(tp=1, pp=2, dp=8, steps=6, ranks_per_host=2, microbatches=4, timing=False, seed=250180,
                    buffer_size=200, fault=synth.Fault(kind="dead_link", rank=9, step=2, phase="dp",
                                                       hosts=("node00004", "node00001")))
    # (NCCL timing off: no stamp says how long the collectives had waited; the user says the watchdog dumped)
    report, _ = run(make_job, job, per_host_folders=True, trigger="timeout")
    # (the situation seed 250180 builds: both dp groups stuck at once, none seen to keep completing)
    stuck = report.matching.collectives.filter((pl.col("status") == "in_flight") & (pl.col("n_completed") == 0))
    assert stuck["group"].n_unique() == 2 and not _hosts_of_groups_that_kept_completing(report, "dp")
    assert report.verdict == "inconclusive" and not report.root_causes, report.summary


def test_a_dead_link_in_one_stuck_group_names_no_bystander_host(make_job):
    """256 ranks, tp 8 over four hosts of 2: the link node00088 <-> node00091 dies under a tp collective. One
    stuck group holds hosts 88-91, all stuck alike; 88, 90 and 91 happened to complete something elsewhere
    since, and host node00089 was named for being 'in none of the 46 groups that kept completing'."""
    job = synth.Job(tp=8, pp=4, dp=8, ranks_per_host=2, steps=2, microbatches=1, seed=375754,
                    fault=synth.Fault(kind="dead_link", rank=177, phase="dp", hosts=("node00088", "node00091")))
    report, _ = run(make_job, job, per_host_folders=True)
    # (the situation seed 375754 builds: 88, 90 and 91 completed something elsewhere since, 89 did not)
    kept = set().union(*_hosts_of_groups_that_kept_completing(report))
    assert {"node00088", "node00090", "node00091"} <= kept and "node00089" not in kept
    assert report.verdict == "inconclusive" and not report.root_causes, report.summary
    assert "node00089" not in report.summary or "not narrowed" in report.summary


def test_a_rank_stopped_before_its_pipeline_send_says_where_else_it_is_waited_on(make_job):
    """The headline names one op (tp all_gather #19, its tp peers' wait); its pipeline peer's wait for the send it
    never posted, the op the generator stopped it at, was said nowhere (API review helper)."""
    job = synth.Job(tp=2, pp=4, dp=2, fault=synth.Fault(kind="not_joined", rank=5, phase="p2p"))
    report, truth = run(make_job, job)
    root = report.root_causes[0]
    assert root.ranks == truth["ranks"] == [5]
    assert f"send/recv in group {truth['pg_name']} (desc 'pp')" in root.evidence["also_waited_on_in"]


@pytest.mark.parametrize("tp, pp, dp, per_host, phase", [(8, 1, 4, 8, "dp"), (4, 2, 2, 4, "dp"), (4, 2, 4, 2, "tp")])
def test_a_hosts_network_dying_implicates_that_host_and_no_other(make_job, tp, pp, dp, per_host, phase):
    """nic_down: every op node00001's ranks share with another host hangs. The first hangs seen are often its
    links to one neighbour, and a link is then as far as the dumps go: it must have node00001 at one end
    (or the verdict stay inconclusive), never point at a host or link without it."""
    job = synth.Job(tp=tp, pp=pp, dp=dp, ranks_per_host=per_host,
                    fault=synth.Fault(kind="nic_down", rank=per_host, phase=phase, hosts=("node00001",)))
    report, truth = run(make_job, job, per_host_folders=True)
    assert truth["hosts"] == ["node00001"] and report.verdict in ("fault", "inconclusive"), report.summary
    named = report.culprits
    assert all("node00001" in link for link in named["links"]) and set(named["hosts"]) <= {"node00001"}
    assert not named["ranks"] or {job.host_of(r) for r in named["ranks"]} == {"node00001"}


def test_gloo_mode_writes_what_the_real_gloo_dumps_hold(make_job):
    """The generator's Gloo dumps against fixtures/healthy (a real one): one unnamed pg_config, 'gloo:' names,
    every entry 'scheduled' with no start or completion time, no send or receive. The config lists the world's
    ranks only while a job has no group but the default one (fixtures/healthy), none once it makes subgroups
    (fixtures/subgroups_per_host), as every generated job does."""
    from flightrec.ingest.safe_read import loads_plain_pickle

    from .conftest import FIXTURES

    real = loads_plain_pickle((FIXTURES / "healthy" / "nccl_trace_rank_0").read_bytes())
    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, backend="gloo", timing=False))
    made = loads_plain_pickle((out / "nccl_trace_rank_0").read_bytes())
    assert list(made["pg_config"]) == list(real["pg_config"]) == [""]
    with_subgroups = loads_plain_pickle((FIXTURES / "subgroups_per_host" / "node0" / "nccl_trace_rank_0").read_bytes())
    assert real["pg_config"][""]["ranks"] == "[0, 1, 2, 3]"
    assert made["pg_config"][""]["ranks"] == with_subgroups["pg_config"][""]["ranks"] == "[]"
    for dump in (real, made):
        entries = dump["entries"]
        assert {e["state"] for e in entries} == {"scheduled"} and not any(e["is_p2p"] for e in entries)
        assert all(e["profiling_name"].startswith("gloo:") for e in entries)
        assert all(e["time_discovered_completed_ns"] is None for e in entries)
        assert set(real["entries"][0]) - {"frames"} <= set(entries[0])


def test_gloo_generator_keys_no_group_used_only_for_sends_and_receives(make_job):
    """As torch 2.13's Gloo writes pg_status (fixtures/record_p2p_keys.py, a real run): a key per group with a
    recorded entry; none for a pipeline group, used only for sends and receives, which Gloo never records."""
    from flightrec.ingest.safe_read import loads_plain_pickle

    out, _ = make_job(synth.Job(tp=2, pp=2, dp=2, backend="gloo", timing=False))
    for path in out.rglob("nccl_trace_rank_*"):
        dump = loads_plain_pickle(path.read_bytes())
        recorded = {str(e["pg_id"]) for e in dump["entries"]}
        assert set(dump["pg_status"]) == recorded
        assert {e["process_group"][1] for e in dump["entries"]} == {"default_pg", "tp", "dp"}
        # (local ids count the rank's groups in the order it made them: the pipeline group's is the gap)
        assert max(map(int, recorded)) + 1 > len(recorded)


def test_gloo_pipeline_ranks_that_went_on_past_their_last_entry_are_suspects_not_culprits(make_job):
    """Gloo records no send or receive, and keeps no counter for a group used only for them. Rank 5 stops
    before a tp all_reduce; the next stage's ranks 6 and 7, blocked in a receive from it, stop past their last
    entry as it does, and were named with it. Which of them holds the others the dumps can't say: a stage that
    never sends stops its neighbours the same way (sweep: 4 of 6 such jobs had the cause in a stage that stopped
    whole). They are listed as suspects, none named."""
    job = synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, backend="gloo", timing=False,
                    fault=synth.Fault(kind="not_joined", rank=5))
    report, truth = run(make_job, job, per_host_folders=True)
    assert truth["ranks"] == [5]
    assert report.verdict == "inconclusive" and report.culprits["ranks"] == [], report.summary
    suspects = report.findings[0]
    assert suspects.kind == "waiting" and suspects.evidence["in_unrecorded_transfers"] == "suspects"
    assert suspects.ranks == [5, 6, 7] and "send or receive" in report.summary and "send or receive" in suspects.message


@pytest.mark.parametrize("kind", ["size_mismatch", "type_mismatch"])
def test_gloo_pipeline_stages_stopped_past_their_last_entry_are_held_beside_a_mismatch(make_job, kind):
    """A mismatch in a tp group of a Gloo pipeline: the other stage's ranks, waiting to receive from the stuck
    one, stop past their last entries and their dp peers wait on them. They were named beside the mismatch;
    they are held by it (sweep, seed 7, jobs 138 and 230)."""
    job = synth.Job(tp=2, pp=2, dp=2, steps=3, ranks_per_host=2, microbatches=1, backend="gloo", timing=False,
                    seed=324939, fault=synth.Fault(kind=kind, rank=2, phase="tp"))
    report, truth = run(make_job, job, per_host_folders=True)
    assert report.culprits["ranks"] == truth["ranks"] == [2], report.summary
    held = next(f for f in report.findings if f.evidence.get("in_unrecorded_transfers"))
    assert held.role == "symptom" and held.evidence["in_unrecorded_transfers"] == "held" and 2 not in held.ranks


def test_gloo_pipeline_hang_in_transfers_alone_reads_healthy_with_a_warning_it_would_not_show(make_job):
    """A NIC down in a Gloo pipeline's first step: every rank stops in a send or receive, after collectives that
    all finished. Nothing recorded is behind or stuck: the verdict is healthy (so is a healthy job's, whose dumps
    read the same), with an `unrecorded_groups` warning that a hang in a send or receive would not show."""
    job = synth.Job(tp=2, pp=3, dp=2, steps=4, ranks_per_host=4, microbatches=1, backend="gloo", timing=False,
                    seed=469536, fault=synth.Fault(kind="nic_down", rank=6, phase="p2p", step=0,
                                                   hosts=("node00001",)))
    report, _ = run(make_job, job, per_host_folders=True)
    # (the situation seed 469536 builds: every collective recorded finished; the hang is in the transfers)
    assert set(report.matching.collectives["status"].cast(pl.String)) == {"matched"}
    assert report.verdict == "healthy" and report.exit_code == 0, report.summary
    # (and, Gloo listing no world once a job makes subgroups, that a lost last rank would not show either)
    assert [f.kind for f in report.findings] == ["unrecorded_groups", "world_size_unknown"]
    assert report.findings[0].ranks
    assert "a Gloo send/recv hang would not show" in report.summary


@pytest.mark.parametrize("tp, pp", [(2, 1), (4, 1), (2, 2), (1, 3)])
def test_healthy_gloo_jobs_stay_healthy_whatever_groups_they_never_used(make_job, tp, pp):
    """Jobs make groups they never record in (one-rank pipeline groups with pp 1, pipeline groups used only for
    sends and receives): a key missing from pg_status. That alone is a warning, not a reason to doubt the job
    (review: healthy Gloo jobs read inconclusive)."""
    report, _ = run(make_job, synth.Job(tp=tp, pp=pp, dp=2, backend="gloo", timing=False))
    assert report.verdict == "healthy" and report.culprits["ranks"] == [], report.summary


@pytest.mark.parametrize("lost", [2, 6])
def test_gloo_a_rank_waiting_to_receive_from_a_lost_one_is_not_named_in_its_place(make_job, lost):
    """Rank `lost` never posts its send (Gloo pipeline, tp 2 x pp 2 x dp 2) and its dump is lost. The rank
    waiting to receive from it stopped past its last entry, and was named alone once the lost rank, whose
    waiters it shares, was cleared by it (review). It is held: the two may hold each other."""
    job = synth.Job(tp=2, pp=2, dp=2, ranks_per_host=2, microbatches=1, backend="gloo", timing=False, seed=5,
                    fault=synth.Fault(kind="not_joined", rank=lost, phase="p2p"))
    out, truth = make_job(job, per_host_folders=True)
    assert truth["ranks"] == [lost]
    _damage(out, lost)
    report = analyze(out)
    assert set(report.culprits["ranks"]) <= {lost}, report.summary
    held = next(f for f in report.findings if f.evidence.get("in_unrecorded_transfers"))
    assert held.evidence["in_unrecorded_transfers"] == "held" and lost not in held.ranks


def test_gloo_host_down_its_groups_without_the_lost_rank_are_not_read_as_complete_and_stuck(make_job):
    """Gloo dumps declare no groups: they are read from who used them, so a dp group whose other member died
    with its dump read as the group {1}, complete and stuck in flight, and host node00001 was named down. The
    one short group of each kind takes the one rank without entries that no group of the kind holds."""
    job = synth.Job(tp=2, pp=1, dp=2, ranks_per_host=1, backend="gloo", timing=False,
                    fault=synth.Fault(kind="host_down", rank=3, phase="dp"))
    report, truth = run(make_job, job, fmt="json", per_host_folders=True)
    assert (report.culprits["ranks"], report.culprits["hosts"]) == ([3], ["node00003"]) == (truth["ranks"],
                                                                                           truth["hosts"])
    groups = {g: sorted(r) for g, r in report.trace.groups.select(pl.col("group").cast(pl.String), "ranks").iter_rows()}
    assert sorted(groups.values()) == [[0, 1], [0, 1, 2, 3], [0, 2], [1, 3], [2, 3]]


def test_gloo_host_down_groups_whose_lost_members_are_unknown_wait_on_the_ranks_that_could_be_them(make_job):
    """A host of 4 ranks (a whole tp group) down in a Gloo job: every dp group lost its other member, so all
    read as groups of one, alike, and nothing says which lost rank was in which. Before, each read as complete
    and stuck in flight, and the live host node00000 was named down. Their ranks wait on the ranks without a
    dump that no dp group holds: the lost host is named."""
    job = synth.Job(tp=4, pp=1, dp=2, ranks_per_host=4, backend="gloo", timing=False,
                    fault=synth.Fault(kind="host_down", rank=5, phase="dp"))
    report, truth = run(make_job, job, hosts_csv=True)
    assert report.culprits["ranks"] == truth["ranks"] == [4, 5, 6, 7], report.summary
    assert report.culprits["hosts"] == truth["hosts"] == ["node00001"]
    dp = report.trace.groups.filter(pl.col("pg_desc") == "dp")
    assert dp["ranks"].list.len().to_list() == [1] * 4
    assert not [f for f in report.findings if f.kind == "stuck_in_flight"]
    # The dumps list no world (Gloo, with subgroups), and the lost host is the last: its ranks are past the
    # highest seen. Each dp group left its all_reduce in flight with one member: 4 members lacking, 8 ranks.
    assert (report.trace.world_size, report.trace.world_size_from) == (8, "groups")
    assert [f.evidence["from"] for f in report.findings if f.kind == "world_size_unknown"] == ["groups left in flight"]


@pytest.mark.parametrize("fault", [synth.Fault(kind="not_joined", rank=4, step=0, phase="tp"),
                                   synth.Fault(kind="dead_link", rank=3, step=-1, phase="p2p",
                                               hosts=("node00000", "node00001"))])
def test_gloo_a_hang_in_the_first_step_with_every_dump_there_adds_no_rank(make_job, fault):
    """A review's cases: every dump is there, but some live rank has not reached a group's first collective
    (a hang in the first step), so that group reads with one member and its collective in flight. The rank
    that group lacks is one of the world seen that no group of the kind holds: no rank past the highest is
    added (the first version added ranks 8-9 and named a host that does not exist)."""
    job = synth.Job(tp=2, pp=2, dp=2, steps=3 if fault.kind == "not_joined" else 1, ranks_per_host=2,
                    backend="gloo", timing=False, fault=fault)
    report, truth = run(make_job, job)
    assert not truth["missing_ranks"]
    assert (report.trace.world_size, report.trace.world_size_from) == (8, "seen")
    assert report.trace.missing_ranks == []
    assert all(r < 8 for r in report.culprits["ranks"]), report.summary


def test_gloo_a_host_down_whose_ranks_no_group_names_is_still_waited_on(make_job, monkeypatch):
    """Held-out sweep (seed 101, job 129): 16 Gloo ranks, host 0 (ranks 0-7) down. The dumps left name no group
    holding a lost rank (no world collective in the window), so the lost ranks were in no group's member list:
    every dp group read as a complete group of one, stuck in flight, and the live host1 was named down. The
    world's ranks without a dump (from Gloo's unnamed config) are the candidates for the short groups."""
    job = synth.Job(tp=2, pp=4, dp=2, steps=4, ranks_per_host=8, microbatches=4, version="2.9", timing=False,
                    seed=320808, buffer_size=2000, backend="gloo",
                    fault=synth.Fault(kind="host_down", rank=1, step=0, phase="dp"))
    out, truth = make_job(job)
    report = analyze(out, ranks_per_host=8)
    assert report.culprits["ranks"] == truth["ranks"] == list(range(8)), report.summary
    assert report.culprits["hosts"] == ["host0"]
    assert not [f for f in report.findings if f.kind == "stuck_in_flight"]
    # (8 groups x 8 lost ranks: over a cap, the guess is dropped rather than making millions of edges)
    guessed = wait_graph._lost_members(report.matching.progress, report.trace.groups, report.trace.missing_ranks)
    assert guessed.height == 64
    monkeypatch.setattr(wait_graph, "MAX_GUESSED_MEMBERS", 63)
    assert wait_graph._lost_members(report.matching.progress, report.trace.groups, report.trace.missing_ranks).height == 0


def test_gloo_a_host_down_that_took_one_member_of_each_evenly_spaced_group_is_named(make_job):
    """Held-out sweep (seed 202, job 73): 24 Gloo ranks, host node00000 (ranks 0-7) down, per-host folders.
    Every dp group read as two members ({8, 16}, {9, 17}, ...), all alike, and the 8 lost ranks also divide into
    4 groups of 2: they were taken for whole groups of their own, every dp group read as complete and stuck in
    flight, and a link between the two live hosts was named. Each group's next place (0 before 8, 16) is a
    lost rank: a member of each is lost."""
    job = synth.Job(tp=4, pp=2, dp=3, steps=4, ranks_per_host=8, microbatches=4, timing=False, seed=36451,
                    buffer_size=2000, backend="gloo", fault=synth.Fault(kind="host_down", rank=7, step=-1, phase="dp"))
    report, truth = run(make_job, job, per_host_folders=True, fmt="json")
    assert culprits(report) == (truth["ranks"], ["node00000"], []) == (list(range(8)), truth["hosts"], [])
    assert not [f for f in report.findings if f.kind == "stuck_in_flight"]


@pytest.mark.parametrize("keep", [None, 0.8])
def test_a_mismatch_whose_partner_lost_its_dump_is_settled_by_the_peer_groups(make_job, keep):
    """Rank 4 broadcasts where its dp group {1, 4} all_reduces, and rank 1's dump is lost (or cut short): no
    member present shows the mismatch, and rank 1 was named for never joining. Every other dp group ran an
    all_reduce at that seq, after the same history: rank 4 is the one that diverged."""
    job = synth.Job(tp=1, pp=3, dp=2, steps=4, fault=synth.Fault(kind="type_mismatch", rank=4, phase="dp"))
    out, truth = make_job(job)
    _damage(out, 1, keep)
    report = analyze(out)
    assert culprits(report)[0] == truth["ranks"] == [4], report.summary
    root = report.root_causes[0]
    assert (root.kind, root.op, root.evidence["minority"], root.evidence["peer_groups"]) == (
        "mismatch", "all_reduce", "broadcast", 2)
    assert "other members' dumps are lost or cut short" in root.message


def _gloo_job(tp, pp, dp, per_host, seed, fault):
    return synth.Job(tp=tp, pp=pp, dp=dp, steps=4 if dp == 8 else 3, ranks_per_host=per_host, microbatches=2,
                     version="2.9", timing=False, seed=seed, backend="gloo", fault=fault)


def test_gloo_a_lost_dump_whose_waiters_wait_in_unrecorded_transfers_takes_no_blame(make_job):
    """Dead link node00001 <-> node00002 in a Gloo pipeline, rank 0's dump lost. Ranks 15-17 wait in sends or
    receives Gloo does not record; their last entry is in the world group, where rank 0 is missing, so they
    read as waiting on it, and it was named. What holds them is the transfer (as undamaged: inconclusive)."""
    job = _gloo_job(1, 3, 8, 8, 219582, synth.Fault(kind="dead_link", rank=16, phase="dp",
                                                    hosts=("node00002", "node00001")))
    out, _ = make_job(job, per_host_folders=True)
    _damage(out, 0)
    report = analyze(out)
    assert report.verdict == "inconclusive" and report.culprits["ranks"] == [], report.summary
    assert next(f for f in report.findings if f.kind == "missing_dump").role == "warning"


def test_gloo_a_lost_dump_beside_groups_held_by_unrecorded_transfers_takes_no_blame(make_job):
    """A dead NIC on node00007 in a Gloo pipeline (pp 3 x dp 3, a rank a host), rank 6's dump cut short. Rank
    6's dp peers wait on it; the other dp groups wait, at the same seq, only on ranks waiting in transfers Gloo
    does not record (7 and 8). Rank 6, a last stage like them, may well be held the same way: host node00006
    was named down."""
    job = synth.Job(tp=1, pp=3, dp=3, steps=3, ranks_per_host=1, microbatches=1, version="2.9", timing=False,
                    seed=973650, backend="gloo", fault=synth.Fault(kind="nic_down", rank=7, phase="p2p",
                                                                    hosts=("node00007",)))
    out, _ = make_job(job, per_host_folders=True)
    _damage(out, 6, keep=0.7)
    report = analyze(out)
    assert report.verdict == "inconclusive" and "node00006" not in report.culprits["hosts"], report.summary


def test_gloo_a_lost_dump_whose_tp_peers_are_all_in_a_mismatch_is_a_warning(make_job):
    """Rank 4 all_gathers the wrong size in its tp group {0-7}; rank 7's dump is lost. Its dp peers wait on
    it, but its tp peers are all in the mismatch: it is likely there too, and only rank 4 is named."""
    job = synth.Job(tp=8, pp=1, dp=3, steps=4, ranks_per_host=1, microbatches=2, version="2.4", timing=False,
                    seed=877052, backend="gloo", fault=synth.Fault(kind="size_mismatch", rank=4, step=0, phase="tp"))
    out, truth = make_job(job)
    _damage(out, 7)
    report = analyze(out)
    assert culprits(report)[0] == truth["ranks"] == [4], report.summary
    assert next(f for f in report.findings if f.kind == "missing_dump").role == "warning"


def test_gloo_a_whole_host_down_is_named_beside_lost_bystander_dumps(make_job):
    """Host node00005 (ranks 10, 11) down in a Gloo pipeline, and ranks 0 and 15 lost their dumps too. The dp
    groups are short of unknown members and their ranks wait on the four lost ranks; ranks 8 and 9 wait in
    transfers Gloo does not record. A whole host silent is named; the two bystanders are warnings."""
    job = synth.Job(tp=2, pp=2, dp=4, steps=3, ranks_per_host=2, microbatches=4, version="2.7", timing=False,
                    seed=959941, backend="gloo", fault=synth.Fault(kind="host_down", rank=10, phase="tp"))
    out, truth = make_job(job, per_host_folders=True)
    _damage(out, 0)
    _damage(out, 15)
    report = analyze(out)
    assert (report.culprits["ranks"], report.culprits["hosts"]) == ([10, 11], ["node00005"]) == (
        truth["ranks"], truth["hosts"]), report.summary


def _gloo(tp, pp, dp, per_host, fault):
    return synth.Job(tp=tp, pp=pp, dp=dp, ranks_per_host=per_host, backend="gloo", timing=False, fault=fault)


@pytest.mark.parametrize("tp, pp, culprit, lost", [
    # Rank 5 never joins a dp all_reduce; the whole tp group {0, 1} lost its dumps. The other tp groups are then
    # all alike, and were taken as short of the lost ranks: rank 5, in its tp group at the end, waited on them
    # and the lost host was named. Two lost ranks make a whole tp group of their own.
    (2, 2, 5, (0, 1)),
    # Ranks 1 and 3 lost their dumps (dp group {1, 3} whole, one member of each tp group): the tp groups read
    # {0} and {2}, which may be short of them. Rank 2 stopped before its dp all_reduce, after a tp op its
    # pg_status says finished: it is not held in tp, and is named.
    (2, 1, 2, (1, 3)),
])
def test_gloo_lost_dumps_in_groups_of_guessed_members_hold_no_live_culprit(make_job, tp, pp, culprit, lost):
    job = _gloo(tp, pp, 2, 2, synth.Fault(kind="not_joined", rank=culprit, phase="dp"))
    out, truth = make_job(job, per_host_folders=True)
    for rank in lost:
        _damage(out, rank)
    report = analyze(out)
    assert culprits(report)[0] == truth["ranks"] == [culprit], report.summary


@pytest.mark.parametrize("per_host, lost, keep", [
    (4, (6,), None),        # a bystander's dump deleted: 'rank 6 left no dump, and 7 ranks wait on it'
    (2, (6, 7), None),      # a bystander host's: 'host node00003 is down'
    (4, (6,), 0.7),         # cut after its first world all_reduce, before the second (sweep seed 7, job 103)
])
def test_gloo_a_lost_dump_in_a_collective_a_member_completed_holds_no_one(make_job, per_host, lost, keep):
    """Rank 1 never joins its tp all_gather and stops after the world all_reduce before it, which its pg_status
    says finished. Gloo records no states: rank 1's last entry, in the world group, reads as where it waits,
    on the members whose dump is lost or cut. But a collective completes only once every member joined it: so
    far, the lost ones got at least (`progress.enqueued_at_least`), and rank 1, held by no one, is named."""
    job = _gloo(4, 1, 2, per_host, synth.Fault(kind="not_joined", rank=1, phase="tp", step=2))
    out, truth = make_job(job, per_host_folders=True)
    for rank in lost:
        _damage(out, rank, keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (a cut file's)
        report = analyze(out, use_cache=False)
    world = report.matching.progress.filter(pl.col("group").cast(pl.String) == "0")
    lost_rows = world.filter(pl.col("rank").is_in(list(lost)))
    assert not lost_rows["has_dump"].any()
    assert (lost_rows["enqueued_at_least"] == world.filter(pl.col("rank") == 1)["last_completed"].item()).all()
    assert culprits(report)[0] == truth["ranks"] == [1], report.summary


def test_a_lone_mismatch_is_settled_only_by_whole_peer_groups_two_at_least(make_job):
    """A dp size mismatch by rank 3 in a job of two dp groups, ranks 1 and 2 lost: each group holds one member
    and each read as the lone one against the other, naming live rank 0 too. Two peer groups must agree, one
    at least missing no member: here none is whole, and no live rank is named for a mismatch."""
    job = synth.Job(tp=1, pp=2, dp=2, ranks_per_host=2, fault=synth.Fault(kind="size_mismatch", rank=3, phase="dp"))
    out, _ = make_job(job, per_host_folders=True)
    _damage(out, 1)
    _damage(out, 2)
    report = analyze(out)
    assert 0 not in culprits(report)[0] and not [f for f in report.root_causes if f.kind == "mismatch"], report.summary


def test_gloo_a_lone_mismatch_in_a_group_kept_short_is_settled_by_its_peers(make_job):
    """Rank 6 runs BFloat16 in its dp all_reduce; host node00001 (ranks 2, 3) lost its dumps, so dp group
    {6, 2} reads {6}, kept short. Its peer dp groups all ran Float: rank 6 is named, not the lost host."""
    job = _gloo(2, 2, 2, 2, synth.Fault(kind="dtype_mismatch", rank=6, phase="dp"))
    out, truth = make_job(job, per_host_folders=True)
    _damage(out, 2)
    _damage(out, 3)
    report = analyze(out)
    assert culprits(report)[0] == truth["ranks"] == [6], report.summary


def test_gloo_a_crashed_rank_with_no_host_known_is_named_beside_its_waiting_pipeline_neighbours(make_job):
    """A Gloo pipeline (pp 4 x dp 2), rank 2 gone with no file, no host mapping. Its neighbours wait on it in
    sends and receives Gloo does not record: they don't clear it (they may be waiting on it)."""
    job = _gloo(1, 4, 2, 1, synth.Fault(kind="host_down", rank=2, phase="p2p", hosts=("node00002",)))
    out, truth = make_job(job)
    report = analyze(out)
    assert culprits(report)[0] == truth["ranks"] == [2], report.summary


@pytest.mark.parametrize("layout, fault, keep, want, keeps_none_of_the_stuck_group", [
    # the link's own end: rank 2, alone on node00002, cut before its stuck dp all_reduce
    (dict(tp=2, pp=1, dp=2, ranks_per_host=1),
     synth.Fault(kind="dead_link", rank=0, phase="dp", hosts=("node00000", "node00002")), (2, 0.6),
     ([], [], [["node00000", "node00002"]]), False),
    # a bystander in the stuck world all_reduce (sweep seed 7, job 86: 'rank 3 left a dump cut short, and 95 ranks
    # wait on it'), now read as in flight on every member
    (dict(tp=2, pp=1, dp=4, ranks_per_host=2),
     synth.Fault(kind="dead_link", rank=0, phase="dp", hosts=("node00000", "node00003")), (3, 0.6), None, False),
    # a bystander cut before any of its world-group entries (sweep seed 7, job 24: 'rank 47 left a dump cut
    # short, and 63 ranks wait on it'): only the default group's local id, 0, ties its pg_status to the group
    (dict(tp=8, pp=4, dp=2, ranks_per_host=2, version="2.10", timing=False),
     synth.Fault(kind="dead_link", rank=38, phase="p2p", step=1, hosts=("node00019", "node00031")), (47, 0.6), None,
     True),
])
def test_a_cut_dumps_pg_status_says_it_joined_the_stuck_collective(make_job, layout, fault, keep, want,
                                                                   keeps_none_of_the_stuck_group):
    """A dump cut short loses its newest entries, but its pg_status (written before them) survives: NCCL's
    counter says the rank enqueued the collective the others are stuck in. It joined: nobody waits on it, and
    it is a member of the stuck collective for group testing."""
    out, _ = make_job(synth.Job(**layout, steps=3, fault=fault), per_host_folders=True)
    _damage(out, *keep)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the cut file's)
        # (with NCCL timing off no stamp says how long the collectives waited: the watchdog dumped, the user says)
        report = analyze(out, use_cache=False, trigger="timeout" if not layout.get("timing", True) else "auto")
    cut = report.matching.progress.filter(pl.col("rank") == keep[0])
    assert cut["enqueued_at_least"].drop_nulls().len() > 0 and not cut["has_dump"].any()
    kept = report.trace.entries.filter(pl.col("rank") == keep[0])["group"].unique()
    stuck = report.matching.collectives.filter(pl.col("status") == "in_flight")["group"].unique()
    assert stuck.is_in(kept.implode()).any() != keeps_none_of_the_stuck_group
    assert not [f for f in report.findings if f.kind == "missing_dump" and f.role == "root_cause"], report.summary
    if want is None:
        assert report.verdict == "inconclusive" and "in flight on every member" in report.summary, report.summary
        assert keep[0] in next(f for f in report.findings if f.kind == "stuck_in_flight").ranks
    else:
        assert culprits(report) == want, report.summary


def test_a_mismatch_against_a_cut_member_is_no_hang_below_the_collectives(make_job):
    """Rank 4 all_reduces in BFloat16 in dp group {1, 4}; rank 1's dump is cut before that collective, its
    pg_status kept: it joined. The peer groups settle the mismatch; the collective, in flight on both members,
    is not also a stuck group naming link node00000 <-> node00002 (sweep seed 7, job 8)."""
    job = synth.Job(tp=1, pp=3, dp=2, ranks_per_host=2, steps=6, microbatches=2, buffer_size=200, seed=918812,
                    fault=synth.Fault(kind="dtype_mismatch", rank=4, phase="dp"))
    out, truth = make_job(job, per_host_folders=True)
    _damage(out, 1, keep=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (the cut file's)
        report = analyze(out, use_cache=False)
    assert [(f.kind, f.ranks) for f in report.root_causes] == [("mismatch", [4])], report.summary


@pytest.mark.parametrize("timing, lost, tp, dp, step", [
    (True, (1, 9, 21, 30), 4, 4, -1),
    (False, (0, 22), 4, 4, -1),
    (True, (3, 25), 2, 8, 1),
])
def test_lost_bystander_dumps_beside_a_host_down_are_warnings_under_it(make_job, timing, lost, tp, dp, step):
    """At scale some dumps go missing beside a real fault. Host node00003 (ranks 12-15) down, and bystanders
    on other hosts lost their dumps too: every group that waits on a bystander waits on the host's ranks as
    well, and the host is waited on in more. The host is the one root cause (it was named among one per lost
    dump, not first: 15 root causes, the host seventh, with 20 lost at 256 ranks); the bystanders are a warning
    that says what overshadows them and that they may be down too."""
    job = synth.Job(tp=tp, pp=2, dp=dp, ranks_per_host=4, timing=timing,
                    fault=synth.Fault(kind="host_down", rank=13, phase="dp", step=step))
    out, truth = make_job(job, per_host_folders=True)
    for rank in lost:
        _damage(out, rank)
    report = analyze(out)
    jsonschema.validate(report.to_dict(), SCHEMA)
    assert culprits(report) == (truth["ranks"], truth["hosts"], []) == ([12, 13, 14, 15], ["node00003"], []), \
        report.summary
    assert report.summary.startswith("FAULT: host node00003 down") and "more" not in report.summary
    warning = next(f for f in report.findings if f.kind == "missing_dump" and f.role == "warning")
    assert warning.ranks == sorted(lost) and warning.evidence["overshadowed_by"] == [12, 13, 14, 15]
    assert "may be down too" in warning.message


def test_lost_dumps_waited_on_in_the_same_groups_alike_are_named_together(make_job):
    """Two lost dumps that the same groups wait on, neither a whole host: nothing tells which is why, so
    neither overshadows the other (one rank a host: a host of one rank silent says no more than a lost file).
    They are one root cause that says so, and, as every other rank joined the dp all_reduce they are waited on
    in, that their dumps may only be lost and the hang below the software (they were a root cause each)."""
    job = synth.Job(tp=1, pp=1, dp=8, ranks_per_host=1, fault=synth.Fault(kind="host_down", rank=3, phase="dp"))
    out, truth = make_job(job, per_host_folders=True)
    _damage(out, 6)
    report = analyze(out)
    assert culprits(report)[0] == [3, 6], report.summary
    assert not any(f.evidence.get("overshadowed_by") for f in report.findings)
    [root] = report.root_causes
    assert root.evidence["ambiguous"] and root.evidence["alike"] == ["3", "6"] and root.evidence["all_others_joined"]
    assert "can't say which" in root.message and "below the software" in root.message


def test_lost_dumps_alike_say_a_hang_below_only_where_every_member_with_a_dump_joined(make_job):
    """The clause 'or none is, and the hang is below the software' stands on every member with a dump having
    enqueued the group's frontier: one behind (here made so in the job's own progress table) takes it away."""
    job = synth.Job(tp=1, pp=1, dp=8, ranks_per_host=1, fault=synth.Fault(kind="host_down", rank=3, phase="dp"))
    out, _ = make_job(job, per_host_folders=True)
    _damage(out, 6)
    report = analyze(out)
    progress, group = report.matching.progress, report.root_causes[0].evidence["groups"]
    assert all_with_a_dump_joined(progress, group)
    behind = progress.with_columns(pl.when(pl.col("rank") == 5).then(pl.col("frontier") - 1)
                                   .otherwise(pl.col("last_enqueued")).alias("last_enqueued"))
    assert not all_with_a_dump_joined(behind, group)
    assert not all_with_a_dump_joined(progress, ["no such group"])


def test_a_lost_dump_whose_waiters_all_wait_on_a_host_down_through_others_is_a_warning(make_job):
    """Ranks 1 and 3 lost their dumps; rank 5 waits on them in its dp all_reduce, and on rank 7, behind in it,
    stuck in tp on host node00006, down. Everyone waiting on 1 and 3 waits on rank 6 (through 7): they are a
    warning under it (they were a root cause: 'the dumps can't say which')."""
    job = synth.Job(tp=2, pp=1, dp=4, ranks_per_host=1, fault=synth.Fault(kind="host_down", rank=6, phase="tp"))
    out, truth = make_job(job, per_host_folders=True)
    _damage(out, 1)
    _damage(out, 3)
    report = analyze(out)
    assert culprits(report)[:2] == (truth["ranks"], truth["hosts"]) == ([6], ["node00006"]), report.summary
    warning = next(f for f in report.findings if f.evidence.get("overshadowed_by"))
    assert warning.ranks == [1, 3] and warning.evidence["overshadowed_by"] == [6]


@pytest.mark.parametrize("lost", [None, 4])
def test_gloo_the_middle_host_of_three_down_leaves_dp_groups_short_not_stuck(make_job, lost):
    """Gloo, tp 2 x pp 4 x dp 3 on three hosts of 8: the middle host down takes the middle member of every dp
    group (0, 8, 16 reads 0, 16). Read as complete, the dp groups were stuck in flight on every member and a
    link between the two live hosts was named; the place halfway between a group's two known ranks is a lost
    rank in every one of them, so each lacks a member, and the host down is named. With rank 4's dump lost
    too (sweep seed 7, job 274) one dp group reads shorter than the rest, and the rest lack members all the
    same."""
    job = synth.Job(tp=2, pp=4, dp=3, steps=3, ranks_per_host=8, microbatches=2, version="2.4", timing=False,
                    seed=832080, backend="gloo", fault=synth.Fault(kind="host_down", rank=10, phase="dp"))
    out, truth = make_job(job, per_host_folders=True)
    if lost is not None:
        _damage(out, lost)
    report = analyze(out)
    assert culprits(report) == (truth["ranks"], truth["hosts"], []) == (list(range(8, 16)), ["node00001"], []), \
        report.summary


def test_collectives_in_flight_everywhere_with_no_time_to_say_how_long_read_healthy_with_a_note(make_job):
    """The dead link of `test_a_dead_link_whose_ends_both_completed_elsewhere_names_no_bystander_host`, with NCCL
    timing off: no stamp says how long the collectives in flight had waited. Read where the watchdog wrote them,
    the files' times are its signature (written as the oldest op reached its timeout): a hang. Copied later
    (their times the copy's), nothing says, and a running job's snapshot reads the same: healthy, with a note
    that says how to settle it; `trigger="timeout"` does."""
    job = synth.Job(tp=1, pp=2, dp=8, steps=6, ranks_per_host=2, microbatches=4, timing=False, seed=250180,
                    buffer_size=200, fault=synth.Fault(kind="dead_link", rank=9, step=2, phase="dp",
                                                       hosts=("node00004", "node00001")))
    out, _ = make_job(job, per_host_folders=True)
    in_place = analyze(out)
    assert in_place.verdict == "inconclusive", in_place.summary
    for path in out.rglob("nccl_trace_rank_*"):
        later = path.stat().st_mtime_ns + 3 * 3600 * 10**9   # (copied three hours after)
        os.utime(path, ns=(later, later))
    copied = analyze(out, use_cache=False)
    assert copied.verdict == "healthy", copied.summary
    assert "--trigger timeout" in copied.next_step
    assert [f.kind for f in copied.findings if f.kind == "in_flight_at_dump"] == ["in_flight_at_dump"]
    assert analyze(out, use_cache=False, trigger="timeout").verdict == "inconclusive"


def test_with_timing_on_the_dump_itself_says_the_collectives_timed_out(make_job):
    """NCCL timing on: the dump stamps each op it finds started, at its own moment: ten minutes after the hang,
    past the 600 s timeout. Proof of a hang, whatever the files' times."""
    job = synth.Job(tp=2, pp=4, dp=2, ranks_per_host=2,
                    fault=synth.Fault(kind="dead_link", rank=2, hosts=("node00001", "node00002")))
    report, _ = run(make_job, job, per_host_folders=True)
    assert report.verdict == "fault" and report.root_causes[0].kind == "stuck_in_flight", report.summary
