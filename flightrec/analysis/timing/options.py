"""The timing analysis's thresholds (`TimingOptions`) and its frames (`TimingResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from flightrec.analysis.timing.clock_offsets import Suspect


@dataclass(frozen=True, kw_only=True)
class TimingOptions:
    """Thresholds. A straggler must be late by at least `min_late_ms` and by `spread_factor` times the robust
    spread of everyone's lateness (or of the punctual members', when smaller), on at least `min_late_fraction`
    of its collectives (`min_collectives`+)."""

    min_late_ms: float = 20.0
    spread_factor: float = 5.0
    min_late_fraction: float = 0.6
    min_collectives: int = 5
    slow_factor: float = 2.0
    min_slow_ms: float = 5.0
    window: int = 32   # judge each group on its last `window` collectives: the state of the job now
    # a member that joins a stuck collective this fraction of its timeout after the others caused the timeout
    late_timeout_fraction: float = 0.9


@dataclass(frozen=True)
class TimingResult:
    """Frames behind the timing findings (see `per_rank`, `per_host`, `lateness`)."""

    lateness: pl.DataFrame          # (group, collective_seq_id, rank, cross, timeout_ms, late_ms): one row per
                                    # member per collective of the window (hosts: join per_rank)
    per_rank: pl.DataFrame          # rank, host, n, median_late_ms, late_fraction, straggler, tied_with, echo, groups
    per_host: pl.DataFrame          # host, ranks, median_late_ms, straggler, threshold_ms, tied_with, echo,
                                    # clock_offset_ms
    # tied_with: pipeline neighbours named as stragglers too, as late as this one: one of them is the cause
    # echo: late enough to be named, but not, as it only waits on one that is (or on a slow link)
    clock_offsets: pl.DataFrame     # host, clock_offset_ms (removed before computing lateness)
    slow_groups: pl.DataFrame       # group, op, median_ms, peer_median_ms, ratio
    slow_hosts: list[str]
    slow_links: list[list[str]]
    threshold_ms: float
    # host pairs whose sends and receives are slow at both ends (checked when hosts are late, or ranks: then
    # only pairs with a late rank at both ends): a, b, a_ms, b_ms, baseline_ms
    slow_p2p_links: pl.DataFrame | None = None
    # every host's clock offset was estimated (completion times): else a rank is judged within its host
    clocks_known: bool = True
    # without them, ranks and hosts late on most collectives whose peers never waited for them
    # (`unfelt.Suspect("rank", 5)` or ("host", "node3") -> median ms late): their clock runs ahead; not stragglers
    clock_ahead: dict[Suspect, float] = field(default_factory=dict)
    # what tells them: "next entries" (peers went on at once: `unfelt.unfelt`, no completion times) or
    # "completions" (they complete as late: `unfelt.completed_late`, no host placement)
    clock_ahead_by: str = "next entries"
