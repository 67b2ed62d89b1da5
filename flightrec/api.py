"""`analyze(path) -> Report`: the one place that wires the stages together. The CLI calls this too."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import polars as pl

from flightrec.analysis.dump_times import TRIGGERS, Waited, dump_moments, waited
from flightrec.analysis.entry_facts import written_only_active
from flightrec.analysis.gpu_position import unit_pending
from flightrec.analysis.localize import Location, locate
from flightrec.analysis.matching import Matching, match
from flightrec.analysis.timing.options import TimingOptions, TimingResult
from flightrec.analysis.timing.stragglers import analyze_timing
from flightrec.analysis.wait_graph import Waits, build_waits
from flightrec.diagnosis.actions import headline, summary_line, with_actions
from flightrec.diagnosis.collection import without_path
from flightrec.diagnosis.stragglers import straggler_findings
from flightrec.diagnosis.verdict import NOTHING_WRONG, diagnose
from flightrec.errors import DumpProblemWarning, FlightrecError, require_count
from flightrec.ingest.load import load
from flightrec.ingest.pool import paused_gc
from flightrec.model.topology import Topology, resolve
from flightrec.model.trace import LoadOptions, Trace
from flightrec.report.model import DumpSummary, Finding, Report


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions:
    """Settings for `analyze`.

    Attributes:
        load: how to find and read the dumps (prefix, world size, cache, workers).
        hosts_file: CSV `rank,host` (with header) or JSON {"rank": "host"}.
        topology_file: CSV `host,switch` to roll culprits up to switches.
        ranks_per_host: when nothing names hosts, ranks r..r+N-1 share host `host<k>`.
        pg: only consider process groups whose name or desc is this.
        timing: straggler and slow-link thresholds.
        trigger: what wrote the dumps, where the user knows: "timeout" (the watchdog, after a collective timed
            out: ops in flight on every member are a hang), "on-demand" (a snapshot of a running job), or "auto"
            (default: read from the times in the dumps, `dump_times`).
        stage: called with a short message as each stage starts (progress display).
    """

    load: LoadOptions = field(default_factory=LoadOptions)
    hosts_file: str | os.PathLike | None = None
    topology_file: str | os.PathLike | None = None
    ranks_per_host: int | None = None
    pg: str | None = None
    timing: TimingOptions = field(default_factory=TimingOptions)
    trigger: str = "auto"
    stage: Callable[[str], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        require_count("ranks_per_host", self.ranks_per_host)
        if self.trigger not in TRIGGERS:
            raise FlightrecError(f"trigger must be one of {', '.join(TRIGGERS)}, not {self.trigger!r}")


def run_match(trace: Trace, pg: str | None = None) -> Matching:
    entries, groups, members = trace.entries, trace.groups, trace.members
    if pg is not None:
        groups = trace.select_groups(pg)
        entries = entries.join(groups.select("group"), on="group", how="semi")
        members = members.join(groups.select("group"), on="group", how="semi")
    return match(entries, groups, members, trace.dumps, trace.pg_status)


class Diagnosis(NamedTuple):
    """What `analyze` works out after matching (`diagnose_matched`)."""

    waits: Waits
    location: Location | None
    timing: TimingResult
    verdict: str
    summary: str
    findings: list[Finding]          # `rootcause.diagnose`'s
    timing_findings: list[Finding]   # stragglers and slow links (`timing.findings`)


def how_long_waited(trace: Trace, m: Matching, trigger: str = "auto") -> Waited:
    """How long the collectives in flight had waited when the dumps were written (`dump_times`)."""
    ends = pl.concat([m.p2p.filter(pl.col(f"{end}_pending")).select(pl.col(f"{end}_rank").alias("rank"),
                                                                     pl.col(f"{end}_record").alias("record_id"))
                      for end in ("send", "recv")]).drop_nulls()
    sends_and_receives = (trace.entries.lazy().select("rank", "record_id", "time_created_ns", "timeout_ms")
                          .join(ends.lazy(), on=["rank", "record_id"], how="semi").drop("record_id").collect())
    pending = pl.concat([m.units.filter(unit_pending()).select("rank", "time_created_ns", "timeout_ms"),
                         sends_and_receives])
    return waited(pending, dump_moments(trace.dumps, trace.entries), trigger)


def diagnose_matched(trace: Trace, m: Matching, topo: Topology,
                     timing_options: TimingOptions | None = None, trigger: str = "auto") -> Diagnosis:
    """Who waits for whom (`build_waits`, then `locate`), the timing analysis, and the diagnosis. Timing needs
    only the matching: it runs on a second thread from the start, and the diagnosis waits for it only where a
    finding needs it. The wait analysis and the diagnosis keep about one of two cores busy (much of them is
    Python), and timing's Polars work fills part of the other: at 16,384 ranks timing then adds 13-16% of
    matching's time to the analysis, warm or the first time in a fresh process, against 24-25% as a stage
    alone (`python -m bench.stages`, bench/README.md)."""
    timing_options = timing_options or TimingOptions()

    def read_timestamps() -> tuple[TimingResult, list[Finding]]:
        timing = analyze_timing(m, trace.groups, topo, timing_options, entries=trace.entries)
        return timing, straggler_findings(timing, trace.groups, topo)

    # (No Polars expression on either side calls back into Python, map_elements or map_batches: such a callback
    # needs the GIL from inside Polars' shared thread pool, and can deadlock with another Python thread.)
    with ThreadPoolExecutor(max_workers=1) as pool:
        job = pool.submit(read_timestamps)
        w = build_waits(m, trace.entries, trace.groups, trace.missing_ranks)
        loc = locate(m, topo, exclude=set(w.waiting) | set(m.gpu_stalls["rank"].to_list()))
        verdict, summary, findings = diagnose(trace, m, w, loc, topo, lambda: job.result()[0], timing_options,
                                              how_long_waited(trace, m, trigger))
        timing, timing_findings = job.result()
    return Diagnosis(w, loc, timing, verdict, summary, findings, timing_findings)


def dump_summary(trace: Trace, topo: Topology, window: dict | None = None) -> DumpSummary:
    """What was read: loaded, refused (not a dump, or damaged past reading) and unreadable (there, and this user or
    the disk could not read it: a file, or a folder that could not be listed)."""
    loaded = trace.dumps.filter(pl.col("loaded"))
    failed = trace.dumps.filter(~pl.col("loaded"))
    unreadable = pl.col("unreadable").fill_null(False)

    def reasons(frame: pl.DataFrame) -> list[dict]:
        return [{"path": trace.relative(p), "reason": "; ".join(without_path(x, p, trace.root) for x in r),
                 "rank": rank} for p, r, rank in frame.select("path", "problems", "rank").iter_rows()]

    newest = trace.entries["time_created_ns"].max()
    return DumpSummary(
        world_size=trace.world_size,
        loaded=loaded.height,
        missing_ranks=trace.missing_ranks,
        versions=sorted(v for v in loaded["version"].drop_nulls().unique().to_list()),
        refused=[{k: v for k, v in r.items() if k != "rank"} for r in reasons(failed.filter(~unreadable))],
        unreadable=reasons(failed.filter(unreadable)) + [
            {"path": trace.relative(p), "reason": why, "rank": None}
            for p, why in trace.unlisted.select("path", "reason").iter_rows()],
        host_source=topo.source,
        only_active=written_only_active(trace.dumps),
        writers=dict(loaded.group_by(pl.col("writer").cast(pl.String)).len().sort("writer").iter_rows()),
        empty_host_folders=list(trace.empty_hosts),
        fast_reader_declined=[{"path": trace.relative(p), "reason": why} for p, why in loaded.filter(
            pl.col("fast_reader_declined").is_not_null()).select("path", "fast_reader_declined").iter_rows()],
        folder=Path(trace.root).name,
        last_entry_at=_utc(newest),
        last_entry_ns=newest if newest is not None and newest > 0 else None,
        window=window,
    )


def _utc(ns: int | None) -> str | None:
    """Nanoseconds since the epoch as ISO 8601 UTC, to the second."""
    if ns is None or ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds")


def analyze(path: str | os.PathLike, options: AnalyzeOptions | None = None, **kwargs) -> Report:
    """Load every dump under `path`, match collectives, follow the waits and name the root cause.

    Args:
        path: a directory of per-rank flight-recorder dumps (pickle or JSON, any recorder version).
        options: see `AnalyzeOptions`; keyword arguments of the same names are accepted as a shortcut.

    Returns:
        A `Report`: `verdict`, `summary`, `findings`, `culprits`, `to_dict()`, `to_text()`; the frames behind it
        are `report.trace`, `report.matching`, `report.waits`.

    Raises:
        FlightrecError: no readable dump, or a bad option (the message says what to do).
    """
    if options is not None and kwargs:
        raise FlightrecError(f"analyze: pass either options= or keyword arguments, not both (got {sorted(kwargs)}); "
                             "e.g. AnalyzeOptions(load=LoadOptions(...), ...)")
    if options is None:
        load_keys = set(LoadOptions.__dataclass_fields__)
        known = load_keys | set(AnalyzeOptions.__dataclass_fields__) - {"load"}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise FlightrecError(f"analyze: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                                 f"known: {', '.join(sorted(known))}")
        load_opts = LoadOptions(**{k: v for k, v in kwargs.items() if k in load_keys})
        options = AnalyzeOptions(load=load_opts, **{k: v for k, v in kwargs.items() if k not in load_keys})
    stage = options.stage or (lambda _msg: None)
    if os.path.isfile(path):
        # (one rank's dump alone makes every other rank look missing, and the verdict blames them)
        raise FlightrecError(f"{path} is a file: analyze reads the folder holding every rank's dump "
                             f"(here, {os.path.dirname(os.path.abspath(path))}); to read one dump, use "
                             "`flightrec entries` or `flightrec load`")

    with paused_gc():   # (few objects with cycles are made; a full collection would scan them all, per file)
        stage("loading dumps")
        trace = load(path, options.load)
    return analyze_trace(trace, options)


def analyze_trace(trace: Trace, options: AnalyzeOptions, window: dict | None = None) -> Report:
    """Everything `analyze` does once the dumps are loaded: also what `flightrec.distributed` runs on the
    entries its workers hand back (`window`: how much of each rank's history they kept, said in the report)."""
    stage = options.stage or (lambda _msg: None)
    with paused_gc():
        topo = resolve(world_size=trace.world_size, from_dumps=trace.hosts, hosts_file=options.hosts_file,
                       ranks_per_host=options.ranks_per_host, topology_file=options.topology_file)
        stage("matching collectives")
        m = run_match(trace, options.pg)
        stage("following waits and reading timestamps")
        w, _, timing, verdict, summary, findings, timing_findings = diagnose_matched(trace, m, topo, options.timing,
                                                                                     options.trigger)
    # (the caveats that hold whatever else is found come after what was found)
    caveats = [f for f in findings if f.kind == "world_size_unknown"]
    findings = with_actions([f for f in findings if f.kind != "world_size_unknown"] + timing_findings + caveats)
    summary = summary_line(verdict, findings, summary)
    if verdict == "healthy" and timing_findings:
        # (the timing warning before the caveats, which the findings list anyway: one line stays short)
        base, said, _caveats = summary.partition(NOTHING_WRONG)
        summary = f"{base}{said}; warning: {headline(timing_findings[0])}"

    dumps = dump_summary(trace, topo, window)
    if dumps.refused:
        warnings.warn(f"{len(dumps.refused)} file(s) refused as no dump; see the report's 'dumps.refused'",
                      DumpProblemWarning, stacklevel=3)
    scope = None
    if options.pg is not None:
        scope = {"pg": options.pg, "groups": int(m.progress["group"].n_unique()), "of_groups": trace.groups.height}
    return Report(verdict=verdict, summary=summary, findings=findings, dumps=dumps, trace=trace, matching=m,
                  waits=w, topology=topo, timing=timing, scope=scope)
