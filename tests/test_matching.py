"""Matching rules on small hand-built frames: one rule per test, no files."""

import polars as pl

from flightrec.analysis.matching import match
from flightrec.model.schema import GROUPS, MEMBERS, PG_STATUS, conform
from flightrec.model.trace import DUMPS_WITH_LOADED, ENTRIES_WITH_GROUP


def entry(rank, seq, op="all_reduce", *, group="g", state="completed", ins="[[8]]", outs=None, dtype="Float",
          record=None, n_in=8, n_out=None, p2p=False, p2p_seq=0, peer=None, name=None):
    return {
        "rank": rank, "group": group, "pg_name": group, "pg_desc": "tp", "pg_id": 1, "record_id": record if record is not None else seq,
        "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op": op, "profiling_name": name or f"nccl:{op}",
        "is_p2p": p2p, "peer": peer, "state": state, "input_sizes": ins, "output_sizes": outs or ins,
        "input_dtypes": dtype, "output_dtypes": dtype, "input_numel": n_in,
        "output_numel": n_out if n_out is not None else n_in, "time_created_ns": 1000 * seq + rank,
    }


def run(rows, ranks=(0, 1, 2, 3), wrapped=False, backend="nccl", group_ranks=None, pg_status=None):
    group_ranks = list(group_ranks or ranks)
    entries = conform(pl.DataFrame(rows, infer_schema_length=None), ENTRIES_WITH_GROUP).sort("rank", "record_id")
    groups = conform(pl.DataFrame({"group": ["g"], "pg_name": ["g"], "pg_desc": ["tp"], "size": [len(group_ranks)],
                                   "ranks": [group_ranks], "source": ["pg_config"]}), GROUPS)
    members = conform(pl.DataFrame({"group": ["g"] * len(group_ranks), "rank": group_ranks,
                                    "local_rank": list(range(len(group_ranks)))}), MEMBERS)
    dumps = conform(pl.DataFrame({"rank": list(ranks), "loaded": [True] * len(ranks), "wrapped": [wrapped] * len(ranks),
                                  "backend": [backend] * len(ranks), "problems": [[]] * len(ranks)}), DUMPS_WITH_LOADED)
    return match(entries, groups, members, dumps, conform(pl.DataFrame(pg_status or [], schema=PG_STATUS), PG_STATUS))


def status(m, seq):
    return m.collectives.filter(pl.col("collective_seq_id") == seq)["status"][0]


def test_all_matched():
    m = run([entry(r, s) for r in range(4) for s in (1, 2)])
    assert m.collectives["status"].to_list() == ["matched", "matched"]
    assert m.divergences.height == 0


def test_not_joined_names_the_laggard():
    rows = [entry(r, s) for r in range(4) for s in (1, 2) if not (r == 2 and s == 2)]
    rows = [dict(e, state="started") if e["collective_seq_id"] == 2 else e for e in rows]
    m = run(rows)
    assert status(m, 2) == "not_joined"
    d = m.divergences.row(0, named=True)
    assert (d["collective_seq_id"], d["ranks"], d["ambiguous"]) == (2, [2], False)
    prog = m.progress.filter(pl.col("rank") == 2).row(0, named=True)
    assert (prog["last_enqueued"], prog["behind"]) == (1, 1)


def test_type_mismatch_minority():
    rows = [entry(r, 1, op="all_gather" if r == 3 else "all_reduce") for r in range(4)]
    d = run(rows).divergences.row(0, named=True)
    assert (d["status"], d["ranks"], d["majority"], d["minority"]) == ("type_mismatch", [3], "all_reduce", "all_gather")


def test_dtype_mismatch_minority():
    d = run([entry(r, 1, dtype="BFloat16" if r == 0 else "Float") for r in range(4)]).divergences.row(0, named=True)
    assert (d["status"], d["ranks"]) == ("dtype_mismatch", [0])


def test_a_missing_field_is_unknown_not_a_disagreement():
    """A rank whose recorder left out a field (dtypes, shapes, the op's name) did not run another one: null is
    unknown, never a mismatch; a known value that differs still is, with the unknown rank on neither side."""
    assert status(run([entry(r, 1, dtype=None if r == 3 else "Float") for r in range(4)]), 1) == "matched"
    assert status(run([entry(r, 1, dtype=None) for r in range(4)]), 1) == "matched"
    assert status(run([entry(r, 1, ins=None if r == 3 else "[[8]]", n_in=None if r == 3 else 8)
                       for r in range(4)]), 1) == "matched"
    mixed = run([entry(r, 1, dtype={0: "Half", 3: None}.get(r, "Float")) for r in range(4)])
    d = mixed.divergences.row(0, named=True)
    assert (d["status"], d["ranks"], d["ambiguous"]) == ("dtype_mismatch", [0], False)


def test_size_mismatch_minority():
    d = run([entry(r, 1, ins="[[16]]" if r == 1 else "[[8]]") for r in range(4)]).divergences.row(0, named=True)
    assert (d["status"], d["ranks"]) == ("size_mismatch", [1])


def test_all_gather_output_must_be_input_times_group_size():
    rows = [entry(r, 1, op="all_gather", ins="[[8]]", outs="[[32]]", n_in=8, n_out=32) for r in range(3)]
    rows.append(entry(3, 1, op="all_gather", ins="[[8]]", outs="[[24]]", n_in=8, n_out=24))
    d = run(rows).divergences.row(0, named=True)
    assert (d["status"], d["ranks"]) == ("size_mismatch", [3])


def test_reduce_scatter_input_must_be_output_times_group_size():
    ok = [entry(r, 1, op="reduce_scatter", ins="[[32]]", outs="[[8]]", n_in=32, n_out=8) for r in range(4)]
    assert status(run(ok), 1) == "matched"
    bad = ok[:3] + [entry(3, 1, op="reduce_scatter", ins="[[16]]", outs="[[8]]", n_in=16, n_out=8)]
    assert run(bad).divergences.row(0, named=True)["ranks"] == [3]


def test_all_to_all_uneven_splits_match_by_totals():
    rows = [entry(0, 1, op="all_to_all", ins="[[10]]", outs="[[6]]", n_in=10, n_out=6),
            entry(1, 1, op="all_to_all", ins="[[2]]", outs="[[6]]", n_in=2, n_out=6)]
    assert status(run(rows, ranks=(0, 1)), 1) == "matched"
    rows[1] = entry(1, 1, op="all_to_all", ins="[[3]]", outs="[[6]]", n_in=3, n_out=6)
    assert status(run(rows, ranks=(0, 1)), 1) == "size_mismatch"


def test_coalesced_batch_is_one_unit():
    def batch(r, second):
        return [entry(r, 1, op="all_reduce", ins="[[8]]", record=10, state="scheduled"),
                entry(r, 1, op="all_reduce", ins=second, record=11, state="scheduled"),
                entry(r, 1, op="coalesced", ins="[]", record=12, n_in=0, name="nccl:allreduce_coalesced")]
    same = [e for r in range(4) for e in batch(r, "[[4]]")]
    m = run(same)
    assert m.collectives.height == 1 and status(m, 1) == "matched"
    assert m.units.filter(pl.col("rank") == 0)["n_entries"].to_list() == [3]
    diff = [e for r in range(4) for e in batch(r, "[[2]]" if r == 2 else "[[4]]")]
    assert run(diff).divergences.row(0, named=True)["ranks"] == [2]


def test_batch_interleaved_with_another_groups_entry_is_still_one_unit():
    """Units are built from runs of consecutive entries; a batch split by another thread's entry (record 11,
    group h) must still come out as one unit (the key appears in two runs: matching falls back to the key)."""
    def batch(r):
        return [entry(r, 1, ins="[[8]]", record=10, state="scheduled"),
                entry(r, 5, group="h", record=11),
                entry(r, 1, ins="[[4]]", record=12, state="scheduled"),
                entry(r, 1, op="coalesced", ins="[]", record=13, n_in=0, name="nccl:allreduce_coalesced")]
    m = run([e for r in range(4) for e in batch(r)])
    g = m.units.filter(pl.col("group") == "g")
    assert g.height == 4 and g["n_entries"].to_list() == [3, 3, 3, 3]
    assert m.units.filter(pl.col("group") == "h")["n_entries"].to_list() == [1, 1, 1, 1]
    assert status(m, 1) == "matched"


def test_units_keep_record_order_so_progress_reports_the_latest_op():
    """progress takes each member's last op without sorting: units must come out in (rank, record) order,
    also when a coalesced batch goes through the multi-entry path."""
    rows = []
    for r in range(4):
        rows += [entry(r, 1, record=1),
                 entry(r, 2, ins="[[8]]", record=2, state="scheduled"),
                 entry(r, 2, ins="[[4]]", record=3, state="scheduled"),
                 entry(r, 2, op="coalesced", ins="[]", record=4, n_in=0, name="nccl:allreduce_coalesced"),
                 entry(r, 3, op="broadcast", record=5, state="started")]
    m = run(rows)
    assert m.units.select("rank", "record_id").rows() == [(r, rec) for r in range(4) for rec in (1, 2, 5)]
    last = m.progress.select("last_enqueued", "last_op", "last_state").unique().rows()
    assert last == [(3, "broadcast", "started")]


def test_in_flight_everywhere_and_state_disagreement():
    rows = [entry(r, 1, state="started") for r in range(4)]
    assert status(run(rows), 1) == "in_flight"
    rows = [entry(r, 1, state="completed" if r < 3 else "started") for r in range(4)]
    assert status(run(rows), 1) == "state_mismatch"


def test_gloo_never_in_flight():
    rows = [entry(r, 1, state="scheduled") for r in range(4)]
    assert status(run(rows, backend="gloo"), 1) == "matched"


def test_window_every_member_covers():
    """A wrapped buffer that lost seq 1-2 on rank 0 is no evidence of rank 0 missing them."""
    rows = [entry(r, s) for r in range(4) for s in (1, 2, 3, 4) if not (r == 0 and s < 3)]
    m = run(rows, wrapped=True)
    assert m.collectives["collective_seq_id"].to_list() == [3, 4]
    assert set(m.collectives["status"].to_list()) == {"matched"}


def test_keeps_going_after_the_first_mismatch():
    rows = [entry(r, s, dtype="Double" if (r == 1 and s in (1, 3)) else "Float") for r in range(4) for s in (1, 2, 3)]
    m = run(rows)
    assert m.collectives["status"].to_list() == ["dtype_mismatch", "matched", "dtype_mismatch"]
    assert m.divergences.row(0, named=True)["later_mismatches"] == 1


def test_tie_is_ambiguous():
    d = run([entry(r, 1, dtype="Double" if r < 2 else "Float") for r in range(4)]).divergences.row(0, named=True)
    assert d["ambiguous"] is True


def test_p2p_pairs_and_unmatched():
    def p2p(rank, op, peer, state, record):
        return entry(rank, 0, op=op, p2p=True, p2p_seq=record, peer=peer, state=state, record=record,
                     name=f"nccl:{op} 0->1", ins="[[4]]")
    rows = [p2p(0, "send", 1, "completed", 1), p2p(1, "recv", 0, "completed", 1),
            p2p(0, "send", 1, "started", 2)]
    m = run(rows, ranks=(0, 1))
    assert m.p2p["status"].to_list() == ["matched", "unmatched_send"]
    assert m.p2p.row(1, named=True)["send_rank"] == 0


def test_one_entry_units_read_like_aggregated_ones():
    """When no unit spans several entries, the entries are taken as the units without aggregating: nulls must
    come out as the aggregations give them (a null numel stays unknown, a null `retired` counts as all retired,
    a null time stays null), and a batch elsewhere in the job must not change the single-entry units."""
    singles = [dict(entry(r, 1), input_numel=None, retired=None, time_created_ns=None) for r in range(4)]
    singles += [entry(r, 2, state="started") for r in range(4)]
    fast = run(singles).units
    assert fast["n_entries"].to_list() == [1] * 8
    assert fast.filter(pl.col("collective_seq_id") == 1).select("input_numel", "retired", "time_created_ns").unique().rows() == [(None, True, None)]
    batch = [entry(r, 3, record=3, state="scheduled") for r in range(4)] + [
        entry(r, 3, op="coalesced", ins="[]", record=4, n_in=0, name="nccl:allreduce_coalesced") for r in range(4)]
    aggregated = run(singles + batch).units
    assert aggregated.filter(pl.col("collective_seq_id") < 3).equals(fast)
    assert aggregated.filter(pl.col("collective_seq_id") == 3)["n_entries"].to_list() == [2] * 4


def test_progress_is_the_newest_entry_not_pg_status_counters():
    """pg_status counters can run ahead of every entry (Gloo counts sends and receives it never records; NCCL's
    hold a p2p seq once p2p entries left the buffer): how far a rank got is its newest entry, and it can't
    have completed more than that."""
    rows = [entry(r, s) for r in range(4) for s in (1, 2)]
    ahead = [{"rank": r, "pg_id": 1, "last_enqueued": 90, "last_started": -1, "last_completed": 90} for r in range(4)]
    prog = run(rows, pg_status=ahead).progress
    assert set(prog["last_enqueued"].to_list()) == {2} and set(prog["last_completed"].to_list()) == {2}
    assert set(prog["behind"].to_list()) == {0}


def test_an_all_to_all_member_with_unknown_output_is_no_size_mismatch():
    rows = [entry(r, 1, op="all_to_all", outs=None if r == 3 else "[[8]]", n_out=None if r == 3 else 8)
            for r in range(4)]
    for row in rows:
        if row["rank"] == 3:
            row["output_sizes"], row["output_numel"] = None, None
    assert status(run(rows), 1) == "matched"


def test_an_all_gather_every_member_sizes_for_another_group_size_is_no_mismatch():
    """Every member's output is 4x its input in a group we hold as 5 (a world size given too large): the size
    is ours to doubt, not theirs; no member keeps the rule, so none breaks it against the others."""
    rows = [entry(r, 1, op="all_gather", ins="[[2]]", outs="[[4, 2]]", n_in=2, n_out=8) for r in range(4)]
    m = run(rows, ranks=(0, 1, 2, 3), group_ranks=[0, 1, 2, 3, 4])
    assert status(m, 1) != "size_mismatch"
    assert m.divergences.filter(pl.col("status") == "size_mismatch").height == 0

