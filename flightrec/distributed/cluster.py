"""The runner a user asks for: this process, a Dask cluster already running (`scheduler`), or a local one
started for the call (`local_workers` processes of one thread, each capped at `worker_memory`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from flightrec.distributed.runner import InProcess, OnDask, Runner
from flightrec.errors import FlightrecError, require_count


def _dask():
    try:
        import distributed
    except ImportError as exc:
        raise FlightrecError("running on a cluster needs Dask: pip install 'flightrec[distributed]'") from exc
    return distributed


@contextmanager
def connect(scheduler: str | None = None, local_workers: int | None = None, worker_memory: str | None = None,
            deadline_s: float | None = None) -> Iterator[Runner]:
    """A runner for the block: `InProcess` when neither `scheduler` nor `local_workers` is given.

    Args:
        scheduler: a Dask scheduler's address (tcp://host:8786), or a scheduler file's path.
        local_workers: start a local cluster of this many worker processes for the block (the simulation of a
            cluster on one machine, or a big machine's cores).
        worker_memory: each local worker's memory limit ("4GiB"): a worker past it is restarted by its nanny
            and its task retried elsewhere; one that kills every worker it lands on is named as failed.
        deadline_s: the longest to wait for all of a step's tasks; those not done are named as failed.
    """
    require_count("local_workers", local_workers)
    if scheduler and local_workers:
        raise FlightrecError("give either a scheduler to connect to or a number of local workers, not both")
    if not scheduler and not local_workers:
        yield InProcess()
        return
    distributed = _dask()
    if scheduler:
        with _client(distributed, scheduler) as client:
            yield OnDask(client, deadline_s)
        return
    with distributed.LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True,
                                  memory_limit=_bytes(worker_memory) if worker_memory else "auto",
                                  dashboard_address=None) as local, distributed.Client(local) as client:
        yield OnDask(client, deadline_s)


def _client(distributed, scheduler: str, wait_s: float = 60):
    """A client of the scheduler at an address or in a scheduler file, once at least one worker has joined."""
    if scheduler.endswith(".json"):
        if not os.path.exists(scheduler):
            raise FlightrecError(f"{scheduler}: no such scheduler file: start `dask scheduler --scheduler-file "
                                 f"{scheduler}` first (docs/scale.md)")
        where = {"scheduler_file": scheduler}
    else:
        where = {"address": scheduler}
    try:
        client = distributed.Client(**where, timeout="30s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise FlightrecError(f"could not reach the Dask scheduler at {scheduler} ({exc}): is it running, is its "
                             "address right (tcp://host:8786), and is its port open from here?") from exc
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError as exc:
        client.close()
        raise FlightrecError(f"the Dask scheduler at {scheduler} has no worker after {wait_s:g} s: start them "
                             "(docs/scale.md)") from exc
    return client


def _bytes(size: str) -> int:
    from dask.utils import parse_bytes

    try:
        return parse_bytes(size)
    except (ValueError, TypeError) as exc:
        raise FlightrecError(f"--worker-memory: {size!r} is no size; give e.g. 4GiB or 8GB") from exc
