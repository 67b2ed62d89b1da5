"""Load every dump under a directory into typed Polars frames (the `Trace`).

Files are parsed in a process pool, each turned into Arrow columns right away; the main process only
concatenates columns (`raw_frames`), then `assemble` reads the job from them. A cache keyed on every file's
(path, size, mtime) makes the second run map columns instead of reading pickles (`flightrec.store.cache`)."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import polars as pl

from flightrec.errors import DumpProblemWarning, NoDumpsError
from flightrec.ingest import pool as parse_pool
from flightrec.ingest.assemble import assemble
from flightrec.ingest.discover import discover, discover_all
from flightrec.ingest.raw_frames import assemble_raw
from flightrec.model.schema import UNLISTED
from flightrec.model.trace import DumpFile, LoadOptions, Trace
from flightrec.model.wording import listed
from flightrec.store import cache as _cache
from flightrec.store.shards import find_shards, read_shards


def _parse_all(files: list[DumpFile], options: LoadOptions, spool: str | None = None) -> list[dict]:
    return parse_pool.parse_all(files, options.workers, options.reader, options.progress, spool)


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
        raw, failed = read_shards(shards)  # converted next to the job: Parquet only, no pickle to parse
        raw["unlisted"] = pl.DataFrame(failed, schema=UNLISTED, orient="row")
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
            raw = assemble_raw(files, _parse_all(files, options, spool))
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
