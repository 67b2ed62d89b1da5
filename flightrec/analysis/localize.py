"""From stuck groups to a host or a link, by group testing.

When a collective is in flight on every member and completed on none, nobody is behind: the fault is under
the software (a GPU, a NIC, a cable). Each stuck group is a positive test, each group that kept completing
after the hang began is a negative one. The hosts (and host pairs) present in every positive test and in no
negative test are the suspects; one host pair is a link, one host is a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import polars as pl

from flightrec.analysis.gpu_position import oldest_pending, unit_pending
from flightrec.analysis.matching import Matching
from flightrec.model.schema import GroupId
from flightrec.model.topology import Topology


@dataclass(frozen=True)
class Location:
    """Result of group testing. `hosts` / `links` are the suspects; empty when nothing narrows it down."""

    stuck_groups: list[str]
    healthy_groups: int
    hosts: list[str]
    links: list[list[str]]
    candidates: list[str]         # hosts in every stuck group, before the healthy groups cleared some
    stuck_ranks: list[int]
    seqs: dict[str, int]          # stuck group -> its in-flight collective seq (or -1 for a p2p pair)


def stuck_tests(m: Matching) -> pl.DataFrame:
    """(test id, rank) for every in-flight collective at a group's frontier and every in-flight p2p pair that
    holds each member's GPU: it is every member's oldest unfinished op (`oldest_pending`), or it began on every
    member (`started`). One that is some member's run-ahead, queued behind another op, proves nothing of the
    hardware under it: with NCCL timing off every enqueued op reads `scheduled`, and at a hang most are in
    flight on every member (NVIDIA's real dumps, fixtures/nvrx)."""
    # (any collective in flight, not only a group's newest: with the CPU ahead of the GPU, the one holding the
    # GPUs is often older than what the CPUs went on to enqueue; which hold them is said below)
    colls = (
        m.collectives
        .filter(pl.col("status") == "in_flight")
        .select("group", "collective_seq_id")
        # (not one whose members disagree, found beyond its own entries: a mismatch settled by the peer groups
        # where a member's dump was cut. The mismatch explains it; it is no hang below the collectives)
        .join(m.divergences.select("group", "collective_seq_id"), on=["group", "collective_seq_id"], how="anti")
    )
    # a semi join hashes the few stuck collectives and streams the units past them (an inner join with the
    # units on the right hashed all 14.6M of them at 16K x 2,000: +1.5 GiB)
    oldest = oldest_pending(m)
    # (a member on which it is finished, a Gloo member whose part failed at its timeout, says nothing either way)
    coll_ranks = (m.units.lazy().select("group", "collective_seq_id", "rank", "record_id", "state",
                                        unit_pending().alias("_pending"))
                  .join(colls.lazy(), on=["group", "collective_seq_id"], how="semi")
                  .join(oldest.lazy(), on="rank", how="left")
                  .filter((~pl.col("_pending") | (pl.col("record_id") == pl.col("_oldest")).fill_null(False)).all()
                          .over("group", "collective_seq_id")
                          | (pl.col("state") == "started").all().over("group", "collective_seq_id"))
                  .select("group", "collective_seq_id", "rank").collect())
    colls = colls.join(coll_ranks.select("group", "collective_seq_id").unique(), on=["group", "collective_seq_id"],
                       how="semi")
    # and members whose dump doesn't show that entry (cut short before it), though they provably enqueued it
    # (`progress.enqueued_at_least`: NCCL's counter, where it passed the entries kept) and did not complete it:
    # a rank alone on its host is that host's only witness
    cut = (m.progress.filter(pl.col("enqueued_at_least").is_not_null()).join(colls, on="group")
           .filter((pl.col("enqueued_at_least") >= pl.col("collective_seq_id"))
                   & ~(pl.col("last_completed") >= pl.col("collective_seq_id")).fill_null(False))
           .select("group", "collective_seq_id", "rank"))
    coll_ranks = pl.concat([coll_ranks, cut.cast(coll_ranks.schema)])
    at = {end: (pl.col(f"{end}_rank").replace_strict(oldest["rank"], oldest["_oldest"], default=None)
                == pl.col(f"{end}_record")).fill_null(False) for end in ("send", "recv")}
    p2p = m.p2p.filter((pl.col("status") == "in_flight")
                       & ((at["send"] & at["recv"]) | (pl.col("send_started") & pl.col("recv_started"))))
    p2p_ranks = pl.concat([
        p2p.select(pl.format("{}:{}->{}", "group", "src", "dst").alias("group"),
                   pl.lit(-1, pl.Int64).alias("collective_seq_id"), pl.col(c).alias("rank"))
        for c in ("send_rank", "recv_rank")
    ])
    # test ids are group names and p2p pair labels: plain strings
    return pl.concat([coll_ranks.select(pl.col("group").cast(pl.String), "collective_seq_id", "rank"),
                      p2p_ranks]).unique()


def locate(m: Matching, topo: Topology, exclude: frozenset[int] | set[int] = frozenset()) -> Location | None:
    """Group testing over stuck groups. Groups with a member in `exclude` (ranks that wait on someone else)
    are left out: that member's GPU may be queued behind its other wait, so the group proves nothing."""
    tests = stuck_tests(m)
    if exclude and tests.height:
        tainted = tests.filter(pl.col("rank").is_in(list(exclude))).select("group").unique()
        tests = tests.join(tainted, on="group", how="anti")
    if tests.height == 0:
        return None
    stuck_ranks = sorted(tests["rank"].unique().to_list())
    seqs = dict(tests.select("group", "collective_seq_id").unique().iter_rows())
    if not topo.host_of:
        return Location(sorted(seqs), 0, [], [], [], stuck_ranks, seqs)

    hosts = topo.frame()
    stuck_hosts = (tests.join(hosts, on="rank", how="left").group_by("group")
                   .agg(pl.col("host").drop_nulls().unique().sort()))
    host_sets = [set(h) for h in stuck_hosts["host"].to_list()]
    common = sorted(set.intersection(*host_sets)) if host_sets else []

    # Negative tests: groups that completed a collective after the first stuck op was enqueued.
    stuck_keys = tests.select(pl.col("group").cast(GroupId), "collective_seq_id").unique()
    # Lazy over the columns read: the anti join keeps nearly every unit, and eager it copied all their columns.
    units = m.units.lazy().select("group", "collective_seq_id", "rank", "state", "time_created_ns", "time_completed_ns")
    since = (units.join(stuck_keys.lazy(), on=["group", "collective_seq_id"])
             .select(pl.col("time_created_ns").min()).collect().item())
    healthy = (
        units.filter((pl.col("state") == "completed")
                     & (pl.col("time_completed_ns") > since if since is not None else pl.lit(False)))
        .select("group", "rank").unique()
        .join(stuck_keys.lazy().select("group"), on="group", how="anti")
        .join(hosts.lazy(), on="rank").group_by("group").agg(pl.col("host").unique())
        .collect()
    )
    healthy_sets = [set(h) for h in healthy["host"].to_list()]

    link_suspects = [
        [a, b] for a, b in combinations(common, 2)
        if not any(a in s and b in s for s in healthy_sets)
    ]
    # One host left uncleared is not named: a group that kept completing clears its hosts, but not the links
    # between them (a ring or tree uses a few of its host pairs, not all), so a dead link between two cleared
    # hosts explains the stuck groups as well as the one host left (bystander hosts were named for dead links
    # at 16 and 256 ranks, the real link's two ends both in a group that completed). One host is named where
    # the stuck groups share only it.
    if len(common) == 1:
        found_hosts, found_links = list(common), []
    elif len(common) == 2 or len(link_suspects) == 1:
        found_hosts, found_links = [], ([common] if len(common) == 2 else link_suspects)
    else:
        found_hosts, found_links = [], []
    return Location(sorted(seqs), len(healthy_sets), found_hosts, found_links, common, stuck_ranks, seqs)
