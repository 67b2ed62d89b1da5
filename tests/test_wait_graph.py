"""The wait-for graph's roots, waiting ranks, cycles and waiters, read from its edges, against networkx on the
whole graph (what `build_waits` did before it pruned the graph and left networkx out of the common case)."""

import networkx as nx
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from flightrec.analysis.wait_graph import WAIT_EDGES, waits_from_edges

_nodes = st.sampled_from([f"r:{i}" for i in range(6)] + ["g:0", "g:1", "g:2"])


def _edges(pairs: list[tuple[str, str]], p2p: set[int] = frozenset()) -> pl.DataFrame:
    return pl.DataFrame({"src": [a for a, _ in pairs], "dst": [b for _, b in pairs],
                         "kind": ["p2p" if i in p2p else "behind" for i in range(len(pairs))],
                         "group": ["0"] * len(pairs), "seq": [1] * len(pairs)}, schema=WAIT_EDGES).unique()


def _want(edges: pl.DataFrame):
    graph = nx.DiGraph()
    graph.add_edges_from(zip(edges["src"].to_list(), edges["dst"].to_list()))
    ranks = [n for n in graph.nodes if n.startswith("r:")]
    roots = sorted(int(n[2:]) for n in ranks if graph.out_degree(n) == 0 and graph.in_degree(n) > 0)
    waiting = sorted(int(n[2:]) for n in ranks if graph.out_degree(n) > 0)
    cycles = sorted(sorted(int(n[2:]) for n in comp if n.startswith("r:"))
                    for comp in nx.strongly_connected_components(graph)
                    if sum(n.startswith("r:") for n in comp) > 1)
    return graph, roots, waiting, cycles


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_nodes, _nodes), max_size=14))
def test_roots_waiting_cycles_and_waiters_are_the_whole_graphs(pairs):
    edges = _edges(pairs)
    graph, roots, waiting, cycles = _want(edges)
    w = waits_from_edges(edges)
    assert (w.roots, w.waiting, [ranks for ranks, _ in w.cycles]) == (roots, waiting, cycles)
    for r in range(6):
        node = f"r:{r}"
        want = sorted(int(n[2:]) for n in (nx.ancestors(graph, node) if node in graph else ())
                      if n.startswith("r:") and n != node)
        assert w.waiters_of([r]) == want
    assert sorted(w.graph.edges) == sorted(graph.edges)   # (made when asked for)


def test_a_cycle_behind_a_star_of_waiters_is_found_with_its_groups():
    """8 ranks wait on group 1, whose member 0 waits in group 2 on rank 1, which waits back on rank 0 by a
    send: the star's edges are pruned, the cycle kept, with its p2p group."""
    pairs = [(f"r:{i}", "g:1") for i in range(2, 10)] + [("g:1", "r:0"), ("r:0", "g:2"), ("g:2", "r:1"),
                                                          ("r:1", "r:0")]
    w = waits_from_edges(_edges(pairs, p2p={len(pairs) - 1}))
    assert w.cycles == [([0, 1], ["0", "2"])]
    assert w.roots == [] and w.waiting == list(range(10))
