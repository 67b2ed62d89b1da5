"""Who broke the order in a wait cycle: the rank to blame when ranks wait for each other across groups.

In a cycle each rank is held up in one group (a collective it has not joined, A #a) while it waits in another
(B #b, which it joined). Ranks running one program pass their collectives in one order, so the cycle means
some rank ran A #a and B #b the other way round than the rest, or skipped A #a and went on (its ring buffer may
have rolled past A: pg_status placed it). The dumps can't tell those two apart, but they show who: every other
rank that ran or reached one of the two says which comes first in the program, by kind of group (pg_desc: its
own dp group's #a is the same point of the program as this rank's). A rank that joined A #a and has not
reached B #b (or recorded A #a before a B #x, x <= b) puts A first; one that did the opposite puts B first. The
rank whose own order most ranks contradict is the one that broke it. When no single rank does (A ran g1 first
and B g2, nobody else says which), the cycle is a deadlock with no side to blame.

Small frames: the cycle's ranks and groups, the progress per kind of group, the few units at the seqs in
question; never a loop over entries.
"""

from __future__ import annotations

import polars as pl


def odd_one_out(progress: pl.DataFrame, groups: pl.DataFrame, units: pl.DataFrame, edges: pl.DataFrame,
                ranks: list[int], cycle_groups: list[str]) -> tuple[int, str, int] | None:
    """(rank, group, seq): the cycle's rank whose order of two collectives most other ranks contradict, and
    the collective it never joined (A #a, where the others wait on it); None when no single rank stands out."""
    steps = _steps(edges, groups, ranks, cycle_groups)
    if steps.height == 0:
        return None
    kind = groups.select("group", pl.col("pg_desc").fill_null(""))
    # each rank's progress per kind of group, where it is in one group of that kind
    where = (progress.filter(pl.col("last_enqueued").is_not_null()).join(kind, on="group")
             .group_by("rank", "pg_desc").agg(pl.col("last_enqueued").first(), pl.len().alias("_n"))
             .filter(pl.col("_n") == 1).drop("_n"))
    a_first = _says_first(steps, where, units, kind, ("_da", "_a"), ("_db", "_b"))
    b_first = _says_first(steps, where, units, kind, ("_db", "_b"), ("_da", "_a"))
    votes = (steps.join(a_first, on="rank", how="left").join(b_first, on="rank", how="left", suffix="_b")
             .with_columns(pl.col("_says").fill_null(0), pl.col("_says_b").fill_null(0)))
    # (the rank itself ran B first: it is among the ones that say so)
    broke = votes.filter(pl.col("_says") > pl.col("_says_b"))
    if broke["rank"].n_unique() != 1:
        return None
    rank, group, seq = broke.sort("_says", descending=True).select("rank", "_group", "_a").row(0)
    return rank, group, seq


def _steps(edges: pl.DataFrame, groups: pl.DataFrame, ranks: list[int], cycle_groups: list[str]) -> pl.DataFrame:
    """Per cycle rank: the collective it holds up (group A, seq a, kind _da) and the one it waits in (seq b,
    kind _db), from the cycle's wait edges; one row per such pair."""
    nodes = [f"r:{r}" for r in ranks]
    behind = edges.filter(pl.col("kind") == "behind")
    desc = groups.select(pl.col("group").cast(pl.String), pl.col("pg_desc").fill_null(""))
    held = (behind.filter(pl.col("src").is_in([f"g:{g}" for g in cycle_groups]) & pl.col("dst").is_in(nodes))
            .select(pl.col("dst").str.slice(2).cast(pl.Int64).alias("rank"), pl.col("group").cast(pl.String),
                    pl.col("seq").alias("_a"))
            .join(desc, on="group").rename({"group": "_group", "pg_desc": "_da"}))
    waits = (behind.filter(pl.col("src").is_in(nodes) & pl.col("dst").is_in([f"g:{g}" for g in cycle_groups]))
             .select(pl.col("src").str.slice(2).cast(pl.Int64).alias("rank"), pl.col("group").cast(pl.String),
                     pl.col("seq").alias("_b"))
             .join(desc, on="group").rename({"pg_desc": "_db"}).drop("group"))
    return (held.join(waits, on="rank").filter((pl.col("_da") != pl.col("_db")) & (pl.col("_da") != ""))
            .drop_nulls(["_a", "_b"]))


def _says_first(steps: pl.DataFrame, where: pl.DataFrame, units: pl.DataFrame, kind: pl.DataFrame,
                first: tuple[str, str], then: tuple[str, str]) -> pl.DataFrame:
    """(rank, _says): for each cycle rank's pair, how many ranks show `first` (kind, seq) before `then` in
    their program: they joined the first and have not reached the second, or recorded the first before one of
    the second's kind at or below its seq."""
    (d1, s1), (d2, s2) = first, then
    pairs = steps.select("rank", pl.col(d1).alias("_d1"), pl.col(s1).alias("_s1"), pl.col(d2).alias("_d2"),
                         pl.col(s2).alias("_s2")).unique()
    p1 = where.rename({"rank": "_s", "pg_desc": "_d1", "last_enqueued": "_p1"})
    p2 = where.rename({"rank": "_s", "pg_desc": "_d2", "last_enqueued": "_p2"})
    reached = (pairs.join(p1, on="_d1").join(p2, on=["_d2", "_s"])
               .filter((pl.col("_p1") >= pl.col("_s1")) & (pl.col("_p2") < pl.col("_s2"))).select("rank", "_s"))
    # recorded both: the first's entry before an entry of the second's kind at or below its seq
    seqs = (units.lazy().select("group", "collective_seq_id", "rank", "record_id")
            .join(kind.lazy(), on="group").rename({"rank": "_s"}))
    at_first = (seqs.join(pairs.lazy(), left_on=["pg_desc", "collective_seq_id"], right_on=["_d1", "_s1"])
                .select("rank", "_s", "_d2", "_s2", pl.col("record_id").alias("_r1")))
    recorded = (at_first.join(seqs, left_on=["_s", "_d2"], right_on=["_s", "pg_desc"])
                .filter((pl.col("collective_seq_id") <= pl.col("_s2")) & (pl.col("record_id") > pl.col("_r1")))
                .select("rank", "_s").collect())
    return (pl.concat([reached, recorded]).unique().group_by("rank").agg(pl.len().alias("_says")))
