"""Cache of the parsed dumps, so a second look at the same incident is near-instant; and the table folders
that shards (`flightrec convert`) are written as.

Location: `$FLIGHTREC_CACHE_DIR`, else `~/.cache/flightrec`, one folder per dump directory (hash of its
absolute path and the file-name prefix). The cache is used only when every dump file still has the same
path, size and modification time as when it was written, and the same flightrec cache format; otherwise it
is rebuilt. A cache that can't be written (read-only home, full disk) is skipped with a warning.

Two layouts of one set of tables:
- "arrow" (the local cache): one uncompressed Arrow IPC file per column, memory-mapped when read. Reading is
  mapping pages the OS already holds in its page cache: at 16K ranks x 2,000 entries, 0.1 s for the 4.9 GB of
  entries where decoding Parquet took 3-6 s, most of it first touches of fresh memory (~1-3 ms a MB on VMs).
  The price is disk: about the size of the tables in memory (~155 bytes an entry: 4.9 GB for 31M entries).
- "parquet" (shards): compressed (~6 bytes an entry), for tables that travel between machines.

So that caches of past incidents don't fill the disk, writing one removes the least recently used others
until all fit `$FLIGHTREC_CACHE_MAX_GB` (default 20). Only folders that are flightrec caches are touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc

from .schema import CACHE_FORMAT_VERSION

if TYPE_CHECKING:
    from .discover import DumpFile
    from .load import LoadOptions

TABLES = ("dumps", "entries", "pg_config", "rank_lists", "pg_status", "stacks")
MANIFEST = "flightrec-tables.json"
DEFAULT_MAX_GB = 20.0
_OURS = re.compile(r"^[0-9a-f]{24}(\.tmp\d+)?$")   # a cache folder's name, or a write's that died midway


def cache_root(options: "LoadOptions") -> Path:
    if options.cache_dir is not None:
        return Path(options.cache_dir)
    env = os.environ.get("FLIGHTREC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "flightrec"


def _folder(root: str, options: "LoadOptions") -> Path:
    key = f"{os.path.realpath(root)}\0{options.prefix}"
    return cache_root(options) / hashlib.sha256(key.encode()).hexdigest()[:24]


def _fingerprint(files: list["DumpFile"]) -> str:
    h = hashlib.sha256(f"v{CACHE_FORMAT_VERSION}-{LOCAL_LAYOUT}".encode())
    for f in files:
        h.update(f"{f.path}\0{f.rank}\0{f.host}\0{f.size}\0{f.mtime_ns}\n".encode())
    return h.hexdigest()


LOCAL_LAYOUT = "arrow"   # the local cache's; shards are "parquet"


def write_tables(raw: dict[str, pl.DataFrame], folder: Path, manifest: dict, layout: str = "parquet") -> None:
    """Write the raw tables and a manifest into `folder`, atomically (readers see old or new, never half)."""
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
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "format": CACHE_FORMAT_VERSION, "layout": layout}))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_columns(frame: pl.DataFrame, folder: Path) -> None:
    """`frame` as one Arrow IPC file per column (uncompressed, one record batch: one chunk when read back).
    Column by column, so a frame of many chunks (the workers' batches) is never copied whole into one."""
    folder.mkdir()
    for i, name in enumerate(frame.columns):
        table = frame.select(name).rechunk().to_arrow()   # (the field keeps Polars' dtype: enum categories...)
        with pa.OSFile(str(folder / f"{i:03d}.arrow"), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)


def read_columns(folder: Path) -> pl.DataFrame:
    """A `write_columns` folder as one frame whose columns are memory-mapped from the files, not copied (bar
    categoricals, whose ids Polars remaps: in one call, column by column in parallel). The files may be
    replaced or removed meanwhile: the mapping keeps the data."""
    tables = [ipc.open_file(pa.memory_map(str(path), "r")).read_all() for path in sorted(folder.glob("*.arrow"))]
    if not tables:
        return pl.DataFrame()
    table = pa.Table.from_arrays([t.column(0) for t in tables], schema=pa.schema([t.schema.field(0) for t in tables]))
    return pl.from_arrow(table, rechunk=False)


def read_tables(folder: Path, names: tuple[str, ...] = TABLES, layout: str = "parquet") -> dict[str, pl.DataFrame]:
    if layout == "arrow":
        return {name: read_columns(folder / name) for name in names}
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
    if meta is None or meta.get("fingerprint") != _fingerprint(files):
        return None
    try:
        _mark_used(folder)
        return read_tables(folder, layout=LOCAL_LAYOUT)
    except Exception as exc:  # a damaged cache is rebuilt, never trusted
        warnings.warn(f"cache at {folder} is unreadable ({exc}); rebuilding it", stacklevel=3)
        return None


def write(raw: dict[str, pl.DataFrame], files: list["DumpFile"], root: str, options: "LoadOptions") -> Path | None:
    """Write the cache, then make room (`prune`); returns its folder, or None (with a warning) when it could not
    be written."""
    folder = _folder(root, options)
    try:
        write_tables(raw, folder, {"fingerprint": _fingerprint(files), "root": os.path.realpath(root),
                                   "files": len(files)}, layout=LOCAL_LAYOUT)
    except OSError as exc:
        warnings.warn(f"could not write the cache at {folder} ({exc}); pass --no-cache to skip it", stacklevel=3)
        return None
    prune(folder.parent, keep=folder, budget_bytes=max_bytes())
    return folder


def max_bytes() -> int:
    """The cache's size budget: `$FLIGHTREC_CACHE_MAX_GB` (GiB), else `DEFAULT_MAX_GB`."""
    text = os.environ.get("FLIGHTREC_CACHE_MAX_GB", "")
    try:
        return int(float(text or DEFAULT_MAX_GB) * 2**30)
    except ValueError:
        warnings.warn(f"FLIGHTREC_CACHE_MAX_GB={text!r} is not a number of GiB; using {DEFAULT_MAX_GB:g}", stacklevel=4)
        return int(DEFAULT_MAX_GB * 2**30)


def prune(cache_dir: Path, keep: Path, budget_bytes: int) -> list[Path]:
    """Remove the least recently used caches in `cache_dir` (never `keep`) until the rest fit `budget_bytes`.
    Only flightrec's folders: a hash-named folder holding a manifest, or one a write left behind (an hour
    old); anything else there is never read or removed. Returns what was removed."""
    sizes, used = {}, {}
    for folder in cache_dir.iterdir() if cache_dir.is_dir() else ():
        if folder == keep or not folder.is_dir() or not _OURS.match(folder.name):
            continue
        if (folder / MANIFEST).is_file():
            used[folder] = (folder / MANIFEST).stat().st_mtime
        elif ".tmp" in folder.name and folder.stat().st_mtime < time.time() - 3600:
            used[folder] = 0.0   # (a write that died: first to go)
        else:
            continue
        sizes[folder] = _size(folder)
    total = _size(keep) + sum(sizes.values())
    removed = []
    for folder in sorted(used, key=used.get):
        if total <= budget_bytes:
            break
        shutil.rmtree(folder, ignore_errors=True)   # (a process still reading it keeps its mapped pages)
        total -= sizes[folder]
        removed.append(folder)
    return removed


def _mark_used(folder: Path) -> None:
    try:
        os.utime(folder / MANIFEST)
    except OSError:
        pass   # (a read-only cache is still read; it just ages)


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
