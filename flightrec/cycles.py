"""Who broke the order in a wait cycle: the rank to blame when ranks wait for each other across groups.

Ranks running one program pass their collectives in one order, so their progress is monotone: a rank behind
another in one kind of group (pg_desc) is not ahead of it in another. A cycle of waits means some rank ran
them in another order, or skipped one and went on (its ring buffer may have rolled past the group: pg_status
placed it). The dumps can't tell those two apart, but they show who: the rank whose progress in two kinds of
group is inverted against what most members of its group show (behind in dp, ahead in tp). When no such rank
stands out, one that alone holds up a group whose other members it waits on elsewhere. Where neither picks a
single rank (A ran g1 first, B g2), the cycle is a deadlock with no side to blame.

Small frames: the cycle's groups, their members' progress; never the entries.
"""

from __future__ import annotations

import polars as pl


def odd_one_out(progress: pl.DataFrame, groups: pl.DataFrame, edges: pl.DataFrame, ranks: list[int],
                cycle_groups: list[str]) -> tuple[int, str, int] | None:
    """(rank, group, seq): the cycle's rank that broke the order, and the collective it never joined (the
    group of the cycle it holds up, at the seq the others wait in); None when no single rank stands out."""
    nodes = [f"r:{r}" for r in ranks]
    held = (edges.filter(pl.col("src").is_in([f"g:{g}" for g in cycle_groups]) & pl.col("dst").is_in(nodes)
                         & (pl.col("kind") == "behind"))
            .select("group", pl.col("dst").str.slice(2).cast(pl.Int64).alias("rank"), "seq"))
    if held.height == 0:
        return None
    rank = _inverted(progress, groups, ranks, cycle_groups)
    if rank is None:
        alone = held.group_by("group").agg(pl.col("rank").unique()).filter(pl.col("rank").list.len() == 1)
        if alone.height != 1 or held["group"].n_unique() < 2:
            return None
        rank = alone["rank"][0][0]
    mine = held.filter(pl.col("rank") == rank).sort("group")
    if mine.height == 0:
        return None
    group, _, seq = mine.row(0)
    return (rank, group, seq) if seq is not None else None


def _inverted(progress: pl.DataFrame, groups: pl.DataFrame, ranks: list[int], cycle_groups: list[str]) -> int | None:
    """The one rank of `ranks` whose (seq in a group G, seq in its group of another kind D) is inverted
    against the pair most members of G share: lower in one, higher in the other. None unless exactly one."""
    desc = groups.select("group", pl.col("pg_desc").fill_null(""))
    known = (progress.filter(pl.col("last_enqueued").is_not_null()).select("group", "rank", "last_enqueued")
             .join(desc, on="group"))
    # a rank's seq per kind of group, where it is in one group of that kind
    per_kind = (known.group_by("rank", "pg_desc").agg(pl.col("last_enqueued").first(), pl.len().alias("_n"))
                .filter(pl.col("_n") == 1).select("rank", pl.col("pg_desc").alias("_other"),
                                                  pl.col("last_enqueued").alias("_b")))
    points = (known.filter(pl.col("group").cast(pl.String).is_in(cycle_groups))
              .select("group", "pg_desc", "rank", pl.col("last_enqueued").alias("_a"))
              .join(per_kind, on="rank").filter(pl.col("_other") != pl.col("pg_desc")))
    if points.height == 0:
        return None
    usual = (points.group_by("group", "_other", "_a", "_b").len()
             .with_columns(pl.col("len").sum().over("group", "_other").alias("_members"))
             .filter(pl.col("len") * 2 > pl.col("_members"))
             .select("group", "_other", pl.col("_a").alias("_ua"), pl.col("_b").alias("_ub")))
    odd = (points.join(usual, on=["group", "_other"])
           .filter(((pl.col("_a") < pl.col("_ua")) & (pl.col("_b") > pl.col("_ub")))
                   | ((pl.col("_a") > pl.col("_ua")) & (pl.col("_b") < pl.col("_ub"))))
           .filter(pl.col("rank").is_in(ranks))["rank"].unique())
    return int(odd[0]) if odd.len() == 1 else None
