"""What every stage after ingest reads: the options a load was made with (`LoadOptions`), the typed frames of
one job (`Trace`), and how ranks are written for people (`format_ranks`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import polars as pl

from flightrec.errors import FlightrecError, require_count
from flightrec.model.schema import (
    DUMPS,
    ENTRIES,
    UNLISTED,
    empty,
)
from flightrec.model.wording import listed


@dataclass(frozen=True)
class DumpFile:
    """One dump file found: where it is, whose it is (rank, host) and what it was when listed (its cache key)."""
    path: str   # (a string, not a Path: making 16K Paths took ~40% of listing a dump folder)
    rank: int
    host: str | None
    size: int
    mtime_ns: int


READERS = ("auto", "tape", "unpickler")


def check_reader(reader: str) -> None:
    if reader not in READERS:
        raise FlightrecError(f"unknown reader {reader!r}: use 'auto', 'tape' or 'unpickler'")


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
        reader: how pickles are parsed. "unpickler": the plain-data-only unpickler, then Arrow. "tape": the
            fast reader (`flightrec.ingest.fastpickle`, compiled by numba), the same columns, 1.2-2.2x faster
            cold, ~0.5 s to start in each worker (at once). "auto" (default): the fast reader where the pickles
            add up to `flightrec.ingest.pool.TAPE_MIN_BYTES`, else the unpickler.
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
        check_reader(self.reader)


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
        """Ranks whose dump is there and could not be read (permissions, an I/O error); a shard's that could not be
        read; and where a folder could not be listed, every missing rank, as its dump may be in it."""
        unread = set(self.dumps.filter(pl.col("unreadable").fill_null(False))["rank"].to_list())
        if self.unlisted["ranks"].null_count():
            unread |= set(self.missing_ranks)
        unread |= set(self.unlisted["ranks"].explode().drop_nulls().to_list()) & set(self.missing_ranks)
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


ENTRIES_WITH_GROUP = pl.Schema({**ENTRIES, "group": pl.Categorical()})


DUMPS_WITH_LOADED = pl.Schema({**DUMPS, "loaded": pl.Boolean})
