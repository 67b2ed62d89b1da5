"""Where the tasks run: in this process (the default on one machine), or on a Dask cluster. Both hand back one
`Outcome` per task, a value or a failure said in a line, so the driver treats a dead worker, an unreadable shard
and a storage that timed out alike: named in the report, the rest analysed.

Only failures of the input, the storage or the machinery are caught (`TASK_PROBLEMS`, a worker that died, the
deadline): any other exception, a Polars error included, is a bug in flightrec and is raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from flightrec.errors import FlightrecError

# The input's or the storage's fault, whichever process it happens in (Dask re-raises a task's own exception):
# flightrec's errors about its input (a shard that can't be read, a folder with no dump) and the system's.
TASK_PROBLEMS = (FlightrecError, OSError)


@dataclass(frozen=True)
class Outcome:
    """One task's result: `value`, or `failure` (why, in a line) when it has none; `ranks`: the ranks its input
    held, where the error knew them (a damaged shard's manifest lists them)."""

    item: Any
    value: Any = None
    failure: str | None = None
    ranks: list[int] | None = None


def failed(item: Any, exc: BaseException) -> Outcome:
    text = str(exc) or type(exc).__name__
    return Outcome(item, failure=text if isinstance(exc, FlightrecError) else f"{type(exc).__name__}: {text}",
                   ranks=getattr(exc, "ranks", None))


class Runner(Protocol):
    workers: int

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], on_done: Callable[[Outcome], None] | None = None
            ) -> list[Outcome]: ...


class InProcess:
    """Runs each task here, one after another: the same code as on a cluster, with nothing to start."""

    workers = 1

    def map(self, fn, items, on_done=None):
        out = []
        for item in items:
            try:
                outcome = Outcome(item, value=fn(item))
            except TASK_PROBLEMS as exc:
                outcome = failed(item, exc)
            if on_done:
                on_done(outcome)
            out.append(outcome)
        return out


class OnDask:
    """Runs each task on a Dask cluster (`distributed.Client`); an item with a `worker` (a worker's name) runs
    on that worker only, its input being on that worker's disk.

    A worker that dies mid-task (killed for its memory, or crashed) has its task retried by the scheduler on
    another (`distributed.scheduler.allowed-failures` times), then the task fails as `KilledWorker`; a task
    pinned to a worker that left can run nowhere else, and is named at once. `timeout_s` bounds the wait for all the
    answers (storage that hangs): a task not done by then is named as such, and cancelled (one already running
    may still finish on its worker; its answer is not used). Results are taken as they complete and released on
    the cluster at once, so the driver holds each answer once, not a queue of them there as well."""

    def __init__(self, client, timeout_s: float | None = None):
        self.client, self.timeout_s = client, timeout_s

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info(n_workers=-1)["workers"])

    def map(self, fn, items, on_done=None):
        from distributed import wait

        items = list(items)
        addresses = self._addresses()
        futures, pinned_to = {}, {}
        out: list[Outcome | None] = [None] * len(items)
        for k, item in enumerate(items):
            pinned = getattr(item, "worker", None)
            if pinned is not None and pinned not in addresses:
                out[k] = Outcome(item, failure=f"no worker named {pinned} in the cluster (it left, or never joined)")
                if on_done:
                    on_done(out[k])
                continue
            placement = {"workers": [pinned], "allow_other_workers": False} if pinned is not None else {}
            future = self.client.submit(fn, item, pure=False, **placement)
            futures[future] = k
            if pinned is not None:
                pinned_to[future] = addresses[pinned]

        def settle(future, outcome: Outcome) -> None:
            out[futures[future]] = outcome
            future.release()
            if on_done:
                on_done(outcome)

        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        pending = set(futures)
        while pending and (deadline is None or time.monotonic() < deadline):
            try:
                done, pending = wait(pending, timeout=self._poll_s(deadline), return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            for future in done:
                settle(future, self._outcome(items[futures[future]], future))
            # A task pinned to a worker that left (died; its nanny restarts it under a new address) can never run:
            # the scheduler would hold it for ever. It is named instead.
            present = set(self._addresses().values()) if pinned_to and pending else set()
            for future in [f for f in pending if f in pinned_to and pinned_to[f] not in present]:
                pending.discard(future)
                future.cancel()
                settle(future, Outcome(items[futures[future]], failure="the worker on that host left the cluster "
                                       "before answering (it died, or was restarted: see its log)"))
        for future in pending:
            future.cancel()
            settle(future, Outcome(items[futures[future]], failure=f"no answer from the cluster within "
                                                                   f"{self.timeout_s:g} s (storage or a worker hung)"))
        return out

    def _addresses(self) -> dict:
        """Each worker's name -> its address."""
        return {info["name"]: address for address, info in self.client.scheduler_info(n_workers=-1)["workers"].items()}

    @staticmethod
    def _poll_s(deadline: float | None) -> float:
        # (often enough to see a pinned task's worker leave; no busier: each look asks the scheduler)
        return 2.0 if deadline is None else max(0.01, min(2.0, deadline - time.monotonic()))

    @staticmethod
    def _outcome(item, future) -> Outcome:
        from distributed.scheduler import KilledWorker

        try:
            return Outcome(item, value=future.result())
        except KilledWorker as exc:
            first = str(exc).splitlines()[0][:160]
            return Outcome(item, failure="the worker running it died on every try (e.g. past its memory limit: see "
                                         f"the workers' logs, or give them more memory); {first}")
        except TASK_PROBLEMS as exc:
            return failed(item, exc)
