"""Load every dump under a directory into typed Polars frames (the `Trace`).

Files are parsed in a process pool, each turned into Arrow columns right away; the main process only
concatenates columns. A cache keyed on every file's (path, size, mtime) makes the second run map columns
instead of reading pickles (`flightrec.store.cache`). This module interprets nothing: it reads, renames and types.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import polars as pl
import pyarrow as pa

from flightrec.errors import DumpProblemWarning, FlightrecError, MultipleJobsError, NoDumpsError, require_count
from flightrec.ingest import pool as parse_pool
from flightrec.ingest import writers
from flightrec.ingest.column_builder import raw_values
from flightrec.ingest.discover import DumpFile, discover, discover_all
from flightrec.ingest.group_membership import inferred_groups, place_rolled_out_members, unseen_ranks
from flightrec.model import dense_index as lookup
from flightrec.model.schema import (
    DUMPS,
    ENTRIES,
    GROUPS,
    MEMBERS,
    MEMBERSHIPS,
    PG_STATUS,
    RANK_LISTS,
    RAW_PG_CONFIG,
    STACKS,
    UNLISTED,
    Text,
    conform,
    empty,
    ran_collectives,
    reports_completion,
)
from flightrec.model.wording import listed
from flightrec.store import cache as _cache
from flightrec.store.shards import find_shards, read_shards


@dataclass(frozen=True, kw_only=True)
class LoadOptions:
    """How to find and read dumps.

    Attributes:
        prefix: file-name prefix before the rank; default: any name ending in a number.
        world_size: the job's world size when no dump says it (Gloo dumps carry no group config).
        workers: processes for parsing; default: one per core.
        use_cache: read and write the cache (see `flightrec.store.cache`).
        cache_dir: where the cache lives; default `$FLIGHTREC_CACHE_DIR` or `~/.cache/flightrec`.
        progress: called as progress(done_files, total_files) while parsing.
        reader: how pickles are parsed. "unpickler": the plain-data-only unpickler, then Arrow (always
            available). "tape": the compiled opcode reader (`flightrec.ingest.fastpickle.walker`; needs numba, `pip install
            flightrec[fast]`), same columns, 1.2-2.2x faster cold, ~0.45 s to start (in each worker, at once).
            "auto" (default): the tape when numba is installed and the pickles add up to
            `parse_pool.TAPE_MIN_BYTES`, else the unpickler.
    """

    prefix: str | None = None
    world_size: int | None = None
    workers: int | None = None
    use_cache: bool = True
    cache_dir: str | os.PathLike | None = None
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)
    reader: str = "auto"

    def __post_init__(self) -> None:
        require_count("world_size", self.world_size)
        require_count("workers", self.workers)
        parse_pool.check_reader(self.reader)




@dataclass(frozen=True)
class Trace:
    """Every rank's dump as frames. All are Polars DataFrames with the schemas in `flightrec.model.schema`.

    Attributes:
        dumps: one row per dump file (rank, host, path, format, version, problems...).
        entries: one row per recorded collective or p2p op, every rank.
        stacks: stack_id -> frames, deduplicated across the job.
        groups: one row per process group (name + member set), with its ranks.
        members: (group, rank, local_rank) for every member of every group.
        memberships: (rank, pg_name, ranks_key): what each rank's own pg_config declares.
        pg_status: per rank and local pg id, the last enqueued/started/completed collective seq ids.
        world_size: ranks in the job (given; else from the world group; else the highest rank seen + 1, or as
            many as the groups left in flight need: `world_size_from`).
        world_size_from: where `world_size` comes from: "given" (the caller's), "declared" (a dump lists the
            world's ranks: the default group's), "seen" (the highest rank a file or a group names, + 1: Gloo
            writes no group config once a job makes subgroups; ranks past it that left no dump don't show), or
            "groups" (more: groups left in flight lack members no dump shows, `inferred_groups.unseen_ranks`).
    """

    root: str
    dumps: pl.DataFrame
    entries: pl.DataFrame
    stacks: pl.DataFrame
    groups: pl.DataFrame
    members: pl.DataFrame
    memberships: pl.DataFrame
    pg_status: pl.DataFrame
    world_size: int
    world_size_from: str = "declared"
    # folders under `root` that could not be listed (schema.UNLISTED): dumps in them were not read
    unlisted: pl.DataFrame = field(default_factory=lambda: empty(UNLISTED))
    # host folders beside the ones holding dumps, named alike, with no dump in them (`discover.Found.empty_hosts`)
    empty_hosts: list[str] = field(default_factory=list)

    def select_groups(self, pg: str | None) -> pl.DataFrame:
        """The groups whose name, desc or identity is `pg` (all groups for None).

        Raises:
            FlightrecError: no group matches; the message lists the known names and descs.
        """
        if pg is None:
            return self.groups
        keep = self.groups.filter((pl.col("pg_name") == pg) | (pl.col("pg_desc") == pg) | (pl.col("group") == pg))
        if keep.height == 0:
            names = sorted({*self.groups["pg_desc"].drop_nulls().to_list(), *self.groups["pg_name"].to_list()})
            raise FlightrecError(f"no process group is named or described {pg!r}; known: {listed(names, 20)} "
                                 "(see `flightrec groups`)")
        return keep

    def relative(self, path: str) -> str:
        """A dump's path as the user knows it: relative to the directory they passed."""
        try:
            return os.path.relpath(path, self.root) if os.path.isdir(self.root) else os.path.basename(path)
        except ValueError:
            return path

    @property
    def missing_ranks(self) -> list[int]:
        have = set(self.dumps.filter(pl.col("loaded"))["rank"].to_list())
        return [r for r in range(self.world_size) if r not in have]

    @property
    def unreadable_ranks(self) -> list[int]:
        """Ranks whose dump is there and could not be read (permissions, an I/O error); and where a folder could not
        be listed, every missing rank, as its dump may be in it."""
        unread = set(self.dumps.filter(pl.col("unreadable").fill_null(False))["rank"].to_list())
        if self.unlisted.height:
            unread |= set(self.missing_ranks)
        return sorted(unread)

    @property
    def hosts(self) -> dict[int, str]:
        known = self.dumps.filter(pl.col("host").is_not_null())
        return dict(zip(known["rank"].to_list(), known["host"].to_list()))

    def summary_dict(self) -> dict:
        """What `summary` says, for `flightrec load --format json`."""
        loaded = self.dumps.filter(pl.col("loaded"))
        failed = self.dumps.filter(~pl.col("loaded"))
        unreadable = pl.col("unreadable").fill_null(False)

        def files(frame: pl.DataFrame) -> list[dict]:
            return [{"path": self.relative(p), "rank": r, "problems": list(x)}
                    for p, r, x in frame.select("path", "rank", "problems").iter_rows()]
        return {
            "root": str(self.root), "world_size": self.world_size, "world_size_from": self.world_size_from,
            "loaded": loaded.height, "missing_ranks": self.missing_ranks, "entries": self.entries.height,
            "process_groups": self.groups.height,
            "versions": sorted(v for v in loaded["version"].unique().to_list() if v),
            "backends": sorted(b for b in loaded["backend"].unique().to_list() if b),
            "refused": files(failed.filter(~unreadable)), "unreadable": files(failed.filter(unreadable)),
            "read_with_problems": files(loaded.filter(pl.col("problems").list.len() > 0)),
            "unlisted_folders": self.unlisted.to_dicts(), "empty_host_folders": list(self.empty_hosts),
        }

    def summary(self) -> str:
        loaded = self.dumps.filter(pl.col("loaded"))
        versions = sorted(v for v in loaded["version"].unique().to_list() if v)
        backends = sorted(b for b in loaded["backend"].unique().to_list() if b)
        lines = [
            f"{self.root}: {loaded.height} of {self.world_size} ranks loaded, {self.entries.height:,} entries, "
            f"{self.groups.height} process groups",
            f"  recorder versions: {', '.join(versions) or 'unknown'}; backends: {', '.join(backends) or 'unknown'}",
        ]
        missing = self.missing_ranks
        if missing:
            lines.append(f"  missing dumps: ranks {format_ranks(missing)}")
        refused = self.dumps.filter(~pl.col("loaded"))
        for path, problems in zip(refused["path"].to_list(), refused["problems"].to_list()):
            lines.append(f"  refused {path}: {'; '.join(problems)}")
        # (loaded with a problem, e.g. cut short: how far its rank got is then unknown; say it where -q hides
        # the warnings, at most a screenful)
        noted = loaded.filter(pl.col("problems").list.len() > 0)
        for path, problems in zip(noted["path"].head(20).to_list(), noted["problems"].head(20).to_list()):
            lines.append(f"  read with a problem {self.relative(path)}: {'; '.join(problems)}")
        if noted.height > 20:
            lines.append(f"  ... and {noted.height - 20:,} more files read with a problem")
        return "\n".join(lines)


def format_ranks(ranks: Iterable[int], limit: int = 12) -> str:
    """[0,1,2,3,7,9,10] -> '0-3, 7, 9-10'; long lists are cut with a count."""
    ranks = sorted(set(ranks))
    spans: list[str] = []
    start = prev = None
    for r in ranks:
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            spans.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        spans.append(f"{start}" if start == prev else f"{start}-{prev}")
    if len(spans) > limit:
        return ", ".join(spans[:limit]) + f", ... ({len(ranks):,} ranks)"
    return ", ".join(spans)


# ---------------------------------------------------------------------------------------------- parsing


def _parse_all(files: list[DumpFile], options: LoadOptions, spool: str | None = None) -> list[dict]:
    return parse_pool.parse_all(files, options.workers, options.reader, options.progress, spool)


# ---------------------------------------------------------------------------------------------- assembly


def _printable(text: str | None) -> str | None:
    """A file name's text as UTF-8 can hold it: bytes that aren't UTF-8 (kept by Python as lone surrogates)
    become U+FFFD. For display only; files are opened by their `Path`."""
    return None if text is None else text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _assemble_raw(files: list[DumpFile], results: list[dict]) -> dict[str, pl.DataFrame]:
    metas = [m for r in results for m in r["metas"]]
    by_rank = {f.rank: f for f in files}
    dumps = pl.DataFrame({
        "rank": [m["rank"] for m in metas],
        "host": [_printable(by_rank[m["rank"]].host) for m in metas],
        "path": [_printable(str(by_rank[m["rank"]].path)) for m in metas],
        "format": [m["format"] for m in metas],
        "version": [m["version"] for m in metas],
        "backend": [m["backend"] for m in metas],
        "comm_lib_version": [m["comm_lib_version"] for m in metas],
        "entry_count": [m["entry_count"] for m in metas],
        # (when the file was written, where it was not copied since without its times: `dump_times`)
        "mtime_ns": [by_rank[m["rank"]].mtime_ns for m in metas],
        "problems": _list_column("problems", [[_printable(p) for p in m["problems"]] for m in metas],
                                 pa.large_string()),
        "loaded": [m["loaded"] for m in metas],
        "unreadable": [m.get("unreadable", False) for m in metas],
    }, schema_overrides={"problems": pl.List(pl.String), "host": pl.String, "version": pl.String,
                         "backend": pl.String, "comm_lib_version": pl.String, "format": pl.String})
    entries = _entries_frame([r["entries"] for r in results if r["entries"] is not None])
    stacks: dict[int, list] = {}
    rank_lists: dict[int, str] = {}
    for r in results:
        stacks.update(r["stacks"])
        rank_lists.update(r["rank_lists"])
    return {
        "dumps": dumps,
        "entries": entries,
        "pg_config": _frame_from_tables([r["pg_config"] for r in results], RAW_PG_CONFIG),
        "rank_lists": pl.DataFrame({"ranks_key": list(rank_lists), "ranks_text": list(rank_lists.values())},
                                   schema=RANK_LISTS),
        "pg_status": _frame_from_tables([r["pg_status"] for r in results], PG_STATUS),
        "stacks": pl.DataFrame({"stack_id": list(stacks), "frames": list(stacks.values())},
                               schema=STACKS),
    }


def _frame_from_tables(tables: list[pa.Table], schema: pl.Schema) -> pl.DataFrame:
    """The workers' row tables (`flatten.rows_table`) as one frame of `schema`."""
    if not tables:
        return empty(schema)
    return conform(pl.from_arrow(pa.concat_tables(tables)), schema)


def _list_column(name: str, lists: list[list | None], values_type: pa.DataType) -> pl.Series:
    """A list column from Python lists (null where a list is None), built as Arrow offsets and values: Polars
    builds a Series per inner list (50 ms for 8,192 ranks' lists of problems, nearly all empty; 30-40 ms for the
    3,105 groups' rank lists of 8,192 ranks)."""
    offsets = [0]
    for inner in lists:
        offsets.append(offsets[-1] + (len(inner) if inner is not None else 0))
    values = pa.array([v for inner in lists if inner is not None for v in inner], type=values_type)
    mask = pa.array([inner is None for inner in lists], type=pa.bool_())
    return pl.Series(name, pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), values, mask=mask))


def _entries_frame(parts: list) -> pl.DataFrame:
    """Concatenate the workers' columns (tables, or spool files to memory-map) into the ENTRIES frame."""
    tables = [pa.ipc.open_file(pa.memory_map(p, "r")).read_all() if isinstance(p, str) else p for p in parts]
    if not tables:
        return empty(ENTRIES)
    table = pa.concat_tables(tables, promote_options="permissive")
    enums = {name: _as_enum(table.column(name), dtype) for name, dtype in ENTRIES.items()
             if isinstance(dtype, pl.Enum) and name in table.column_names}
    enums = {name: series for name, series in enums.items() if series is not None}
    frame = pl.from_arrow(table.drop_columns(list(enums)), rechunk=False)
    return conform(frame.with_columns(**enums) if enums else frame, ENTRIES)


_ENUM_CODES = {pl.UInt8: np.uint8, pl.UInt16: np.uint16, pl.UInt32: np.uint32}   # (an enum's physical type)


def _as_enum(column: pa.ChunkedArray, dtype: pl.Enum) -> pl.Series | None:
    """A dictionary column of `dtype`'s categories as that enum, each chunk's codes mapped to the enum's in one
    numpy gather. Read as a categorical and cast, it went through the texts: 13-15 ms a column of 1.6M rows
    (8,192 x 200), ~5% of the analysis after the pool. None where the column is no dictionary or holds a text
    outside `dtype`: the cast then reads it (and says which values are not categories)."""
    if not pa.types.is_dictionary(column.type):
        return None
    numpy_type = _ENUM_CODES.get(pl.Series([], dtype=dtype).to_physical().dtype)
    if numpy_type is None:   # (an enum kept in another physical type by some Polars: the cast's way)
        return None
    position = {category: i for i, category in enumerate(dtype.categories)}
    pieces = []
    for chunk in column.chunks:
        table = np.array([position.get(word, -1) for word in chunk.dictionary.to_pylist()], np.int64)
        if (table < 0).any():
            return None
        indices = chunk.indices
        if len(table) and indices.null_count < len(indices):
            # (under a null row the index is whatever the buffer holds: clipped into range, masked below)
            codes = np.take(table.astype(numpy_type), raw_values(indices), mode="clip")
        else:   # (every row null)
            codes = np.zeros(len(chunk), numpy_type)
        mask = np.asarray(indices.is_null()) if indices.null_count else None
        pieces.append(pl.from_arrow(pa.array(codes, mask=mask)).cat.to(dtype))
    if not pieces:
        return pl.Series([], dtype=dtype)
    return pieces[0] if len(pieces) == 1 else pl.concat(pieces, rechunk=False)


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
        _list_column("ranks", _parse_rank_lists(distinct["ranks_text"].to_list()), pa.int64()),
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
                      f"ranks up to {listed - 1}: using {proven}; check --world-size", stacklevel=2)
        world_size = proven
    elif declared_world and world_size > declared_world:
        # (kept as given too: the ranks past the declared world then read as missing dumps)
        warnings.warn(f"world size {world_size} was given, but the dumps' default group declares a world of "
                      f"{declared_world} ranks: {'rank' if world_size - declared_world == 1 else 'ranks'} "
                      f"{format_ranks(range(declared_world, world_size))} will read as missing; "
                      "check --world-size", stacklevel=2)
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
    entries = conform(entries.drop("group", "peer", strict=False).with_columns(keys["group"], keys["peer"]),
                      ENTRIES_WITH_GROUP)
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


ENTRIES_WITH_GROUP = pl.Schema({**ENTRIES, "group": pl.Categorical()})
DUMPS_WITH_LOADED = pl.Schema({**DUMPS, "loaded": pl.Boolean})


def load(path: str | os.PathLike, options: LoadOptions | None = None) -> Trace:
    """Load every flight-recorder dump under `path`.

    Args:
        path: a directory of per-rank dumps (searched recursively) or one dump file.
        options: see `LoadOptions`.

    Returns:
        A `Trace` whose frames follow `flightrec.model.schema`.

    Raises:
        FlightrecError: the path holds no dump, or no dump could be read.
    """
    options = options or LoadOptions()
    root = str(path)
    shards = find_shards(path)
    if shards:
        raw = read_shards(shards)  # converted next to the job: Parquet only, no pickle to parse
        _warn_unconverted(path, shards, options.prefix)
    else:
        with parse_pool.paused_gc():
            raw = load_raw(path, options)

    for rank, problems in zip(raw["dumps"]["rank"].to_list(), raw["dumps"]["problems"].to_list()):
        for problem in problems:
            warnings.warn(f"rank {rank}: {problem}", DumpProblemWarning, stacklevel=2)
    if not raw["dumps"]["loaded"].any():
        reasons = [f"rank {rank}: {'; '.join(problems)}" for rank, problems
                   in raw["dumps"].select("rank", "problems").iter_rows() if problems]
        raise NoDumpsError(f"{root}: none of the {raw['dumps'].height} dump files could be read: "
                           f"{listed(reasons, 3, sep='; ')}")
    return assemble(raw, root, options.world_size)


def _warn_unconverted(path: str | os.PathLike, shards: list[Path], prefix: str | None) -> None:
    """Shards win over raw dumps in the same tree; say so rather than ignore the dumps silently."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            files = discover(path, prefix)
    except NoDumpsError:
        return
    inside = [str(s) + os.sep for s in shards]
    loose = [f for f in files if not str(f.path).startswith(tuple(inside))]
    if loose:
        warnings.warn(f"{path}: read {len(shards)} converted shard(s) and ignored {len(loose)} dump "
                      f"file(s) outside them (e.g. {os.path.basename(loose[0].path)}); convert those too, or point "
                      "flightrec at a folder holding only one kind", stacklevel=3)


def load_raw(path: str | os.PathLike, options: LoadOptions) -> dict[str, pl.DataFrame]:
    """Per-file tables for every dump under `path`, from the cache when it is current; `raw["unlisted"]`: the
    folders under it that could not be listed, `raw["empty_hosts"]` the host folders holding no dump (both read
    afresh each time: never cached)."""
    found = discover_all(path, options.prefix)
    files = found.files
    root = str(path)
    raw = _cache.read(files, root, options) if options.use_cache else None
    if raw is None:
        with tempfile.TemporaryDirectory(prefix="flightrec-spool-") as spool:
            raw = _assemble_raw(files, _parse_all(files, options, spool))
            # (a file this user could not read is read again next time: its permissions may be fixed, which
            # changes no size or time the cache is keyed on)
            cache = options.use_cache and not raw["dumps"]["unreadable"].any()
            folder = _cache.write(raw, files, root, options) if cache else None
            _reload_in_one_chunk(raw, [p for p in (folder, Path(spool)) if p is not None])
    raw["unlisted"] = found.unlisted
    raw["empty_hosts"] = found.empty_hosts
    return raw


SPILL_BYTES = 1 << 30   # entries above this are made one chunk through disk, not by a second copy in memory


def _reload_in_one_chunk(raw: dict[str, pl.DataFrame], folders: list[Path]) -> None:
    """The workers' entries come in one chunk per batch, partly memory-mapped from their spool files; the
    analysis needs one chunk per column. Copying them into one in memory would hold both copies at once (10 GB
    at 16K ranks x 2,000 entries, and fresh pages are slow on VMs); instead they are memory-mapped back from the
    first of `folders` that works: the cache just written (one chunk a column), else spool files written the
    same way. Then the first copy is released."""
    entries = raw["entries"]
    if all(n <= 1 for n in entries.n_chunks("all")) or entries.estimated_size() < SPILL_BYTES:
        return   # small: `assemble` copies it into one chunk in memory, which is faster than a round trip
    for folder in folders:
        path = folder / "entries"
        try:
            if not path.exists():
                _cache.write_columns(entries, path)
            mapped = _cache.map_columns(path, entries.columns)
        except (OSError, ValueError) as exc:   # (e.g. another process removed the cache meanwhile)
            warnings.warn(f"could not read the entries back from {path} ({exc}); trying the next place", stacklevel=3)
            continue
        raw["entries"] = entries = None   # released before Polars copies the categoricals out of the mapping
        raw["entries"] = pl.from_arrow(mapped, rechunk=False)
        return
    # (nowhere: the batches stay as they are, and `assemble` copies them into one chunk in memory)
