"""Each group's first collective that went wrong: a mismatch (who did something else, settled by the
majority, or by the peer groups of the same kind where two members disagree) or members that never joined.
Small frames: the few divergent collectives and their members' units."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.shape_rules import dtype_text, known_op, shape_text, size_rule_ok
from flightrec.model.schema import DIVERGENCES, MISMATCH_STATUSES, conform


def _minority(units: pl.DataFrame, firsts: pl.DataFrame, field: pl.Expr) -> pl.DataFrame:
    """For each divergent collective: the ranks whose `field` differs from the most common value."""
    u = units.join(firsts.select("group", "collective_seq_id"), on=["group", "collective_seq_id"]).with_columns(
        field.cast(pl.String).alias("_v")).filter(pl.col("_v").is_not_null())   # (unknown is no side)
    counts = u.group_by("group", "collective_seq_id", "_v").agg(pl.len().alias("_n"), pl.col("rank").sort())
    ranked = counts.sort("_n", "_v", descending=[True, False]).group_by(
        "group", "collective_seq_id", maintain_order=True)
    return ranked.agg(
        pl.col("_v").first().alias("majority"),
        pl.col("_v").slice(1).str.join(" / ").alias("minority"),
        pl.col("rank").slice(1).list.explode(keep_nulls=False, empty_as_null=False).sort().alias("ranks"),
        # blame needs a strict majority: a tie, or one rank against one, can't say who is wrong
        ((pl.col("_n").len() > 1) & (pl.col("_n").first() > pl.col("_n").slice(1).sum())).not_().alias("ambiguous"),
    )


def _peer_groups(rows: pl.DataFrame, units: pl.DataFrame, groups: pl.DataFrame,
                 limit: int | None = None, exclude: pl.DataFrame | None = None) -> pl.DataFrame:
    """(group, collective_seq_id, _of): for each of `rows` (group, collective_seq_id), the groups of the same
    kind (pg_desc, not PyTorch's default "undefined") that ran the same program before that seq
    (`_same_history`); the first `limit` of them by name, when given (each is read over its whole history);
    none of the groups in `exclude` (group)."""
    desc = groups.select("group", pl.col("pg_desc")).filter(~pl.col("pg_desc").fill_null("").is_in(["", "undefined"]))
    wanted = rows.select("group", "collective_seq_id").join(desc, on="group")
    peers = (desc.join(wanted.select("pg_desc", "collective_seq_id", pl.col("group").alias("_of")), on="pg_desc")
             .filter(pl.col("group") != pl.col("_of")))
    if exclude is not None:
        peers = peers.join(exclude.select(pl.col("group").cast(peers.schema["group"])), on="group", how="anti")
    if limit is not None:
        peers = peers.sort("group").group_by("_of", "collective_seq_id", maintain_order=True).head(limit)
    return _same_history(peers, units) if peers.height else peers


def _settled_by_peer_groups(m: pl.DataFrame, units: pl.DataFrame, groups: pl.DataFrame | None,
                            field: pl.Expr, lone: bool = False, peers: pl.DataFrame | None = None,
                            missing: pl.DataFrame | None = None) -> pl.DataFrame:
    """Ambiguous rows of `m` (`_minority`: one rank against one, or a tie) settled by the group's peers: the
    groups of the same kind (pg_desc, not PyTorch's default "undefined") at the same seq, where they ran the
    same program: the same ops and shapes as this group at every seq before it both recorded, one at least
    (a first pipeline stage's tp group runs an extra collective a step: the other stages' tp groups are no
    peers of it; with no history to compare, none is). Where the peers that recorded it each agreed within
    itself and all on one value, and one side here has that value, the other side is wrong (`peer_groups`:
    how many said so). Else the row stays ambiguous. `lone`: the rows are collectives whose other members left
    no dump: the members present are wrong where they all differ from the peers' value too. `peers`: from
    `_peer_groups`, when already found. `missing` (group): groups missing members; with it, one peer at least
    that agreed must be missing none."""
    unsettled = m.filter(pl.col("ambiguous"))
    if unsettled.height == 0 or groups is None:
        return m
    if peers is None:
        peers = _peer_groups(unsettled, units, groups)
    if peers.height == 0:
        return m
    peer_rows = peers.lazy().select("group", "collective_seq_id", "_of").unique()
    whole = pl.lit(True)
    if missing is not None:
        peer_rows = peer_rows.join(missing.lazy().select(pl.col("group").cast(peers.schema["group"]),
                                                         pl.lit(False).alias("_whole")), on="group", how="left")
        whole = pl.col("_whole").fill_null(True).first()
    values = (units.lazy().join(peer_rows, on=["group", "collective_seq_id"])
              .with_columns(field.cast(pl.String).alias("_v")).filter(pl.col("_v").is_not_null())
              .group_by("_of", "group", "collective_seq_id").agg(pl.col("_v").unique(), whole.alias("_whole"))
              .group_by("_of", "collective_seq_id")
              .agg(pl.col("_v").list.explode(keep_nulls=False, empty_as_null=False).unique().alias("_vs"),
                   pl.len().alias("peer_groups"), pl.col("_whole").any()).collect())
    agreed = (values.filter((pl.col("_vs").list.len() == 1) & pl.col("_whole"))
              .select(pl.col("_of").alias("group"), "collective_seq_id", pl.col("_vs").list.first().alias("_usual"),
                      "peer_groups"))
    # (lazy: the few rows joined stream the units past them, no copy of every column)
    sides = (units.lazy().join(unsettled.lazy().select("group", "collective_seq_id"), on=["group", "collective_seq_id"])
             .with_columns(field.cast(pl.String).alias("_v")).filter(pl.col("_v").is_not_null())
             .join(agreed.lazy(), on=["group", "collective_seq_id"])
             .group_by("group", "collective_seq_id")
             .agg((pl.col("_v") == pl.col("_usual")).any().alias("_has_usual"),
                  pl.col("rank").filter(pl.col("_v") != pl.col("_usual")).sort().alias("_wrong"),
                  pl.col("_v").filter(pl.col("_v") != pl.col("_usual")).unique().sort().str.join(" / ").alias("_odd"),
                  pl.col("_usual").first(), pl.col("peer_groups").first())
             .collect())
    settled = sides.filter((pl.col("_has_usual") | lone) & (pl.col("_wrong").list.len() > 0))
    if settled.height == 0:
        return m
    return (m.join(settled.drop("_has_usual"), on=["group", "collective_seq_id"], how="left")
            .with_columns(pl.coalesce("_wrong", "ranks").alias("ranks"),
                          pl.coalesce("_usual", "majority").alias("majority"),
                          pl.coalesce("_odd", "minority").alias("minority"),
                          (pl.col("ambiguous") & pl.col("_wrong").is_null()).alias("ambiguous"))
            .drop("_wrong", "_usual", "_odd"))


def _same_history(peers: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    """`peers` (group, collective_seq_id, _of) kept where the peer ran the same ops and shapes as group `_of`
    at every seq before that both recorded, one at least: the whole recorded history, as each group's lowest
    rank recorded it (an extra op a step shows only where steps meet, and a step can hold hundreds)."""
    spans = pl.concat([peers.select("group", "collective_seq_id", "_of"),
                       peers.select(pl.col("_of").alias("group"), "collective_seq_id", "_of").unique()])
    mine = units.lazy().join(spans.lazy().select("group").unique(), on="group", how="semi")
    first = mine.group_by("group").agg(pl.col("rank").min())
    history = (mine.join(first, on=["group", "rank"], how="semi")
               .select("group", pl.col("collective_seq_id").alias("_seq"),
                       pl.format("{} {} {}", pl.col("op"), pl.col("input_sizes"), pl.col("output_sizes")).alias("_did"))
               .join(spans.lazy(), on="group")
               .filter(pl.col("_seq") < pl.col("collective_seq_id"))
               .collect())
    own = history.filter(pl.col("group") == pl.col("_of")).drop("group")
    theirs = history.filter(pl.col("group") != pl.col("_of"))
    alike = (theirs.join(own, on=["_of", "collective_seq_id", "_seq"], suffix="_own")
             .group_by("group", "_of", "collective_seq_id").agg((pl.col("_did") == pl.col("_did_own")).all())
             .filter(pl.col("_did")))
    return peers.join(alike.select("group", "_of", "collective_seq_id"), on=["group", "_of", "collective_seq_id"])


_LONE_PEERS = 32
_LONE_MIN_PEERS = 2   # one other group agreeing is one witness: the lone side may be the right one


def _lone_against_peers(units: pl.DataFrame, colls: pl.DataFrame, bad: pl.DataFrame, prog: pl.DataFrame,
                        groups: pl.DataFrame | None) -> pl.DataFrame:
    """Mismatches no member present can show: in a group whose other members left no dump (or one cut short),
    the first collective where the members present all ran another op, dtype or shape than every peer group of
    the same kind at that seq (`_settled_by_peer_groups`, same history). A dp pair's broadcast, where every
    other dp group ran an all_reduce, read as the lost partner never joining. (DIVERGENCES rows, not ambiguous;
    groups with a divergence of their own are left to it.)"""
    if groups is None:
        return pl.DataFrame(schema=DIVERGENCES)
    # groups missing members: ones that left no dump, or ones no entry names (Gloo: `inferred_groups`)
    lost = pl.concat([prog.filter(~pl.col("has_dump")).select("group"),
                      groups.filter(pl.col("size") > pl.col("ranks").list.len())
                      .select(pl.col("group").cast(prog.schema["group"]))]).unique()
    if lost.height == 0:
        return pl.DataFrame(schema=DIVERGENCES)
    # (at the group's frontier: where its members present stopped. Each row is checked against every peer
    # group's history, which at 16K ranks costs ~0.1 s a row)
    frontier = prog.join(lost, on="group").group_by("group").agg(pl.col("frontier").max().alias("collective_seq_id"))
    short = (colls.join(frontier, on=["group", "collective_seq_id"], how="semi")
             .filter((pl.col("n_known") < pl.col("size")) & (pl.col("n_present") > 0)
                     & pl.col("status").is_in(["in_flight", "missing_dumps", "matched"]))
             .join(bad.select("group").unique(), on="group", how="anti"))
    if short.height == 0:
        return pl.DataFrame(schema=DIVERGENCES)
    # (a few dozen peers settle it as well as thousands: at 16K ranks a kind has 2,048 groups.) Two peers must
    # agree, one at least missing no member: of two groups each missing members, each reads as the lone one
    # against the other, and the culprit may be the member present in either.
    peers = _peer_groups(short, units, groups, limit=_LONE_PEERS)
    if peers.join(lost.select(pl.col("group").cast(peers.schema["group"])), on="group", how="anti").height == 0:
        return pl.DataFrame(schema=DIVERGENCES)
    found = []
    for status, field in (("type_mismatch", known_op()), ("dtype_mismatch", dtype_text()),
                          ("size_mismatch", shape_text())):
        rows = short.select("group", "collective_seq_id", "op", pl.lit(status).alias("status"),
                            pl.lit("").alias("majority"), pl.lit("").alias("minority"),
                            pl.lit([], pl.List(pl.Int64)).alias("ranks"), pl.lit(True).alias("ambiguous"))
        settled = _settled_by_peer_groups(rows, units, groups, field, lone=True, peers=peers, missing=lost)
        if "peer_groups" not in settled.columns:
            continue   # (none settled)
        settled = settled.filter(~pl.col("ambiguous") & (pl.col("peer_groups") >= _LONE_MIN_PEERS))
        if settled.height:
            found.append(settled)
    if not found:
        return pl.DataFrame(schema=DIVERGENCES)
    firsts = (pl.concat([conform(f.with_columns(pl.col("status").cast(DIVERGENCES["status"])), DIVERGENCES)
                         for f in found])
              .sort("collective_seq_id").group_by("group", maintain_order=True).first())
    # (what the group should have run, for the message: the op the peers ran, where it is the op that differs)
    return firsts.with_columns(
        pl.when(pl.col("status") == "type_mismatch")
        .then(pl.col("majority").cast(DIVERGENCES["op"], strict=False)).otherwise(pl.col("op")).fill_null(pl.col("op"))
        .alias("op"),
        pl.lit(0, DIVERGENCES["later_mismatches"]).alias("later_mismatches"))


def _self_inconsistent(units: pl.DataFrame, firsts: pl.DataFrame) -> pl.DataFrame:
    """(group, seq, _bad, _bad_text): the members whose shapes break the op's own rule, where others keep it or
    all agree on the input (empty where none does, or all do and their inputs differ)."""
    u = units.join(firsts.select("group", "collective_seq_id"), on=["group", "collective_seq_id"]).with_columns(
        size_rule_ok().alias("_ok"))
    return u.group_by("group", "collective_seq_id").agg(
        pl.col("rank").filter(~pl.col("_ok")).sort().alias("_bad"),
        (pl.col("_ok").any() | (pl.col("input_sizes").n_unique() == 1)).alias("_telling"),
        pl.format("{} -> {}", pl.col("input_sizes").cast(pl.String),
                  pl.col("output_sizes").cast(pl.String)).filter(~pl.col("_ok")).first().alias("_bad_text"),
    ).with_columns(pl.when("_telling").then("_bad").otherwise(pl.lit([], pl.List(pl.Int64))).alias("_bad")
                   ).drop("_telling")


def _totals_apart(units: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """Size mismatches no member's shape shows (`rows` with no ranks): an all_to_all whose members, all there,
    send more or fewer elements in all than they receive. Each member's splits are its own, so without the split
    sizes (recorder 2.11, proposed) no member can be named: ambiguous, all members."""
    apart = rows.filter(pl.col("ranks").is_null()).select("group", "collective_seq_id")
    if apart.height == 0:
        return pl.DataFrame(schema={"group": rows.schema["group"], "collective_seq_id": pl.Int64})
    return (units.join(apart, on=["group", "collective_seq_id"])
            .group_by("group", "collective_seq_id")
            .agg(pl.col("rank").sort().alias("ranks"),
                 pl.format("{} elements sent in all", pl.col("input_numel").sum()).alias("majority"),
                 pl.format("{} received", pl.col("output_numel").sum()).alias("minority"),
                 pl.lit(True).alias("ambiguous")))


def divergences(units: pl.DataFrame, colls: pl.DataFrame, prog: pl.DataFrame,
                groups: pl.DataFrame | None = None) -> pl.DataFrame:
    """Each group's first collective that is a mismatch or that some members never joined. With `groups`, a
    mismatch between two members (or a tie) is settled by the peer groups of the same kind where they agree."""
    bad = colls.filter(pl.col("status").is_in([*MISMATCH_STATUSES, "not_joined"]))
    lone = _lone_against_peers(units, colls, bad, prog, groups)
    if bad.height == 0 and lone.height == 0:
        return pl.DataFrame(schema=DIVERGENCES)
    firsts = bad.sort("collective_seq_id").group_by("group", maintain_order=True).first()
    later = (
        colls.join(firsts.select("group", pl.col("collective_seq_id").alias("_first")), on="group")
        .filter((pl.col("collective_seq_id") > pl.col("_first")) & pl.col("status").is_in(MISMATCH_STATUSES))
        .group_by("group").agg(pl.len().alias("later_mismatches"))
    )
    parts = []
    for status, field in (("type_mismatch", known_op()), ("dtype_mismatch", dtype_text()),
                          ("size_mismatch", shape_text())):
        sel = firsts.filter(pl.col("status") == status)
        if sel.height:
            m = _minority(units, sel, field)
            if status == "size_mismatch":
                # Where some members break the op's own rule (an all_gather's output not its input times the group)
                # and others keep it, those are the culprits, whatever the majority: one shape everywhere, or two
                # members, one of each. An all_to_all's totals that don't add up name no member (`_totals_apart`).
                si = _self_inconsistent(units, sel)
                m = (sel.select("group", "collective_seq_id").join(m, on=["group", "collective_seq_id"], how="left")
                     .join(si, on=["group", "collective_seq_id"], how="left")
                     .with_columns(pl.col("_bad").list.len().gt(0).fill_null(False).alias("_by_rule"))
                     .with_columns(
                         pl.when("_by_rule").then("_bad").otherwise("ranks").alias("ranks"),
                         pl.when("_by_rule").then("_bad_text").otherwise("minority").alias("minority"),
                         pl.when("_by_rule").then(pl.lit(False)).otherwise("ambiguous").alias("ambiguous"))
                     .drop("_bad", "_bad_text", "_by_rule"))
                m = pl.concat([m.filter(pl.col("ranks").is_not_null()), _totals_apart(units, m)], how="diagonal")
            m = _settled_by_peer_groups(m, units, groups, field)
            parts.append(sel.join(m, on=["group", "collective_seq_id"]))
    nj = firsts.filter(pl.col("status") == "not_joined")
    if nj.height:
        laggards = (
            prog.join(nj.select("group", "collective_seq_id"), on="group")
            .filter(pl.col("last_enqueued") < pl.col("collective_seq_id"))
            .group_by("group", "collective_seq_id")
            .agg(pl.col("rank").sort().alias("ranks"),
                 pl.col("last_enqueued").max().cast(pl.String).alias("minority"))
        )
        parts.append(nj.join(laggards, on=["group", "collective_seq_id"], how="left").with_columns(
            pl.col("op").cast(pl.String).alias("majority"),
            (pl.col("size") <= 2).alias("ambiguous"),
        ))
    parts.append(lone)
    out = pl.concat([conform(p, DIVERGENCES) for p in parts]).drop("later_mismatches")
    out = out.join(later, on="group", how="left").with_columns(pl.col("later_mismatches").fill_null(0))
    return conform(out, DIVERGENCES).sort("group", "collective_seq_id")
