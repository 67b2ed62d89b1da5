"""The runner a user asks for: this process, a Dask cluster already running (`scheduler`), or a local one
started for the call (`local_workers` processes of one thread, each capped at `worker_memory`)."""

from __future__ import annotations

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
        where = {"scheduler_file": scheduler} if scheduler.endswith(".json") else {"address": scheduler}
        try:
            client = distributed.Client(**where, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise FlightrecError(f"could not reach the Dask scheduler at {scheduler} ({exc}): is it running, and "
                                 "is its port open from here?") from exc
        with client:
            yield OnDask(client, deadline_s)
        return
    with distributed.LocalCluster(n_workers=local_workers, threads_per_worker=1, processes=True,
                                  memory_limit=worker_memory or "auto", dashboard_address=None) as local, \
            distributed.Client(local) as client:
        yield OnDask(client, deadline_s)
