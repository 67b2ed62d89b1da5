"""Shards: one host's (or one job step's) dumps already parsed into Parquet tables.

Past one machine, parsing is the cost and it is per file: each host runs `flightrec convert` on its own dumps
next to the job (`flightrec convert /tmp/fr OUT/$(hostname) --shard-only --host $(hostname)`), and the
analysis then reads only Parquet: `flightrec analyze OUT/` finds every shard below OUT and concatenates
their tables. See docs/scale.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from flightrec.errors import FlightrecError, NoDumpsError
from flightrec.store import cache


def find_shards(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.rglob(cache.MANIFEST) if ".flightrec-cache" not in p.parts)


def write_shard(raw: dict[str, pl.DataFrame], out: str | os.PathLike, *, source: str, host: str | None) -> Path:
    """Write `raw` as a shard into `out`, replacing it whole: `out` must be new, empty, or a shard."""
    out = Path(out)
    check_replaceable(out)
    if host is not None:
        raw = dict(raw, dumps=raw["dumps"].with_columns(pl.col("host").fill_null(host)))
    cache.write_tables(raw, out, {"kind": "shard", "source": source, "host": host,
                                  "ranks": raw["dumps"]["rank"].to_list()})
    return out


def check_replaceable(out: Path) -> None:
    """Writing a shard replaces its folder whole: refuse a folder holding anything flightrec didn't write there
    (the dumps themselves, given as OUT by mistake)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FlightrecError(f"{out} is a file: give a new or empty folder to convert into")
    if cache.manifest_kind(out) == "shard":
        return   # (converting again: the old shard is replaced)
    if any(out.iterdir()):
        raise FlightrecError(f"{out} is not empty and holds no flightrec shard: converting would replace what is "
                             "there. Give a new or empty folder")


def write_failed(out: str | os.PathLike, reason: str, *, source: str, host: str | None) -> Path:
    """Mark `out` as the shard of dumps that could not be converted, with why: the analysis then names it among
    the unreadable (its ranks missing, a verdict resting on them inconclusive) instead of never knowing."""
    return _write_marker(Path(out), {"kind": "failed", "source": source, "host": host, "reason": reason})


def write_empty(out: str | os.PathLike, *, source: str, host: str | None) -> Path:
    """Mark `out` as the shard of a host whose dump folder holds no file at all: as beside other hosts' folders
    on one machine (`discover.Found.empty_hosts`), that host is read as gone, its ranks missing."""
    return _write_marker(Path(out), {"kind": "empty", "source": source, "host": host})


def _write_marker(out: Path, manifest: dict) -> Path:
    check_replaceable(out)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / cache.MANIFEST).write_text(json.dumps({**manifest, "format": cache.CACHE_FORMAT_VERSION}))
    if out.exists():
        cache.remove(out)
    tmp.rename(out)
    return out


@dataclass(frozen=True)
class HostGone:
    """A shard that marks a host whose dump folder held no file (`write_empty`)."""

    host: str


class UnreadableShard(FlightrecError):
    """A shard that can't be read: damaged, of another version, or marking a failed conversion. `ranks`: the
    ranks it holds, where its manifest says (a conversion that failed knows none)."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = ranks


def read_shard(folder: Path) -> dict[str, pl.DataFrame] | HostGone:
    """One shard's tables, or `HostGone`. Raises UnreadableShard (the shard's fault: named in the report, the
    rest analysed) and OSError (the disk's); anything else is a bug."""
    meta = cache.read_manifest(folder)
    if meta is None:
        raise UnreadableShard("no shard manifest of this flightrec version (damaged, or written by another "
                              "version): convert those dumps again")
    ranks = meta.get("ranks") if isinstance(meta.get("ranks"), list) else None
    if meta.get("kind") == "failed":
        raise UnreadableShard(f"its conversion failed ({meta.get('reason') or 'no reason recorded'}); convert "
                              f"{meta.get('source') or 'those dumps'} again")
    if meta.get("kind") == "empty":
        return HostGone(str(meta.get("host") or folder.name))
    try:
        return cache.read_tables(folder)
    except (pl.exceptions.ComputeError, pl.exceptions.SchemaError, pl.exceptions.ColumnNotFoundError) as exc:
        # (what Polars raises for a cut or garbled Parquet file, or one missing a column)
        raise UnreadableShard(f"damaged ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); convert those "
                              "dumps again", ranks) from exc


# What reading a shard raises when the shard or the disk, not flightrec, is at fault.
SHARD_PROBLEMS = (UnreadableShard, OSError)


def read_shards(shards: list[Path]) -> tuple[dict[str, pl.DataFrame], list[tuple[str, str, list[int] | None]]]:
    """Every readable shard's tables as one job's, and (folder, why, its ranks or None) for each that could not
    be read."""
    parts, failed = [], []
    for folder in shards:
        try:
            parts.append(read_shard(folder))
        except SHARD_PROBLEMS as exc:
            failed.append((str(folder), shard_problem(folder, exc), getattr(exc, "ranks", None)))
    if not any(isinstance(p, dict) for p in parts):
        raise NoDumpsError(no_readable_shard(shards, failed))
    return merge_shards(parts), failed


def no_readable_shard(shards: list, failed: list[tuple]) -> str:
    gone = len(shards) - len(failed)
    why = "; ".join(f"{os.path.basename(str(f[0]).rstrip('/'))}: {f[1]}" for f in failed[:3])
    return (f"none of the {len(shards)} shard(s) holds a readable dump"
            + (f" ({gone} mark a host that left no dump)" if gone else "") + (f": {why}" if why else ""))


def shard_problem(folder: str | os.PathLike, exc: BaseException) -> str:
    """Why a shard could not be read, in a line without its own path (the report names the path)."""
    text = str(exc).replace(f"{folder}: ", "").replace(str(folder), "the shard")
    return text if isinstance(exc, FlightrecError) else f"{type(exc).__name__}: {text}"


def merge_shards(parts: list[dict[str, pl.DataFrame] | HostGone]) -> dict[str, pl.DataFrame]:
    """Several shards' tables (and hosts that left no dump) as one job's: each rank in one shard only, stacks and
    rank lists once, `raw["empty_hosts"]` the hosts gone."""
    empty_hosts = sorted(p.host for p in parts if isinstance(p, HostGone))
    parts = [p for p in parts if isinstance(p, dict)]
    raw = {name: pl.concat([p[name] for p in parts], how="vertical_relaxed") for name in cache.TABLES}
    raw["empty_hosts"] = empty_hosts
    dumps = raw["dumps"].sort("rank")
    dup = dumps.filter(pl.col("rank").is_duplicated())
    if dup.height:
        first = dup["rank"][0]
        where = sorted({os.path.dirname(p) for p in dup.filter(pl.col("rank") == first)["path"].to_list()})
        raise FlightrecError(f"ranks {sorted(set(dup['rank'].to_list()))[:10]} appear in more than one shard (rank "
                             f"{first}'s dumps were read from {' and '.join(where)}); convert each host's dumps once")
    raw["dumps"] = dumps
    raw["stacks"] = raw["stacks"].unique("stack_id")
    raw["rank_lists"] = raw["rank_lists"].unique("ranks_key")
    return raw
