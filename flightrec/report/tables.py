"""Tables for people reading one job: entries, side-by-side ranks, stacks, groups; and Parquet export.

Each table is a frame (`*_frame`) rendered as text or JSON; the CLI only prints it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from flightrec.analysis.entry_facts import is_p2p_closer
from flightrec.analysis.matching import Matching
from flightrec.model.trace import Trace, format_ranks

__all__ = ["as_json", "check_ranks", "entries_frame", "entries_table", "export_parquet", "groups_frame", "groups_table", "side_by_side", "side_by_side_frames", "stack_groups", "stack_groups_frame", "text_table"]


def text_table(df: pl.DataFrame, max_width: int = 48) -> str:
    """Plain aligned columns: pipes well, no box drawing."""
    if df.height == 0:
        return "(no rows)"
    cells = [[str(c) for c in df.columns]]
    for row in df.iter_rows():
        cells.append(["" if v is None else str(v)[:max_width] for v in row])
    widths = [max(len(r[i]) for r in cells) for i in range(len(df.columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def as_json(value: Any) -> str:
    """A frame (as a list of rows), or a structure holding frames, as indented JSON."""
    def plain(v: Any) -> Any:
        if isinstance(v, pl.DataFrame):
            return [plain(row) for row in v.to_dicts()]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return json.dumps(plain(value), indent=2, default=str) + "\n"


def check_ranks(trace: Trace, ranks: list[int] | None) -> None:
    """A rank outside the job is a typo, not an empty table."""
    outside = sorted(r for r in ranks or [] if not 0 <= r < trace.world_size)
    if outside:
        from flightrec.errors import FlightrecError

        raise FlightrecError(f"rank {format_ranks(outside)} is not in this job (ranks 0-{trace.world_size - 1})")


def entries_frame(trace: Trace, ranks: list[int] | None = None, pg: str | None = None, last: int = 20) -> pl.DataFrame:
    check_ranks(trace, ranks)
    e = trace.entries
    if ranks:
        e = e.filter(pl.col("rank").is_in(ranks))
    if pg is not None:
        e = e.join(trace.select_groups(pg).select("group"), on="group", how="semi")
    e = e.sort("rank", "record_id").group_by("rank", maintain_order=True).tail(last)
    # (seconds since the job's first recorded entry, beside the raw stamp: readable, and comparable across ranks
    # as far as their clocks agree; `retired`: the only sign of completion Gloo's recorder gives)
    start = trace.entries["time_created_ns"].min()
    return e.select(
        "rank", "record_id", "group", "pg_desc", "collective_seq_id", "p2p_seq_id", "op", "profiling_name",
        "state", "retired", "input_sizes", "input_dtypes",
        ((pl.col("time_created_ns") - start) / 1e9).round(3).alias("created_s"), "time_created_ns",
    )


def entries_table(trace: Trace, ranks: list[int] | None = None, pg: str | None = None, last: int = 20) -> str:
    return text_table(entries_frame(trace, ranks, pg, last))


def side_by_side(trace: Trace, ranks: list[int], pg: str | None, seq: int, width: int = 5,
                 max_groups: int = 8) -> str:
    """`side_by_side_frames` as text: at most `max_groups` groups, the rest counted."""
    frames = side_by_side_frames(trace, ranks, pg, seq, width)
    parts = []
    for label, wide in frames[:max_groups]:
        desc = f" (desc '{label['pg_desc']}')" if label["pg_desc"] else ""
        parts += [f"group {label['group']}{desc}, ranks {format_ranks(label['ranks'] or [])}:",
                  text_table(wide.fill_null("-")), ""]
    if len(frames) > max_groups:
        parts.append(f"... and {len(frames) - max_groups:,} more groups: narrow with --rank or a group's name as --pg")
    return "\n".join(parts).rstrip()


def side_by_side_frames(trace: Trace, ranks: list[int], pg: str | None, seq: int,
                        width: int = 5) -> list[tuple[dict, pl.DataFrame]]:
    """Per group `pg` selects ({group, pg_desc, ranks}, frame): one row per sequence id in seq-width..seq+width
    and one column per member (or per rank of `ranks`): what each recorded there. Collectives are lined up by
    collective_seq_id; a pipeline's sends and receives (and the entry that closes a batch of them) by
    p2p_seq_id, their own counter, in rows marked p2p."""
    from flightrec.errors import FlightrecError

    if pg is None:
        raise FlightrecError("--around needs --pg: sequence ids are per process group")
    check_ranks(trace, ranks)
    groups = trace.select_groups(pg)
    # (the batch's closer by matching's own rule, read in the entries' (rank, record) order, before any filter)
    p2p = pl.col("is_p2p") | is_p2p_closer()
    entries = (trace.entries.with_columns(pl.when(p2p).then(pl.lit("p2p")).otherwise(pl.lit("")).alias("kind"),
                                          pl.when(p2p).then("p2p_seq_id").otherwise("collective_seq_id").alias("seq"))
               .join(groups.select("group"), on="group", how="semi"))
    if ranks:
        entries = entries.filter(pl.col("rank").is_in(ranks))
    near = entries.filter(pl.col("seq").is_between(seq - width, seq + width))
    if near.height == 0:
        held = (f"its entries run #{entries['seq'].min()}-#{entries['seq'].max()}" if entries.height
                else "it holds no entry")
        raise FlightrecError(f"nothing recorded in {pg} within {width} of #{seq}"
                             f"{' for these ranks' if ranks else ''}: {held}")
    # (a batch of sends and receives repeats one op and state: said once, with a count)
    cells = (near.with_columns(pl.format("{} {}", "op", "state").alias("cell"))
             .group_by("group", "kind", "seq", "rank", maintain_order=True)
             .agg(pl.col("cell").unique(maintain_order=True), pl.len().alias("_n"))
             .with_columns(pl.when((pl.col("cell").list.len() == 1) & (pl.col("_n") > 1))
                           .then(pl.format("{} x{}", pl.col("cell").list.first(), "_n"))
                           .otherwise(pl.col("cell").list.join("+")).alias("cell")))
    out = []
    for group in cells["group"].unique(maintain_order=True).sort().to_list():
        mine = cells.filter(pl.col("group") == group)
        label = groups.filter(pl.col("group") == group).row(0, named=True)
        wide = (mine.sort("rank").pivot(on="rank", index=["kind", "seq"], values="cell")
                .sort("kind", "seq").rename({"seq": "seq_id"}))
        wide = wide.rename({c: f"rank {c}" for c in wide.columns if c not in ("kind", "seq_id")})
        if (wide["kind"] == "").all():
            wide = wide.drop("kind")   # (collectives only)
        out.append(({"group": str(group), "pg_desc": label["pg_desc"], "ranks": label["ranks"]}, wide))
    return out


def stack_groups_frame(trace: Trace) -> pl.DataFrame:
    """Ranks grouped by the stack of their last unfinished entry (their last entry when nothing reports
    completion, as with Gloo)."""
    from flightrec.analysis.entry_facts import completion_by_rank

    e = trace.entries.sort("rank", "record_id").join(
        completion_by_rank(trace.entries, trace.dumps).rename({"tracks_completion": "_tracks"}), on="rank", how="left")
    # batch send/recv members stay 'scheduled' forever: their closing entry carries the batch's state
    unfinished = (e.filter(pl.col("_tracks") & (pl.col("state") != "completed") & ~pl.col("is_p2p"))
                  .group_by("rank").agg(pl.all().first()))
    last = e.group_by("rank").agg(pl.all().last())
    pick = last.join(unfinished.select("rank", pl.col("record_id").alias("_rid")), on="rank", how="left")
    pick = e.join(pick.select("rank", pl.coalesce("_rid", "record_id").alias("record_id")), on=["rank", "record_id"])
    frames = trace.stacks.with_columns(
        pl.col("frames").list.eval(pl.element().struct.field("name")).list.reverse().list.join(" -> ").alias("stack"))
    out = (pick.join(frames.select("stack_id", "stack"), on="stack_id", how="left")
           .with_columns(pl.coalesce(pl.col("stack"), pl.lit("(no stack)")).alias("stack"))
           .group_by("stack", "op", "state").agg(pl.col("rank").sort().alias("ranks"))
           .with_columns(pl.col("ranks").list.len().alias("n")).sort("n", "stack", descending=[True, False]))
    missing = trace.missing_ranks
    if missing:
        out = pl.concat([out, pl.DataFrame({"stack": ["(no dump)"], "op": [None], "state": [None],
                                            "ranks": [missing], "n": [len(missing)]}, schema=out.schema)])
    return out


def stack_groups(trace: Trace) -> str:
    lines = []
    for stack, op, state, ranks, n in stack_groups_frame(trace).iter_rows():
        what = f"{op} ({state})" if op else "no entry"
        lines.append(f"{n:,} rank{'s' if n != 1 else ''}: {stack} -> {what}\n    ranks {format_ranks(ranks)}")
    return "\n".join(lines)


def groups_frame(trace: Trace, m: Matching, ranks_as_text: bool = True) -> pl.DataFrame:
    prog = m.progress.group_by("group").agg(
        # (the furthest collective any member enqueued, and where the slowest member is)
        pl.col("frontier").first().alias("furthest_seq"),
        pl.col("last_enqueued").min().alias("slowest_member_seq"),
        (pl.col("behind") > 0).sum().alias("n_behind"),
        (~pl.col("has_dump")).sum().alias("n_missing"),
    )
    status = m.collectives.sort("collective_seq_id").group_by("group").agg(pl.col("status").last().alias("last_status"))
    out = trace.groups.join(prog, on="group", how="left").join(status, on="group", how="left")
    if ranks_as_text:
        out = out.with_columns(pl.col("ranks").map_batches(
            lambda s: pl.Series([format_ranks(r, limit=3) for r in s.to_list()]), return_dtype=pl.String))
    return (out
            .select("group", "pg_desc", "size", "ranks", "furthest_seq", "slowest_member_seq", "n_behind", "n_missing",
                    "last_status", "source")
            .sort(pl.col("group").cast(pl.String).str.len_chars(), "group"))


def groups_table(trace: Trace, m: Matching) -> str:
    return text_table(groups_frame(trace, m), max_width=40)


def export_parquet(trace: Trace, m: Matching, out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    frames = {
        "dumps": trace.dumps, "entries": trace.entries, "stacks": trace.stacks, "groups": trace.groups,
        "members": trace.members, "pg_status": trace.pg_status, "collectives": m.collectives,
        "progress": m.progress, "divergences": m.divergences, "p2p_pairs": m.p2p,
    }
    written = []
    for name, df in frames.items():
        path = out / f"{name}.parquet"
        df.write_parquet(path)
        written.append(path)
    return written
