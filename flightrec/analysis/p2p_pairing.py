"""Sends paired with receives between each pair of ranks (by p2p sequence id, or by order where ids are
missing), receives from any source, and the send/recv batches."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.entry_facts import cut_short, is_p2p_closer, written_only_active
from flightrec.model.schema import (
    ANY_SOURCE,
    P2P_OPS_SCHEMA,
    conform,
)


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
    own_pending, done = _own_pending(entries, pg_status, only_active)
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
    return conform(_paired(pool), P2P_OPS_SCHEMA).sort("group", "src", "dst", "ordinal")


def _own_pending(entries: pl.DataFrame, pg_status: pl.DataFrame, only_active: bool) -> tuple[pl.Expr, pl.DataFrame]:
    """(whether a send or receive run alone is unfinished, the counters that expression reads per (rank, pg_id)).
    Its own state, but where the writer kept only unfinished entries, also the group's counters (`p2p_pairs`)."""
    if not only_active:
        return pl.col("state") != "completed", pg_status.clear()
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
    return own_pending, done


def _paired(pool: pl.DataFrame) -> pl.DataFrame:
    """Each send beside the receive it pairs with (by group, ends and ordinal; receives from any source after),
    and the pair's status."""
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
    return pairs


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
