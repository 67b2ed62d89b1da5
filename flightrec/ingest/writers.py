"""Which writer wrote each dump, and what its fields mean: the renames that make every writer's dump mean what
PyTorch's own recorder's does, before anything is matched.

Three writers share the dump format (version "2.10", the same keys) and differ in what the values say
(research: PyTorch's FlightRecorder*.hpp, hooks/FlightRecorderHook.cpp; torchcomms' hooks/fr/):

- "pytorch": ProcessGroupNCCL's, Gloo's, XCCL's own recorder. What `docs/findings.md` describes.
- "c10d_hook": PyTorch's hook for backends that don't record natively (`nccl2:`, the default NCCL backend from
  torch 2.15, and `fake:`, `mpi:`, `ucc:`, `c10d:`). Its pg_status counters hold op ids, not sequence
  numbers: they are not read. On a backend that reports completion (nccl2) an entry stays un-retired until it
  completes; on others it is retired when issued, which says nothing of completion.
- "torchcomms": one sequence counter for the whole process across every communicator (renumbered here per
  group, where the dump holds the rank's whole history), sends and receives with no peer (in a two-rank
  communicator the peer is the other member), `retired` meaning "issued", an empty pg_status, and the backend
  name where pg_config's desc would be (no group description).
"""

from __future__ import annotations

import polars as pl

WRITERS = ("pytorch", "c10d_hook", "torchcomms")
Writer = pl.Enum(list(WRITERS))

# Backends whose process groups record natively (PyTorch's `recordsFlightRecorderNatively`, and the vendors'
# forks that keep its recorder)
NATIVE_BACKENDS = ("nccl", "gloo", "xccl", "ncclx", "rccl", "rcclx", "hccl", "mccl")
# Hooked backends that report each op's completion to the hook (its entries complete like NCCL's)
HOOK_COMPLETION_BACKENDS = ("nccl2",)
# The backend names torchcomms writes where pg_config's desc would be
_TORCHCOMMS_BACKENDS = ("nccl", "ncclx", "rccl", "rcclx", "gloo", "xccl", "fake")
# Every backend prefix a writer we have read writes (the hook's: its backend's name, "c10d" when it has none)
KNOWN_BACKENDS = (*NATIVE_BACKENDS, *HOOK_COMPLETION_BACKENDS, *_TORCHCOMMS_BACKENDS, "fake", "mpi", "ucc", "c10d",
                  "custom")


def _backends(column: str = "backend") -> pl.Expr:
    return pl.col(column).fill_null("").str.split(",").list.eval(pl.element().filter(pl.element() != ""))


def dump_writers(dumps: pl.DataFrame, pg_status: pl.DataFrame, pg_config: pl.DataFrame) -> pl.DataFrame:
    """(rank, writer): each dump's writer, read from its profiling names' prefixes, whether it has a pg_status,
    and its pg_config's descs."""
    status = pg_status.select("rank").unique().with_columns(pl.lit(True).alias("_status"))
    # (a rank whose every group desc is a backend name: torchcomms writes the backend there)
    descs = (pg_config.group_by("rank")
             .agg(pl.col("pg_desc").fill_null("").is_in(_TORCHCOMMS_BACKENDS).all().alias("_backend_descs")))
    return (dumps.select("rank", "entry_count", _backends().alias("_b"))
            .join(status, on="rank", how="left").join(descs, on="rank", how="left")
            .select("rank", pl.when(~pl.col("_status").fill_null(False) & (pl.col("entry_count") > 0)
                                    & pl.col("_backend_descs").fill_null(False))
                    .then(pl.lit("torchcomms"))
                    .when(pl.col("_b").list.eval(~pl.element().is_in(NATIVE_BACKENDS)).list.any())
                    .then(pl.lit("c10d_hook"))
                    .otherwise(pl.lit("pytorch")).cast(Writer).alias("writer")))


def _unknown_backends_noted(dumps: pl.DataFrame) -> pl.DataFrame:
    """A dump whose profiling names carry a backend no writer we have read writes gets a problem saying how it
    was read (as the hook writer's, on a backend that reports no completion): its file is named in a warning."""
    unknown = _backends().list.eval(pl.element().filter(~pl.element().is_in(KNOWN_BACKENDS)))
    note = pl.format("its profiling names' backend ({}) is no writer's we know: its ops are read as reporting no "
                     "completion", unknown.list.join(", "))
    return dumps.with_columns(pl.when(unknown.list.len() > 0).then(pl.col("problems").list.concat(pl.concat_list(note)))
                              .otherwise(pl.col("problems")).alias("problems"))


def issued_not_finished(dumps: pl.DataFrame) -> pl.DataFrame:
    """(rank): ranks whose writer retires an entry when it is issued, so `retired` says nothing of completion:
    torchcomms', and the hook's on a backend that doesn't report completion."""
    return dumps.filter((pl.col("writer") == "torchcomms")
                        | ((pl.col("writer") == "c10d_hook")
                           & ~_backends().list.eval(pl.element().is_in(HOOK_COMPLETION_BACKENDS)).list.any())
                        ).select("rank")


def as_pytorch_writes_it(raw: dict[str, pl.DataFrame]) -> None:
    """Gives `raw` (load's per-file tables, changed in place: its entries are the job's biggest frame, and no
    second reference to them is kept) a `writer` column in `dumps`, and renames every writer's fields to mean
    what PyTorch's recorder's mean (see the module's docstring). Nothing else changes for PyTorch's own dumps."""
    dumps = raw["dumps"]
    writers = dump_writers(dumps, raw["pg_status"], raw["pg_config"])
    out = raw
    out["dumps"] = dumps = _unknown_backends_noted(
        dumps.drop("writer", strict=False).join(writers, on="rank", how="left", maintain_order="left"))
    if (writers["writer"] == "pytorch").all():
        return
    hook = writers.filter(pl.col("writer") == "c10d_hook").select("rank")
    comms = writers.filter(pl.col("writer") == "torchcomms").select("rank")
    # (the hook's counters hold op ids: as collective sequence numbers they would read as far ahead)
    out["pg_status"] = raw["pg_status"].join(hook, on="rank", how="anti")
    entries = raw["entries"]
    unknown = issued_not_finished(dumps)
    if unknown.height:
        entries = entries.with_columns(
            pl.when(pl.col("rank").is_in(unknown["rank"].implode())).then(None).otherwise(pl.col("retired"))
            .alias("retired"))
    if comms.height:
        entries, out["dumps"] = _renumbered_per_group(entries, out["dumps"], comms)
        # (its desc is the backend's name: no description of the group, so no kind to compare groups by)
        out["pg_config"] = raw["pg_config"].with_columns(
            pl.when(pl.col("rank").is_in(comms["rank"].implode())).then(pl.lit("")).otherwise(pl.col("pg_desc"))
            .alias("pg_desc"))
        entries = entries.with_columns(
            pl.when(pl.col("rank").is_in(comms["rank"].implode())).then(pl.lit("", dtype=entries.schema["pg_desc"]))
            .otherwise(pl.col("pg_desc")).alias("pg_desc"))
    out["entries"] = entries


def _renumbered_per_group(entries: pl.DataFrame, dumps: pl.DataFrame,
                          comms: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """torchcomms numbers every op of the process with one counter; a group's collectives are numbered here from
    1 in the rank's record order, as PyTorch numbers them. Right only where the dump holds the rank's whole
    history (its first record is 0): where the ring buffer rolled its oldest entries out, how many of a group's
    collectives came before is unknown, so its entries are given no sequence number (and its dump says so)."""
    firsts = (entries.lazy().filter(pl.col("rank").is_in(comms["rank"].implode()))
              .group_by("rank").agg(pl.col("record_id").min().alias("_first")).collect())
    whole = firsts.filter(pl.col("_first") == 0)["rank"].implode()
    mine = pl.col("rank").is_in(comms["rank"].implode())
    collective = mine & ~pl.col("is_p2p")
    ordinal = (pl.int_range(1, pl.len() + 1, dtype=pl.Int64)
               .over(pl.col("rank"), pl.col("pg_name"), order_by="record_id"))
    entries = entries.with_columns(
        pl.when(collective & pl.col("rank").is_in(whole)).then(ordinal)
        .when(collective).then(None)
        .otherwise(pl.col("collective_seq_id")).alias("collective_seq_id"))
    rolled = firsts.filter(pl.col("_first") > 0)["rank"].to_list()
    if rolled:
        note = ("torchcomms numbers the ops of every group with one counter, and this dump's ring buffer rolled its "
                "oldest entries out: its collectives can't be lined up with its peers' (how far it got in each "
                "group is unknown)")
        dumps = dumps.with_columns(
            pl.when(pl.col("rank").is_in(rolled)).then(pl.col("problems").list.concat(pl.lit([note])))
            .otherwise(pl.col("problems")).alias("problems"))
    return entries, dumps


def pair_peers_in_two_rank_groups(entries: pl.DataFrame, members: pl.DataFrame) -> pl.DataFrame:
    """Sends and receives that name no peer (torchcomms') in a group of two ranks: the peer is the other member.
    (In a larger group it stays unknown: such a transfer is not paired.)"""
    pairs = (members.filter(pl.len().over("group") == 2)
             .with_columns(pl.col("rank").reverse().over("group").alias("_other"),
                           pl.col("local_rank").reverse().over("group").alias("_other_local")))
    if pairs.height == 0:
        return entries
    unnamed = pl.col("op").is_in(["send", "recv"]) & pl.col("peer").is_null() & pl.col("peer_local").is_null()
    filled = (entries.lazy().select("group", "rank", unnamed.alias("_u"))
              .join(pairs.lazy().select("group", "rank", "_other", "_other_local"), on=["group", "rank"],
                    how="left", maintain_order="left")
              .select(pl.when("_u").then("_other").alias("_peer"),
                      pl.when("_u").then(pl.col("_other_local").cast(pl.Int32)).alias("_local")).collect())
    return entries.with_columns(pl.coalesce(pl.col("peer"), filled["_peer"]).alias("peer"),
                                pl.coalesce(pl.col("peer_local"), filled["_local"]).alias("peer_local"))
