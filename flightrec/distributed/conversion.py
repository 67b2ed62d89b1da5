"""Every host's dumps into its shard, a task per host: from one folder (or URL) per host, or from the same
path on every Dask worker's own disk (`--on-each-worker`). A host whose conversion fails gets a shard that says
why (`store.shards.write_failed`), which the analysis names: nothing is left merely missing."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from flightrec.distributed import storage
from flightrec.distributed.runner import InProcess, Outcome, Runner
from flightrec.distributed.tasks import ConvertJob, convert_host
from flightrec.errors import FlightrecError
from flightrec.store.cache import MANIFEST
from flightrec.store.shards import write_failed

# A dump's file name: a rank number at the end, before any .json/.pickle/.gz
_DUMP_NAME = re.compile(r"\d+(\.(json|pkl|pickle|gz))*$")


@dataclass(frozen=True)
class Converted:
    """What `convert_hosts` did: per host, the shard written or why not."""

    outcomes: list[Outcome]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.failure is not None]


def convert_hosts(jobs: list[ConvertJob], runner: Runner | None = None,
                  on_done: Callable[[Outcome], None] | None = None) -> Converted:
    """Convert every host's dumps into its shard, a task per host; a host whose task failed (or gave no answer
    by the runner's deadline) gets a shard marking why."""
    runner = runner or InProcess()

    def note(outcome: Outcome) -> Outcome:
        if outcome.failure is not None:
            job: ConvertJob = outcome.item
            try:
                with storage.local_target(job.out, MANIFEST) as out:
                    write_failed(out, outcome.failure, source=job.source, host=job.host)
            except (FlightrecError, OSError) as exc:   # (e.g. OUT/<host> holds files that are no shard)
                outcome = Outcome(job, failure=f"{outcome.failure}; and no shard could mark it ({exc})")
        if on_done:
            on_done(outcome)
        return outcome
    marked: list[Outcome] = []
    runner.map(convert_host, jobs, on_done=lambda o: marked.append(note(o)))
    order = {id(job): k for k, job in enumerate(jobs)}
    return Converted(sorted(marked, key=lambda o: order[id(o.item)]))


def host_jobs(source: str, out: str, prefix: str | None = None) -> list[ConvertJob]:
    """One job per host folder directly under `source` (a folder or URL), its shard at `out`/<host>. An empty
    folder counts as a host (gone) only when named like the others (`node7` beside `node6`), as on one machine."""
    if "{host}" in source:
        raise FlightrecError(f"{source}: {{host}} stands for each worker's name only with --on-each-worker (a "
                             "worker per host converting its own disk's dumps); else give the folder holding one "
                             "folder per host")
    source, out = storage.absolute(source), storage.absolute(out)
    local = not storage.is_remote(source)
    if local and not storage.is_remote(out) and _inside(out, source):
        raise FlightrecError(f"{out} is inside {source}: give an OUT outside the dumps' folder (a second run would "
                             "read the shards as a host)")
    hosts = [h for h in storage.subfolders(source) if not os.path.basename(h.rstrip("/")).startswith(".")]
    if local:
        hosts = _hosts_among(hosts)
        loose = sorted(f for f in os.listdir(source)
                       if _DUMP_NAME.search(f) and os.path.isfile(os.path.join(source, f)))
        if loose:
            raise FlightrecError(f"{source} holds dump files beside its host folders (e.g. {loose[0]}), which would "
                                 "be left out: give a folder holding one folder per host, or convert a flat folder "
                                 "with `flightrec convert DUMPS OUT --shard-only`")
    if not hosts:
        raise FlightrecError(f"{source} holds no folder: give the folder holding one folder of dumps per host")
    return [ConvertJob(source=h, out=storage.join(out, os.path.basename(h.rstrip("/"))),
                       host=os.path.basename(h.rstrip("/")), prefix=prefix) for h in hosts]


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _hosts_among(folders: list[str]) -> list[str]:
    """The folders holding files, and the empty ones named like those (a stem and a number: `node7`)."""
    full = [f for f in folders if any(files for _, _, files in os.walk(f))]
    stems = {re.sub(r"\d+$", "", os.path.basename(f)) for f in full}
    return [f for f in folders if f in full or (re.search(r"\d+$", os.path.basename(f))
                                                and re.sub(r"\d+$", "", os.path.basename(f)) in stems)]


def worker_jobs(client, dumps_on_host: str, out: str, prefix: str | None = None,
                expect: int | None = None, wait_s: float = 60) -> list[ConvertJob]:
    """One job per Dask worker, converting the dumps at `dumps_on_host` on that worker's own disk (a worker per
    host, started with `--name $(hostname)`), its shard at `out`/<worker name>. `{host}` in `dumps_on_host`
    stands for the worker's name (dumps kept per host on shared storage: /shared/fr/{host}). With `expect`,
    waits up to `wait_s` for that many workers and refuses to go on with fewer (a host not converted would
    read as a host gone). A relative path is taken from where this runs, not from each worker's working folder."""
    dumps_on_host, out = storage.absolute(dumps_on_host), storage.absolute(out)
    if expect:
        try:
            client.wait_for_workers(expect, timeout=wait_s)
        except TimeoutError as exc:
            joined = len(client.scheduler_info(n_workers=-1)["workers"])
            raise FlightrecError(f"{joined} of the {expect} expected Dask workers joined within {wait_s:g} s: start "
                                 "one per host (docs/scale.md), or pass --expect-hosts with how many did") from exc
    workers = client.scheduler_info(n_workers=-1)["workers"]
    if not workers:
        raise FlightrecError("the Dask cluster has no worker: start one per host (docs/scale.md)")
    # (pinned by name, not address: a worker its nanny restarts keeps its name, under a new address)
    named = sorted((str(info["name"]), info["name"]) for info in workers.values())
    names = [text for text, _ in named]
    if any("://" in name for name in names) or len(set(names)) < len(names):
        raise FlightrecError(f"the Dask workers are named {', '.join(names[:4])}{'...' if len(names) > 4 else ''}: "
                             "with --on-each-worker, start one worker per host named after it (dask worker --name "
                             "\"$(hostname)\", run on each host)")
    return [ConvertJob(source=dumps_on_host.replace("{host}", text), out=storage.join(out, text), host=text,
                       prefix=prefix, worker=name) for text, name in named]
