"""Process groups no rank declared (Gloo dumps carry no pg_config): their members, read from who used them.

A member whose ring buffer rolled every entry of the group out (the buffer is one per rank, shared by its
groups) used it too, but no entry says so: only its pg_status, keyed by the rank's local pg id, still counts
the group's collectives. `place_rolled_out_members` puts such a rank in the one group it can only be in.
Small frames (groups, pg_status, per-rank keys); the entries are read only when a group is short of members.
"""

from __future__ import annotations

import polars as pl

from flightrec.model.schema import GROUPS, Text, conform, of_a_kind


def inferred_groups(entries: pl.DataFrame, declared: pl.DataFrame, world_size: int | None) -> pl.DataFrame:
    """Groups no rank declared: members are the ranks that used them.

    The default group is known to hold every rank, so with a known world size it gets all of them; that is
    how a rank that died without dumping still shows up as a member."""
    # (lazy: the three columns read, not the whole frame filtered)
    used = (entries.lazy().select("pg_name", "pg_desc", "rank").filter(pl.col("pg_name").is_not_null())
            .join(declared.lazy().select(pl.col("pg_name").cast(Text)), on="pg_name", how="anti")
            .group_by("pg_name")
            .agg(pl.col("pg_desc").drop_nulls().mode().first(), pl.col("rank").unique().sort().alias("ranks"))
            .collect())
    if world_size is not None:
        everyone = pl.lit(list(range(world_size)), dtype=pl.List(pl.Int64))
        used = used.with_columns(
            pl.when(pl.col("pg_desc") == "default_pg").then(everyone).otherwise(pl.col("ranks")).alias("ranks"))
    return conform(_with_size(used.with_columns(pl.col("pg_name").alias("group"),
                                                pl.lit("inferred").alias("source"))), GROUPS)


def place_rolled_out_members(groups: pl.DataFrame, entries: pl.DataFrame, pg_status: pl.DataFrame,
                             without_entries: list[int]) -> pl.DataFrame:
    """`groups` with ranks added to inferred groups they used but no entry of theirs shows.

    A rank belongs to a group of kind D (pg_desc: "dp") when its pg_status has a local pg id its entries don't
    show, and that id is a D group on every rank whose entries show it (processes make their groups in the
    same order). The ranks `without_entries` (no dump, or an empty one) may be in any group. When exactly one
    D group is short of members (smaller than the largest), and the ranks that may fill it (those of the first
    kind in no D group the entries show, and those without entries in no D group) are exactly as many as its
    places, they go there: every rank is in one group of a kind that covers the world, as tp, pp and dp do.
    A kind whose short groups can't be filled so keeps them short, with `size` its largest group's when the
    ranks without entries are enough to fill them: their collectives then read as members' dumps missing, not
    as complete and stuck (in flight on a host whose other ranks were lost with their dumps). Groups of no kind
    (PyTorch's default desc "undefined" names none) are left as they are."""
    inferred = of_a_kind(groups)
    places = (inferred.with_columns((pl.col("size").max().over("pg_desc") - pl.col("size")).alias("_places"))
              .filter(pl.col("_places") > 0))
    if places.height == 0:
        return groups
    members = inferred.select("pg_desc", pl.col("ranks").alias("rank")).explode("rank")
    kinds = places.select("pg_desc").unique()
    # ranks without entries that no group of the kind holds: each may be the missing member of any of them
    lost = (kinds.join(pl.DataFrame({"rank": without_entries}, schema={"rank": pl.Int64}), how="cross")
            .join(members, on=["rank", "pg_desc"], how="anti"))
    # each rank's local pg ids, as its entries show them, and the kind of group each id is on every rank
    shown = (entries.lazy().select("rank", "pg_id", pl.col("pg_name").cast(pl.String)).drop_nulls().unique().collect()
             .join(inferred.select("pg_name", "pg_desc"), on="pg_name"))
    kind_of_id = (shown.group_by("pg_id").agg(pl.col("pg_desc").unique())
                  .filter(pl.col("pg_desc").list.len() == 1).select("pg_id", pl.col("pg_desc").list.first()))
    rolled_out = (pg_status.filter(pl.col("pg_id") != 0).select("rank", "pg_id")
                  .join(shown.select("rank", "pg_id"), on=["rank", "pg_id"], how="anti")
                  .join(kind_of_id, on="pg_id")
                  .join(members, on=["rank", "pg_desc"], how="anti")
                  .select("pg_desc", "rank").unique())
    fillers = (pl.concat([rolled_out, lost.select("pg_desc", "rank")]).unique()
               .group_by("pg_desc").agg(pl.col("rank").sort().alias("_new")))
    fits = (places.group_by("pg_desc").agg(pl.len().alias("_short"), pl.col("group").first(),
                                           pl.col("_places").first(), pl.col("_places").sum().alias("_shortfall"))
            .join(fillers, on="pg_desc")
            .with_columns(pl.col("_new").list.len().alias("_n")))
    placed_here = fits.filter((pl.col("_short") == 1) & (pl.col("_places") == pl.col("_n")))
    still_short = fits.filter(~pl.col("group").is_in(placed_here["group"].implode())
                              & (pl.col("_shortfall") <= pl.col("_n")))
    if placed_here.height == 0 and still_short.height == 0:
        return groups
    largest = inferred.group_by("pg_desc").agg(pl.col("size").max().alias("_largest"))
    out = (groups.join(placed_here.select("group", "_new"), on="group", how="left")
           .with_columns(pl.concat_list("ranks", pl.col("_new").fill_null(pl.lit([], pl.List(pl.Int64))))
                         .list.sort().alias("ranks"))
           .drop("_new"))
    out = _with_size(out)
    if still_short.height:
        short = places.join(still_short.select("pg_desc"), on="pg_desc").select("group")
        out = (out.join(largest, on="pg_desc", how="left")
               .with_columns(pl.when(pl.col("group").is_in(short["group"].implode()))
                             .then(pl.col("_largest")).otherwise(pl.col("size")).alias("size"))
               .drop("_largest"))
    return conform(out, GROUPS)


def unseen_ranks(groups: pl.DataFrame, entries: pl.DataFrame, world_size: int) -> int:
    """How many ranks past the highest seen the inferred groups need, where the job's size is not known (Gloo
    lists no world once a job makes subgroups: `Trace.world_size_from` "seen"). Ranks past the highest seen
    that left no dump (a last host, down) are then in no group's list, and their groups read as complete.

    A group whose newest collective some member left in flight (not retired) and that has one member (a
    collective of one rank waits on no one) or fewer than the largest of its kind lacks members: as many as
    it takes to reach the largest (at least 2). Every rank is in one group of a kind that covers the world (as
    tp, pp and dp do), so a kind's groups lack that many ranks in all; those the ranks of the world seen
    (`world_size`) that no group of the kind holds can't fill are past the highest seen. (Any such rank may
    fill one: a dump lost, or a live rank that has not reached its group's first collective yet, or whose
    entries there rolled out of its buffer; counting only ranks without entries invented ranks on whole dumps
    of a hang in the first step.) The answer is the most any kind needs; 0 where none is short, or where the
    dumps were taken after the error (Gloo then retires the failed collective as done, and nothing is left in
    flight: `fixtures/host_down`). Not seen: a last host down where every group of a kind lost a member to it
    alike (dp 3 and more), nor groups of no kind (desc "undefined")."""
    inferred = of_a_kind(groups)
    if inferred.height == 0:
        return 0
    # (collectives only: a batch of sends and receives is not retired op by op)
    newest = (entries.lazy().select(pl.col("pg_name").cast(pl.String), "collective_seq_id", "retired", "is_p2p")
              .join(inferred.lazy().select("pg_name"), on="pg_name", how="semi")
              .filter(pl.col("collective_seq_id").is_not_null() & ~pl.col("is_p2p").fill_null(False))
              .filter(pl.col("collective_seq_id") == pl.col("collective_seq_id").max().over("pg_name"))
              .group_by("pg_name").agg((~pl.col("retired").fill_null(True)).any().alias("_in_flight"))
              .collect())
    target = pl.max_horizontal(pl.col("size").max().over("pg_desc"), pl.lit(2))
    short = (inferred.join(newest, on="pg_name", how="left")
             .with_columns((target - pl.col("size")).alias("_lacks"))
             .filter(pl.col("_in_flight").fill_null(False) & (pl.col("_lacks") > 0)))
    if short.height == 0:
        return 0
    held = inferred.select("pg_desc", pl.col("ranks").alias("rank")).explode("rank")
    spare = (short.select("pg_desc").unique()
             .join(pl.DataFrame({"rank": range(world_size)}, schema={"rank": pl.Int64}), how="cross")
             .join(held, on=["pg_desc", "rank"], how="anti")
             .group_by("pg_desc").agg(pl.len().alias("_spare")))
    needed = (short.group_by("pg_desc").agg(pl.col("_lacks").sum())
              .join(spare, on="pg_desc", how="left")
              .select((pl.col("_lacks") - pl.col("_spare").fill_null(0)).clip(lower_bound=0).max()).item())
    return int(needed or 0)


def _with_size(groups: pl.DataFrame) -> pl.DataFrame:
    return groups.with_columns(pl.col("ranks").list.len().cast(pl.Int64).alias("size"))
