"""The timing analysis as a table for people and as a dict for JSON (`flightrec timing`)."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.timing.options import TimingResult
from flightrec.model.topology import NO_HOSTS_HINT


def lateness_dict(result: TimingResult, top: int = 20, late_joins: list | None = None) -> dict:
    """What `lateness_table` shows, as data (`flightrec timing --format json`)."""
    return {
        "threshold_ms": result.threshold_ms,
        "joined_past_timeout": [
            {"rank": r, "group": f.process_group.name if f.process_group else None,
             "pg_desc": f.process_group.desc if f.process_group else None, "seq": f.collective_seq_id,
             "late_ms": f.evidence.get("late_ms"), "timeout_ms": f.evidence.get("timeout_ms")}
            for f in late_joins or [] for r in f.ranks],
        "ranks": result.per_rank.sort("median_late_ms", descending=True).head(top)
        .select("rank", "host", "n", "median_late_ms", "late_fraction", "straggler",
                pl.col("echo").alias("only_waits")),
        "hosts": result.per_host.sort("median_late_ms", descending=True).head(top)
        .select("host", "ranks", "median_late_ms", "threshold_ms", "clock_offset_ms", "straggler",
                pl.col("echo").alias("only_waits")),
        "clock_ahead_ms": [{"what": s.kind, "name": s.name, "median_late_ms": ms}
                           for s, ms in sorted(result.clock_ahead.items())],
        "slow_groups": result.slow_groups,
        "slow_p2p_links": result.slow_p2p_links if result.slow_p2p_links is not None else [],
    }


def lateness_table(result: TimingResult, top: int = 20, late_joins: list | None = None) -> str:
    """Text for `flightrec timing`: the latest ranks, the hosts, clock offsets, slow groups and host pairs; and
    `late_joins` (the root-cause findings of members that joined a collective past its timeout) first."""
    from flightrec.report.tables import text_table

    parts = [f"Lateness threshold: {result.threshold_ms:,.1f} ms (median + 5 x spread of all ranks' lateness, or of "
             "the punctual ones' when smaller; at least the minimum; hosts: see their own, against the other hosts)",
             ""]
    if late_joins:
        # (late once, past the timeout: why the job stopped, where the medians below can look on time)
        rows = [{"rank": r, "group": f.process_group.label() if f.process_group else "", "seq": f.collective_seq_id,
                 "late_ms": f.evidence.get("late_ms"), "timeout_ms": f.evidence.get("timeout_ms")}
                for f in late_joins for r in f.ranks]
        parts += ["Joined a collective past its timeout (the others timed out waiting; `analyze` names it):",
                  text_table(pl.DataFrame(rows)), ""]
    parts.append("Ranks, latest first:")
    ranks = (result.per_rank.sort("median_late_ms", descending=True).head(top)
             .select("rank", "host", "n", pl.col("median_late_ms").round(2), pl.col("late_fraction").round(2),
                     "straggler", pl.col("echo").alias("only_waits")))
    parts.append(text_table(ranks))
    if result.per_host.height:
        hosts = (result.per_host.sort("median_late_ms", descending=True).head(top)
                 .select("host", pl.col("ranks").list.len().alias("n_ranks"), pl.col("median_late_ms").round(2),
                         pl.col("threshold_ms").round(2), pl.col("clock_offset_ms").round(2), "straggler",
                         pl.col("echo").alias("only_waits")))
        parts += ["", "Hosts:", text_table(hosts)]
    elif result.per_rank["host"].null_count() == result.per_rank.height and result.per_rank.height > 1:
        parts += ["", f"Hosts: {NO_HOSTS_HINT}"]
    if result.per_rank["echo"].any() or result.per_host["echo"].any():
        parts += ["", "only_waits: late enough to be named, but it only waits on a straggler (a pipeline neighbour, "
                  "the straggler's peers, a slow link): not named"]
    if result.clock_ahead:
        parts += ["", "Late by their clock only (nobody waited on them; no completion times to align clocks): "
                  + ", ".join(f"{label} ({ms:,.0f} ms)" for label, ms in sorted(result.clock_ahead.items()))]
    if result.slow_groups.height:
        parts += ["", "Slow groups:", text_table(result.slow_groups.with_columns(pl.col(pl.Float64).round(2)))]
    if result.slow_p2p_links is not None and result.slow_p2p_links.height:
        parts += ["", "Host pairs whose sends and receives are slow at both ends (ms, median at each end):",
                  text_table(result.slow_p2p_links.with_columns(pl.col(pl.Float64).round(2)))]
    return "\n".join(parts)
