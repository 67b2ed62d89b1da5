"""What a worker runs: convert one host's dumps into a shard, or read one shard's newest entries. Plain
functions of one picklable argument, so that the same call runs in this process or on any Dask worker."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from flightrec.distributed.storage import local_copy, local_target
from flightrec.distributed.window import Window, newest_entries
from flightrec.errors import FlightrecError
from flightrec.ingest.load import load_raw
from flightrec.model.trace import LoadOptions
from flightrec.store.cache import MANIFEST
from flightrec.store.shards import HostGone, read_shard, write_empty, write_shard


@dataclass(frozen=True)
class ConvertJob:
    """One host's dumps (`source`, a folder or URL) to be converted into the shard `out` (a folder or URL).
    `worker`: the name of the Dask worker on the host holding them, when they are on its local disk.
    `parse_workers`: processes parsing the dumps; 1 (here) by default, as a Dask worker is one of the cluster's
    processes already (and its nanny starts it as a daemon, which may not start processes of its own)."""

    source: str
    out: str
    host: str | None = None
    prefix: str | None = None
    worker: str | int | None = None
    parse_workers: int = 1


@dataclass(frozen=True)
class ShardJob:
    """One shard (a folder or URL) of which each rank's newest `keep` entries are wanted."""

    shard: str
    keep: int


def convert_host(job: ConvertJob) -> dict:
    """Parse the host's dumps (no cache: a worker's disk keeps nothing behind) and write them as one shard. A
    host folder holding no file at all is written as an empty shard (the host gone, as `analyze` reads an empty
    host folder beside the others); one holding files none of which is a dump fails, saying so."""
    options = LoadOptions(prefix=job.prefix, use_cache=False, workers=job.parse_workers)
    with local_copy(job.source) as dumps, local_target(job.out, MANIFEST) as out:
        if not os.path.isdir(dumps):
            raise FlightrecError(f"{job.source}: no such folder" + (f" on worker {job.worker}" if job.worker else ""))
        if not any(files for _, _, files in os.walk(dumps, onerror=_raise)):
            write_empty(out, source=job.source, host=job.host)
            return {"source": job.source, "out": job.out, "dumps": 0, "entries": 0, "pid": os.getpid()}
        raw = load_raw(dumps, options)
        write_shard(raw, out, source=job.source, host=job.host)
    return {"source": job.source, "out": job.out, "dumps": raw["dumps"].height,
            "entries": raw["entries"].height, "pid": os.getpid()}


def _raise(exc: OSError) -> None:
    raise exc   # (os.walk skips a folder it can't list, which would read as no dump)


def read_window(job: ShardJob) -> Window | HostGone:
    """The shard's ranks' newest entries (`newest_entries`), or `HostGone` for a host that left no dump."""
    with local_copy(job.shard) as folder:
        tables = read_shard(Path(folder))
    return tables if isinstance(tables, HostGone) else newest_entries(tables, job.keep)
