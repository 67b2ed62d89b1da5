"""Match collectives and point-to-point ops across ranks, for every process group at once.

Frames in, frames out, pure Polars. The evidence used holds whatever the recorder setting: sequence ids
(who enqueued what), shapes and dtypes (who did something else), and completion only where the rank's
recorder reports it (NCCL does, with or without timing; Gloo never does)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from flightrec.analysis.collectives import classify, collective_units
from flightrec.analysis.entry_facts import completion_by_rank, tracks_completion, written_only_active
from flightrec.analysis.first_divergence import divergences
from flightrec.analysis.gpu_stalls import gpu_stalls
from flightrec.analysis.p2p_pairing import groups_with_p2p, p2p_pairs
from flightrec.analysis.progress import progress


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
