"""Backfill: every incident folder under a directory that is not in the log yet, analysed and recorded.

Incidents are analysed side by side in worker processes, each parsing its own dumps in-process (a pool of
pools would fork from a process already running Polars' threads); each worker starts fresh (spawn), and the
cache of parsed dumps serves a folder analysed before. The parent records each report as it comes, in its own
transaction: a folder that fails is one line, and never costs what was recorded before it.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.errors import FlightrecError
from flightrec.history.store import History


@dataclass
class Backfill:
    """What a scan did: the folders recorded, passed over (already in the log), and those that failed, with why."""
    recorded: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def incident_folders(root: str | os.PathLike) -> list[Path]:
    """The folders directly under `root`, each one incident's dumps (a job's dump folder per hang). Refused
    where `root` is itself one incident: dumps in it, or one job's dumps over several host folders."""
    root = Path(root)
    if not root.is_dir():
        raise FlightrecError(f"{root}: not a folder; pass the folder holding one sub-folder of dumps per incident")
    if _one_incident(root):
        raise FlightrecError(f"{root} holds one incident's dumps: record it with `flightrec analyze {root} --record`, "
                             "or pass --scan the folder holding one sub-folder per incident")
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _one_incident(root: Path) -> bool:
    """`root` reads as one job's dumps: some lie in it, or they lie in several of its folders and make one job
    together (a job's host folders), not one each (incidents, each a whole job, claiming the same ranks)."""
    import warnings

    from flightrec.errors import MultipleJobsError, NoDumpsError
    from flightrec.ingest.discover import discover

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            files = discover(root)
    except (MultipleJobsError, NoDumpsError):
        return False
    tops = {Path(f.path).relative_to(root).parts[0] if Path(f.path).parent != root else "" for f in files}
    return "" in tops or len(tops) > 1


def _analyze(folder: str, use_cache: bool) -> dict:
    """Worker: one incident's report, or why it has none."""
    import warnings

    from flightrec.api import analyze

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # (each dump's problems are findings in its report)
            return {"report": analyze(folder, use_cache=use_cache, workers=1).to_dict()}
    except FlightrecError as exc:
        return {"error": str(exc)}


def backfill(history: History, root: str | os.PathLike, workers: int | None = None, use_cache: bool = True,
             progress: Callable[[int, int], None] | None = None) -> Backfill:
    """Analyse and record every incident folder under `root` that the log doesn't hold yet."""
    done = Backfill()
    known = history.recorded_paths()
    todo = []
    for folder in incident_folders(root):
        (done.known if str(folder.resolve()) in known else todo).append(folder)
    done.known = [str(p) for p in done.known]
    if not todo:
        return done
    workers = max(1, min(workers or os.cpu_count() or 1, len(todo)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_analyze, str(folder), use_cache): folder for folder in todo}
        for n, future in enumerate(as_completed(futures), 1):
            folder = futures[future]
            result = future.result()
            if "error" in result:
                done.failed.append((str(folder), result["error"]))
            else:
                try:
                    history.record(result["report"], folder)
                    done.recorded.append(str(folder))
                except FlightrecError as exc:
                    done.failed.append((str(folder), str(exc)))
            if progress:
                progress(n, len(todo))
    return done
