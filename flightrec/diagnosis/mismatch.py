"""Members that called different collectives, or the same one with another dtype or shape, at one point."""

from __future__ import annotations

import polars as pl

from flightrec.diagnosis.context import Context
from flightrec.model.schema import MISMATCH_STATUSES
from flightrec.report.model import Finding

_FIELD_WORDS = {"type_mismatch": "called", "dtype_mismatch": "used dtype", "size_mismatch": "used shape"}


def mismatch_findings(ctx: Context) -> list[Finding]:
    out = []
    div = ctx.m.divergences.filter(pl.col("status").is_in(MISMATCH_STATUSES))
    for row in div.iter_rows(named=True):
        g = ctx.groups[row["group"]]
        seq, op, status = row["collective_seq_id"], str(row["op"]), row["status"]
        word = _FIELD_WORDS[status]
        present = ctx.m.units.filter((pl.col("group") == row["group"]) & (pl.col("collective_seq_id") == seq))
        ranks = row["ranks"]
        if row["ambiguous"] and op == "all_to_all" and status == "size_mismatch":
            ranks = sorted(present["rank"].to_list())
            msg = (f"members of {g.label()} disagree at {op} #{seq}: {row['majority']}, {row['minority']} "
                   f"({ctx.ranks_label(ranks)}); the dumps hold no split sizes to say which member is wrong")
        elif row["ambiguous"]:
            ranks = sorted(present["rank"].to_list())
            msg = (f"members of {g.label()} disagree at {op} #{seq}: {row['majority']} vs {row['minority']} "
                   f"({ctx.ranks_label(ranks)}); with {len(ranks)} members it can't be said which side is wrong")
        elif len(present) == len(ranks) and row["peer_groups"]:
            # (its other members left no dump or a cut one: what they did is unknown, the peer groups settle it)
            n, kind = row["peer_groups"], f"'{g.desc}'" if g.desc else "same-kind"
            msg = (f"{ctx.ranks_label(ranks)} {word} {row['minority']} in {op} #{seq} of {g.label()}, where every "
                   f"member of the {n:,} other {kind} group{'s' if n != 1 else ''} {word} {row['majority']} (its "
                   "other members' dumps are lost or cut short)")
        else:
            others = len(present) - len(ranks)
            msg = (f"{ctx.ranks_label(ranks)} {word} {row['minority']} in {op} #{seq} of {g.label()}, where the "
                   f"other {others:,} member{'s' if others != 1 else ''} {word} {row['majority']}")
            if row["peer_groups"]:
                n = row["peer_groups"]
                kind = f"'{g.desc}'" if g.desc else "same-kind"
                msg += (f", as did every member of the {n:,} other {kind} group{'s' if n != 1 else ''} at #{seq} "
                        "(one member against one can't say who is wrong: its peer groups can)")
        members = present["rank"].to_list()
        waiting = (set(members) | set(ctx.w.waiters_of(members))) - set(ranks)
        out.append(Finding(
            kind="mismatch", role="root_cause", message=msg, ranks=ranks, hosts=ctx.topo.hosts(ranks),
            process_group=g, collective_seq_id=seq, op=op,
            evidence={"mismatch": status, "majority": row["majority"], "minority": row["minority"],
                      "ambiguous": row["ambiguous"], "later_mismatches_in_group": row["later_mismatches"],
                      **({"peer_groups": row["peer_groups"]} if row["peer_groups"] else {}),
                      "waiting_ranks": len(waiting)},
            stacks=[s for r in ranks[:2] for s in ctx.stack_of(r, ctx.describe_last(r))],
        ))
    return out
