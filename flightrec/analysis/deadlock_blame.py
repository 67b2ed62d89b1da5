"""Who broke the order in a wait cycle: the rank to blame when ranks wait for each other across groups.

In a cycle each rank is held up in one group (a collective it has not joined, A #a) while it waits in another
(B #b, which it joined). Ranks running one program pass their collectives in one order, so the cycle means
some rank ran A #a and B #b the other way round than the rest, or skipped A #a and went on (its ring buffer may
have rolled past A: pg_status placed it). The dumps can't tell those two apart, but they show who: every other
rank that ran or reached one of the two says which comes first in the program, by kind of group (pg_desc: its
own dp group's #a is the same point of the program as this rank's). A rank that joined A #a and has not
reached B #b (or recorded A #a before a B #x, x <= b) puts A first; one that did the opposite puts B first.

A rank is named only when more ranks contradict its order than share it, and none shares it: where groups of
one kind legitimately count differently (a first pipeline stage with an extra tp collective per step) or
stages run them in another order, other ranks share the "odd" order and the cycle stays a deadlock with no
side to blame, as it does when nobody else ran either (a two-rank world).

Votes are counted once per distinct pair of collectives (a cycle of thousands of ranks has one or two), from
the progress per kind of group and each rank's first and last record of them; never a join of ranks by ranks.
"""

from __future__ import annotations

import polars as pl

_PAIR = ["_da", "_a", "_db", "_b"]


def odd_one_out(progress: pl.DataFrame, groups: pl.DataFrame, units: pl.DataFrame, edges: pl.DataFrame,
                ranks: list[int], cycle_groups: list[str]) -> tuple[int, str, int] | None:
    """(rank, group, seq): the cycle's rank whose order of two collectives the other ranks contradict, and
    the collective it never joined (A #a, where the others wait on it); None when no single rank stands out."""
    steps = _steps(edges, groups, ranks, cycle_groups)
    if steps.height == 0:
        return None
    kind = groups.select("group", pl.col("pg_desc").fill_null(""))
    # each rank's progress per kind of group, where it is in one group of that kind
    where = (progress.filter(pl.col("last_enqueued").is_not_null()).join(kind, on="group")
             .group_by("rank", "pg_desc").agg(pl.col("last_enqueued").first(), pl.len().alias("_n"))
             .filter(pl.col("_n") == 1).drop("_n"))
    pairs = steps.select(_PAIR).unique()
    a_first = _voters(pairs, where, units, kind, ("_da", "_a"), ("_db", "_b"))
    b_first = _voters(pairs, where, units, kind, ("_db", "_b"), ("_da", "_a"))
    votes = (steps.join(a_first, on=_PAIR, how="left").join(b_first, on=_PAIR, how="left", suffix="_b")
             .with_columns(pl.col("_voters").fill_null([]), pl.col("_voters_b").fill_null([])))
    # its order is its own alone (it may not count itself: a rank in two groups of one kind has no vote)
    broke = votes.filter((pl.col("_voters").list.len() > pl.col("_voters_b").list.len())
                         & pl.col("_voters_b").list.set_difference(pl.concat_list("rank")).list.len().eq(0))
    if broke["rank"].n_unique() != 1:
        return None
    rank, group, seq = broke.sort(pl.col("_voters").list.len(), descending=True).select("rank", "_group", "_a").row(0)
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


def _voters(pairs: pl.DataFrame, where: pl.DataFrame, units: pl.DataFrame, kind: pl.DataFrame,
            first: tuple[str, str], then: tuple[str, str]) -> pl.DataFrame:
    """(pair..., _voters): per distinct pair, the ranks that show `first` (kind, seq) before `then` in their
    program: they joined the first and have not reached the second, or recorded the first before an entry
    of the second's kind at or below its seq."""
    (d1, s1), (d2, s2) = first, then
    keyed = pairs.with_columns(pl.col(d1).alias("_d1"), pl.col(s1).alias("_s1"), pl.col(d2).alias("_d2"),
                               pl.col(s2).alias("_s2"))
    p1 = where.rename({"rank": "_v", "pg_desc": "_d1", "last_enqueued": "_p1"})
    p2 = where.rename({"rank": "_v", "pg_desc": "_d2", "last_enqueued": "_p2"})
    reached = (keyed.join(p1, on="_d1").join(p2, on=["_d2", "_v"])
               .filter((pl.col("_p1") >= pl.col("_s1")) & (pl.col("_p2") < pl.col("_s2"))).select(*_PAIR, "_v"))
    # recorded both: each rank's first record of the first, and its last record of the second's kind at or
    # below its seq (one row per rank and pair each, whatever the size of the job)
    seqs = (units.lazy().select("group", "collective_seq_id", "rank", "record_id").join(kind.lazy(), on="group")
            .rename({"rank": "_v"}))
    at_first = (seqs.join(keyed.lazy(), left_on=["pg_desc", "collective_seq_id"], right_on=["_d1", "_s1"])
                .group_by(*_PAIR, "_v").agg(pl.col("record_id").min().alias("_r1")))
    later = (seqs.join(keyed.lazy().select(*_PAIR, "_d2", "_s2"), left_on="pg_desc", right_on="_d2")
             .filter(pl.col("collective_seq_id") <= pl.col("_s2"))
             .group_by(*_PAIR, "_v").agg(pl.col("record_id").max().alias("_r2")))
    recorded = (at_first.join(later, on=[*_PAIR, "_v"]).filter(pl.col("_r2") > pl.col("_r1"))
                .select(*_PAIR, "_v").collect())
    return (pl.concat([reached, recorded]).unique().group_by(_PAIR).agg(pl.col("_v").sort().alias("_voters")))
