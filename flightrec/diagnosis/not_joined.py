"""Ranks the others wait for that wait for nobody: each a root cause, unless something the dumps show
explains it (a mismatch, a deadlock, a hang in flight, a lost rank more wait on)."""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from flightrec.diagnosis.context import Context, counted_only, kind_of, n_wait, never_joined, stopped_note, whole_host
from flightrec.diagnosis.missing import missing_findings
from flightrec.model.wording import listed
from flightrec.report.model import Finding


def _preceded(ctx: Context, edges: pl.DataFrame) -> pl.DataFrame:
    """(dst, group, seq): collectives a root is waited on in that another one it is waited on comes before, in
    some rank's program order: that rank recorded both, the other first, or recorded the other and never
    reached this one. Enqueue times can't say it across hosts, whose clocks disagree. Where the order goes
    both ways (ranks disagree), nothing is dropped for that root."""
    cands = edges.filter(pl.col("kind") != "p2p").select("dst", "group", "seq").drop_nulls().unique()
    none = cands.clear()
    if cands.height < 2:
        return none
    rows = (ctx.m.units.lazy().select("group", pl.col("collective_seq_id").alias("seq"), "rank", "record_id")
            .join(cands.lazy().select("group", "seq").unique(), on=["group", "seq"]).collect())
    pairs = (cands.join(cands, on="dst", suffix="_b")
             .filter((pl.col("group") != pl.col("group_b")) | (pl.col("seq") != pl.col("seq_b"))))
    if pairs.height == 0:
        return none
    first = pairs.join(rows, on=["group", "seq"])   # a rank that recorded the earlier candidate, A
    recorded_first = (first.join(rows.rename({"group": "group_b", "seq": "seq_b", "record_id": "_rec_b"}),
                                 on=["group_b", "seq_b", "rank"])
                      .filter(pl.col("record_id") < pl.col("_rec_b")))
    never_reached = (first.join(ctx.m.progress.select(pl.col("group").alias("group_b"), "rank", "last_enqueued"),
                                on=["group_b", "rank"])
                     .filter(pl.col("last_enqueued") < pl.col("seq_b")))
    before = pl.concat([f.select("dst", "group", "seq", "group_b", "seq_b") for f in (recorded_first, never_reached)])
    before = before.unique()
    # (a pair ordered both ways is no evidence: drop both directions)
    both = before.join(before.select(pl.col("group_b").alias("group"), pl.col("seq_b").alias("seq"),
                                     pl.col("group").alias("group_b"), pl.col("seq").alias("seq_b"), "dst"),
                       on=["dst", "group", "seq", "group_b", "seq_b"], how="semi")
    before = before.join(both, on=["dst", "group", "seq", "group_b", "seq_b"], how="anti")
    preceded = before.select("dst", pl.col("group_b").alias("group"), pl.col("seq_b").alias("seq")).unique()
    # never drop every candidate of a root (an order that goes round in a circle says nothing)
    left = cands.join(preceded, on=["dst", "group", "seq"], how="anti").select("dst").unique()
    return preceded.join(left, on="dst", how="semi")


def held_in_transfers_finding(ctx: Context) -> Finding:
    """The ranks `root_findings` held as maybe blocked in a send or receive Gloo does not record: beside
    another cause (`held_beside_cause`), or, with none, as the suspects one of which holds the others."""
    ranks = sorted(ctx.held_in_transfers)
    beside_cause = ctx.held_beside_cause
    one = len(ranks) == 1
    went = (f"{ctx.ranks_label(ranks)} {'is' if one else 'are'} waited on, but had finished every op "
            f"{'it' if one else 'they'} recorded")
    if beside_cause:
        message = (f"{went}: in a job running ops Gloo does not record (sends and receives), likely blocked in one, "
                   "held by another cause (above, or a rank that left no dump)")
    else:
        hosts = ctx.topo.hosts(ranks)
        link = f", or a link between their hosts ({listed(hosts, 4)})," \
            if len(hosts) > 1 else ""
        message = (f"{went}, and nothing else holds the job: Gloo records no send or receive, and this job ran some "
                   "(groups its ranks recorded nothing in, or counters past their recorded collectives), so one of "
                   f"them{link} may hold the others in a transfer these dumps can't show")
    return Finding(kind="waiting", role="symptom", ranks=ranks, hosts=ctx.topo.hosts(ranks), message=message,
                   evidence={"ranks": ranks, "in_unrecorded_transfers": "held" if beside_cause else "suspects"})


def _missing_waits(ctx: Context) -> list[tuple[int, str, int | None]]:
    """(rank, group, seq) of each rank waiting in a group on a member that left no dump (or is guessed lost)."""
    return (ctx.w.edges.filter((pl.col("kind") == "missing") & pl.col("src").str.starts_with("r:"))
            .select(pl.col("src").str.slice(2).cast(pl.Int64), pl.col("group").cast(pl.String), "seq").rows())


def _beside_stuck(ctx: Context, stuck_at: dict[str, int]) -> set[int]:
    """Ranks waiting on a missing member in a collective in flight on every member with a dump, where a group of
    the same kind is stuck in flight at the same seq with every dump there (`stuck_at`: group -> seq): the hang
    below the collectives holds both groups, and the missing one need not be why (a dead link's dp groups)."""
    if not stuck_at:
        return set()
    kind = {g: ref.desc for g, ref in ctx.groups.items()}
    stuck_kinds = {(kind.get(g), seq) for g, seq in stuck_at.items()}
    in_flight = set(ctx.m.collectives.filter(pl.col("status") == "in_flight")
                    .select(pl.col("group").cast(pl.String), "collective_seq_id").iter_rows())
    return {rank for rank, group, seq in _missing_waits(ctx)
            if (group, seq) in in_flight and group not in stuck_at and (kind.get(group), seq) in stuck_kinds}


def _still_unexplained(ctx: Context, missing: list[int], holding: set[int]) -> list[int]:
    """The `missing` ranks not explained by the `holding` ranks: some rank waits on it and on none of those
    (directly or through others), and in no group of its smaller than the world are its peers with a dump all
    held so (its tp peers stuck in a mismatched all_gather: it is likely where they are)."""
    if not missing or not holding:
        return missing
    covered = set(ctx.w.waiters_of(sorted(holding))) | holding
    missing = [r for r in missing if not set(ctx.w.waiters_of([r])) <= covered]
    if not missing:
        return missing
    # (one pass over the small progress table for every missing rank: not a filter a rank)
    small = [name for name, g in ctx.groups.items() if g.size and g.size < ctx.trace.world_size]
    prog = ctx.m.progress.filter(pl.col("group").cast(pl.String).is_in(small))
    held_groups = (prog.filter(pl.col("has_dump"))
                   .group_by("group").agg(pl.len().alias("_n"), pl.col("rank").is_in(list(covered)).all().alias("_in"))
                   .filter((pl.col("_n") >= 2) & pl.col("_in")).select("group"))
    beside = set(prog.filter(pl.col("rank").is_in(missing)).join(held_groups, on="group")["rank"].to_list())
    return [r for r in missing if r not in beside]


def _silent_hosts(ctx: Context, gone: set[int]) -> set[str | None]:
    """Hosts all of whose ranks are `gone` (left no file at all: one cut short or unreadable was written by a
    rank alive to write it), and None (a rank whose host is unknown)."""
    hosts = {ctx.topo.host_of.get(r) for r in gone} - {None}
    return {h for h in hosts if set(ctx.topo.ranks_on(h)) <= gone} | {None}


def _beside_held(ctx: Context) -> set[int]:
    """Ranks waiting on a missing member at seq s of a group, where a group of the same kind waits at s only on
    members that are held by something else themselves (they wait on someone, or in a send or receive Gloo
    didn't record): the missing one, in the same place as those, may well be held the same way (the last
    stage of a pipeline behind a dead NIC, its dumps lost for one replica)."""
    edges = ctx.w.edges
    behind = edges.filter((pl.col("kind") == "behind") & pl.col("src").str.starts_with("g:"))
    if behind.height == 0:
        return set()
    held_ranks = [f"r:{r}" for r in set(ctx.w.waiting) | ctx.went_on]
    kind = {g: ref.desc for g, ref in ctx.groups.items()}
    # (a group -> laggard edge carries the seq its peers wait in: the laggard's next)
    held = (behind.group_by(pl.col("group").cast(pl.String), "seq")
            .agg(pl.col("dst").is_in(held_ranks).all().alias("_held")).filter(pl.col("_held")))
    held_at = {(kind.get(g), seq) for g, seq in held.select("group", "seq").iter_rows()}
    if not held_at:
        return set()
    return {rank for rank, group, seq in _missing_waits(ctx)
            if kind.get(group) not in (None, "", "default_pg") and (kind.get(group), seq) in held_at}


def root_findings(ctx: Context, explained: set[int], stuck: set[int],
                  stuck_at: dict[str, int] | None = None) -> list[Finding]:
    """Roots of the wait graph: ranks that others wait for and that wait for nobody."""
    roots = [r for r in ctx.w.roots if r not in explained and r not in stuck]
    edges = ctx.w.edges.filter(pl.col("dst").is_in([f"r:{r}" for r in roots]))
    roots, missing = _unexplained_roots(ctx, roots, explained, stuck, stuck_at or {})
    edges = _in_program_order(ctx, edges)
    # (ranks whose dumps prove them behind come first: how far a rank with no dump got is unknown)
    return _not_joined_findings(ctx, roots, missing, edges) + missing_findings(ctx, missing, edges)


def _unexplained_roots(ctx: Context, roots: list[int], explained: set[int], stuck: set[int],
                       stuck_at: dict[str, int]) -> tuple[list[int], list[int]]:
    """(the roots to name, those of them with no dump): roots left once what else the dumps show is taken out."""
    # A missing dump whose waiters are all stuck in a mismatched collective is explained by the mismatch.
    missing = [r for r in roots if r not in ctx.has_dump and not set(ctx.w.waiters_of([r])) <= explained]
    # So is one whose waiters all wait on a rank whose own dump shows it behind, or on ranks stuck in a
    # collective in flight on every member (a hang below the collectives: a dead link): those explain the hang,
    # while how far the missing one got is unknown (a warning names it, `warning_findings`). A bystander's
    # lost dump took the blame for a dead link.
    provable = [r for r in roots if r in ctx.has_dump]
    # (and ranks a root cause found above explains, a mismatch's or a deadlock's: their waiters wait on them)
    strict = set(provable) | stuck | _beside_stuck(ctx, stuck_at) | explained
    missing = _still_unexplained(ctx, missing, strict)
    # Weaker: Gloo ranks that went on past their last entry (maybe blocked in a send or receive Gloo didn't
    # record: their last entry, maybe in the missing one's group, only looks like where they stopped), and ranks
    # beside same-kind groups whose laggards are held elsewhere (`_beside_held`). Those may be waiting on the
    # missing rank itself (its pipeline neighbours): they don't clear one that left no file at all where its
    # whole host left none, or where no host is known (a crashed rank is the likelier reason it went silent).
    loose = ctx.went_on | (_beside_held(ctx) if missing else set())
    cleared: list[int] = []   # missing ranks only those loose ones explain: they may wait on them, or they on it
    if missing and loose:
        silent_ranks = set(ctx.trace.missing_ranks) - set(ctx.trace.dumps["rank"].to_list())
        silent = _silent_hosts(ctx, silent_ranks)
        kept = [r for r in missing if ctx.topo.host_of.get(r, None) in silent and r in silent_ranks]
        still = sorted(kept + _still_unexplained(ctx, [r for r in missing if r not in kept], strict | loose))
        cleared, missing = [r for r in missing if r not in still], still
    missing, ctx.overshadowed = _overshadowed(ctx, missing)
    roots = [r for r in roots if r in ctx.has_dump or r in missing]
    # Which of those are held. A rank that went on past its last entry, in a job running ops Gloo does not
    # record, stopped in host code (a cause) or in a send or receive, on a stopped peer: the dumps can't say.
    # Beside a cause they can show (a mismatch, a deadlock, a hang in flight, a silent rank, a rank stopped in
    # an op it recorded) it is held; so beside a lost rank it cleared above (it may be waiting on that one: a
    # stage whose sender died). Several of them and nothing else can hold one another through transfers (a
    # stage that never sends stops its neighbours' stages, whose peers wait on them all): none is named,
    # `held_in_transfers_finding` lists them. One alone is named.
    went_on = ctx.went_on & set(roots)
    ctx.held_beside_cause = bool(explained or stuck or missing or cleared or set(roots) - went_on)
    if went_on and (ctx.held_beside_cause or len(went_on) > 1):
        ctx.held_in_transfers = went_on
        roots = [r for r in roots if r not in went_on]
    return roots, missing


def _not_joined_findings(ctx: Context, roots: list[int], missing: list[int], edges: pl.DataFrame) -> list[Finding]:
    """One not_joined finding per point of the program where roots with a dump stopped (`edges`: the wait edges
    into them, in program order)."""
    out: list[Finding] = []
    # Roots that never joined the same collective of groups of one kind (the same seq of each expert-parallel
    # group: two ranks stopped at one point of the program) are one finding; else one per (group, seq, kind).
    by_instance: dict[tuple, list[int]] = defaultdict(list)   # (group or kind, seq, edge kind) -> roots
    groups_of: dict[tuple, list[str]] = defaultdict(list)
    mine_of: dict[int, pl.DataFrame] = {}
    for r in roots:
        if r in missing:
            continue
        mine = edges.filter(pl.col("dst") == f"r:{r}").sort("_t", "kind", "group", nulls_last=True)
        if mine.height == 0:
            continue
        first = mine.row(0, named=True)
        seq = first["seq"] if first["kind"] != "p2p" else None
        # (only ranks that stopped alike: the same note on their last entry)
        alike = stopped_note(ctx, r, ctx.describe_last(r)) if len(roots) > 1 else ""
        key = (kind_of(ctx, first["group"]) if seq is not None else first["group"], seq, first["kind"], alike)
        by_instance[key].append(r)
        if first["group"] not in groups_of[key]:
            groups_of[key].append(first["group"])
        mine_of[r] = mine
    for key, ranks in sorted(by_instance.items(), key=lambda kv: kv[1][0]):
        _, seq, kind, _ = key
        group, *more = groups_of[key]
        g = ctx.groups.get(group)
        waiting = ctx.w.waiters_of(ranks)
        doing = ctx.describe_last(ranks[0])
        if kind == "p2p":
            msg = (f"{ctx.ranks_label(ranks)} never posted the send/recv its pipeline peer waits for in "
                   f"{g.label() if g else group}; {n_wait(len(waiting))} on it")
            op = "send/recv"
        else:
            op, msg = never_joined(ctx, ranks, groups_of[key], seq, waiting)
        counted: dict = {}
        for each in groups_of[key]:
            counted |= counted_only(ctx, ranks, each).get("last_seq_from_pg_status", {})
        out.append(Finding(
            kind="not_joined", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            process_group=g, collective_seq_id=seq, op=op,
            evidence={"last_entry": doing, "waiting_ranks": len(waiting), "note": stopped_note(ctx, ranks[0], doing),
                      **({"also_waited_on_in": also} if (also := _other_waits(ctx, mine_of[ranks[0]])) else {}),
                      **({"groups": groups_of[key]} if more else {}),
                      **({"last_seq_from_pg_status": counted} if counted else {})},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))],
        ))
    return out


def _in_program_order(ctx: Context, edges: pl.DataFrame) -> pl.DataFrame:
    """The wait edges into roots, with `_t` (when its peers enqueued the op waited for) and without those another
    one precedes: a root is often waited on in several groups, and the op it should have run first is, of those
    no other precedes in some rank's program order (`_preceded`: clock-free), the one its peers enqueued earliest
    (on one clock: the hosts' offsets timing found are taken out)."""
    # (lazy, over the three columns it reads: an eager join copies every column of the matched units)
    when = (ctx.m.units.lazy().select("group", "collective_seq_id", "rank", "time_created_ns")
            .join(edges.lazy().select("group", pl.col("seq").alias("collective_seq_id")).unique(),
                  on=["group", "collective_seq_id"])
            .join(ctx.clock_shift.lazy(), on="rank", how="left")
            .group_by("group", "collective_seq_id")
            .agg((pl.col("time_created_ns") - pl.col("_shift_ns").fill_null(0)).min().alias("_t")).collect())
    edges = edges.join(when.rename({"collective_seq_id": "seq"}), on=["group", "seq"], how="left")
    return edges.join(_preceded(ctx, edges), on=["dst", "group", "seq"], how="anti")


def _other_waits(ctx: Context, mine: pl.DataFrame) -> list[str]:
    """Where else others wait on a root (its wait edges, in order, after the first: the one its headline names),
    one label each: 'send/recv in group 10 (desc 'pp')', 'all_reduce #3 in group 18 (desc 'dp')'. A rank stopped
    before its pipeline send is also what its tp peers wait for at their next collective. (Per finding, not per
    root: reading an op can scan the units.)"""
    first = mine.row(0, named=True)
    out = []
    for group, seq, kind in mine.slice(1).select("group", "seq", "kind").unique(maintain_order=True).iter_rows():
        if (group, kind) == (first["group"], first["kind"]):
            continue
        g = ctx.groups.get(group)
        where = g.label() if g else f"group {group}"
        what = "send/recv" if kind == "p2p" else f"{ctx.op_at(group, seq) or 'collective'} #{seq}"
        label = f"{what} in {where}"
        if label not in out:
            out.append(label)
    return out[:4]


def _missing_units(ctx: Context, missing: list[int]) -> list[list[int]]:
    """The missing ranks of each known host. (Ranks with no known host are left out: a host down is then seen
    rank by rank, each waited on by its own peers, and the ranks fewer wait on would read as overshadowed by
    the others, the host named without them: --no-hosts sweep, seed 7, job 6.)"""
    by_host: dict[str, list[int]] = defaultdict(list)
    for r in missing:
        host = ctx.topo.host_of.get(r)
        if host is not None:
            by_host[host].append(r)
    return list(by_host.values())


def _overshadowed(ctx: Context, missing: list[int]) -> tuple[list[int], dict[int, list[int]]]:
    """Of the missing ranks others wait on, those a stronger missing unit explains: every rank waiting on them
    waits on that unit too (directly or through others, as `_still_unexplained` asks of ranks with a dump), and
    that unit has more waiters, or as many and is a whole host gone silent (a host that went down), where they
    are not. At scale dumps go missing beside a real fault (a full disk, a job killed before every rank wrote):
    20 lost files beside a host down named 15 root causes, the host seventh. Each stuck collective with several
    members missing needs only one of them to be why; the one every waiter waits on is the likelier reading.
    Units with the same waiters, both plain, are kept (`missing_findings` names them together: nothing tells
    them apart). Returns (the ranks still named, rank -> the ranks of the units that overshadow it)."""
    if len(missing) < 2:
        return missing, {}
    units = [(ranks, frozenset(ctx.w.waiters_of(ranks)), whole_host(ctx, ranks))
             for ranks in _missing_units(ctx, missing)]

    def stronger(a, b) -> bool:
        return len(a[1]) > len(b[1]) or (len(a[1]) == len(b[1]) and a[2] and not b[2])

    # (stronger first: a unit can only be overshadowed by one before it)
    order = sorted(range(len(units)), key=lambda i: (-len(units[i][1]), not units[i][2]))
    over: dict[int, list[int]] = {}
    for pos, i in enumerate(order):
        unit = units[i]
        if unit[1]:
            over[i] = [j for j in order[:pos] if unit[1] <= units[j][1] and stronger(units[j], unit)]
    # (named by the units they leave standing: one that overshadows another is itself overshadowed only by a
    # stronger one through a superset, which then covers the first too)
    shadowed = {i for i, by in over.items() if by}
    by_ranks = {r: sorted(r2 for j in over[i] if j not in shadowed for r2 in units[j][0])
                for i in shadowed for r in units[i][0]}
    return [r for r in missing if r not in by_ranks], by_ranks
