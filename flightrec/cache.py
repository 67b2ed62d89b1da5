"""Parquet cache of the parsed dumps, so a second look at the same incident is near-instant.

Location: `$FLIGHTREC_CACHE_DIR`, else `~/.cache/flightrec`, one folder per dump directory (hash of its
absolute path and the file-name prefix). The cache is used only when every dump file still has the same
path, size and modification time as when it was written, and the same flightrec cache format; otherwise it
is rebuilt. A cache that can't be written (read-only home, full disk) is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from .schema import CACHE_FORMAT_VERSION

if TYPE_CHECKING:
    from .discover import DumpFile
    from .load import LoadOptions

TABLES = ("dumps", "entries", "pg_config", "rank_lists", "pg_status", "stacks")
MANIFEST = "flightrec-tables.json"


def cache_root(options: "LoadOptions") -> Path:
    if options.cache_dir is not None:
        return Path(options.cache_dir)
    env = os.environ.get("FLIGHTREC_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "flightrec"


def _folder(root: str, options: "LoadOptions") -> Path:
    key = f"{os.path.realpath(root)}\0{options.prefix}"
    return cache_root(options) / hashlib.sha256(key.encode()).hexdigest()[:24]


def _fingerprint(files: list["DumpFile"]) -> str:
    h = hashlib.sha256(f"v{CACHE_FORMAT_VERSION}".encode())
    for f in files:
        h.update(f"{f.path}\0{f.rank}\0{f.host}\0{f.size}\0{f.mtime_ns}\n".encode())
    return h.hexdigest()


def write_tables(raw: dict[str, pl.DataFrame], folder: Path, manifest: dict) -> None:
    """Write the raw tables and a manifest into `folder`, atomically (readers see old or new, never half)."""
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name in TABLES:
            # One row group: read back, every column is one contiguous chunk, which the analysis needs (a frame
            # of many chunks would have to be copied whole into one, doubling peak memory: 5 GB at 16K x 2,000).
            raw[name].write_parquet(tmp / f"{name}.parquet", compression="lz4", statistics=False,
                                    row_group_size=max(1, raw[name].height))
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "format": CACHE_FORMAT_VERSION}))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_tables(folder: Path, names: tuple[str, ...] = TABLES) -> dict[str, pl.DataFrame]:
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
        return read_tables(folder)
    except Exception as exc:  # a damaged cache is rebuilt, never trusted
        warnings.warn(f"cache at {folder} is unreadable ({exc}); rebuilding it", stacklevel=3)
        return None


def write(raw: dict[str, pl.DataFrame], files: list["DumpFile"], root: str, options: "LoadOptions") -> Path | None:
    """Write the cache; returns its folder, or None (with a warning) when it could not be written."""
    folder = _folder(root, options)
    try:
        write_tables(raw, folder, {"fingerprint": _fingerprint(files), "root": os.path.realpath(root),
                                   "files": len(files)})
    except OSError as exc:
        warnings.warn(f"could not write the cache at {folder} ({exc}); pass --no-cache to skip it", stacklevel=3)
        return None
    return folder
