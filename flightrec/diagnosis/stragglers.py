"""Findings (warnings) from the timing analysis: straggler ranks and hosts, slow links, clocks ahead."""

from __future__ import annotations

import polars as pl

from flightrec.analysis.timing.options import TimingResult
from flightrec.model.schema import WATCHDOG_POLL_MS
from flightrec.model.topology import Topology


def straggler_findings(result: TimingResult, groups: pl.DataFrame, topo: Topology) -> list:
    """Straggler and slow-link findings (role warning)."""
    from flightrec.model.trace import format_ranks
    from flightrec.report.model import Finding

    out = []
    host_stragglers = result.per_host.filter(pl.col("straggler"))
    covered: set[int] = set()
    for host, ranks, med, bar, tied, offset in host_stragglers.select(
            "host", "ranks", "median_late_ms", "threshold_ms", "tied_with", "clock_offset_ms").iter_rows():
        covered |= set(ranks)
        out.append(Finding(
            kind="straggler", role="warning", ranks=list(ranks), hosts=[host],
            message=(f"host {host} is a straggler: its {len(ranks)} ranks ({format_ranks(ranks)}) enqueue their "
                     f"collectives {med:,.0f} ms after their peers (median){_clock_text(offset)}{_tie_text(tied)}"),
            evidence={"median_late_ms": round(med, 3), "threshold_ms": round(bar, 3),
                      "clock_offset_ms": None if offset is None else round(offset, 3),
                      **({"tied_with": tied} if tied else {})},
        ))
    flagged = result.per_rank.filter(pl.col("straggler") & ~pl.col("rank").is_in(list(covered)))
    # (the rule only matters, and is only said, where there are hosts to tell apart)
    clocks_unknown = not result.clocks_known and result.per_host.height > 1
    # (only where a rank is flagged: the medians by kind of group read the whole lateness, ~25 ms at 16K ranks)
    by_kind = _lateness_by_group_kind(result.lateness, flagged["rank"], groups) if flagged.height else {}
    desc = dict(groups.select("group", pl.col("pg_desc").fill_null("")).iter_rows()) if flagged.height else {}
    for row in flagged.iter_rows(named=True):
        descs = sorted({desc.get(g, "") for g in row["groups"]} - {""})
        where = f" in {', '.join(descs)} groups" if descs else ""
        host = f" (host {row['host']})" if row["host"] else ""
        kinds = by_kind.get(row["rank"], {})
        # (waits add up along a step: a rank 150 ms late on each op is 450 ms late in a group it reaches after
        # three of them; its least late kind of group is its own delay)
        split = (f"; by group: {', '.join(f'{k} {v:,.0f}' for k, v in sorted(kinds.items(), key=lambda kv: kv[1]))} ms"
                 if len(kinds) > 1 else "")
        if split and clocks_unknown:
            split += "; judged within its host: no completion times to align the hosts' clocks"
        out.append(Finding(
            kind="straggler", role="warning", ranks=[row["rank"]], hosts=[row["host"]] if row["host"] else [],
            message=(f"rank {row['rank']}{host} is a straggler: it enqueues its collectives "
                     f"{row['median_late_ms']:,.0f} ms after the first of its peers (median{split}), late on "
                     f"{row['late_fraction']:.0%} of {row['n']} collectives{where}{_tie_text(row['tied_with'])}"),
            evidence={"median_late_ms": round(row["median_late_ms"], 3),
                      "late_fraction": round(row["late_fraction"], 3),
                      "collectives": row["n"], "threshold_ms": round(result.threshold_ms, 3),
                      **({"median_late_ms_by_group": {k: round(v, 3) for k, v in sorted(kinds.items())}}
                         if len(kinds) > 1 else {}),
                      **({"tied_with": row["tied_with"]} if row["tied_with"] else {})},
        ))
    if result.clock_ahead_by == "completions" and result.clock_ahead:
        out.append(_clock_from_completions(result))
    for label, ms in sorted(result.clock_ahead.items() if result.clock_ahead_by == "next entries" else []):
        what, name = label
        ranks = [name] if what == "rank" else sorted(result.per_host.filter(pl.col("host") == name)["ranks"][0])
        out.append(Finding(
            kind="clock_offset", role="warning", ranks=ranks, hosts=[] if what == "rank" else [name],
            message=(f"{label} reads {ms:,.0f} ms late on its collectives (median), yet none of its peers waits for it "
                     "(their next entry comes as soon as ever): not a straggler, the clocks disagree (its host's runs "
                     "ahead, or its peers' run behind). These dumps have no completion times to align clocks by"),
            evidence={"median_late_ms": round(ms, 3), "threshold_ms": round(result.threshold_ms, 3)},
        ))
    if result.slow_groups.height:
        slow = result.slow_groups
        what = (f"collectives in {slow['group'].n_unique()} group(s) take {slow['ratio'].median():.1f}x longer "
                f"than the same ops in their peer groups (median {slow['median_ms'].median():,.1f} ms vs "
                f"{slow['peer_median_ms'].median():,.1f} ms)")
        if result.slow_links:
            a, b = result.slow_links[0]
            message = f"slow link {a} <-> {b}: {what}; every slow group spans both hosts, no fast one does"
        elif result.slow_hosts:
            message = f"slow host {result.slow_hosts[0]}: {what}; it is in every slow group and in no fast one"
        else:
            message = f"{what}; not narrowed to one host or link"
        out.append(Finding(
            kind="slow_link", role="warning", hosts=result.slow_hosts, links=result.slow_links, message=message,
            evidence={"slow_groups": slow["group"].to_list()[:50], "ratio": round(slow["ratio"].median(), 2)},
        ))
    if result.slow_p2p_links is not None and result.slow_p2p_links.height:
        out += _p2p_findings(result)
    return out


def _clock_from_completions(result: TimingResult):
    """One `clock_offset` warning for every rank `unfelt.completed_late` cleared (no host placement: one host's
    clock off makes each of its ranks, or each of everyone else's, read late alike)."""
    from flightrec.model.trace import format_ranks
    from flightrec.report.model import Finding

    by_rank = {suspect.name: ms for suspect, ms in result.clock_ahead.items()}
    ranks = sorted(by_rank)
    ms = sorted(by_rank.values())[(len(by_rank) - 1) // 2]
    one = len(ranks) == 1
    who, reads, its, verdict, runs = (("rank", "reads", "its", "not a straggler", "its runs") if one else
                                      ("ranks", "read", "their", "not stragglers", "theirs run"))
    return Finding(
        kind="clock_offset", role="warning", ranks=ranks,
        message=(f"{who} {format_ranks(ranks)} {reads} {ms:,.0f} ms late on {its} collectives (median), and {its} "
                 f"completions read as late, though a collective ends at one instant on every member: {verdict}, the "
                 f"clocks disagree ({runs} ahead, or the first members' run behind). With no host placement known, "
                 "no clock offset was estimated to remove"),
        evidence={"median_late_ms": round(ms, 3), "threshold_ms": round(result.threshold_ms, 3),
                  **({"median_late_ms_by_rank": {r: round(v, 3) for r, v in sorted(by_rank.items())}}
                     if not one else {})},
    )


def _lateness_by_group_kind(lateness: pl.DataFrame, ranks: pl.Series, groups: pl.DataFrame) -> dict[int, dict]:
    """For the few `ranks`: their median lateness (ms) per kind of group (pg_desc), {rank: {desc: ms}}."""
    per = (lateness.join(pl.DataFrame({"rank": ranks}), on="rank", how="semi")
           .join(groups.select("group", pl.col("pg_desc").cast(pl.String)), on="group", how="left")
           .filter(pl.col("pg_desc").is_not_null() & (pl.col("pg_desc") != ""))
           .group_by("rank", "pg_desc").agg(pl.col("late_ms").median()))
    out: dict[int, dict] = {}
    for rank, kind, ms in per.iter_rows():
        out.setdefault(rank, {})[kind] = ms
    return out


def _p2p_findings(result: TimingResult) -> list:
    """A host at the end of two or more slow pairs is the slow one (its NIC, its GPU): one finding for it. The
    other pairs are links. Hosts and links the collective groups already named are not repeated."""
    from flightrec.report.model import Finding

    pairs = result.slow_p2p_links
    ends = pl.concat([pairs.select(pl.col("a").alias("host"), pl.col("b").alias("other"), pl.col("a_ms").alias("ms")),
                      pairs.select(pl.col("b").alias("host"), pl.col("a").alias("other"), pl.col("b_ms").alias("ms"))])
    per_host = (ends.group_by("host").agg(pl.col("other").sort(), pl.col("ms").median())
                .filter(pl.col("other").list.len() > 1))
    slow_hosts = set(per_host["host"].to_list())
    known_hosts = set(result.slow_hosts)
    known_links = {tuple(sorted(link)) for link in result.slow_links}
    base = pairs["baseline_ms"][0]
    out = []
    for host, others, ms in per_host.sort("host").iter_rows():
        if host not in known_hosts:
            out.append(Finding(
                kind="slow_link", role="warning", hosts=[host], links=[],
                message=(f"slow host {host}: its sends and receives with {', '.join(others)} are slow at both ends "
                         f"({ms:,.0f} ms median at its end, {base:,.1f} ms between other hosts); the ranks waiting on "
                         "it are late, not slow"),
                evidence={"slow_with": others, "median_ms": round(ms, 3), "baseline_ms": round(base, 3)},
            ))
    for a, b, a_ms, b_ms, base in pairs.iter_rows():
        if {a, b} & (slow_hosts | known_hosts) or (a, b) in known_links:
            continue   # (a slow host is slow with every peer: its pairs are not links)
        out.append(Finding(
            kind="slow_link", role="warning", hosts=[], links=[[a, b]],
            message=(f"slow link {a} <-> {b}: sends and receives between them take {a_ms:,.0f} / {b_ms:,.0f} ms "
                     f"(median, at each end) against {base:,.1f} ms between other hosts; the ranks waiting on it "
                     "are late, not slow"),
            evidence={"median_ms": [round(a_ms, 3), round(b_ms, 3)], "baseline_ms": round(base, 3)},
        ))
    return out


def _clock_text(offset: float | None) -> str:
    """What is known of the host's clock: a late host and a host whose clock runs ahead look alike."""
    if offset is None:
        return ("; its clock offset can't be told apart (no completion times in these dumps, as with Gloo or no "
                "cross-host collective): a clock running ahead reads the same")
    if offset == 0:
        return (f"; its clock agrees with the other hosts' within the watchdog's {WATCHDOG_POLL_MS:.0f} ms polling "
                "noise (a clock off by less than about half of that can still read as late)")
    return f", after removing its clock offset of {offset:+,.0f} ms"


def _tie_text(tied: list) -> str:
    if not tied:
        return ""
    return (f"; as late as its pipeline neighbour{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} "
            "(named too): the data can't tell which one the others wait on")
