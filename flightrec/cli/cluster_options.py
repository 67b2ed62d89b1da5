"""Options of the commands that can run past one machine (`analyze` on shards, `convert-hosts`). Only click
here: the engine (`flightrec.distributed`) is imported when a command runs."""

from __future__ import annotations

import click

CLUSTER_OPTIONS = ("scheduler", "local_workers", "worker_memory", "deadline")


def cluster_options(fn):
    """--scheduler, --local-workers, --worker-memory, --deadline: where the tasks run (default: here)."""
    decorators = [
        click.option("--scheduler", metavar="ADDRESS",
                     help="Run on this Dask cluster: the scheduler's address (tcp://host:8786) or its scheduler "
                          "file (.json). Needs `pip install 'flightrec[distributed]'`; see docs/scale.md."),
        click.option("--local-workers", type=click.IntRange(min=1), metavar="N",
                     help="Run on a Dask cluster of N worker processes started on this machine for the command."),
        click.option("--worker-memory", metavar="SIZE",
                     help="With --local-workers: each worker's memory limit (e.g. 4GiB); a worker past it is "
                          "restarted and its task retried, and a task no worker survives is named as failed."),
        click.option("--deadline", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                     help="On a cluster: the longest to wait for the workers' answers; a shard or host not done by "
                          "then is named as failed (storage that hangs), the rest analysed."),
    ]
    for d in reversed(decorators):
        fn = d(fn)
    return fn


def runner_from_options(scheduler, local_workers, worker_memory, deadline):
    """The runner the options ask for (a context manager), from `flightrec.distributed.cluster`."""
    from flightrec.distributed.cluster import connect

    if worker_memory and not local_workers:
        raise click.UsageError("--worker-memory sets the memory of --local-workers' workers; a remote cluster's "
                               "workers set theirs when started (dask worker --memory-limit)")
    if deadline and not (scheduler or local_workers):
        raise click.UsageError("--deadline bounds the wait for a cluster's workers: give --scheduler or "
                               "--local-workers too")
    return connect(scheduler=scheduler, local_workers=local_workers, worker_memory=worker_memory, deadline_s=deadline)
