"""How far each rank got in each group: its last sequence id enqueued, begun and finished, from its entries, or
from its pg_status counters where its ring buffer rolled past the group."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.entry_facts import cut_short, last_group_per_rank, written_only_active
from flightrec.model.schema import (
    PROGRESS,
    conform,
    ran_collectives,
)


def progress(units: pl.DataFrame, trace_entries: pl.DataFrame, members: pl.DataFrame, dumps: pl.DataFrame,
             pg_status: pl.DataFrame, tracks: pl.DataFrame, p2p_groups: pl.DataFrame,
             groups: pl.DataFrame | None = None) -> pl.DataFrame:
    """How far each member of each group got. Uses pg_status where it is about collectives only (not in
    `p2p_groups`, from `groups_with_p2p`). `groups` (the trace's) tells which is the default group, for ranks
    whose ring buffer rolled past a group."""
    default_groups = (groups.filter(pl.col("pg_desc") == "default_pg").select("group") if groups is not None
                      else members.clear().select("group"))
    per = _newest_entries(units, pg_status, p2p_groups)
    rank_info = _dump_knowledge(dumps, pg_status, tracks)
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
    out = out.with_columns((pl.col("frontier") - pl.col("last_enqueued")).alias("behind"), _enqueued_at_least())
    return conform(out, PROGRESS).sort("group", "rank")


def _newest_entries(units: pl.DataFrame, pg_status: pl.DataFrame, p2p_groups: pl.DataFrame) -> pl.DataFrame:
    """Per (group, rank): the seqs its entries there show, and its pg_status counters beside them."""
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
    return (
        per.join(status, on=["rank", "pg_id"], how="left")
        .with_columns(pl.col("group").is_in(p2p_groups["group"].implode()).alias("_has_p2p"))
    )


def _dump_knowledge(dumps: pl.DataFrame, pg_status: pl.DataFrame, tracks: pl.DataFrame) -> pl.DataFrame:
    """Per rank: whether its dump says how far it got (`has_dump`), whether it wrapped, and `tracks_completion`."""
    # How far a rank got is unknown, as with no dump, when its dump was cut short (the newest entries, written
    # last, are the ones lost), or holds no entry at all while its pg_status counters show it ran collectives
    # (a recorder that kept nothing, or a writer that left them out): it only looks behind. So its dump counts
    # as none (`has_dump`): it is never named as behind, and the wait-for graph still sees who provably waits on
    # it, as for a rank that left no dump (a culprit whose dump was cut while it hung). Not where the job's
    # writer kept only unfinished entries (`only_active`): there an empty dump says its rank had nothing in
    # flight, and its pg_status says how far it got (it counts as `wrapped`).
    ran = ran_collectives(pg_status)
    return dumps.filter(pl.col("loaded")).join(ran, on="rank", how="left").select(
        "rank", pl.col("wrapped"),
        (pl.col("rank").is_in(cut_short(dumps).implode())
         | ((pl.col("entry_count") == 0) & pl.col("_ran").fill_null(False) & ~pl.col("wrapped"))).alias("_unknown"),
    ).with_columns((~pl.col("_unknown")).alias("has_dump")).join(tracks, on="rank", how="left")


def _enqueued_at_least() -> pl.Expr:
    """How far a member whose dump can't say (none, or cut short) got at least. A collective completes only once
    every member joined it: so far as any member completed it, where that is proof (`_moved_on`). A cut dump
    also shows its newest entry kept, and its pg_status, written with the rest of the dump before the entries (a
    cut keeps it). Its enqueued counter is the collectives' only where the recorder is NCCL's and the group has
    no sends or receives, as above; where the cut left no entry of the group, the counter `_rolled_out_status`
    read."""
    return (
        pl.when(~pl.col("has_dump"))
        .then(pl.max_horizontal(
            pl.col("last_completed").filter(pl.col("tracks_completion") | pl.col("_moved_on")).max().over("group"),
            pl.when(pl.col("_unknown").fill_null(False)).then("_kept"),
            pl.when(pl.col("_unknown").fill_null(False) & pl.col("tracks_completion")).then(pl.coalesce(
                pl.when(~pl.col("_has_p2p").fill_null(True)).then("_st_last"), "_st_enq"))))
        .alias("enqueued_at_least"))


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
    by_peers = _keys_by_peers(left, keys, pg_status, entries, one_each.clear().select(*_TIED))
    tied = pl.concat([frame.select(*_TIED) for frame in (default, one_each, by_peers)])
    by_order = tied.clear()
    if declared is not None:
        rest = candidates.join(tied, on=["rank", "group"], how="anti").join(shown, on=["rank", "group"], how="anti")
        if rest.height:
            by_order = _keys_by_creation_order(rest, keys, status, declared, members, pg_status, entries)
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


_TIED = ("rank", "pg_id", "group", "_st", "_fin")   # (a pg_status key tied to the group it counts)


def _keys_by_peers(left: pl.DataFrame, keys: pl.DataFrame, pg_status: pl.DataFrame, entries: pl.DataFrame,
                   none: pl.DataFrame) -> pl.DataFrame:
    """`left` (group, rank)'s keys as the group's other members use them, where they all use one and the rank
    has it unread (and the same local ids as the rank: `_rolled_out_status`). `none`: the empty result."""
    if left.height == 0:
        return none
    ids = pg_status.group_by("rank").agg(pl.col("pg_id").sort().alias("_ids"))
    used = (entries.lazy().filter(pl.col("group").is_in(left["group"].unique().implode()))
            .select("group", pl.col("rank").alias("_peer"), "pg_id").drop_nulls().unique().collect()
            .join(ids.rename({"rank": "_peer"}), on="_peer"))
    peer_key = (left.join(ids, on="rank").join(used, on=["group", "_ids"])
                .select("rank", "group", "pg_id").unique()
                .filter(pl.len().over("rank", "group") == 1))
    return (peer_key.join(keys, on=["rank", "pg_id"])
            .filter(pl.len().over("rank", "pg_id") == 1)
            .select(*_TIED))


def _keys_by_creation_order(rest: pl.DataFrame, keys: pl.DataFrame, status: pl.DataFrame, declared: pl.DataFrame,
                            members: pl.DataFrame, pg_status: pl.DataFrame, entries: pl.DataFrame) -> pl.DataFrame:
    """`rest` (group, rank)'s keys by the order the rank made its groups, where that key is unread (a group with
    no key there was never used: nothing enqueued, nothing completed)."""
    return (_ids_in_creation_order(declared, members, pg_status, entries)
            .join(rest, on=["rank", "group"], how="semi")
            .join(status, on=["rank", "pg_id"], how="left")
            .join(keys.select("rank", "pg_id", pl.lit(True).alias("_free")), on=["rank", "pg_id"], how="left")
            .filter(pl.col("_free").fill_null(False) | pl.col("_st").is_null())
            .select("rank", "pg_id", "group", pl.col("_st").fill_null(0), pl.col("_fin").fill_null(0)))


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
