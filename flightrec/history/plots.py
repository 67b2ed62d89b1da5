"""Figures of the fleet's history for notebooks: incidents over time per host, hosts by week. They draw the
frames `flightrec.history` computes (`named`, `hosts_by_week`); nothing is computed here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from flightrec.report.plots import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def incidents_over_time(named: pl.DataFrame, what: str = "host", top: int = 20) -> "Figure":
    """One row per host (or link, switch, rank: `what`) named as a root cause, a mark at each incident, the most
    often named at the top. `named`: `flightrec.history.named(log, since)`."""
    plt = pyplot()
    rows = named.filter(pl.col("what") == what)
    order = (rows.group_by("name").agg(pl.col("incident").n_unique().alias("n")).sort(["n", "name"],
             descending=[True, False]).head(top)["name"].to_list())
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(order), 3) + 1.2))
    for y, name in enumerate(reversed(order)):
        at = rows.filter(pl.col("name") == name)["at"].to_list()
        ax.scatter(at, [y] * len(at), color="#d62728" if len(set(at)) > 1 else "#7f7f7f", s=30, zorder=2)
    ax.set_yticks(range(len(order)), list(reversed(order)))
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(f"incidents naming each {what} as a root cause (red: named more than once)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def hosts_heat_map(by_week: pl.DataFrame, top: int = 30) -> "Figure":
    """Hosts x weeks, each cell the incidents that named the host that week. `by_week`:
    `flightrec.history.hosts_by_week(log, since)`."""
    plt = pyplot()
    totals = by_week.group_by("name").agg(pl.col("incidents").sum()).sort(["incidents", "name"],
                                                                            descending=[True, False]).head(top)
    hosts = totals["name"].to_list()
    weeks = sorted(by_week["week"].unique().to_list())
    cells = [[0] * len(weeks) for _ in hosts]
    where = {h: i for i, h in enumerate(hosts)}
    column = {w: j for j, w in enumerate(weeks)}
    for name, week, n in by_week.select("name", "week", "incidents").iter_rows():
        if name in where:
            cells[where[name]][column[week]] = n
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(weeks) + 2), 0.35 * max(len(hosts), 3) + 1.2))
    image = ax.imshow(cells, aspect="auto", cmap="Reds", vmin=0)
    ax.set_yticks(range(len(hosts)), hosts)
    ax.set_xticks(range(len(weeks)), [w.strftime("%Y-%m-%d") for w in weeks], rotation=45, ha="right")
    ax.set_title("incidents naming each host, by week")
    fig.colorbar(image, ax=ax, label="incidents")
    fig.tight_layout()
    return fig
