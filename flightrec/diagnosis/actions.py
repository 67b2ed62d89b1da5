"""What to do about each finding: an action a runbook can branch on, and the next step in one line for a person.

A verdict is a promise to someone at 3 a.m. A host is drained only for what its hardware did (a GPU that
stopped, a host down, a hang below the collectives only that host is in); a rank that ran other code (a
mismatch, an order of collectives no other rank ran, a send to the wrong peer) is a bug to fix, and no host to
drain; a process that stopped outside any collective is to be looked at first (its stack, its log); a dump that
could not be read is to be collected again.
"""

from __future__ import annotations

from dataclasses import replace

from flightrec.model.cluster_failures import is_cluster_failure
from flightrec.model.vocab import Action
from flightrec.model.wording import listed
from flightrec.report.model import Finding


def action_of(f: Finding) -> Action:
    """The finding's action (see `Action`)."""
    kind, root = f.kind, f.role == "root_cause"
    if kind in ("unreadable", "mixed_incidents") or (kind == "no_entries" and not f.evidence.get("idle")):
        return Action.RECOLLECT_DUMPS
    if kind == "world_size_unknown":
        return Action.RERUN_WITH_WORLD_SIZE
    if kind == "in_flight_at_dump":
        return Action.RERUN_WITH_TRIGGER if f.evidence.get("waited") == "unknown" else Action.NONE
    if kind == "missing_dump" and not root and f.evidence.get("hosts_gone"):
        return Action.RECOLLECT_DUMPS   # (down, or not collected: collect first, drain if it wrote nothing)
    if not root:
        return Action.NONE
    if kind == "gpu_stalled":
        return Action.DRAIN_HOST
    if kind == "stuck_in_flight":
        return Action.CHECK_LINK if f.links else Action.DRAIN_HOST
    if kind == "switch":
        return Action.CHECK_SWITCH
    if kind == "missing_dump":
        return Action.DRAIN_HOST if f.evidence.get("whole_host_missing") else Action.INSPECT_PROCESS
    if kind in ("mismatch", "deadlock", "p2p_unmatched"):
        return Action.FIX_CODE
    if kind in ("not_joined", "straggler"):
        return Action.INSPECT_PROCESS
    return Action.NONE


def next_step(f: Finding, action: Action) -> str:
    """The next step, one line, for a person."""
    hosts = ", ".join(f.hosts) or "its host"
    match action:
        case Action.DRAIN_HOST:
            if not f.hosts:
                one = len(f.ranks) <= 1
                return (f"drain the host{'' if one else 's'} of {_ranks(f.ranks)} (--hosts FILE names "
                        f"{'it' if one else 'them'}) and restart without {'it' if one else 'them'}")
            one = len(f.hosts) == 1
            return f"drain {'host' if one else 'hosts'} {hosts} and restart the job without {'it' if one else 'them'}"
        case Action.CHECK_LINK:
            a, b = f.links[0]
            return (f"test the link {a} <-> {b} (NICs, cables, switch ports: an NCCL all-reduce across the two hosts); "
                    "drain an end that fails")
        case Action.CHECK_SWITCH:
            return f"check switch {f.evidence.get('switch')} (every host under it is implicated)"
        case Action.INSPECT_PROCESS:
            return (f"look at {_who(f)}: py-spy dump, {'its' if len(f.ranks) <= 1 else 'their'} log, the host's "
                    "dmesg (Xid); drain only for a hardware fault")
        case Action.FIX_CODE:
            if f.evidence.get("ambiguous"):
                return (f"one of {_who(f)} ran other code (the dumps can't say which: compare their stacks): a bug "
                        "for the job's owner; drain nothing")
            one = len(f.ranks) <= 1
            return (f"{_who(f)} ran other code than {'its' if one else 'their'} peers (see the stack): a bug for the "
                    "job's owner; drain nothing")
        case Action.RECOLLECT_DUMPS:
            if f.kind == "mixed_incidents":
                return ("put each incident's dumps in a folder of its own (the older ones may be stale files of an "
                        "earlier run) and analyze each; trust no verdict from them mixed")
            if f.evidence.get("hosts_gone"):
                gone = ", ".join(f.evidence["hosts_gone"])
                return f"collect {gone}'s dumps and analyze again; if it wrote none, it is down: drain it"
            reasons = [p.get("reason", "") for p in f.evidence.get("paths", []) if isinstance(p, dict)]
            if reasons and all(is_cluster_failure(r) for r in reasons):
                return (f"the cluster did not read {_count(len(reasons), 'shard')} (see why below): check its workers "
                        "and the storage, then analyze again (a longer --deadline, or more --worker-memory)")
            return "collect the dumps again, readable by this user and with their entries, and analyze again"
        case Action.RERUN_WITH_WORLD_SIZE:
            if f.evidence.get("unseen_groups"):
                return ("analyze again with --world-size N (the job's size) to see which ranks are missing, and "
                        "collect their dumps")
            return "analyze again with --world-size N (the job's size)"
        case Action.RERUN_WITH_TRIGGER:
            return "if the job hung, analyze again with --trigger timeout"
    return ""


def with_actions(findings: list[Finding]) -> list[Finding]:
    """Each finding with its action and next step."""
    out = []
    for f in findings:
        action = action_of(f)
        out.append(replace(f, action=action.value, next_step=next_step(f, action)))
    return out


# The culprits a runbook acts on, by action (`Report.culprits`)
HARDWARE = (Action.DRAIN_HOST,)
LINKS = (Action.CHECK_LINK, Action.CHECK_SWITCH)


HEADLINE_MAX = 160


def _group(f: Finding) -> str:
    """A process group as a headline names it: its desc where it has one, with its name ('tp 2'), else 'group 2'."""
    g = f.process_group
    if g is None:
        return ""
    if g.desc == "default_pg":
        return "default_pg"
    desc = g.desc if g.desc and g.desc != "undefined" else ""
    return f"{desc} {g.name}" if desc and desc != g.name else f"group {g.name}"


def _short(text: str, limit: int = 32) -> str:
    # (a batch's shapes are joined by ';', entry by entry: '+' reads as "and then")
    text = text.replace(";", " + ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ranks(ranks: list[int]) -> str:
    from flightrec.model.trace import format_ranks
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks, limit=4)}"


def _who(f: Finding) -> str:
    """The culprit first: its ranks and (one) host, or its hosts."""
    if f.ranks:
        host = f" ({f.hosts[0]})" if len(f.hosts) == 1 else f" ({len(f.hosts)} hosts)" if f.hosts else ""
        return _ranks(f.ranks) + host
    return listed(f.hosts, 3)


def headline(f: Finding) -> str:
    """A finding in one short line, culprit first (at most HEADLINE_MAX characters): what a pager shows."""
    if f.role != "root_cause":
        text = _not_a_root_headline(f)
        return text if len(text) <= HEADLINE_MAX else text[: HEADLINE_MAX - 3].rsplit(" ", 1)[0] + "..."
    ev, op, seq, where = f.evidence, f.op or "collective", f.collective_seq_id, _group(f)
    waiting = ev.get("waiting_ranks")
    wait = (f"; {waiting:,} rank{'s wait' if waiting != 1 else ' waits'} on {'it' if len(f.ranks) <= 1 else 'them'}"
            if waiting else "")
    at = f" {op} #{seq}" + (f" in {where}" if where else "") if seq is not None else ""
    if f.kind == "gpu_stalled":
        text = f"{_who(f)}: GPU stopped" + (f", never joined{at}" if seq is not None and "never_began" not in ev
                                            else f", never began{at}" if seq is not None else "") + wait
    elif f.kind == "not_joined":
        text = f"{_who(f)} never joined{at or ' a send/recv'}{wait}"
    elif f.kind == "missing_dump" and ev.get("whole_host_missing"):
        text = f"host {', '.join(f.hosts)} down: {_ranks(f.ranks)} left no dump{wait}"
    elif f.kind == "missing_dump":
        damaged = ev.get("damaged_dumps")
        text = (f"one of {_who(f)} is why (their dumps are lost){wait}" if ev.get("ambiguous")
                else f"{_who(f)} left a damaged dump{wait}" if damaged and len(damaged) == len(f.ranks)
                else f"{_who(f)} left no dump{wait}")
    elif f.kind == "mismatch" and ev.get("ambiguous"):
        text = (f"{where or 'a group'} disagrees at {op} #{seq}: {_short(str(ev.get('majority')))} vs "
                f"{_short(str(ev.get('minority')))}; can't tell which side is wrong")
    elif f.kind == "mismatch":
        what = {"type_mismatch": "called", "dtype_mismatch": "used dtype", "size_mismatch": "used shape"}.get(
            ev.get("mismatch"), "did")
        at = f"#{seq}" + (f" of {where}" if where else "")
        text = (f"{_who(f)} called {ev.get('minority')} at {at}, the others {ev.get('majority')}"
                if ev.get("mismatch") == "type_mismatch" else
                f"{_who(f)} {what} {_short(str(ev.get('minority')))} in {op} {at}, the others "
                f"{_short(str(ev.get('majority')))}")
    elif f.kind == "stuck_in_flight" and f.links:
        a, b = f.links[0]
        text = f"link {a} <-> {b}: {_stuck_count(ev)} stuck across it"
    elif f.kind == "stuck_in_flight" and f.hosts:
        text = f"host {', '.join(f.hosts)}: {_stuck_count(ev)} stuck on it and on no other host"
    elif f.kind == "deadlock":
        text = f"deadlock: {_ranks(f.ranks)} wait on each other across {len(ev.get('groups', []))} groups"
    elif f.kind == "p2p_unmatched" and ev.get("any_source"):
        text = f"{_who(f)} stuck in a receive from any source in {where}; nobody sent to it"
    elif f.kind == "p2p_unmatched" and "never_traded_with" in ev:
        text = f"{_who(f)} posted a {ev.get('posted', op)} in {where}, a peer it never traded with that way"
    elif f.kind == "p2p_unmatched" and "sent_to" in ev:
        text = f"{_who(f)} sent to rank {ev['sent_to']}, which expects nothing from it{wait}"
    elif f.kind == "p2p_unmatched":
        text = f"{_who(f)}: a send and its receive disagree on the shape in {where}"
    elif f.kind == "straggler" and seq is not None:
        text = f"{_who(f)} joined{at} {ev.get('late_ms', 0) / 1e3:,.1f} s late, past its timeout"
    elif f.kind == "switch":
        text = f"switch {ev.get('switch')}: all {len(f.hosts)} hosts under it implicated"
    else:
        text = _not_a_root_headline(f)
    return text if len(text) <= HEADLINE_MAX else text[: HEADLINE_MAX - 3].rsplit(" ", 1)[0] + "..."


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _stuck_count(ev: dict) -> str:
    """'3 collectives', '2 pipeline transfers' or '4 collectives and transfers' stuck (`stuck_groups`: a pipeline
    pair reads '<group>:<src>-><dst>')."""
    stuck = ev.get("stuck_groups", [])
    n, pairs = ev.get("stuck_group_count", len(stuck)), sum("->" in str(g) for g in stuck)
    noun = "collective" if pairs == 0 else "pipeline transfer" if pairs == len(stuck) else "collective and transfer"
    return _count(n, noun) if pairs in (0, len(stuck)) else f"{n:,} collectives and transfers"


def _not_a_root_headline(f: Finding) -> str:
    """A finding that decides a verdict naming nobody (inconclusive, or healthy with a note), in one line."""
    ev = f.evidence
    if f.kind == "waiting" and ev.get("in_unrecorded_transfers") == "suspects":
        text = (f"{_who(f)} {'is' if len(f.ranks) == 1 else 'are'} waited on past their last recorded op: one may "
                "hold the others in a send or receive Gloo doesn't record")
    elif f.kind == "stuck_in_flight":
        text = (f"{_stuck_count(ev)} in flight on every member ({_who(f)}), completed on none: a hang below them "
                "not narrowed to a host or link")
    elif f.kind == "in_flight_at_dump" and ev.get("waited") == "running":
        text = f"a running job's snapshot: {_count(len(ev.get('stuck_groups', [])), 'collective')} in flight, none late"
    elif f.kind == "in_flight_at_dump":
        text = (f"{_count(len(ev.get('stuck_groups', [])), 'collective')} in flight on every member, and nothing "
                "says whether the job hung or was running")
    elif f.kind == "unreadable":
        ranks, paths = ev.get("unreadable_ranks", []), ev.get("paths", [])
        text = (f"the dump{'s' if len(ranks) != 1 else ''} of {_ranks(ranks)} could not be read" if ranks else
                f"{_count(len(paths), 'file')} or folder{'s' if len(paths) != 1 else ''} could not be read")
        if ev.get("waiting_ranks"):
            text += f"; {_count(ev['waiting_ranks'], 'rank')} wait on {'it' if len(ranks) == 1 else 'them'}"
    elif f.kind == "missing_dump" and ev.get("hosts_gone"):
        gone = ev["hosts_gone"]
        text = (f"host{'s' if len(gone) != 1 else ''} {listed(gone, 3)} "
                f"left no dump{f' ({_ranks(f.ranks)})' if f.ranks else ''}: down, or not collected")
    elif f.kind == "missing_dump":
        text = f"{_ranks(f.ranks)} left no dump; nobody is provably waiting on {'it' if len(f.ranks) == 1 else 'them'}"
    elif f.kind == "straggler" and "late_fraction" in ev:
        text = (f"{_who(f)} straggles: {ev['median_late_ms']:,.0f} ms late (median) on "
                f"{ev['late_fraction']:.0%} of its collectives")
    elif f.kind == "straggler" and "median_late_ms" in ev:
        text = f"host {listed(f.hosts, 3)} straggles: its ranks {ev['median_late_ms']:,.0f} ms late (median)"
    elif f.kind == "clock_offset":
        text = (f"{_who(f)} reads {ev.get('median_late_ms', 0):,.0f} ms late, but nobody waits on it: its clock "
                "is off, not a straggler")
    elif f.kind == "slow_link":
        where = (f"link {' <-> '.join(f.links[0])}" if f.links else f"host {listed(f.hosts, 3)}" if f.hosts
                 else f"{_count(len(ev.get('slow_groups', [])), 'group')} (not narrowed to a host or link)")
        text = f"{where} slow" + (f": {ev['ratio']:.1f}x its peers' time" if ev.get("ratio") else "")
    elif f.kind == "no_entries":
        text = "the dumps hold no entry (written without them): nothing to match"
    else:
        text = f.message
    return text


def summary_line(verdict: str, findings: list[Finding], said: str) -> str:
    """The report's first line: the verdict and, for a fault, the first root cause naming someone, culprit first
    (and how many more); else what the diagnosis `said` (built from headlines: short too)."""
    roots = [f for f in findings if f.role == "root_cause" and (f.ranks or f.hosts or f.links)]
    if verdict == "fault" and roots:
        more = f" (+{len(roots) - 1} more)" if len(roots) > 1 else ""
        said = f"FAULT: {headline(roots[0])}{more}"
    if any(f.kind == "mixed_incidents" for f in findings):
        # (a verdict from two incidents' dumps matched as one is not to be acted on: said where it is read first)
        said += "; but the dumps look like two incidents mixed: analyze each alone"
    return said
