"""Figures for post-mortems in a notebook. Each helper takes a `Report` and returns a matplotlib Figure.

matplotlib rather than plotly: static figures render in any notebook viewer, in CI and in a PDF of the
post-mortem without JavaScript, and their marks can be checked in tests. Computation stays in the frames;
these functions only draw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from flightrec.model.trace import format_ranks

if TYPE_CHECKING:  # matplotlib is imported lazily: only notebooks need it
    from matplotlib.figure import Figure

    from flightrec.report.model import Report

# One colour per rank state, shared by every figure.
STATE_COLOURS = {
    "culprit": "#d62728",
    "waiting": "#ff7f0e",
    "healthy": "#2ca02c",
    "missing": "#7f7f7f",
}
CELL_COLOURS = {  # progress heatmap cells
    "no evidence": "#f0f0f0",
    "completed": "#2ca02c",
    "in flight": "#ff7f0e",
    "enqueued": "#9ecae1",      # the recorder can't say whether it finished (Gloo)
    "not joined": "#d62728",
}

__all__ = ["host_grid", "lateness", "progress_heatmap", "rank_states", "timeline", "wait_graph"]


def pyplot():
    """matplotlib.pyplot, imported when a figure is drawn (Agg outside a notebook), or an ImportError that says
    what to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("flightrec.report.plots needs matplotlib: pip install 'flightrec[notebook]' (from a clone: "
                          "pip install '.[notebook]')") from None

    if matplotlib.get_backend().lower() not in ("agg",) and not _in_notebook():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        return get_ipython() is not None
    except ImportError:
        return False


def rank_states(report: "Report") -> pl.DataFrame:
    """(rank, host, state) for every rank: culprit, waiting, healthy or missing."""
    trace = report.trace
    culprits = set(report.culprits["ranks"])
    waiting = set(report.waits.waiting) if report.waits else set()
    missing = set(trace.missing_ranks)
    ranks = list(range(trace.world_size))
    states = ["culprit" if r in culprits else "missing" if r in missing else "waiting" if r in waiting
              else "healthy" for r in ranks]
    hosts = [report.topology.host_of.get(r) if report.topology else None for r in ranks]
    return pl.DataFrame({"rank": ranks, "host": hosts, "state": states}, schema={
        "rank": pl.Int64, "host": pl.String, "state": pl.String})


def host_grid(report: "Report", max_hosts: int = 64) -> "Figure":
    """Hosts (rows) by local rank (columns), each cell coloured by the rank's state."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    states = rank_states(report)
    if states["host"].null_count() == states.height:
        width = 8
        states = states.with_columns((pl.col("rank") // width).cast(pl.String).alias("host"))
    hosts = states.group_by("host").agg(pl.col("rank").min().alias("_first")).sort("_first")["host"].to_list()
    hosts = hosts[:max_hosts]
    per_host = max(states.group_by("host").len()["len"].max(), 1)
    order = list(STATE_COLOURS)
    grid = np.full((len(hosts), per_host), np.nan)
    labels = np.full((len(hosts), per_host), "", dtype=object)
    for i, host in enumerate(hosts):
        rows = states.filter(pl.col("host") == host).sort("rank")
        for j, (rank, state) in enumerate(zip(rows["rank"].to_list(), rows["state"].to_list())):
            grid[i, j] = order.index(state)
            labels[i, j] = str(rank)
    fig, ax = plt.subplots(figsize=(1 + 0.6 * per_host, 1 + 0.35 * len(hosts)))
    ax.imshow(grid, cmap=ListedColormap([STATE_COLOURS[s] for s in order]), vmin=-0.5, vmax=len(order) - 0.5,
              aspect="auto")
    if per_host * len(hosts) <= 512:
        for (i, j), text in np.ndenumerate(labels):
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(hosts)), labels=hosts)
    ax.set_xticks(range(per_host))
    ax.set_xlabel("local rank")
    handles = [plt.Rectangle((0, 0), 1, 1, color=STATE_COLOURS[s]) for s in order]
    ax.legend(handles, order, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.set_title("Ranks by host")
    fig.tight_layout()
    fig.flightrec_grid = (hosts, grid, order)  # what was drawn, for tests and for people poking at it
    return fig


def progress_heatmap(report: "Report", group: str | None = None, window: int = 12) -> "Figure":
    """One group's members (rows) by collective sequence id (columns): completed, in flight, not joined.

    Default group: the first root cause's group, else the group with the most members behind."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap

    m = report.matching
    group = _one_group(report, group) if group is not None else _default_group(report)
    prog = m.progress.filter(pl.col("group") == group).sort("rank")
    units = m.units.filter(pl.col("group") == group)
    hi = int(prog["frontier"].max() or 0)
    lo = max(1, hi - window + 1)
    seqs = list(range(lo, hi + 1))
    order = list(CELL_COLOURS)
    grid = np.zeros((prog.height, len(seqs)))
    done = {(r, s): st for r, s, st in units.select("rank", "collective_seq_id", "state").iter_rows()}
    for i, (rank, last, tracks) in enumerate(prog.select("rank", "last_enqueued", "tracks_completion").iter_rows()):
        for j, s in enumerate(seqs):
            if last is None:
                cell = "no evidence"
            elif s > last:
                cell = "not joined"
            elif (rank, s) in done:
                cell = ("completed" if done[(rank, s)] == "completed" else "in flight") if tracks else "enqueued"
            else:
                cell = "no evidence"
            grid[i, j] = order.index(cell)
    fig, ax = plt.subplots(figsize=(1.5 + 0.45 * len(seqs), 1 + 0.3 * prog.height))
    ax.imshow(grid, cmap=ListedColormap([CELL_COLOURS[c] for c in order]), vmin=-0.5, vmax=len(order) - 0.5,
              aspect="auto")
    ax.set_xticks(range(len(seqs)), labels=[str(s) for s in seqs], fontsize=7)
    ax.set_yticks(range(prog.height), labels=[f"rank {r}" for r in prog["rank"].to_list()], fontsize=7)
    ax.set_xlabel("collective_seq_id")
    name = report.trace.groups.filter(pl.col("group") == group)
    desc = name["pg_desc"][0] if name.height else ""
    ax.set_title(f"Progress in group {group} ({desc})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=CELL_COLOURS[c]) for c in order]
    ax.legend(handles, order, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.flightrec_grid = (prog["rank"].to_list(), seqs, grid, order)
    return fig


def _one_group(report: "Report", pg: str | int) -> str:
    """The group `pg` names (name, desc or id, as everywhere): of several (a desc), the one with the most members
    behind, the lowest id on a tie."""
    chosen = report.trace.select_groups(str(pg))["group"].cast(pl.String).to_list()
    if len(chosen) == 1:
        return chosen[0]
    behind = (report.matching.progress.filter(pl.col("group").cast(pl.String).is_in(chosen))
              .group_by(pl.col("group").cast(pl.String)).agg((pl.col("behind") > 0).sum().alias("n"))
              .sort(["n", "group"], descending=[True, False]))
    return behind["group"][0] if behind.height else chosen[0]


def _default_group(report: "Report") -> str:
    for f in report.root_causes:
        if f.process_group is not None:
            hit = report.trace.groups.filter((pl.col("pg_name") == f.process_group.name))
            if hit.height:
                return hit["group"][0]
    prog = report.matching.progress
    behind = prog.group_by("group").agg((pl.col("behind") > 0).sum().alias("n")).sort("n", "group", descending=True)
    return behind["group"][0]


def wait_graph(report: "Report") -> "Figure":
    """The wait-for graph collapsed: each root cause is a node; the ranks waiting on it are grouped by the
    desc of the group they wait in, one node each with its count."""
    plt = pyplot()
    import networkx as nx

    w, trace = report.waits, report.trace
    culprits = report.culprits["ranks"]
    desc = dict(trace.groups.select("group", pl.col("pg_desc").fill_null("?")).iter_rows())
    g = nx.DiGraph()
    for r in culprits:
        g.add_node(f"rank {r}", kind="culprit")
    for f in report.root_causes:
        if not f.ranks and (f.hosts or f.links):
            label = " <-> ".join(f.links[0]) if f.links else f.hosts[0]
            g.add_node(label, kind="culprit")
    clusters: dict[str, set[int]] = {}
    for src, grp in w.edges.filter(pl.col("src").str.starts_with("r:")).select("src", "group").iter_rows():
        rank = int(src[2:])
        if rank not in culprits:
            clusters.setdefault(desc.get(grp, "?"), set()).add(rank)
    for name, ranks in clusters.items():
        node = f"{len(ranks):,} waiting in {name}"
        g.add_node(node, kind="waiting", ranks=sorted(ranks))
        reach = {int(n[2:]) for r in list(ranks)[:64] for n in nx.descendants(w.graph, f"r:{r}") if n.startswith("r:")}
        for r in culprits:
            if r in reach:
                g.add_edge(node, f"rank {r}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not g.number_of_nodes():
        ax.text(0.5, 0.5, "nobody waits on anyone", ha="center", va="center", fontsize=12, color="#555555")
    if g.number_of_nodes():
        pos = nx.spring_layout(g, seed=1)
        colours = [STATE_COLOURS["culprit" if g.nodes[n].get("kind") == "culprit" else "waiting"] for n in g.nodes]
        nx.draw_networkx(g, pos, ax=ax, node_color=colours, node_size=1400, font_size=8, arrows=True,
                         edge_color="#555555")
    ax.set_title("Who waits for whom")
    ax.axis("off")
    fig.tight_layout()
    fig.flightrec_graph = g
    return fig


def timeline(report: "Report", ranks: list[int] | None = None, last: int = 20) -> "Figure":
    """The last `last` entries of selected ranks on a common clock, coloured by op: a bar from enqueue to
    completion; an unfinished one runs to the end of the plot (black edge). Where the recorder doesn't report
    completion (Gloo), a bar runs to the rank's next entry, hatched: when it finished is not known. Default
    ranks: the members of the first root cause's group (up to 8), else the stragglers, else the culprits and a
    few waiting ranks. Entries far before the rest (a start-up barrier) are clipped at the left edge."""
    plt = pyplot()
    from flightrec.report.tables import check_ranks

    e = report.trace.entries
    check_ranks(report.trace, ranks)
    ranks = ranks or _timeline_ranks(report)
    sel = (e.filter(pl.col("rank").is_in(ranks) & ~pl.col("is_p2p")).sort("rank", "record_id")
           .group_by("rank", maintain_order=True).tail(last)
           .with_columns(pl.col("time_created_ns").shift(-1).over("rank").alias("_next_ns")))
    tracks = set(report.progress.filter(pl.col("tracks_completion"))["rank"].unique().to_list())
    starts = sel["time_created_ns"].drop_nulls()
    end = max(sel["time_created_ns"].max() or 0, sel["time_completed_ns"].max() or 0)
    # (the left edge: around most entries, not at a start-up collective seconds or minutes before them)
    mid = starts.median() if starts.len() else 0
    t0 = max(starts.min() or 0, int(mid - (end - mid)))
    ops = sorted({str(o) for o in sel["op"].to_list()})
    cmap = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 0.6 + 0.5 * len(ranks)))
    for row in sel.iter_rows(named=True):
        start = max(0.0, (row["time_created_ns"] - t0) / 1e6) if row["time_created_ns"] else 0
        unknown = row["rank"] not in tracks and row["time_completed_ns"] is None and row["_next_ns"] is not None
        finish = row["time_completed_ns"] or (row["_next_ns"] if unknown else None) or end
        stop = (finish - t0) / 1e6
        ax.barh(ranks.index(row["rank"]), max(stop - start, 0.5), left=start,
                color=cmap(ops.index(str(row["op"])) % 10), hatch="//" if unknown else None,
                edgecolor="black" if row["state"] != "completed" and not unknown else "none", height=0.6)
    ax.set_yticks(range(len(ranks)), labels=[f"rank {r}" for r in ranks])
    ax.set_xlabel("ms since the left edge (black edge: unfinished; hatched: completion not recorded, drawn to "
                  "the next entry)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i % 10)) for i in range(len(ops))]
    ax.legend(handles, ops, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    roots = report.root_causes
    headline = roots[0].message.split(";")[0] if roots else ""
    about = f"\nroot cause: {headline[:90]}{'...' if len(headline) > 90 else ''}" if roots else ""
    ax.set_title(f"Last {last} collectives of ranks {format_ranks(ranks)}{about}", fontsize=9)
    fig.tight_layout()
    fig.flightrec_ranks = ranks
    return fig


def _timeline_ranks(report: "Report") -> list[int]:
    """The culprit's peers in the group where it broke, culprits first; else stragglers; else who waits."""
    culprits = report.culprits["ranks"]
    for f in report.root_causes:
        if f.process_group is not None:
            members = report.trace.select_groups(f.process_group.name)["ranks"]
            if members.len() == 1 and members[0] is not None:
                peers = [r for r in members[0].to_list() if r not in culprits]
                return (sorted(culprits) + peers)[:8]
    if report.timing is not None and report.timing.per_rank["straggler"].any():
        per_rank = report.timing.per_rank
        stragglers = per_rank.filter(pl.col("straggler"))["rank"].to_list()[:5]
        others = per_rank.filter(~pl.col("straggler"))["rank"].head(3).to_list()   # (to compare with)
        return sorted(set(culprits) | set(stragglers)) + others
    ranks = sorted(set(culprits) | set(report.waits.waiting[:3] if report.waits else []))[:8]
    return ranks or report.trace.entries["rank"].unique().sort().head(4).to_list()


def lateness(report: "Report", ranks: list[int] | None = None) -> "Figure":
    """Lateness (ms, clock offsets removed) of each rank's collectives against when it enqueued them (ms since
    the first shown), in every group at once; stragglers stand out. Default ranks: the six latest by median.
    The dashed line is the threshold a rank's median must pass to be named a straggler."""
    plt = pyplot()
    from flightrec.report.tables import check_ranks

    t = report.timing
    check_ranks(report.trace, ranks)
    if ranks is None:
        ranks = t.per_rank.sort("median_late_ms", descending=True).head(6)["rank"].to_list()
    # (when: the enqueue time of the rank's own entry, read for the few ranks shown)
    when = (report.trace.entries.filter(pl.col("rank").is_in(ranks) & ~pl.col("is_p2p"))
            .select("group", "collective_seq_id", "rank", "time_created_ns")
            .unique(["group", "collective_seq_id", "rank"], keep="first"))
    late = (t.lateness.filter(pl.col("rank").is_in(ranks))
            .join(when, on=["group", "collective_seq_id", "rank"], how="left").drop_nulls("time_created_ns"))
    t0 = late["time_created_ns"].min() or 0
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for r in ranks:
        mine = late.filter(pl.col("rank") == r).sort("time_created_ns")
        # (points, not lines: a rank's groups interleave, and waits add up along a step: a line would zigzag
        # between a tp collective on time and a dp one late)
        ax.plot(((mine["time_created_ns"] - t0) / 1e6).to_list(), mine["late_ms"].to_list(), marker=".",
                linestyle="none", label=f"rank {r}")
    ax.axhline(t.threshold_ms, color="black", linestyle="--", linewidth=0.8,
               label="threshold (on a rank's median)")
    ax.set_xlabel("enqueued at (ms since the first shown collective)")
    ax.set_ylabel("late by (ms)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Lateness per rank over time")
    fig.tight_layout()
    return fig
