"""Each plot helper returns a figure whose marks say what the report says."""

import warnings

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from flightrec import analyze
from flightrec.errors import FlightrecError  # noqa: E402
from flightrec.report import plots
from flightrec.testing import synth


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("plots") / "job"
    synth.generate(synth.Job(tp=4, pp=2, dp=2, ranks_per_host=4, fault=synth.Fault(kind="not_joined", rank=6)),
                   out, per_host_folders=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(out)


def test_host_grid_colours_the_culprit(report):
    fig = plots.host_grid(report)
    hosts, grid, order = fig.flightrec_grid
    assert hosts == ["node00000", "node00001", "node00002", "node00003"]
    assert order[int(grid[1, 2])] == "culprit"          # rank 6 = host node00001, local rank 2
    assert order[int(grid[1, 3])] == "waiting"
    assert sum(order[int(v)] == "culprit" for v in grid.flat) == 1


def test_progress_heatmap_shows_where_the_culprit_stopped(report):
    fig = plots.progress_heatmap(report)
    ranks, seqs, grid, order = fig.flightrec_grid
    seq = report.root_causes[0].collective_seq_id
    assert order[int(grid[ranks.index(6), seqs.index(seq)])] == "not joined"
    assert order[int(grid[ranks.index(4), seqs.index(seq)])] == "in flight"
    assert order[int(grid[ranks.index(4), seqs.index(seq) - 1])] == "completed"


def test_wait_graph_points_at_the_culprit(report):
    g = plots.wait_graph(report).flightrec_graph
    assert g.nodes["rank 6"]["kind"] == "culprit"
    waiting = [n for n in g.nodes if g.nodes[n]["kind"] == "waiting"]
    assert waiting and all(g.has_edge(n, "rank 6") for n in waiting)
    assert sum(len(g.nodes[n]["ranks"]) for n in waiting) == 15


def test_timeline_draws_one_bar_per_entry(report):
    fig = plots.timeline(report, ranks=[4, 6], last=5)
    bars = fig.axes[0].patches
    assert len(bars) == 10
    assert any(b.get_edgecolor()[:3] == (0.0, 0.0, 0.0) for b in bars)  # rank 4's unfinished all_gather


def test_lateness_plot_has_a_line_per_rank(report):
    fig = plots.lateness(report, ranks=[0, 6])
    assert [line.get_label() for line in fig.axes[0].lines][:2] == ["rank 0", "rank 6"]


def test_report_exposes_the_frames_and_html(report):
    assert report.collectives is report.matching.collectives
    assert report.progress.filter(report.progress["behind"] > 0).height > 0
    assert report.waits.edges.height > 0 and report.trace.entries.height > 0
    html = report._repr_html_()
    assert "FAULT: rank 6" in html and "<table>" in html


def _fixture(case):
    from .conftest import FIXTURES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return analyze(FIXTURES / case, use_cache=False)


def test_progress_heatmap_takes_a_desc_or_an_id_as_every_other_api_does():
    """group='tp' drew a blank figure; group=2 raised Polars' 'cannot compare categorical with i32'."""
    sub = _fixture("subgroups_per_host")
    for group in ("tp", 2, "2"):
        ranks, _seqs, _grid, _order = plots.progress_heatmap(sub, group=group).flightrec_grid
        assert ranks == [4, 5, 6, 7], group


def test_timeline_on_gloo_shows_the_culprits_group_and_where_it_stopped():
    """On Gloo (no completion times) every bar ran to the right edge, a start-up broadcast squeezed the rest, and
    the ranks shown were the culprit and three waiters from another group."""
    sub = _fixture("subgroups_per_host")
    fig = plots.timeline(sub)
    assert fig.flightrec_ranks == [5, 4, 6, 7]   # the culprit, then its tp peers
    bars = fig.axes[0].patches
    assert sum(1 for b in bars if b.get_hatch()) >= len(bars) - 4   # drawn to the next entry: when it ended is unknown
    right = max(b.get_x() + b.get_width() for b in bars)
    assert right < 1000   # ms: the last steps, not the 17 s since the start-up broadcast
    with pytest.raises(FlightrecError, match="rank 99 is not in this job"):
        plots.timeline(sub, ranks=[99])


def test_lateness_plot_is_over_time_and_shows_the_straggler():
    late = _fixture("straggler")
    ax = plots.lateness(late).axes[0]
    by_rank = {line.get_label(): line for line in ax.lines if line.get_label().startswith("rank ")}
    assert "rank 2" in by_rank
    xs = list(by_rank["rank 2"].get_xdata())
    assert xs == sorted(xs) and xs[-1] > 100   # ms since the first shown collective, in order


def test_a_report_reads_as_one_line_and_a_healthy_wait_graph_says_nobody_waits():
    """repr(report) printed every finding with its stack frames; wait_graph on a healthy job was a blank canvas."""
    sub = _fixture("subgroups_per_host")
    assert repr(sub).startswith("<Report fault: FAULT: rank 5") and "1 root cause, 2 symptoms" in repr(sub)
    assert len(repr(sub).splitlines()) == 1
    healthy = _fixture("healthy")
    assert [t.get_text() for t in plots.wait_graph(healthy).axes[0].texts] == ["nobody waits on anyone"]


def test_without_the_notebook_extra_the_error_names_it(report, monkeypatch):
    import sys

    from flightrec.report import plots
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # (as if not installed: its import fails)
    with pytest.raises(ImportError, match=r"pip install 'flightrec\[notebook\]'"):
        plots.host_grid(report)
