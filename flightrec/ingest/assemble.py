"""From raw frames to a `Trace`: one job's world size, each group's members (declared, or inferred from who
recorded in it), each entry's group and peer, ranks in order."""

from __future__ import annotations

import json
import os
import warnings

import polars as pl
import pyarrow as pa

from flightrec.errors import MultipleJobsError
from flightrec.ingest import writers
from flightrec.ingest.group_membership import inferred_groups, place_rolled_out_members, unseen_ranks
from flightrec.ingest.raw_frames import list_column
from flightrec.model import dense_index as lookup
from flightrec.model.schema import (
    GROUPS,
    MEMBERS,
    MEMBERSHIPS,
    PG_STATUS,
    UNLISTED,
    Text,
    conform,
    empty,
    ran_collectives,
    reports_completion,
)
from flightrec.model.trace import DUMPS_WITH_LOADED, ENTRIES_WITH_GROUP, Trace, format_ranks


def _parse_rank_lists(texts: list[str | None]) -> list[list[int] | None]:
    """Each distinct `ranks` string once: the world group's list is the same string on every rank. Parsed as
    one JSON array of them all where each is one bracketed list of ints (one call, not one per group: 3,105
    groups at 8,192 ranks), else one at a time, where a bad one reads as None. (One pair of brackets each: so
    bad texts can't join into good lists, as "[1],[2" and "3]" would.)"""
    if texts and all(t and t[0] == "[" and t[-1] == "]" and t.count("[") == 1 and t.count("]") == 1 for t in texts):
        try:
            values = json.loads("[" + ",".join(texts) + "]")
        except (ValueError, TypeError):
            values = None
        if (values is not None and len(values) == len(texts)
                and all(type(v) is list and all(type(x) is int for x in v) for v in values)):
            return [sorted(v) for v in values]
    out = []
    for text in texts:
        try:
            value = json.loads(text) if text else None
            out.append(sorted(int(x) for x in value) if isinstance(value, list) else None)
        except (ValueError, TypeError):
            out.append(None)
    return out


def _groups_from_config(pg_config: pl.DataFrame, rank_lists: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """groups (one per name + member set) and memberships (what each rank declared)."""
    distinct = (pg_config.select("pg_name", "ranks_key").unique()
                .join(rank_lists, on="ranks_key", how="left").sort("pg_name", "ranks_key"))
    distinct = distinct.with_columns(
        list_column("ranks", _parse_rank_lists(distinct["ranks_text"].to_list()), pa.int64()),
    ).filter(pl.col("ranks").is_not_null())
    variants = pl.col("ranks_key").rank("dense").over("pg_name").cast(pl.Int64)
    distinct = distinct.with_columns(
        pl.when(pl.col("ranks_key").n_unique().over("pg_name") > 1)
        .then(pl.col("pg_name") + "#" + variants.cast(pl.String))
        .otherwise(pl.col("pg_name"))
        .alias("group")
    )
    desc = (pg_config.join(distinct.select("pg_name", "ranks_key", "group"), on=["pg_name", "ranks_key"])
            .group_by("group").agg(pl.col("pg_desc").drop_nulls().mode().first()))
    groups = distinct.join(desc, on="group", how="left").with_columns(
        pl.col("ranks").list.len().cast(pl.Int64).alias("size"),
        pl.lit("pg_config").alias("source"),
    )
    memberships = pg_config.join(distinct.select("pg_name", "ranks_key", "group"),
                                 on=["pg_name", "ranks_key"], how="inner")
    return conform(groups, GROUPS), conform(memberships, MEMBERSHIPS)


def assemble(raw: dict[str, pl.DataFrame], root: str, world_size: int | None) -> Trace:
    """Raw per-file tables -> the typed, joined Trace. Vectorized; runs on cached tables too.
    Takes `raw["entries"]` out of `raw`: the frame is rebuilt (rechunked) here, and the reader's copy is freed
    as soon as that is done, not kept until the caller returns."""
    writers.as_pytorch_writes_it(raw)
    dumps, entries, pg_config = raw["dumps"], raw.pop("entries"), raw["pg_config"]
    # Gloo writes one config with an empty name (`{'': {'name': '', 'ranks': '[0, 1, 2, 3]'}}`): it can't be
    # tied to a group, but its rank list still tells the world size.
    rank_lists = raw["rank_lists"]
    unnamed = pg_config.filter(pl.col("pg_name") == "").select("ranks_key").unique().join(rank_lists, on="ranks_key")
    unnamed_lists = [r for r in _parse_rank_lists(unnamed["ranks_text"].to_list()) if r]
    groups, memberships = _groups_from_config(pg_config.filter(pl.col("pg_name") != ""), rank_lists)
    _one_world(groups, memberships, dumps)

    world_size, world_size_from = _world_size(groups, unnamed_lists, dumps, world_size)
    with_entries = set(dumps.filter(pl.col("entry_count") > 0)["rank"].to_list())

    def with_inferred(declared: pl.DataFrame, world_size: int) -> pl.DataFrame:
        found = pl.concat([declared, inferred_groups(entries, declared, world_size)]).sort("group")
        return place_rolled_out_members(found, entries, raw["pg_status"],
                                        without_entries=[r for r in range(world_size) if r not in with_entries])

    declared_groups = groups
    groups = with_inferred(declared_groups, world_size)
    if world_size_from == "seen":
        # (no dump lists the world: ranks past the highest seen that left no dump show only as members the
        # groups lack; the world is then as large as they need, and those ranks read as missing)
        unseen = unseen_ranks(groups, entries, world_size)
        if unseen:
            world_size, world_size_from = world_size + unseen, "groups"
            groups = with_inferred(declared_groups, world_size)

    members = (groups.select("group", "ranks")
               .with_columns(pl.int_ranges(pl.col("ranks").list.len()).alias("local_rank"))
               .explode("ranks", "local_rank").rename({"ranks": "rank"}))
    members = conform(members, MEMBERS)

    entries = _with_group_and_peer(entries, memberships, groups, members)
    if (dumps["writer"] == "torchcomms").any():
        entries = writers.pair_peers_in_two_rank_groups(entries, members)
    if not _sorted_by_rank_and_record(entries):  # files are read in rank order, entries in record order: rare
        entries = entries.sort("rank", "record_id")

    dumps = _check_declared_ranks(dumps, memberships, members)
    dumps = conform(_history_kept(dumps, entries, raw["pg_status"]), DUMPS_WITH_LOADED).sort("rank")
    return Trace(
        root=root, dumps=dumps, entries=entries, stacks=raw["stacks"].unique("stack_id").sort("stack_id"),
        groups=groups, members=members, memberships=memberships,
        pg_status=conform(raw["pg_status"], PG_STATUS).sort("rank", "pg_id"), world_size=int(world_size),
        world_size_from=world_size_from, unlisted=raw.get("unlisted", empty(UNLISTED)),
        empty_hosts=raw.get("empty_hosts", []),
    )


def _world_size(groups: pl.DataFrame, unnamed_lists: list[list[int]], dumps: pl.DataFrame,
                world_size: int | None) -> tuple[int, str]:
    """(world size, where it was read: "given", "declared" or "seen"), warning where one given disagrees with
    the dumps. `unnamed_lists`: the rank lists of Gloo's unnamed configs."""
    # What the dumps prove: every rank a group names exists. What they declare: the world is the default group
    # (Gloo's unnamed config), when it is there; the largest subgroup is not.
    listed = max([*(max(r) + 1 for r in unnamed_lists),
                  *([int(groups["ranks"].list.max().max()) + 1] if groups.height else [])], default=0)
    declared_world = max([*map(len, unnamed_lists),
                          *groups.filter(pl.col("pg_desc") == "default_pg")["size"].to_list()], default=None)
    # A file the readers refused names a rank only by its file name: where the dumps declare the world, one
    # named past it (junk beside the dumps, another job's file) is no rank of this job, and would make
    # every rank it adds look missing.
    named = dumps.filter(pl.col("loaded")) if declared_world and "loaded" in dumps.columns else dumps
    max_rank = named["rank"].max() if named.height else -1
    max_rank = -1 if max_rank is None else max_rank
    proven = max(listed, int(max_rank) + 1)
    # (a group listing every rank up to the last it proves is the world group, whatever its desc)
    world_listed = declared_world is not None or (
        groups.height > 0 and (groups["size"] == proven).any() and listed == proven)
    world_size_from = "given" if world_size is not None else "declared" if world_listed else "seen"
    if world_size is None:
        world_size = proven
    elif proven > world_size:
        # (the dumps prove more ranks: analysed as given, their ranks past it read as "3 of 2 loaded" and their
        # collectives as missing members. To look at part of a job, select its groups instead: --pg)
        warnings.warn(f"world size {world_size} was given, but the dumps hold rank {max_rank} and groups naming "
                      f"ranks up to {listed - 1}: using {proven}; check --world-size", stacklevel=3)
        world_size = proven
    elif declared_world and world_size > declared_world:
        # (kept as given too: the ranks past the declared world then read as missing dumps)
        warnings.warn(f"world size {world_size} was given, but the dumps' default group declares a world of "
                      f"{declared_world} ranks: {'rank' if world_size - declared_world == 1 else 'ranks'} "
                      f"{format_ranks(range(declared_world, world_size))} will read as missing; "
                      "check --world-size", stacklevel=3)
    return world_size, world_size_from


def _with_group_and_peer(entries: pl.DataFrame, memberships: pl.DataFrame, groups: pl.DataFrame,
                         members: pl.DataFrame) -> pl.DataFrame:
    """`entries` with each entry's group and its peer's global rank."""
    # Each entry's group: by its rank's declaration when there is one, else by name (inferred groups).
    # (small frames; entries hold pg_name as a categorical)
    rank_group = memberships.select("rank", pl.col("pg_name").cast(Text), "group").unique(["rank", "pg_name"])
    inferred = groups.filter(pl.col("source") == "inferred").select(pl.col("pg_name").cast(Text),
                                                                    pl.col("group").alias("_g"))
    # Group and peer are computed from the key columns only, then attached: joining the whole frame would copy
    # every column. One contiguous chunk first (in-memory loads hand over one chunk per worker batch): the new
    # columns are one chunk, and misaligned chunks would make every later select copy the frame column by column.
    if any(n > 1 for n in entries.n_chunks("all")):
        entries = entries.rechunk()
    by_name = pl.concat([rank_group.select("pg_name", "group").unique(), inferred.rename({"_g": "group"})])
    if by_name["pg_name"].is_unique().all():
        # Every name is one group (names are reused only when a group is split): read it by the name's id.
        by_name = by_name.select(pl.col("pg_name").to_physical().alias("_n"), "group")
        size = int(max(by_name["_n"].max() or 0, entries["pg_name"].to_physical().max() or 0)) + 1
        keys = entries.lazy().select("peer_local", lookup.read(
            lookup.by_position(by_name, size), "group", pl.col("pg_name").to_physical(), in_range=True))
    else:   # which group a reused name means depends on the rank that declared it
        keys = (entries.lazy().select("rank", "pg_name", "peer_local", _rank_and_name())
                .join(rank_group.lazy().select(_rank_and_name(), "group"), on="_k", how="left", maintain_order="left"))
        if inferred.height:
            keys = keys.join(inferred.lazy(), on="pg_name", how="left", maintain_order="left").with_columns(
                pl.coalesce("group", "_g").alias("group"))
    keys = (keys.select("group", _peer_of(members, groups))
            .collect()
            .rechunk())   # the join hands back a chunk per thread: aligned with the rest, one chunk too
    return conform(entries.drop("group", "peer", strict=False).with_columns(keys["group"], keys["peer"]),
                   ENTRIES_WITH_GROUP)


def _one_world(groups: pl.DataFrame, memberships: pl.DataFrame, dumps: pl.DataFrame) -> None:
    """Every dump declares the same world (its default group's ranks): dumps of jobs of different sizes side by
    side (a run's files beside another run's, under other rank numbers) would read as one job of a mix.

    Raises:
        MultipleJobsError: which ranks declare which world, and what to do.
    """
    worlds = groups.filter(pl.col("pg_desc") == "default_pg")
    if worlds.height < 2:
        return
    declaring = (memberships.join(worlds.select("group", "size"), on="group")
                 .group_by("size").agg(pl.col("rank").unique().sort()).sort("size"))
    lines = "\n".join(f"  ranks {format_ranks(ranks)} declare a world of {size:,} ranks"
                      for size, ranks in declaring.iter_rows())
    folders = sorted({os.path.dirname(p) for p in dumps["path"].to_list()})
    raise MultipleJobsError(f"the dumps come from jobs of different sizes:\n{lines}\nanalyse one job's dumps at a "
                            f"time: move the others out of {folders[0] if len(folders) == 1 else 'the folder'}, or "
                            "keep one folder per job")


def _history_kept(dumps: pl.DataFrame, entries: pl.DataFrame, pg_status: pl.DataFrame) -> pl.DataFrame:
    """`wrapped` and `only_active`: which dumps hold only part of their rank's history.

    A recorder numbers its entries 0, 1, 2, ... (`record_id`) and dumps the newest it kept: a whole history
    starts at 0 with no gap. One that starts later rolled its oldest entries out of the ring buffer; one with
    gaps had entries left out by the writer: with `TORCH_INCLUDE_ONLY_ACTIVE` (`onlyActive`) NCCL's writes only
    those it has not seen complete. Such a dump holds no `completed` entry, while its pg_status counts completed
    collectives: then every dump of the job was written so (the setting is the job's), even one with no entry
    left (its rank had nothing in flight: not a dump that lost its entries). Either way, a group with no entry
    in the dump is no proof that the rank never joined it: how far it got there is its pg_status's to say."""
    spans = (entries.lazy().select(pl.col("rank").set_sorted(), "record_id").group_by("rank")
             .agg(((pl.col("record_id").min() > 0)
                   | (pl.col("record_id").max() - pl.col("record_id").min() + 1 > pl.col("record_id").count()))
                  .alias("_partial"))
             .collect())
    # (Gloo's writer never marks an entry completed, and drops nothing for `onlyActive`: its dumps don't count;
    # the scan of every entry's state last, where the rest holds)
    only_active = bool(spans["_partial"].any() and (pg_status["last_completed"] > 0).any()
                       and dumps.select(reports_completion(pl.col("backend")).any()).item()
                       and not (entries["state"] == "completed").any())
    ran = ran_collectives(pg_status)
    return (dumps.join(spans, on="rank", how="left").join(ran, on="rank", how="left")
            .with_columns(pl.lit(only_active).alias("only_active"))
            .with_columns((pl.col("_partial").fill_null(False) & (pl.col("entry_count") > 0)
                           | pl.col("only_active") & pl.col("_ran").fill_null(False)).alias("wrapped"))
            .drop("_partial", "_ran"))


def _rank_and_name() -> pl.Expr:
    """(rank, pg_name) as one u64 (rank high, the name's categorical id low): a join hashes one integer."""
    return (pl.col("rank").cast(pl.UInt64, strict=False) * (1 << 32)
            + pl.col("pg_name").to_physical().cast(pl.UInt64)).alias("_k")


def _peer_of(members: pl.DataFrame, groups: pl.DataFrame) -> pl.Expr:
    """An entry's peer rank from its group and the peer's local rank, read by position: `members` holds each
    group's ranks contiguously in local-rank order, so the peer is row start(group) + peer_local. Every entry's
    group is one of `groups`, so the per-group table laid out over their ids covers every key."""
    spans = (members.with_row_index("_i").group_by("group")
             .agg(pl.col("_i").min().cast(pl.Int64).alias("_start"), pl.len().cast(pl.Int64).alias("_n"))
             .select(pl.col("group").to_physical().alias("_g"), "_start", "_n"))
    by_group = lookup.by_position(spans, int(groups["group"].to_physical().max() or 0) + 1)
    group, local = pl.col("group").to_physical(), pl.col("peer_local")
    inside = (local >= 0) & (local < lookup.read(by_group, "_n", group, in_range=True))
    at = pl.when(inside).then(lookup.read(by_group, "_start", group, in_range=True) + local)
    return lookup.read(members, "rank", at, in_range=True).alias("peer")


def _sorted_by_rank_and_record(entries: pl.DataFrame) -> bool:
    if entries.height < 2:
        return True
    # (streaming: the differences are made a morsel at a time, not as whole columns of fresh memory; 6x faster
    # at 31M entries)
    step = entries.lazy().select(
        ((pl.col("rank").diff() > 0) | ((pl.col("rank").diff() == 0) & (pl.col("record_id").diff() >= 0)))
        .fill_null(True).all()).collect(engine="streaming")
    return bool(step.item())


def _check_declared_ranks(dumps: pl.DataFrame, memberships: pl.DataFrame, members: pl.DataFrame) -> pl.DataFrame:
    """A file named for rank r whose pg_config puts it in groups without r was probably renamed or mixed up."""
    bad = (memberships.join(members, on=["group", "rank"], how="anti")
           .group_by("rank").agg(pl.col("pg_name").unique().sort()))
    if bad.height == 0:
        return dumps
    bad = bad.with_columns(
        pl.format("the file name says rank {} but its pg_config does not list that rank in group(s) {}",
                  pl.col("rank"), pl.col("pg_name").list.join(", ")).alias("_problem"))
    return (dumps.join(bad.select("rank", "_problem"), on="rank", how="left")
            .with_columns(pl.when(pl.col("_problem").is_not_null())
                          .then(pl.col("problems").list.concat(pl.concat_list("_problem")))
                          .otherwise(pl.col("problems")).alias("problems"))
            .drop("_problem"))
