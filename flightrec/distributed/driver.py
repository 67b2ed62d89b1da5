"""The driver: hands each host's dumps or each shard to a task (`runner`), and finishes the analysis with what
comes back.

    convert_hosts(...)     one task per host: its dumps -> its shard; a host that fails gets a shard marking why
    analyze_shards(...)    one task per shard: its ranks' newest entries; then the one engine `analyze` runs

A shard (or host) whose task failed, whatever the cause (unreadable, storage timed out, a worker died), is named
in the report's `dumps.unreadable` with why, and its ranks are missing: a verdict that rests on them says it is
inconclusive, as for a dump folder that could not be listed. Nothing partial is presented as whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from flightrec.api import AnalyzeOptions, analyze_trace
from flightrec.distributed import storage
from flightrec.distributed.runner import InProcess, Outcome, Runner
from flightrec.distributed.tasks import ConvertJob, ShardJob, convert_host, read_window
from flightrec.errors import FlightrecError, NoDumpsError, require_count
from flightrec.ingest.assemble import assemble
from flightrec.model.schema import UNLISTED
from flightrec.report.model import Report
from flightrec.store import cache
from flightrec.store.shards import find_shards, merge_shards, write_failed

# Each rank's newest entries a distributed analysis reads by default: ten times what the hang needs in every
# real and generated case checked (docs/scale.md), a tenth of PyTorch's default buffer.
DEFAULT_KEEP = 200


@dataclass(frozen=True)
class Converted:
    """What `convert_hosts` did: per host, the shard written or why not."""

    outcomes: list[Outcome]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failure is not None]


def convert_hosts(jobs: list[ConvertJob], runner: Runner | None = None,
                  on_done: Callable[[Outcome], None] | None = None) -> Converted:
    """Convert every host's dumps into its shard, a task per host. A host whose task failed gets a shard that
    says why (`write_failed`), so the analysis names it instead of finding its ranks merely missing."""
    runner = runner or InProcess()

    def note(outcome: Outcome) -> None:
        if outcome.failure is not None:
            job: ConvertJob = outcome.item
            with storage.local_target(job.out) as out:
                write_failed(out, outcome.failure, source=job.source, host=job.host)
        if on_done:
            on_done(outcome)
    return Converted(runner.map(convert_host, jobs, on_done=note))


def host_jobs(source: str, out: str, prefix: str | None = None) -> list[ConvertJob]:
    """One job per host folder directly under `source` (a folder or URL), its shard at `out`/<host>."""
    hosts = storage.subfolders(source)
    if not hosts:
        raise FlightrecError(f"{source} holds no folder: give the folder holding one folder of dumps per host")
    return [ConvertJob(source=h, out=storage.join(out, os.path.basename(h.rstrip("/"))),
                       host=os.path.basename(h.rstrip("/")), prefix=prefix) for h in hosts]


def worker_jobs(client, dumps_on_host: str, out: str, prefix: str | None = None) -> list[ConvertJob]:
    """One job per Dask worker, converting the dumps at `dumps_on_host` on that worker's own disk (a worker per
    host, started with `--name $(hostname)`), its shard at `out`/<worker name>. `{host}` in `dumps_on_host`
    stands for the worker's name (dumps kept per host on shared storage: /shared/fr/{host})."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise FlightrecError("the Dask cluster has no worker: start one per host (docs/scale.md)")
    names = {address: str(info["host"] if info.get("name") in (None, "") else info["name"])
             for address, info in workers.items()}
    if len(set(names.values())) < len(names):
        raise FlightrecError(f"several Dask workers share a name ({', '.join(sorted(names.values()))}): with "
                             "--on-each-worker, start one worker per host, named after it (--name $(hostname))")
    return [ConvertJob(source=dumps_on_host.replace("{host}", name), out=storage.join(out, name), host=name,
                       prefix=prefix, worker=address)
            for address, name in sorted(names.items(), key=lambda x: x[1])]


def shard_locations(root: str) -> list[str]:
    """Every shard under `root` (a folder or URL), failed conversions included."""
    if not storage.is_remote(root):
        return [str(p) for p in find_shards(root.removeprefix("file://"))]
    return storage.folders_holding(root, cache.MANIFEST)


def analyze_shards(root: str, options: AnalyzeOptions | None = None, *, keep: int = DEFAULT_KEEP,
                   runner: Runner | None = None, shards: list[str] | None = None) -> Report:
    """Analyse the shards under `root` (a folder or URL): a task per shard reads its ranks' newest `keep`
    entries (`window.newest_entries`), the driver joins what comes back and runs the engine `analyze` runs.
    The driver's memory grows with ranks x `keep`, not with the buffers the job ran with.

    Raises:
        NoDumpsError: no shard under `root`, or none could be read (each one's reason in the message).
    """
    require_count("keep", keep)
    options = options or AnalyzeOptions()
    runner = runner or InProcess()
    stage = options.stage or (lambda _msg: None)
    shards = shards if shards is not None else shard_locations(root)
    if not shards:
        raise NoDumpsError(f"{root}: no shard found (write them with `flightrec convert-hosts`, or `flightrec "
                           "convert --shard-only` on each host)")
    stage(f"reading the newest {keep:,} entries of each rank from {len(shards):,} shards on "
          f"{runner.workers} worker(s)")
    outcomes = runner.map(read_window, [ShardJob(s, keep) for s in shards])
    read = [o.value for o in outcomes if o.failure is None]
    failed = [(o.item.shard, o.failure) for o in outcomes if o.failure is not None]
    windows = [w for w in read if not isinstance(w, str)]
    if not windows:
        raise NoDumpsError(f"{root}: none of the {len(shards)} shard(s) holds a readable dump: "
                           + "; ".join(f"{os.path.basename(s)}: {why}" for s, why in failed[:3]))
    window = {"entries_per_rank": keep, "entries_left_out": sum(w.entries_left_out for w in windows),
              "shards": len(shards)}
    raw = merge_shards([w if isinstance(w, str) else w.tables for w in read])
    del read, windows, outcomes
    raw["unlisted"] = pl.DataFrame(failed, schema=UNLISTED, orient="row")
    stage("joining the shards' tables")
    trace = assemble(raw, root, options.load.world_size)
    return analyze_trace(trace, options, window=window)
