"""Rank -> host -> switch: from whatever the user has.

Hosts come from, in order: a hosts file (CSV `rank,host` with a header, or JSON `{"rank": "host"}`), the
dump file names or per-host folders, `ranks_per_host` (hosts named `host<k>`); else none. A topology file
(CSV `host,switch[,spine...]`, header optional) rolls hosts up to switches.
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from flightrec.errors import HostMapError
from flightrec.model.trace import format_ranks

# Said wherever hosts would be judged and none is known (a flat folder of dumps, no hosts file). Ranks on one
# host wait on each other at the same pace: without placement a host late as a whole reads on time rank by rank.
NO_HOSTS_HINT = ("hosts unknown: pass --hosts FILE or --ranks-per-host N (or keep one folder per host) to judge "
                 "hosts, links and whole-host stragglers")


@dataclass(frozen=True)
class Topology:
    """Where each rank runs. `host_of` is empty when nothing says."""

    host_of: dict[int, str] = field(default_factory=dict)
    switch_of: dict[str, str] = field(default_factory=dict)
    source: str = "none"
    # the one host folder every dump read sits in (no placement to judge by: one host), where that is so
    only_host: str | None = None

    def hosts(self, ranks) -> list[str]:
        return sorted({self.host_of[r] for r in ranks if r in self.host_of})

    def ranks_on(self, host: str) -> list[int]:
        return sorted(r for r, h in self.host_of.items() if h == host)

    def frame(self) -> pl.DataFrame:
        """(rank, host) sorted by rank. Built once (3 ms at 16K ranks, and an analysis reads it several times):
        a topology is not changed after it is made."""
        built = self.__dict__.get("_frame")
        if built is None:
            built = pl.DataFrame({"rank": list(self.host_of), "host": list(self.host_of.values())},
                                 schema={"rank": pl.Int64, "host": pl.Categorical()}).sort("rank")
            object.__setattr__(self, "_frame", built)   # (frozen: the cache is not a field)
        return built


def read_hosts_file(path: str | Path) -> dict[int, str]:
    """CSV with a `rank,host` header, or JSON {"rank": "host"}."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostMapError(f"{path}: cannot read the hosts file ({exc.strerror})") from None
    if text.lstrip().startswith("{"):
        try:
            raw = json.loads(text)
            return {int(k): str(v) for k, v in raw.items()}
        except (ValueError, AttributeError) as exc:
            raise HostMapError(f'{path}: expected JSON like {{"0": "node001"}} ({exc})') from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["rank", "host"]:
        raise HostMapError(f"{path}: expected a CSV whose first line is 'rank,host'")
    out: dict[int, str] = {}
    for n, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            out[int(row[0])] = row[1].strip()
        except (ValueError, IndexError):
            raise HostMapError(f"{path}:{n}: expected 'rank,host', got {','.join(row)!r}") from None
    return out


def read_topology_file(path: str | Path) -> dict[str, str]:
    """host -> leaf switch, from a CSV `host,switch[,...]` (a header row naming 'host' is skipped)."""
    path = Path(path)
    try:
        rows = list(csv.reader(Path(path).read_text().splitlines()))
    except OSError as exc:
        raise HostMapError(f"{path}: cannot read the topology file ({exc.strerror})") from None
    out = {}
    for n, row in enumerate(rows, start=1):
        if not row or (n == 1 and row[0].strip().lower() == "host"):
            continue
        if len(row) < 2:
            raise HostMapError(f"{path}:{n}: expected 'host,switch', got {','.join(row)!r}")
        out[row[0].strip()] = row[1].strip()
    return out


def resolve(*, world_size: int, from_dumps: dict[int, str], hosts_file: str | Path | None = None,
            ranks_per_host: int | None = None, topology_file: str | Path | None = None) -> Topology:
    switch_of = read_topology_file(topology_file) if topology_file else {}
    topology = _ranks_to_hosts(world_size, from_dumps, hosts_file, ranks_per_host, switch_of)
    hosts = set(topology.host_of.values())
    if switch_of and hosts and not hosts & switch_of.keys():
        # (silently, no host would roll up to a switch: most likely a `rank,host` file given as the topology)
        raise HostMapError(f"{topology_file}: names none of the job's hosts (e.g. {sorted(hosts)[0]!r}) in its first "
                           "column; it should be 'host,switch' (a 'rank,host' file goes to --hosts)")
    return topology


def _ranks_to_hosts(world_size: int, from_dumps: dict[int, str], hosts_file: str | Path | None,
                    ranks_per_host: int | None, switch_of: dict[str, str]) -> Topology:
    if hosts_file is not None:
        host_of = read_hosts_file(hosts_file)
        uncovered = [r for r in range(world_size) if r not in host_of]
        if uncovered:
            # (a culprit among them would be named with no host, and a runbook's drain step would do nothing)
            warnings.warn(f"{hosts_file}: names no host for {len(uncovered):,} of the job's {world_size:,} ranks "
                          f"({format_ranks(uncovered)}): findings about them will name no host", stacklevel=2)
        return Topology(host_of, switch_of, "hosts file")
    filled = _fill_missing_hosts(dict(from_dumps), world_size)
    # (one host holding every rank tells no placement: the lone folder a whole job's dumps sit in, which
    # `discover` takes for the one host left of a per-host layout, may as well be a run's)
    only_host = None
    if len(set(filled.values())) == 1 and set(filled) >= set(range(world_size)):
        only_host, filled = next(iter(filled.values())), {}
    if filled:
        if ranks_per_host:
            warnings.warn(f"--ranks-per-host {ranks_per_host} ignored: the dumps' folders or names say each rank's "
                          "host (pass --hosts FILE to override them)", stacklevel=2)
        return Topology(filled, switch_of, "dump names")
    if ranks_per_host:
        if ranks_per_host < 1:
            raise HostMapError("--ranks-per-host must be a positive number of ranks per host")
        width = len(str(max(0, (world_size - 1) // ranks_per_host)))
        return Topology({r: f"host{r // ranks_per_host:0{width}d}" for r in range(world_size)}, switch_of,
                        "ranks per host")
    return Topology({}, switch_of, "one host folder" if only_host else "none", only_host)


_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<num>\d+)$")


def _block_size(host_of: dict[int, str]) -> int | None:
    """The k for which every known host holds exactly the ranks of blocks [k*i, k*i+k): the usual layout.
    Tried: the most ranks a host shows, then the widest span of them (a host's missing dumps leave holes: 7 of
    8 ranks known read as blocks of 7 and matched nothing, and a whole host down was then named by rank)."""
    by_host: dict[str, list[int]] = {}
    for r, h in host_of.items():
        by_host.setdefault(h, []).append(r)
    widest = max(max(v) - min(v) + 1 for v in by_host.values())
    for k in dict.fromkeys((max(len(v) for v in by_host.values()), widest)):
        if all(len({r // k for r in ranks}) == 1 for ranks in by_host.values()):
            blocks: dict[int, str] = {}
            if all(blocks.setdefault(r // k, h) == h for r, h in host_of.items()):
                return k
    return None


def _fill_missing_hosts(host_of: dict[int, str], world_size: int) -> dict[int, str]:
    """A rank that left no dump has no file name or folder to take its host from. When the known hosts hold
    contiguous blocks of k ranks, the missing rank's block says its host; when a whole block is missing and
    every known host is named `<stem><block number>`, the name follows too. Otherwise it stays unknown."""
    if not host_of:
        return host_of
    k = _block_size(host_of)
    if k is None:
        return host_of
    block_host = {r // k: h for r, h in host_of.items()}
    numbered = [(_NUMBERED.match(h), b) for b, h in block_host.items()]
    pattern = None
    if all(m and int(m["num"]) == b for m, b in numbered):
        stems = {(m["stem"], len(m["num"])) for m, _ in numbered}
        if len(stems) == 1:
            pattern = stems.pop()
    out = dict(host_of)
    for r in range(world_size):
        if r in out:
            continue
        b = r // k
        if b in block_host:
            out[r] = block_host[b]
        elif pattern is not None:
            out[r] = f"{pattern[0]}{b:0{pattern[1]}d}"
    return out
