"""Match collectives and point-to-point ops across ranks, for every process group at once.

Frames in, frames out, pure Polars. The evidence used holds whatever the recorder setting: sequence ids
(who enqueued what), shapes and dtypes (who did something else), and completion only where the rank's
recorder reports it (NCCL does, with or without timing; Gloo never does).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from flightrec.analysis.first_divergence import divergences
from flightrec.analysis.gpu_stalls import gpu_stalls
from flightrec.analysis.shape_rules import all_to_all_totals_ok, dtype_keys, known_op, shape_keys, size_rule_ok
from flightrec.model import dense_index as lookup
from flightrec.model.schema import (
    ANY_SOURCE,
    COLLECTIVES,
    P2P_OPS_SCHEMA,
    PROGRESS,
    TRUNCATED,
    Op,
    conform,
    ran_collectives,
    reports_completion,
)


@dataclass(frozen=True)
class Matching:
    """What matching found. Every frame has its schema in `flightrec.model.schema`.

    Attributes:
        units: one row per rank's part in a collective (coalesced entries folded into one unit).
        collectives: one row per (group, collective_seq_id) in the window every member's buffer covers.
        progress: one row per (group, member): how far it got, how far behind the group's frontier.
        divergences: each group's first collective where members disagree or some never joined.
        p2p: sends paired with receives; unmatched ones name both ends.
        gpu_stalls: ranks whose peers finished collectives with them that they never saw finish (`gpu_stalls`).
    """

    units: pl.DataFrame
    collectives: pl.DataFrame
    progress: pl.DataFrame
    divergences: pl.DataFrame
    p2p: pl.DataFrame
    gpu_stalls: pl.DataFrame


# ---------------------------------------------------------------------------------------------- predicates


def is_p2p_closer() -> pl.Expr:
    """The `coalesced` entry that closes a batch_isend_irecv: it follows the batch's sends/recvs on the same
    rank and group with the same p2p_seq_id (the writer records it with is_p2p False)."""
    prev = lambda c: pl.col(c).shift(1)  # noqa: E731  (entries are sorted by rank, record_id)
    return (
        (pl.col("op") == "coalesced")
        & (prev("rank") == pl.col("rank"))
        & (prev("group") == pl.col("group"))
        & prev("is_p2p").fill_null(False)
        & (prev("p2p_seq_id") == pl.col("p2p_seq_id"))
    )


def written_only_active(dumps: pl.DataFrame) -> bool:
    """The job's writer kept only unfinished entries (`TORCH_INCLUDE_ONLY_ACTIVE`: load's `only_active`)."""
    return "only_active" in dumps.columns and bool(dumps["only_active"].fill_null(False).any())


def tracks_completion(tracks: pl.DataFrame, entries: pl.DataFrame) -> pl.Expr:
    """Each entry's `tracks_completion` (from `completion_by_rank`), read by rank from a table laid out over
    every rank in `entries`: no join. Built once per matching, used by units and p2p pairing."""
    size = int(max(tracks["rank"].max() or 0, entries["rank"].max() or 0)) + 1
    laid_out = lookup.by_position(tracks, size)
    return lookup.read(laid_out, "tracks_completion", pl.col("rank"), in_range=lookup.covers(entries["rank"], size))


def completion_by_rank(entries: pl.DataFrame, dumps: pl.DataFrame) -> pl.DataFrame:
    """(rank, tracks_completion): the rank's recorder reports completion. Read from the backend, so a rank
    whose first op is the one that hung still counts; and from the states, for dumps of unknown backend."""
    # entries are in rank order (as `load` leaves them): flagged sorted, the groups are slices, not hashed (10x
    # faster at 31M entries; flagging the whole frame instead slows the runs in `collective_units` 4x)
    seen = (entries.lazy().select(pl.col("rank").set_sorted(), "state").group_by("rank")
            .agg(pl.col("state").is_in(["started", "completed"]).any().alias("_seen")).collect())
    backend = dumps.select("rank", pl.when(pl.col("backend").is_not_null())
                           .then(reports_completion(pl.col("backend"))).alias("_backend"))
    # A dump with no entry names no backend: its rank's is the job's, where every dump that names one agrees
    # (its pg_status counters then mean what theirs do: a dump cut before its entries, or one with nothing left)
    named = backend["_backend"].drop_nulls()
    job_wide = named.len() > 0 and bool(named.all())
    return (backend.join(seen, on="rank", how="full", coalesce=True)
            .select("rank", (pl.col("_backend").fill_null(job_wide) | pl.col("_seen").fill_null(False))
                    .alias("tracks_completion")))


# ---------------------------------------------------------------------------------------------- units


_UNIT_KEY = ["group", "collective_seq_id", "rank"]


# Each unit column read from one entry (a unit of its own) ...
_ONE_ENTRY = [
    pl.lit(1, pl.UInt32).alias("n_entries"),
    pl.col("op"), pl.col("input_sizes"), pl.col("output_sizes"), pl.col("input_dtypes"), pl.col("output_dtypes"),
    pl.col("input_numel"), pl.col("output_numel"),   # (null: unknown, which no size rule fails)
    pl.col("state"), pl.col("retired").fill_null(True), pl.col("record_id"), pl.col("stack_id"),
    pl.col("time_created_ns"), pl.col("time_completed_ns"), pl.col("tracks_completion"), pl.col("pg_id"),
    pl.col("timeout_ms"), pl.col("duration_ms"),
]
# ... and over a run of such rows. A coalesced batch of collectives shares one seq: its last entry (the closer)
# carries the state; its members' shapes are summed so the batch is compared as one unit.
_RUN_AGGS = [
    pl.col("n_entries").sum(),
    # (the slow path's uneven all_gather / reduce_scatter: one _broadcast_oop / _reduce_oop per member, closed by
    # ALLGATHER_coalesced / REDUCE_SCATTER_coalesced: the uneven form, whose members' inputs (outputs) differ)
    pl.when((pl.len() > 1) & (pl.col("op").last() == "all_gather_coalesced")).then(pl.lit("all_gather_v", Op))
    .when((pl.len() > 1) & (pl.col("op").last() == "reduce_scatter_coalesced")).then(pl.lit("reduce_scatter_v", Op))
    .otherwise(pl.col("op").filter(pl.col("op") != "coalesced").first().fill_null(pl.col("op").first()))
    .alias("op"),
    pl.col("input_sizes").first(), pl.col("output_sizes").first(),
    pl.col("input_dtypes").first(), pl.col("output_dtypes").first(),
    # (a batch's closer records no shapes: summed over the members that did, unknown only if none did)
    *[pl.when(pl.col(c).is_not_null().any()).then(pl.col(c).sum()).alias(c) for c in ("input_numel", "output_numel")],
    pl.col("state").last(), pl.col("retired").all(), pl.col("record_id").min(), pl.col("stack_id").first(),
    pl.col("time_created_ns").min(), pl.col("time_completed_ns").max(),
    pl.col("tracks_completion").first(), pl.col("pg_id").first(), pl.col("timeout_ms").max(),
    pl.col("duration_ms").max(),
]


def _keys_unique_per_rank(units: pl.DataFrame) -> bool:
    """No (group, seq) twice on one rank. Units are in rank order: per-rank slices, each a small exact set
    (8x faster than hashing every key at 14.6M units)."""
    key = pl.col("group").to_physical().cast(pl.UInt64) * (1 << 32) + pl.col("collective_seq_id").cast(pl.UInt64)
    distinct = (units.lazy().select(pl.col("rank").set_sorted(), key.alias("_k")).group_by("rank")
                .agg(pl.col("_k").n_unique()).select(pl.col("_k").sum()).collect().item())
    return (distinct or 0) == units.height


def collective_units(entries: pl.DataFrame, groups: pl.DataFrame, completion: pl.Expr) -> pl.DataFrame:
    """One row per (group, seq, rank) for collectives, in (rank, record) order; p2p and batch closers are left
    out. `entries` must be in (rank, record) order, as `load` leaves them."""
    # Lazy, so only the columns used below are materialized from the (widest, longest) entries frame.
    marked = entries.lazy().with_columns((pl.col("is_p2p") | is_p2p_closer()).alias("_p2p"),
                                         completion.alias("tracks_completion"))
    # (a negative seq id, from a damaged or hand-edited dump, is no place in the sequence: unknown, as null)
    coll = marked.filter(~pl.col("_p2p") & pl.col("group").is_not_null() & (pl.col("collective_seq_id") >= 0))
    # Entries are in (rank, record) order, and one thread records a unit's entries back to back: each run of
    # equal keys is a unit. Each entry is first read as a unit of its own (`_ONE_ENTRY`); when every run is one
    # entry (no coalesced batches: the usual NCCL job) those rows are the units, else runs are aggregated over
    # contiguous slices (`_RUN_AGGS`), not by hashing every row. If a unit's entries were interleaved with
    # another's, its key shows up in two runs: then group by key.
    rows = coll.select(*_UNIT_KEY, *_ONE_ENTRY, pl.struct(_UNIT_KEY).rle_id().alias("_run")).collect()
    if rows.height == 0 or rows["_run"][-1] + 1 == rows.height:
        units = rows.drop("_run")
    else:
        units = (rows.lazy().with_columns(pl.col("_run").set_sorted())
                 .group_by("_run", maintain_order=True).agg(*[pl.col(c).first() for c in _UNIT_KEY], *_RUN_AGGS)
                 .drop("_run").collect())
    del rows
    if not _keys_unique_per_rank(units):
        units = (coll.select(*_UNIT_KEY, *_ONE_ENTRY).group_by(_UNIT_KEY).agg(*_RUN_AGGS)
                 .sort("rank", "record_id").collect())
    multi = units.filter(pl.col("n_entries") > 1)
    if multi.height:
        # Signatures of multi-entry units: every member's shape, in record order, so batches compare whole.
        sig = (
            coll.join(multi.lazy().select("group", "collective_seq_id", "rank"),
                      on=["group", "collective_seq_id", "rank"])
            # (the closer records no tensor: the members' shapes make the signature)
            .filter((pl.col("input_sizes") != "[]") | (pl.col("output_sizes") != "[]"))
            .sort("record_id")
            .group_by("group", "collective_seq_id", "rank")
            .agg(
                pl.col("input_sizes").cast(pl.String).str.join(";").alias("_in"),
                pl.col("output_sizes").cast(pl.String).str.join(";").alias("_out"),
                pl.col("input_dtypes").cast(pl.String).str.join(";").alias("_dt"),
                pl.col("output_dtypes").cast(pl.String).str.join(";").alias("_odt"),
            )
        ).collect()
        units = units.join(sig, on=["group", "collective_seq_id", "rank"], how="left",
                           maintain_order="left").with_columns(
            pl.coalesce(pl.col("_in").cast(pl.Categorical), "input_sizes").alias("input_sizes"),
            pl.coalesce(pl.col("_out").cast(pl.Categorical), "output_sizes").alias("output_sizes"),
            pl.coalesce(pl.col("_dt").cast(pl.Categorical), "input_dtypes").alias("input_dtypes"),
            pl.coalesce(pl.col("_odt").cast(pl.Categorical), "output_dtypes").alias("output_dtypes"),
        ).drop("_in", "_out", "_dt", "_odt")
    sizes = groups.select(pl.col("group").to_physical().alias("_g"), "size")
    by_group = lookup.by_position(sizes, int(sizes["_g"].max() or 0) + 1)
    return units.with_columns(lookup.read(by_group, "size", pl.col("group").to_physical()))


# ---------------------------------------------------------------------------------------------- progress


def cut_short(dumps: pl.DataFrame) -> pl.Series:
    """The ranks whose dump file was cut short (the reader kept the entries written before the cut)."""
    return dumps.filter(pl.col("problems").list.eval(pl.element().str.starts_with(TRUNCATED)).list.any())["rank"]


def progress(units: pl.DataFrame, trace_entries: pl.DataFrame, members: pl.DataFrame, dumps: pl.DataFrame,
             pg_status: pl.DataFrame, tracks: pl.DataFrame, p2p_groups: pl.DataFrame,
             groups: pl.DataFrame | None = None) -> pl.DataFrame:
    """How far each member of each group got. Uses pg_status where it is about collectives only (not in
    `p2p_groups`, from `groups_with_p2p`). `groups` (the trace's) tells which is the default group, for ranks
    whose ring buffer rolled past a group."""
    default_groups = (groups.filter(pl.col("pg_desc") == "default_pg").select("group") if groups is not None
                      else members.clear().select("group"))
    per = (
        units   # in (rank, record) order: within a (group, rank), seq order; `last` below is the latest op
        .group_by("group", "rank")
        .agg(
            pl.col("collective_seq_id").min().alias("first_seq"),
            pl.col("collective_seq_id").max().alias("last_enqueued"),
            pl.col("collective_seq_id").filter(pl.col("state") == "completed").max().alias("last_completed"),
            pl.col("collective_seq_id").filter(pl.col("state") != "completed").min().alias("pending_seq"),
            pl.col("op").last().alias("last_op"),
            pl.col("state").last().alias("last_state"),
            pl.col("pg_id").first(),
        )
    )
    # How far a rank got in a group is its newest entry there (the ring buffer drops the oldest entries; where
    # it dropped all of a group's, see `_rolled_out_status`). pg_status's enqueued counter is not used for it:
    # after a p2p op it holds the p2p seq, and Gloo does not record its sends and receives at all (a pipeline's
    # 80 sends and receives on the default group read as 80 collectives no entry shows: fixtures/straggler_pipeline).
    # Its completed counter is read only where the recorder tracks completion and no p2p entry is seen.
    status = pg_status.rename({"last_completed": "_st_done", "last_enqueued": "_st_last"}).select(
        "rank", "pg_id", "_st_done", "_st_last")
    per = (
        per.join(status, on=["rank", "pg_id"], how="left")
        .with_columns(pl.col("group").is_in(p2p_groups["group"].implode()).alias("_has_p2p"))
    )

    # How far a rank got is unknown, as with no dump, when its dump was cut short (the newest entries, written
    # last, are the ones lost), or holds no entry at all while its pg_status counters show it ran collectives
    # (a recorder that kept nothing, or a writer that left them out): it only looks behind. So its dump counts
    # as none (`has_dump`): it is never named as behind, and the wait-for graph still sees who provably waits on
    # it, as for a rank that left no dump (a culprit whose dump was cut while it hung). Not where the job's
    # writer kept only unfinished entries (`only_active`): there an empty dump says its rank had nothing in
    # flight, and its pg_status says how far it got (it counts as `wrapped`).
    ran = ran_collectives(pg_status)
    rank_info = dumps.filter(pl.col("loaded")).join(ran, on="rank", how="left").select(
        "rank", pl.col("wrapped"),
        (pl.col("rank").is_in(cut_short(dumps).implode())
         | ((pl.col("entry_count") == 0) & pl.col("_ran").fill_null(False) & ~pl.col("wrapped"))).alias("_unknown"),
    ).with_columns((~pl.col("_unknown")).alias("has_dump")).join(tracks, on="rank", how="left")
    # (ranks whose buffer rolled past a group, and ranks whose dump was cut before their entries there: both
    # keep their pg_status, and only it says how far they got)
    # Only-active: a group none of whose members has an entry left had nothing in flight, so nobody waits
    # there; its counters are not read (sends and receives all finished and left out, its counters would hold
    # their p2p seqs as if collectives).
    unread = (pl.concat([p2p_groups, members.select("group").unique()
                         .join(trace_entries.lazy().select("group").unique().collect(), on="group", how="anti")])
              if written_only_active(dumps) else p2p_groups)
    rolled_out = _rolled_out_status(per, members, pg_status, unread, trace_entries,
                                    rank_info.filter((pl.col("has_dump") & pl.col("wrapped")) | pl.col("_unknown"))
                                    .select("rank", pl.col("_unknown").alias("_cut")),
                                    default_groups, groups)
    out = (
        members.join(per, on=["group", "rank"], how="left")
        .join(rank_info, on="rank", how="left")
        .join(rolled_out, on=["group", "rank"], how="left")
        .with_columns(pl.col("has_dump").fill_null(False), pl.col("tracks_completion").fill_null(False),
                      pl.col("last_enqueued").alias("_kept"))
        .with_columns(
            pl.when(pl.col("_unknown").fill_null(False)).then(None)
            .when(pl.col("last_enqueued").is_not_null()).then("last_enqueued")
            # A dump that never wrapped and has nothing in this group: the rank never enqueued anything in it.
            .when(pl.col("has_dump") & ~pl.col("wrapped").fill_null(True)).then(pl.lit(0))
            # One that wrapped past the group: its counter, where it can be read (`_rolled_out_status`); never
            # past the members whose entries show how far they got (it only tells who is behind)
            .when(pl.col("has_dump") & pl.col("_st_enq").is_not_null())
            .then(pl.min_horizontal("_st_enq", pl.col("last_enqueued").max().over("group")))
            .otherwise(None).alias("last_enqueued"),
            # (never past the newest entry: where p2p entries left the buffer, the counter may hold a p2p seq)
            pl.when(pl.col("tracks_completion") & ~pl.col("_has_p2p").fill_null(True)
                    & pl.col("_st_done").is_not_null())
            .then(pl.min_horizontal(pl.max_horizontal("last_completed", "_st_done"), "last_enqueued"))
            # Without completion states (Gloo) the counters still say when everything the rank enqueued in the
            # group finished: both at its newest collective. (Not otherwise: they also count sends and receives
            # Gloo doesn't record, so a lower or different value says nothing about the collectives.)
            .when(~pl.col("tracks_completion") & (pl.col("_st_done") == pl.col("last_enqueued"))
                  & (pl.col("_st_last") == pl.col("last_enqueued")))
            .then("last_enqueued")
            # A dump cut before its entries in the group: its counter there, read by `_rolled_out_status`
            .when(pl.col("_unknown").fill_null(False) & pl.col("tracks_completion") & pl.col("_st_fin").is_not_null())
            .then(pl.min_horizontal("_st_fin", "_st_enq"))
            .otherwise("last_completed").alias("last_completed"),
        )
        .with_columns(pl.col("last_enqueued").max().over("group").alias("frontier"))
    )
    out = out.with_columns(_moved_on(out, trace_entries))
    out = (
        out.with_columns(
            (pl.col("frontier") - pl.col("last_enqueued")).alias("behind"),
            # How far a member whose dump can't say (none, or cut short) got at least. A collective
            # completes only once every member joined it: so far as any member completed it, where
            # that is proof (`_moved_on`). A cut dump also shows its newest entry kept, and its
            # pg_status, written with the rest of the dump before the entries (a cut keeps it). Its
            # enqueued counter is the collectives' only where the recorder is NCCL's and the group has
            # no sends or receives, as above; where the cut left no entry of the group, the counter
            # `_rolled_out_status` read.
            pl.when(~pl.col("has_dump"))
            .then(pl.max_horizontal(
                pl.col("last_completed").filter(pl.col("tracks_completion") | pl.col("_moved_on"))
                .max().over("group"),
                pl.when(pl.col("_unknown").fill_null(False)).then("_kept"),
                pl.when(pl.col("_unknown").fill_null(False) & pl.col("tracks_completion")).then(pl.coalesce(
                    pl.when(~pl.col("_has_p2p").fill_null(True)).then("_st_last"), "_st_enq"))))
            .alias("enqueued_at_least"))
    )
    return conform(out, PROGRESS).sort("group", "rank")


def last_group_per_rank(entries: pl.DataFrame) -> pl.DataFrame:
    """(rank, _last_group): the group of each rank's latest entry. Entries are in (rank, record) order, as `load`
    leaves them: the rank column flagged sorted, each rank is a slice and its last row the latest (no sort of
    31M rows)."""
    return (entries.lazy().select(pl.col("rank").set_sorted(), "group").group_by("rank")
            .agg(pl.col("group").last().alias("_last_group")).collect())


def _moved_on(prog: pl.DataFrame, entries: pl.DataFrame) -> pl.Expr:
    """`_moved_on`: a Gloo member whose newest entry is in another group. Gloo's counters count a collective that
    failed (a member never came, the timeout fired) as finished, so its completion proves every member joined
    only where the rank went on to other work after it: a failed collective raises in the caller. (NCCL's
    completed state is proof itself.) Read only where some member lacks a dump beside a Gloo member."""
    gloo_with_lost = prog.lazy().group_by("group").agg(
        ((~pl.col("has_dump")).any() & (pl.col("has_dump") & ~pl.col("tracks_completion")).any()).alias("_x")
    ).filter("_x").select("group").collect()
    if gloo_with_lost.height == 0:
        return pl.lit(False).alias("_moved_on")
    newest = prog.select("rank").join(last_group_per_rank(entries), on="rank", how="left",
                                      maintain_order="left")["_last_group"]
    return (pl.col("has_dump") & pl.col("last_completed").is_not_null()
            & (pl.lit(newest) != pl.col("group")).fill_null(False)).alias("_moved_on")


def _rolled_out_status(per: pl.DataFrame, members: pl.DataFrame, pg_status: pl.DataFrame, p2p_groups: pl.DataFrame,
                       entries: pl.DataFrame, wrapped: pl.DataFrame, default_groups: pl.DataFrame,
                       declared: pl.DataFrame | None = None) -> pl.DataFrame:
    """(group, rank, _st_enq, _st_fin): how far a rank got in a group none of its entries is in, from its
    pg_status (enqueued, completed).

    The ring buffer is one per rank, shared by all groups: a rank busy in its tensor- and pipeline-parallel
    groups can roll its last data-parallel collectives out of it (`wrapped`: such ranks), and then only
    pg_status says how far it got there. Its keys are local pg ids, which only the rank's entries tie to
    groups: the default group's is 0, and then read where that leaves the rank one group and one key without
    entries; and only where the rank's counters agree with its newest entries in every group they can be
    checked on. Not for groups with sends and receives, whose seq some recorders count in. Else by the order
    the rank made its groups (`_ids_in_creation_order`; `declared`: the trace's groups, with pg_name and source).

    `wrapped`: (rank, _cut). A rank with `_cut` set left a dump cut short: its pg_status, written before the
    entries, survived while its newest entries did not, so its counters need only be at or past them."""
    out = pl.DataFrame(schema={"group": per.schema["group"], "rank": pl.Int64, "_st_enq": pl.Int64,
                               "_st_fin": pl.Int64})
    candidates = (members.select("group", "rank").join(wrapped, on="rank", how="semi")
                  .join(per.select("group", "rank"), on=["group", "rank"], how="anti")
                  .join(p2p_groups, on="group", how="anti"))
    if candidates.height == 0:
        return out
    ranks = candidates["rank"].unique()
    # every group each of those ranks' entries show, sends and receives included (a few ranks: their slices)
    shown = (entries.lazy().filter(pl.col("rank").is_in(ranks.implode())).select("group", "rank", "pg_id")
             .drop_nulls().unique().collect())
    status = pg_status.filter(pl.col("rank").is_in(ranks.implode())).select(
        "rank", "pg_id", pl.col("last_enqueued").alias("_st"), pl.col("last_completed").alias("_fin"))
    agrees = (per.filter(pl.col("rank").is_in(ranks.implode())).join(p2p_groups, on="group", how="anti")
              .join(status, on=["rank", "pg_id"], how="inner").join(wrapped, on="rank")
              .group_by("rank").agg(pl.when(pl.col("_cut")).then(pl.col("_st") >= pl.col("last_enqueued"))
                                    .otherwise(pl.col("_st") == pl.col("last_enqueued")).all().alias("_agrees")))
    keys = status.join(shown, on=["rank", "pg_id"], how="anti")
    groups = (members.select("group", "rank").filter(pl.col("rank").is_in(ranks.implode()))
              .join(shown, on=["group", "rank"], how="anti"))
    # The default group is the first a process makes: its local id is 0 (on every recorded dump we have)
    default = (keys.filter(pl.col("pg_id") == 0)
               .join(groups.join(default_groups, on="group", how="semi"), on="rank")
               .select("rank", "pg_id", "group", "_st", "_fin"))
    # (and never another group's, even where the default group is not known: none of its entries is left)
    keys = keys.filter(pl.col("pg_id") != 0)
    groups = groups.join(default, on=["rank", "group"], how="anti")
    one_each = (keys.group_by("rank").agg(pl.len().alias("_k"), pl.col("pg_id").first(), pl.col("_st").first(),
                                          pl.col("_fin").first())
                .join(groups.group_by("rank").agg(pl.len().alias("_g"), pl.col("group").first()), on="rank")
                .filter((pl.col("_k") == 1) & (pl.col("_g") == 1)))
    # Else by the key the group's other members use for it (processes make their groups in one order: a group's
    # local id is the same on its members), where they all use one and the rank has that key unread. Only
    # members with the same local ids as the rank count: where some ranks are in an extra group (a first stage's
    # embedding group), the ids after it shift, and a peer's id for the group is another group's on this rank.
    left = groups.join(one_each, on="rank", how="anti").join(candidates, on=["group", "rank"], how="semi")
    by_peers = one_each.clear().select("rank", "pg_id", "group", "_st", "_fin")
    if left.height:
        ids = pg_status.group_by("rank").agg(pl.col("pg_id").sort().alias("_ids"))
        used = (entries.lazy().filter(pl.col("group").is_in(left["group"].unique().implode()))
                .select("group", pl.col("rank").alias("_peer"), "pg_id").drop_nulls().unique().collect()
                .join(ids.rename({"rank": "_peer"}), on="_peer"))
        peer_key = (left.join(ids, on="rank").join(used, on=["group", "_ids"])
                    .select("rank", "group", "pg_id").unique()
                    .filter(pl.len().over("rank", "group") == 1))
        by_peers = (peer_key.join(keys, on=["rank", "pg_id"])
                    .filter(pl.len().over("rank", "pg_id") == 1)
                    .select("rank", "pg_id", "group", "_st", "_fin"))
    tied = pl.concat([frame.select("rank", "pg_id", "group", "_st", "_fin") for frame in (default, one_each, by_peers)])
    by_order = tied.clear()
    if declared is not None:
        rest = candidates.join(tied, on=["rank", "group"], how="anti").join(shown, on=["rank", "group"], how="anti")
        if rest.height:
            # (a group with no key there was never used: nothing enqueued, nothing completed)
            by_order = (_ids_in_creation_order(declared, members, pg_status, entries)
                        .join(rest, on=["rank", "group"], how="semi")
                        .join(status, on=["rank", "pg_id"], how="left")
                        .join(keys.select("rank", "pg_id", pl.lit(True).alias("_free")), on=["rank", "pg_id"],
                              how="left")
                        .filter(pl.col("_free").fill_null(False) | pl.col("_st").is_null())
                        .select("rank", "pg_id", "group", pl.col("_st").fill_null(0), pl.col("_fin").fill_null(0)))
    tied = pl.concat([tied, by_order])
    # The writer makes a group's key at the rank's first entry there: once every key of a rank is tied (to a
    # group its entries show, or above), a group of its left with none is one it never used, nothing enqueued.
    all_tied = (status.select("rank", "pg_id")
                .join(pl.concat([shown.select("rank", "pg_id"), tied.select("rank", "pg_id")]).unique(),
                      on=["rank", "pg_id"], how="anti")
                .select("rank").unique())
    unused = (candidates.join(tied, on=["rank", "group"], how="anti").join(shown, on=["rank", "group"], how="anti")
              .join(all_tied, on="rank", how="anti")
              .select("rank", pl.lit(None, pl.Int64).alias("pg_id"), "group", pl.lit(0, pl.Int64).alias("_st"),
                      pl.lit(0, pl.Int64).alias("_fin")))
    # (a rank none of whose counters can be checked against its entries is taken at its word; one whose
    # counters contradict its entries somewhere is not)
    paired = (pl.concat([tied, unused.with_columns(pl.col("group").cast(tied.schema["group"]))])
              .join(agrees.filter(~pl.col("_agrees")), on="rank", how="anti")
              .join(candidates, on=["group", "rank"], how="semi"))
    # (-1 is the counters' start: nothing enqueued, or completed, in the group yet; below that, unreadable)
    return conform(paired.select("group", "rank", pl.when(pl.col("_st") >= -1).then(pl.max_horizontal("_st", 0))
                                 .alias("_st_enq"),
                                 pl.when(pl.col("_fin") >= -1).then(pl.max_horizontal("_fin", 0)).alias("_st_fin")),
                   out.schema)


def _ids_in_creation_order(declared: pl.DataFrame, members: pl.DataFrame, pg_status: pl.DataFrame,
                           entries: pl.DataFrame) -> pl.DataFrame:
    """(rank, pg_id, group): each rank's local pg ids tied to its groups by the order it made them.

    Every process calls `new_group` for every group, members or not, and the group's name counts those calls
    ("0" the default group, "1", "2", ...); a local id counts the groups the process is in (it builds one only
    for those), and its pg_config lists them all. So the k-th of a rank's groups by name has local id k, where
    every name is a number (hashed names, `use_local_synchronization`, say nothing of order) and no pg_status
    key is past them. Whether the rank has a key for it or not: the writer makes a key at a group's first entry.
    Checked against every tie the entries show (their pg_id and group): one that disagrees anywhere (groups made
    some other way) and no rank is paired by order."""
    config = declared.filter(pl.col("source") == "pg_config").select("group", "pg_name")
    if config.height == 0 or not config["pg_name"].str.contains(r"^\d+$").all():
        return pl.DataFrame(schema={"rank": pl.Int64, "pg_id": pl.Int64, "group": members.schema["group"]})
    mine = (members.select("group", "rank").join(config, on="group")
            .with_columns(pl.col("pg_name").cast(pl.Int64).alias("_made"))
            .sort("rank", "_made").with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("rank").alias("pg_id")))
    fits = (mine.group_by("rank").len()
            .join(pg_status.group_by("rank").agg(pl.col("pg_id").max().alias("_top")), on="rank", how="left")
            .filter(pl.col("_top").fill_null(-1) < pl.col("len")).select("rank"))
    paired = mine.join(fits, on="rank").select("rank", "pg_id", "group")
    seen = (entries.lazy().select("rank", "pg_id", "group").drop_nulls().unique().collect()
            .join(paired, on=["rank", "pg_id"], suffix="_by_order"))
    if (seen["group"] != seen["group_by_order"]).any():
        return paired.clear()
    return paired


# ---------------------------------------------------------------------------------------------- collectives


def _all_equal(expr: pl.Expr) -> pl.Expr:
    """In a group_by: every member that recorded a value has the same one. A null is unknown (a field the
    dump lacks, or of a type it can't hold), never a disagreement: a rank whose recorder left out the dtypes
    did not run another dtype. On the physical ids of enums and categoricals, min == max is a pass over the
    slice where n_unique would hash it."""
    ids = expr.to_physical()
    return (ids.min() == ids.max()).fill_null(True)


def classify(units: pl.DataFrame, prog: pl.DataFrame) -> pl.DataFrame:
    """One row per (group, seq) inside the window all members cover, with a status."""
    window = prog.group_by("group").agg(
        pl.col("first_seq").max().alias("_lo"),
        pl.col("last_enqueued").is_not_null().sum().alias("n_known"),
    )
    # Lazy: only the columns read below, joined, filtered and aggregated in one plan. Eager, each step copied
    # the 14.6M units at 16K x 2,000 (10 s, +3.5 GiB; lazy: 2.3 s, +0.7 GiB).
    # (the window's bounds read per unit by group id, not joined)
    window = window.select(pl.col("group").to_physical().alias("_g"), "_lo", "n_known")
    by_group = lookup.by_position(window, int(window["_g"].max() or 0) + 1)
    gid = pl.col("group").to_physical()
    inst = (
        units.lazy()
        .filter(pl.col("collective_seq_id") >= lookup.read(by_group, "_lo", gid))
        .with_columns(*(key.alias(name) for key, name in zip((*shape_keys(), *dtype_keys()),
                                                              ("_in", "_out", "_in_dt", "_out_dt"))),
                      size_rule_ok().alias("_self_ok"),
                      lookup.read(by_group, "n_known", gid).alias("n_known"))
        .group_by("group", "collective_seq_id")
        .agg(
            pl.col("op").first(),   # the most common op where members disagree: below, for those few
            pl.col("size").first(),
            pl.len().alias("n_present"),
            pl.col("n_known").first(),
            (pl.col("state") == "completed").sum().alias("n_completed"),
            pl.col("tracks_completion").sum().alias("n_tracking"),
            # a recorder without completion states (Gloo) still leaves unfinished work un-retired
            (~pl.col("tracks_completion") & ~pl.col("retired").fill_null(True)).sum().alias("n_unretired"),
            _all_equal(known_op()).alias("type_ok"),
            (_all_equal(pl.col("_in_dt")) & _all_equal(pl.col("_out_dt"))).alias("dtype_ok"),
            # (the op's own rule is broken when some members keep it and some don't: where none does, the
            # group's size we hold is what's wrong, e.g. a world size given or inferred too large)
            (_all_equal(pl.col("_in")) & _all_equal(pl.col("_out"))
             & (pl.col("_self_ok").all() | ~pl.col("_self_ok").any())
             & all_to_all_totals_ok()).alias("size_ok"),
        )
        .collect()
    )
    if not inst["type_ok"].all():
        modes = (units.join(inst.filter(~pl.col("type_ok")).select("group", "collective_seq_id"),
                            on=["group", "collective_seq_id"])
                 .group_by("group", "collective_seq_id")
                 .agg(known_op().drop_nulls().mode().sort().first().alias("_mode")))
        inst = inst.join(modes, on=["group", "collective_seq_id"], how="left").with_columns(
            pl.coalesce("_mode", "op").alias("op")).drop("_mode")
    everyone_in = pl.col("n_present") >= pl.col("n_known")
    tracked = pl.col("n_tracking") == pl.col("n_present")
    inst = inst.with_columns(
        pl.when(~pl.col("type_ok")).then(pl.lit("type_mismatch"))
        .when(~pl.col("dtype_ok")).then(pl.lit("dtype_mismatch"))
        .when(~pl.col("size_ok")).then(pl.lit("size_mismatch"))
        .when(~everyone_in).then(pl.lit("not_joined"))
        .when(tracked & (pl.col("n_completed") > 0) & (pl.col("n_completed") < pl.col("n_present")))
        .then(pl.lit("state_mismatch"))
        .when(tracked & (pl.col("n_completed") == 0)).then(pl.lit("in_flight"))
        .when(pl.col("n_known") < pl.col("size")).then(pl.lit("missing_dumps"))
        # Gloo: retired work may have failed, so only members still in it count, and one is enough
        .when(~tracked & (pl.col("n_unretired") > 0)).then(pl.lit("in_flight"))
        .otherwise(pl.lit("matched"))
        .alias("status")
    )
    return conform(inst, COLLECTIVES).sort("group", "collective_seq_id")


# ---------------------------------------------------------------------------------------------- p2p


def p2p_pairs(entries: pl.DataFrame, dumps: pl.DataFrame, completion: pl.Expr,
              pg_status: pl.DataFrame) -> pl.DataFrame:
    """Pair sends with receives by (group, src, dst, k-th transfer).

    The k-th send from A to B is the k-th receive at B from A when neither buffer wrapped. When one did, the
    counts no longer line up, so only unfinished transfers are paired (their order is still the same on both
    ends): that is all a hang needs, and completed transfers were matched by NCCL itself.
    """
    # One lazy plan up to the pool of transfers to pair, in the entries' (rank, record) order (the k-th transfer
    # is counted in it). A batch's state is its closer's, and the closer is recorded right after the batch:
    # read it by filling each closer's state and key backwards over the p2p rows, no join of 8M ops.
    closer = is_p2p_closer()
    # Where the job's writer kept only unfinished entries (`only_active`), a batch that finished left its sends
    # and receives (they read `scheduled` forever) without their closer, and an op sent alone and still in
    # flight reads `scheduled` too (`started` only with timing on, once the GPU began it). The group's counters
    # tell them apart: each batch, each op alone, is one work, and they hold the p2p seq of the latest work
    # enqueued and completed. An op is unfinished where its seq is past the rank's completed one; not in a
    # group that also runs collectives, whose counters mix the two seqs: there, unknown (not pending).
    only_active = written_only_active(dumps)
    own_pending = pl.col("state") != "completed"
    if only_active:
        collective_groups = (entries.lazy().filter(~pl.col("is_p2p") & (pl.col("p2p_seq_id").fill_null(0) == 0))
                             .select("group").unique().collect())
        done = pg_status.select("rank", "pg_id", pl.col("last_completed").alias("_done"),
                                pl.col("last_enqueued").alias("_enqueued"))
        # A send or receive run alone (not in a batch) carries its own state, and the writer left it out once it
        # saw it complete: where the rank's counters show work of the group unfinished, in a group where no rank
        # has a batch left, each one left is unfinished (the counters alone can't say which: single ops to
        # different peers run on different streams and finish out of order, so an older one can be stuck behind
        # a newer completed one; NVIDIA's real dumps, fixtures/nvrx/gpu_error_1st). A batch of one op whose
        # closer was left out reads like one, but leaves the counters even once it finished.
        singles = (~pl.col("group").is_in(_groups_with_batches(entries)["group"].implode())
                   & (pl.col("_done") < pl.col("_enqueued")).fill_null(False))
        own_pending = ((pl.col("state") == "started") | singles
                       | ((pl.col("p2p_seq_id") > pl.col("_done"))
                          & ~pl.col("group").is_in(collective_groups["group"].implode())).fill_null(False))
    # (each rank's last record: read only where a rank's recorder reports no completion and records sends or
    # receives, the c10d hook's and torchcomms' writers; Gloo records none)
    untracked = (entries.lazy().filter(pl.col("is_p2p") & ~completion).select("rank").unique().collect())
    last_record = (entries.lazy().filter(pl.col("rank").is_in(untracked["rank"].implode()))
                   .group_by("rank").agg(pl.col("record_id").max().alias("_last")).collect())
    batch_state = pl.when(pl.col("_closer")).then(pl.col("state")).backward_fill()
    same_batch = pl.all_horizontal(pl.when(pl.col("_closer")).then(pl.col(c)).backward_fill() == pl.col(c)
                                   for c in ("rank", "group", "p2p_seq_id"))
    ops = (
        entries.lazy()
        .select("rank", "group", "p2p_seq_id", "record_id", "op", "peer", "state", "input_sizes", "output_sizes",
                "is_p2p", "pg_id", closer.alias("_closer"), (pl.col("peer_local") == ANY_SOURCE).alias("_any"))
        .filter(pl.col("is_p2p") | pl.col("_closer"))
        .with_columns(pl.when(same_batch).then(batch_state).alias("_batch_state"))
        .filter(pl.col("is_p2p") & pl.col("op").is_in(["send", "recv"])
                & (pl.col("peer").is_not_null() | ((pl.col("op") == "recv") & pl.col("_any").fill_null(False))))
        .pipe(lambda ops: ops.join(done.lazy(), on=["rank", "pg_id"], how="left", maintain_order="left")
              if only_active else ops)
        .with_columns(completion.alias("_tracks"))
        .join(last_record.lazy(), on="rank", how="left", maintain_order="left")
        # (a dump cut short lost its newest entries, the closers that say a batch finished among them: its
        # unfinished-looking ops say nothing, as its last collectives don't (`progress`: has_dump))
        # Where the recorder reports no completion (a writer that retires an op when it is issued), a send or
        # receive that is its rank's last entry is where the rank stopped: it is taken as unfinished.
        .with_columns((pl.when(pl.col("_tracks")).then(pl.when(pl.col("_batch_state").is_not_null())
                                                      .then(pl.col("_batch_state") != "completed")
                                                      .otherwise(own_pending))
                       .otherwise(pl.col("record_id") == pl.col("_last")).fill_null(False)
                       & ~pl.col("rank").is_in(cut_short(dumps).implode())).alias("pending"),
                      (pl.coalesce("_batch_state", "state") == "started").alias("started"))
        .with_columns(
            pl.when(pl.col("op") == "send").then("rank").otherwise("peer").alias("src"),
            pl.when(pl.col("op") == "send").then("peer").otherwise("rank").alias("dst"),
        )
        .drop("is_p2p", "_closer", "pg_id", "_last", *(["_done", "_enqueued"] if only_active else []))
    )
    # Pair over the whole window only where both ends kept their whole history.
    any_wrapped = dumps["wrapped"].any()
    pool = ops if not any_wrapped else ops.filter(pl.col("pending"))
    pool = pool.with_columns(pl.int_range(pl.len()).over("group", "src", "dst", "op").alias("ordinal")).collect()
    if pool.height == 0:
        return pl.DataFrame(schema=P2P_OPS_SCHEMA)
    sends = pool.filter(pl.col("op") == "send").select(
        "group", "src", "dst", "ordinal", pl.col("rank").alias("send_rank"),
        pl.col("pending").alias("send_pending"), pl.col("input_sizes").alias("send_sizes"),
        pl.col("record_id").alias("send_record"), pl.col("started").alias("send_started"))
    recvs = pool.filter(pl.col("op") == "recv").select(
        "group", "src", "dst", "ordinal", pl.col("rank").alias("recv_rank"),
        pl.col("pending").alias("recv_pending"), pl.col("output_sizes").alias("recv_sizes"),
        pl.col("record_id").alias("recv_record"), pl.col("started").alias("recv_started"))
    pairs = _pair_any_source(sends.join(recvs.filter(pl.col("src").is_not_null()), on=["group", "src", "dst", "ordinal"],
                                        how="full", coalesce=True), recvs.filter(pl.col("src").is_null()))
    pairs = pairs.with_columns(
        pl.when(pl.col("recv_rank").is_null()).then(pl.lit("unmatched_send"))
        .when(pl.col("send_rank").is_null()).then(pl.lit("unmatched_recv"))
        .when(pl.col("send_sizes").cast(pl.String) != pl.col("recv_sizes").cast(pl.String))
        .then(pl.lit("size_mismatch"))
        .when(pl.col("send_pending") | pl.col("recv_pending")).then(pl.lit("in_flight"))
        .otherwise(pl.lit("matched")).alias("status"),
    )
    return conform(pairs, P2P_OPS_SCHEMA).sort("group", "src", "dst", "ordinal")


def _pair_any_source(pairs: pl.DataFrame, any_source: pl.DataFrame) -> pl.DataFrame:
    """Receives from any source (`recv 1<-?`: the c10d hook writer's, on backends that have them) paired, in
    order, with the sends to their rank that no receive from a named source took; their `src` is then the
    sender's. One left unpaired has no `src`: it waits on whichever member sends."""
    if any_source.height == 0:
        return pairs
    spare = pairs.filter(pl.col("recv_rank").is_null())
    spare = spare.with_columns(pl.int_range(pl.len()).over("group", "dst", order_by=["ordinal", "src"]).alias("_k"))
    takers = any_source.drop("src").with_columns(pl.int_range(pl.len()).over("group", "dst", order_by="ordinal")
                                                 .alias("_k")).drop("ordinal")
    joined = (spare.drop([c for c in takers.columns if c not in ("group", "dst", "_k")])
              .join(takers, on=["group", "dst", "_k"], how="full", coalesce=True).drop("_k"))
    return pl.concat([pairs.filter(pl.col("recv_rank").is_not_null()), joined], how="diagonal_relaxed")


# ---------------------------------------------------------------------------------------------- entry point


def _groups_with_batches(entries: pl.DataFrame) -> pl.DataFrame:
    """(group): groups where some rank ran sends and receives in a batch (`batch_isend_irecv`): a closer is left,
    or two of its send/recv entries share one p2p seq (a finished batch whose closer the writer left out)."""
    p2p = entries.lazy().filter(pl.col("is_p2p") | is_p2p_closer())
    closers = p2p.filter(pl.col("op") == "coalesced").select("group")
    shared = (p2p.filter(pl.col("is_p2p")).group_by("rank", "group", "p2p_seq_id").len()
              .filter(pl.col("len") > 1).select("group"))
    return pl.concat([closers, shared]).unique().collect()


def groups_with_p2p(entries: pl.DataFrame) -> pl.DataFrame:
    """(group): the groups some rank recorded a send or receive in; their pg_status counters mix p2p seqs in."""
    return entries.lazy().filter(pl.col("is_p2p")).select("group").unique().collect()


def _finished_by_counters(units: pl.DataFrame, p2p_groups: pl.DataFrame, pg_status: pl.DataFrame) -> pl.DataFrame:
    """Only-active dumps: a collective whose seq its rank's counters show completed is, whatever its entries
    read. The writer left out every entry it saw complete, but an entry that never completes on its own stays:
    a coalesced batch's members (its closer carries the state, and is what was left out). Not in `p2p_groups`,
    whose counters mix p2p seqs in."""
    done = pg_status.select("rank", "pg_id", pl.col("last_completed").alias("_done"))
    return (units.join(done, on=["rank", "pg_id"], how="left", maintain_order="left")
            .with_columns(pl.when((pl.col("collective_seq_id") <= pl.col("_done"))
                                  & ~pl.col("group").is_in(p2p_groups["group"].implode()))
                          .then(pl.lit("completed", dtype=units.schema["state"])).otherwise("state").alias("state"))
            .drop("_done"))


def match(entries: pl.DataFrame, groups: pl.DataFrame, members: pl.DataFrame, dumps: pl.DataFrame,
          pg_status: pl.DataFrame) -> Matching:
    """Run every matching step over all groups at once."""
    tracks = completion_by_rank(entries, dumps)
    completion = tracks_completion(tracks, entries)
    units = collective_units(entries, groups, completion)
    p2p_groups = groups_with_p2p(entries)
    if written_only_active(dumps):
        units = _finished_by_counters(units, p2p_groups, pg_status)
    prog = progress(units, entries, members, dumps, pg_status, tracks, p2p_groups, groups)
    colls = classify(units, prog)
    return Matching(
        units=units, collectives=colls, progress=prog, divergences=divergences(units, colls, prog, groups),
        p2p=p2p_pairs(entries, dumps, completion, pg_status), gpu_stalls=gpu_stalls(prog, p2p_groups),
    )
