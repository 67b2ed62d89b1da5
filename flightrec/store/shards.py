"""Shards: one host's (or one job step's) dumps already parsed into Parquet tables.

Past one machine, parsing is the cost and it is per file: each host runs `flightrec convert` on its own dumps
next to the job (`flightrec convert /tmp/fr OUT/$(hostname) --shard-only --host $(hostname)`), and the
analysis then reads only Parquet: `flightrec analyze OUT/` finds every shard below OUT and concatenates
their tables. See docs/scale.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl

from flightrec.errors import FlightrecError
from flightrec.store import cache


def find_shards(root: str | os.PathLike) -> list[Path]:
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.parent for p in root.rglob(cache.MANIFEST) if ".flightrec-cache" not in p.parts)


def write_shard(raw: dict[str, pl.DataFrame], out: str | os.PathLike, *, source: str, host: str | None) -> Path:
    """Write `raw` as a shard into `out`, replacing it whole: `out` must be new, empty, or a shard."""
    out = Path(out)
    check_replaceable(out)
    if host is not None:
        raw = dict(raw, dumps=raw["dumps"].with_columns(pl.col("host").fill_null(host)))
    cache.write_tables(raw, out, {"kind": "shard", "source": source, "host": host,
                                  "ranks": raw["dumps"]["rank"].to_list()})
    return out


def check_replaceable(out: Path) -> None:
    """Writing a shard replaces its folder whole: refuse a folder holding anything flightrec didn't write there
    (the dumps themselves, given as OUT by mistake)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise FlightrecError(f"{out} is a file: give a new or empty folder to convert into")
    if cache.manifest_kind(out) == "shard":
        return   # (converting again: the old shard is replaced)
    if any(out.iterdir()):
        raise FlightrecError(f"{out} is not empty and holds no flightrec shard: converting would replace what is "
                             "there. Give a new or empty folder")


def read_shards(shards: list[Path]) -> dict[str, pl.DataFrame]:
    parts = []
    for folder in shards:
        if cache.read_manifest(folder) is None:
            raise FlightrecError(f"{folder}: written by another flightrec version; convert the dumps again")
        parts.append(cache.read_tables(folder))
    raw = {name: pl.concat([p[name] for p in parts], how="vertical_relaxed") for name in cache.TABLES}
    dumps = raw["dumps"].sort("rank")
    dup = dumps.filter(pl.col("rank").is_duplicated())
    if dup.height:
        raise FlightrecError(f"ranks {sorted(set(dup['rank'].to_list()))[:10]} appear in more than one shard; "
                             "convert each host's dumps once")
    raw["dumps"] = dumps
    raw["stacks"] = raw["stacks"].unique("stack_id")
    raw["rank_lists"] = raw["rank_lists"].unique("ranks_key")
    return raw
