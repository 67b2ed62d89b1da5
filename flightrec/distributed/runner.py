"""Where the tasks run: in this process (the default on one machine), or on a Dask cluster. Both hand back one
`Outcome` per task, a value or a failure said in a line, so the driver treats a dead worker, an unreadable shard
and a storage that timed out alike: named in the report, the rest analysed.

Only failures of the input or the machinery are caught (`TASK_PROBLEMS`, a worker that died, a deadline): any
other exception is a bug in flightrec and is raised, never reported as a bad shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import polars as pl

from flightrec.errors import FlightrecError
from flightrec.store.shards import SHARD_PROBLEMS

# The input's or the storage's fault, whichever process it happens in (Dask re-raises a task's own exception).
TASK_PROBLEMS = (*SHARD_PROBLEMS, TimeoutError, pl.exceptions.PolarsError)


@dataclass(frozen=True)
class Outcome:
    """One task's result: `value`, or `failure` (why, in a line) when it has none."""

    item: Any
    value: Any = None
    failure: str | None = None


class Runner(Protocol):
    workers: int

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], on_done: Callable[[Outcome], None] | None = None
            ) -> list[Outcome]: ...


def _failure(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, FlightrecError) else f"{type(exc).__name__}: {text}"


class InProcess:
    """Runs each task here, one after another: the same code as on a cluster, with nothing to start."""

    workers = 1

    def map(self, fn, items, on_done=None):
        out = []
        for item in items:
            try:
                outcome = Outcome(item, value=fn(item))
            except TASK_PROBLEMS as exc:
                outcome = Outcome(item, failure=_failure(exc))
            if on_done:
                on_done(outcome)
            out.append(outcome)
        return out


class OnDask:
    """Runs each task on a Dask cluster (`distributed.Client`); an item with a `worker` address runs on that
    worker only. A worker that dies mid-task (killed for its
    memory, or crashed) has its task retried on another `allowed_failures` times by the scheduler, then the task
    fails as `KilledWorker`; `timeout_s` bounds how long the driver waits for all the answers (storage that
    hangs): a task not done by then is named as such. Results are taken as they complete and released on the cluster at once, so the driver holds each
    worker's answer, never a queue of them there as well."""

    def __init__(self, client, timeout_s: float | None = None):
        self.client, self.timeout_s = client, timeout_s

    @property
    def workers(self) -> int:
        return max(1, len(self.client.scheduler_info(n_workers=-1)["workers"]))

    def map(self, fn, items, on_done=None):
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        items = list(items)
        futures = {}
        for k, item in enumerate(items):
            # (an item naming a worker runs there only: its input is on that worker's own disk)
            pinned = getattr(item, "worker", None)
            placement = {"workers": [pinned], "allow_other_workers": False} if pinned else {}
            futures[self.client.submit(fn, item, key=f"{fn.__name__}-{k}-{id(items)}", pure=False, **placement)] = k
        out: list[Outcome | None] = [None] * len(items)
        pending = as_completed(futures, timeout=self.timeout_s)
        try:
            for future in pending:
                k = futures[future]
                try:
                    outcome = Outcome(items[k], value=future.result())
                except KilledWorker as exc:
                    outcome = Outcome(items[k], failure=f"the worker running it died ({_killed(exc)})")
                except TASK_PROBLEMS as exc:
                    outcome = Outcome(items[k], failure=_failure(exc))
                future.release()
                out[k] = outcome
                if on_done:
                    on_done(outcome)
        except TimeoutError:
            pass   # (as_completed's own deadline: every task not done by then is named below)
        for future, k in futures.items():
            if out[k] is None:
                future.cancel()
                out[k] = Outcome(items[k], failure=f"no answer from the cluster within {self.timeout_s:g} s "
                                                   "(storage or a worker hung)")
        return out


def _killed(exc: BaseException) -> str:
    """KilledWorker's message names the task and the last worker; what the operator needs is what to check."""
    return ("killed again on every worker that took it, e.g. for exceeding its memory limit: see the workers' logs, "
            f"or give workers more memory; {str(exc).splitlines()[0][:200]}")
