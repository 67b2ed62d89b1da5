"""Cache of the parsed dumps, so a second look at the same incident is near-instant; and the table folders
that shards (`flightrec convert`) are written as.

Location: `$FLIGHTREC_CACHE_DIR`, else `~/.cache/flightrec`, one folder per dump directory (hash of its
absolute path and the file-name prefix). The cache is used only when every dump file still has the same
path, size and modification time as when it was written, and the same flightrec cache format; otherwise it
is rebuilt. A cache that can't be written (read-only home, full disk) is skipped with a warning.

Two layouts of one set of tables:
- "arrow" (the local cache): one uncompressed Arrow IPC file per column, memory-mapped when read. Reading is
  mapping pages the OS already holds in its page cache: at 16K ranks x 2,000 entries, ~1 s for the 4.9 GB of
  entries (mostly Polars copying the categorical columns) where decoding Parquet took 3-6 s, most of it first
  touches of fresh memory (~1-3 ms a MB on VMs).
  The price is disk: about the size of the tables in memory (~155 bytes an entry: 4.9 GB for 31M entries).
- "parquet" (shards): compressed (~6 bytes an entry), for tables that travel between machines.

So that caches of past incidents don't fill the disk, writing one removes the least recently used others
until all fit `$FLIGHTREC_CACHE_MAX_GB` (default 20). Only folders that are flightrec caches are touched, and
folders are replaced or removed by renaming them aside first: a reader finds a whole cache or none. Keep the
cache on a local disk: a memory-mapped file that another host removes from NFS is gone from under the map.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from flightrec.model.schema import CACHE_FORMAT_VERSION

if TYPE_CHECKING:
    from flightrec.model.trace import DumpFile, LoadOptions

TABLES = ("dumps", "entries", "pg_config", "rank_lists", "pg_status", "stacks")
MANIFEST = "flightrec-tables.json"
LOCAL_LAYOUT = "arrow"   # the local cache's; shards are "parquet"
DEFAULT_MAX_GB = 20.0
_OURS = re.compile(r"^[0-9a-f]{24}(\.(tmp|old)\d+)?$")   # a cache folder's name, or a write's or removal's


def cache_root(options: "LoadOptions") -> Path:
    if options.cache_dir is not None:
        return Path(options.cache_dir)
    env = os.environ.get("FLIGHTREC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "flightrec"


def _folder(root: str, options: "LoadOptions") -> Path:
    key = f"{os.path.realpath(root)}\0{options.prefix}"
    return cache_root(options) / hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _fingerprint(files: list["DumpFile"]) -> str:
    h = hashlib.sha256(f"v{CACHE_FORMAT_VERSION}-{LOCAL_LAYOUT}".encode())
    for f in files:
        h.update(f"{f.path}\0{f.rank}\0{f.host}\0{f.size}\0{f.mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def write_tables(raw: dict[str, pl.DataFrame], folder: Path, manifest: dict, layout: str = "parquet") -> None:
    """Write the raw tables and a manifest (naming every table's columns) into `folder`, atomically: readers
    see the old tables, the new ones, or none (then they rebuild), never half of them."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name in TABLES:
            if layout == "arrow":
                write_columns(raw[name], tmp / name)
            else:
                # One row group: read back, every column is one contiguous chunk, which the analysis needs (a
                # frame of many chunks would have to be copied whole into one, doubling peak memory).
                raw[name].write_parquet(tmp / f"{name}.parquet", compression="lz4", statistics=False,
                                        row_group_size=max(1, raw[name].height))
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "format": CACHE_FORMAT_VERSION, "layout": layout,
                                                "tables": {name: raw[name].columns for name in TABLES}}))
        if folder.exists():
            remove(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def remove(folder: Path) -> None:
    """Delete a table folder: renamed aside first (atomic), so no reader ever finds part of it."""
    aside = folder.with_name(f"{folder.name}.old{os.getpid()}")
    os.rename(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def write_columns(frame: pl.DataFrame, folder: Path) -> None:
    """`frame` as one Arrow IPC file per column (uncompressed, one record batch: one chunk when read back).
    Column by column, so a frame of many chunks (the workers' batches) is never copied whole into one."""
    folder.mkdir()
    for i, name in enumerate(frame.columns):
        table = frame.select(name).rechunk().to_arrow()   # (the field keeps Polars' dtype: enum categories...)
        with pa.OSFile(str(folder / f"{i:03d}.arrow"), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)


def read_columns(folder: Path, columns: list[str]) -> pl.DataFrame:
    """A `write_columns` folder of `columns` as one frame whose columns are memory-mapped from the files, not
    copied (bar categoricals, whose ids Polars remaps: in one call, column by column in parallel)."""
    return pl.from_arrow(map_columns(folder, columns), rechunk=False)


def map_columns(folder: Path, columns: list[str]) -> pa.Table:
    """The Arrow table of a `write_columns` folder, memory-mapped. On a local file system the files may then be
    removed: the mapping keeps the data. (Not on NFS, where a file another host removes is gone from under the
    mapping: keep `$FLIGHTREC_CACHE_DIR` on a local disk.) Raises ValueError when the files are not exactly
    `columns` (a folder cut short: rebuild it)."""
    tables = [ipc.open_file(pa.memory_map(str(path), "r")).read_all() for path in sorted(folder.glob("*.arrow"))]
    found = [t.schema.field(0).name for t in tables]
    if found != list(columns):
        raise ValueError(f"{folder} holds columns {found}, not {list(columns)}")
    return pa.Table.from_arrays([t.column(0) for t in tables], schema=pa.schema([t.schema.field(0) for t in tables]))


def read_tables(folder: Path, names: tuple[str, ...] = TABLES, layout: str = "parquet",
                columns: dict[str, list[str]] | None = None) -> dict[str, pl.DataFrame]:
    """The tables of a `write_tables` folder; for the "arrow" layout `columns` (the manifest's "tables") says
    what each must hold."""
    if layout == "arrow":
        return {name: read_columns(folder / name, (columns or {}).get(name, [])) for name in names}
    return {name: pl.read_parquet(folder / f"{name}.parquet") for name in names}


def read_manifest(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return meta if meta.get("format") == CACHE_FORMAT_VERSION else None


def read(files: list["DumpFile"], root: str, options: "LoadOptions") -> dict[str, pl.DataFrame] | None:
    folder = _folder(root, options)
    meta = read_manifest(folder)
    if meta is None or meta.get("fingerprint") != _fingerprint(files) or not isinstance(meta.get("tables"), dict):
        return None
    try:
        _mark_used(folder)
        return read_tables(folder, layout=LOCAL_LAYOUT, columns=meta["tables"])
    except Exception as exc:  # a damaged cache is rebuilt, never trusted
        warnings.warn(f"cache at {folder} is unreadable ({exc}); rebuilding it", stacklevel=3)
        return None


def write(raw: dict[str, pl.DataFrame], files: list["DumpFile"], root: str, options: "LoadOptions") -> Path | None:
    """Write the cache, then make room (`prune`); returns its folder, or None (with a warning) when it could not
    be written."""
    folder = _folder(root, options)
    try:
        write_tables(raw, folder, {"fingerprint": _fingerprint(files), "root": os.path.realpath(root),
                                   "prefix": options.prefix, "files": len(files)}, layout=LOCAL_LAYOUT)
    except OSError as exc:
        warnings.warn(f"could not write the cache at {folder} ({exc}); pass --no-cache to skip it", stacklevel=3)
        return None
    try:
        prune(folder.parent, keep=folder, budget_bytes=max_bytes())
    except OSError as exc:   # (the cache is written: a failure to make room costs disk, not the analysis)
        warnings.warn(f"could not remove old caches from {folder.parent} ({exc})", stacklevel=3)
    return folder


def max_bytes() -> int:
    """The cache's size budget: `$FLIGHTREC_CACHE_MAX_GB` (GiB; `inf` for none), else `DEFAULT_MAX_GB`."""
    text = os.environ.get("FLIGHTREC_CACHE_MAX_GB", "")
    try:
        gib = float(text or DEFAULT_MAX_GB)
    except ValueError:
        gib = math.nan
    if math.isinf(gib) and gib > 0:
        return sys.maxsize
    if not gib >= 0:   # (not a number, or negative)
        warnings.warn(f"FLIGHTREC_CACHE_MAX_GB={text!r} is not a size in GiB; using {DEFAULT_MAX_GB:g}", stacklevel=4)
        gib = DEFAULT_MAX_GB
    return int(gib * 2**30)


def prune(cache_dir: Path, keep: Path | None, budget_bytes: int) -> list[Path]:
    """Remove the least recently used caches in `cache_dir` (never `keep`) until the rest fit `budget_bytes`
    (see `_ours` for what is ever touched). Returns what was removed."""
    used = _ours(cache_dir, keep)
    sizes = {folder: _size(folder) for folder in used}
    total = (_size(keep) if keep is not None else 0) + sum(sizes.values())
    removed = []
    for folder in sorted(used, key=used.get):
        if total <= budget_bytes:
            break
        try:
            remove(folder)   # (a process still reading it keeps the pages it mapped)
        except OSError:
            continue   # (gone already, or not ours to remove after all)
        total -= sizes[folder]
        removed.append(folder)
    return removed


def caches(cache_dir: Path) -> pl.DataFrame:
    """The local caches in `cache_dir`, most recently used first: folder, root (the dump directory), prefix
    (the `--prefix` it was read with: one root read with two prefixes has two caches), files, bytes, last_used
    (UTC)."""
    rows = []
    for folder, used in sorted(_ours(cache_dir, None).items(), key=lambda item: -item[1]):
        meta = read_manifest(folder) or {}
        rows.append({"folder": folder.name, "root": meta.get("root"), "prefix": meta.get("prefix"),
                     "files": meta.get("files"), "bytes": _size(folder), "last_used": used})
    schema = {"folder": pl.String, "root": pl.String, "prefix": pl.String, "files": pl.Int64, "bytes": pl.Int64,
              "last_used": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(
        pl.from_epoch(pl.col("last_used"), time_unit="s").alias("last_used"))


def _ours(cache_dir: Path, keep: Path | None) -> dict[Path, float]:
    """flightrec's own folders in `cache_dir` (bar `keep`), with when each was last used: a hash-named folder
    (not a link) whose manifest is a local cache's, or one a write or a removal left behind (an hour old: 0).
    Anything else there is never read or removed. A folder another process changes meanwhile is skipped."""
    used: dict[Path, float] = {}
    for folder in cache_dir.iterdir() if cache_dir.is_dir() else ():
        try:
            if folder == keep or not _OURS.match(folder.name) or folder.is_symlink() or not folder.is_dir():
                continue
            if "." in folder.name:   # (a write or a removal that died)
                if folder.stat().st_mtime < time.time() - 3600:
                    used[folder] = 0.0
            elif manifest_kind(folder) == "cache":   # (not a shard: a cache folder pointed at shard output keeps them)
                used[folder] = (folder / MANIFEST).stat().st_mtime
        except OSError:
            used.pop(folder, None)
    return used


def manifest_kind(folder: Path) -> str | None:
    """What wrote `folder`'s tables, of any format version: "shard", "cache" (the local cache), or None (no
    readable manifest: not flightrec's)."""
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    return "shard" if meta.get("kind") in ("shard", "failed", "empty") else "cache" if "fingerprint" in meta else None



def _mark_used(folder: Path) -> None:
    try:
        os.utime(folder / MANIFEST)
    except OSError:
        pass   # (a read-only cache is still read; it just ages)


def _size(folder: Path) -> int:
    """Bytes in `folder`, links counted as links (never followed out of it)."""
    total, pending = 0, [folder]
    while pending:
        try:
            with os.scandir(pending.pop()) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue   # (removed meanwhile)
    return total
