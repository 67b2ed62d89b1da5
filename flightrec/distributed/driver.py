"""The analysis past one machine: a task per shard hands back its ranks' newest entries (`tasks.read_window`),
and the driver finishes with the engine `analyze` runs (`api.analyze_trace`).

A shard whose task failed, whatever the cause (damaged, a failed conversion, a worker that died, storage that
gave no answer by the deadline), is named in the report's `dumps.unreadable` with why, and its ranks (where its
manifest says which) are missing and unreadable: the rest is analysed, said to be without them, and a verdict
that rests on them is inconclusive. Nothing partial is presented as whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from flightrec.api import AnalyzeOptions, analyze_trace
from flightrec.distributed import storage
from flightrec.distributed.runner import InProcess, Outcome, Runner
from flightrec.distributed.tasks import ShardJob, read_window
from flightrec.distributed.window import MIN_KEEP, Window
from flightrec.errors import FlightrecError, NoDumpsError
from flightrec.ingest.assemble import assemble
from flightrec.model.schema import UNLISTED
from flightrec.report.model import Report
from flightrec.store import cache
from flightrec.store.shards import find_shards, merge_shards, no_readable_shard

# Each rank's newest entries read by default: every real case checked reads the same from 10 (docs/scale.md);
# 200 is twenty times that, a tenth of PyTorch's default buffer.
DEFAULT_KEEP = 200


def shard_locations(root: str) -> list[str]:
    """Every shard under `root` (a folder or URL), failed conversions included."""
    if not storage.is_remote(root):
        return [str(p) for p in find_shards(root.removeprefix("file://"))]
    return storage.folders_holding(root, cache.MANIFEST)


def analyze_shards(root: str, options: AnalyzeOptions | None = None, *, keep: int = DEFAULT_KEEP,
                   runner: Runner | None = None) -> Report:
    """Analyse the shards under `root` (a folder or URL): a task per shard reads its ranks' newest `keep`
    entries (`window.newest_entries`), the driver joins what comes back and runs the engine `analyze` runs.
    The driver's memory grows with ranks x `keep`, not with the buffers the job ran with.

    Raises:
        NoDumpsError: no shard under `root`, or none holds a readable dump (each one's reason in the message).
    """
    if not isinstance(keep, int) or keep < MIN_KEEP:
        raise FlightrecError(f"keep (--window) must be at least {MIN_KEEP} entries, not {keep!r}")
    root = storage.absolute(root)
    if not storage.is_remote(root) and not Path(root).is_dir():
        raise FlightrecError(f"{root}: no such folder")
    options = options or AnalyzeOptions()
    runner = runner or InProcess()
    stage = options.stage or (lambda _msg: None)
    shards = shard_locations(root)
    if not shards:
        raise NoDumpsError(f"{root}: no shard found (write them with `flightrec convert-hosts`, or `flightrec "
                           "convert --shard-only` on each host; a folder of dumps is analysed without --window)")
    if runner.workers < 1:
        raise FlightrecError("the Dask cluster has no worker: start some (docs/scale.md), then run this again")
    stage(f"reading the newest {keep:,} entries of each rank from {len(shards):,} shards on "
          f"{runner.workers} worker(s)")
    outcomes = runner.map(read_window, [ShardJob(s, keep) for s in shards])
    failed = [(o.item.shard, o.failure, _ranks_of(o)) for o in outcomes if o.failure is not None]
    read = [o.value for o in outcomes if o.failure is None]
    windows = [w for w in read if isinstance(w, Window)]
    if not windows:
        raise NoDumpsError(f"{root}: {no_readable_shard(shards, failed)}")
    window = {"entries_per_rank": keep, "entries_left_out": sum(w.entries_left_out for w in windows),
              "ranks_kept_whole": sum(w.ranks_kept_whole for w in windows), "shards": len(shards)}
    raw = merge_shards([w.tables if isinstance(w, Window) else w for w in read])
    del read, windows, outcomes
    raw["unlisted"] = pl.DataFrame(failed, schema=UNLISTED, orient="row")
    stage("joining the shards' tables")
    trace = assemble(raw, root, options.load.world_size)
    return analyze_trace(trace, options, window=window)


def _ranks_of(outcome: Outcome) -> list[int] | None:
    """The ranks a failed shard holds: from the error where it knew, else from the shard's manifest where it
    can be read (a worker died reading the shard, the storage was slow); None where nothing says."""
    if outcome.ranks is not None:
        return outcome.ranks
    try:
        ranks = json.loads(storage.read_text(storage.join(outcome.item.shard, cache.MANIFEST))).get("ranks")
    except (OSError, ValueError, FlightrecError):
        return None
    return ranks if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) else None

