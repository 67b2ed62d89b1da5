"""How a shard the cluster never read is told from a damaged one: the reasons `distributed.runner` gives a task
that got no answer, whose worker died or left, begin with one of these. The diagnosis reads them to point the
next step at the cluster (its workers, the storage, --deadline) instead of at the dumps."""

from __future__ import annotations

CLUSTER_FAILURES = (
    "no answer from the cluster",               # past --deadline
    "the worker running it died",               # killed on every retry (memory)
    "the worker on that host left the cluster",  # a pinned task's worker went away
    "no worker named",                          # a pinned task's worker never joined
)


def is_cluster_failure(reason: str) -> bool:
    return reason.startswith(CLUSTER_FAILURES)
