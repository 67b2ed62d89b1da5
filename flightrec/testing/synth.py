"""Synthetic NCCL-format flight-recorder dumps for a 3D-parallel job, with injected faults and ground truth.

The job: `tp x pp x dp` ranks (tensor parallel innermost, so a TP group sits on one host), a GPipe schedule of
`microbatches` per step (TP all_gather/reduce_scatter per layer, batched send/recv between pipeline stages
closed by `nccl:coalesced` as `batch_isend_irecv` writes them), a DP gradient all_reduce and a world loss
all_reduce per step. A small discrete-event simulation runs every rank: a collective completes when every
member has arrived, a send when its receiver has. A fault stops a rank, breaks a group or link, or skews
times; the simulation then shows exactly what the recorder would: who is blocked in what, in which state.

Used by the tests (any layout, any fault, known answer) and by the benchmarks (16K+ ranks).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import sys
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from flightrec.testing.synth_stacks import STACKS as _STACKS

# Bump when the bytes generated for a job change: the benchmarks cache generated jobs under this version.
DUMP_LAYOUT = 6

FAULT_KINDS = (
    "none", "not_joined", "missing_dump", "host_down", "size_mismatch", "type_mismatch", "dtype_mismatch",
    "deadlock", "dead_link", "nic_down", "wrong_peer", "straggler", "straggler_host", "slow_link", "clock_offset",
    "late_arrival",
)


@dataclass(frozen=True, kw_only=True)
class Fault:
    """What to break. `rank` and `step` place it; `phase` picks the op: 'tp' (a tensor-parallel collective
    in the forward pass), 'p2p' (a pipeline send), 'dp' (the gradient all_reduce)."""

    kind: str = "none"
    rank: int = 0
    step: int = -1                 # -1: the last step
    phase: str = "tp"
    hosts: tuple[str, ...] = ()    # dead_link / slow_link: two hosts; straggler_host / host_down / nic_down: one
    delay_ms: float = 150.0        # straggler lateness per collective; slow_link extra duration; late_arrival: how
                                   # late the rank joins the faulty collective (past the 600 s timeout to matter)
    offset_ms: float = 0.0         # clock_offset: how far the host's clock is off


@dataclass(frozen=True, kw_only=True)
class Job:
    tp: int = 2
    pp: int = 2
    dp: int = 2
    steps: int = 3
    microbatches: int = 2
    layers: int = 1
    buffer_size: int = 2000
    ranks_per_host: int = 8
    version: str = "2.10"
    timing: bool = True            # TORCH_NCCL_ENABLE_TIMING: 'started' states and duration_ms
    backend: str = "nccl"          # "gloo": what ProcessGroupGloo's recorder writes (`_as_gloo`)
    with_stacks: bool = True
    # TORCH_INCLUDE_ONLY_ACTIVE: the writer leaves out the entries it saw complete (NCCL's; Gloo's sees none)
    only_active: bool = False
    fault: Fault = field(default_factory=Fault)
    seed: int = 0
    relabel: tuple[int, ...] = ()  # rank labels: logical rank i is called relabel[i] (tests of equivariance)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """rank -> (dp index, pp stage, tp index)."""
        logical = self.relabel.index(rank) if self.relabel else rank
        return logical // (self.pp * self.tp), (logical // self.tp) % self.pp, logical % self.tp

    def rank_of(self, dp_i: int, pp_i: int, tp_i: int) -> int:
        logical = dp_i * self.pp * self.tp + pp_i * self.tp + tp_i
        return self.relabel[logical] if self.relabel else logical

    def host_of(self, rank: int) -> str:
        return f"node{rank // self.ranks_per_host:05d}"


@dataclass
class _Group:
    name: str
    desc: str
    ranks: list[int]


def _groups(job: Job) -> tuple[list[_Group], dict[int, dict[str, _Group]]]:
    """Created in the same order on every rank (as new_group requires), so names agree across ranks."""
    groups = [_Group("0", "default_pg", list(range(job.world_size)))]
    for d in range(job.dp):
        for p in range(job.pp):
            groups.append(_Group("", "tp", sorted(job.rank_of(d, p, t) for t in range(job.tp))))
    for d in range(job.dp):
        for t in range(job.tp):
            groups.append(_Group("", "pp", sorted(job.rank_of(d, p, t) for p in range(job.pp))))
    for p in range(job.pp):
        for t in range(job.tp):
            groups.append(_Group("", "dp", sorted(job.rank_of(d, p, t) for d in range(job.dp))))
    for i, g in enumerate(groups):
        g.name = str(i)
    by_rank: dict[int, dict[str, _Group]] = defaultdict(dict)
    for g in groups:
        for r in g.ranks:
            by_rank[r][g.desc] = g
    return groups, by_rank


# One op a rank executes. `keys` are the instances it takes part in (a collective, or each send/recv of a
# batch); it completes when every instance has all its participants.
@dataclass
class _Op:
    step: int
    group: _Group
    name: str                      # profiling-name op, e.g. 'all_gather', 'send 0->1', 'coalesced'
    keys: list[tuple]
    in_sizes: list
    out_sizes: list
    dtype: str
    stack: str
    is_p2p: bool = False
    parts: list["_Op"] = field(default_factory=list)   # a batch's send/recv entries, before its closer


_H = 1024


def _schedule(job: Job, rank: int, by_rank: dict[int, dict[str, _Group]], steps: range | None = None) -> list[_Op]:
    """The ops one rank runs in `steps` (default: every step). Instance keys count from the first step given."""
    dp_i, pp_i, tp_i = job.coords(rank)
    g = by_rank[rank]
    tp, pp = g["tp"], g["pp"]
    counters: dict[tuple, int] = defaultdict(int)
    ops: list[_Op] = []

    def coll(step: int, group: _Group, name: str, n: int, stack: str, dtype: str = "BFloat16") -> None:
        counters[("c", group.name)] += 1
        size = len(group.ranks)
        if name == "all_gather":
            ins, outs = [[n]], [[n * size]]
        elif name == "reduce_scatter":
            ins, outs = [[n * size]], [[n]]
        else:
            ins, outs = [[n]], [[n]]
        ops.append(_Op(step, group, name, [("c", group.name, counters[("c", group.name)])], ins, outs, dtype, stack))

    def p2p(step: int, kind: str, peer_stage: int, stack: str) -> None:
        me, peer = pp.ranks.index(rank), pp.ranks.index(job.rank_of(dp_i, peer_stage, tp_i))
        src, dst = (me, peer) if kind == "send" else (peer, me)
        counters[("p", src, dst)] += 1
        key = ("p", pp.name, src, dst, counters[("p", src, dst)])
        arrow = f"{me}->{peer}" if kind == "send" else f"{me}<-{peer}"
        part = _Op(step, pp, f"{kind} {arrow}", [key], [[4, _H]], [[4, _H]], "BFloat16", stack, is_p2p=True)
        ops.append(_Op(step, pp, "coalesced", [key], [], [], "BFloat16", stack, is_p2p=True, parts=[part]))

    for step in steps if steps is not None else range(job.steps):
        for m in range(job.microbatches):
            if pp_i > 0:
                p2p(step, "recv", pp_i - 1, "recv_forward")
            for _ in range(job.layers):
                if job.tp > 1:
                    coll(step, tp, "all_gather", 4 * _H, "attention_forward")
                    coll(step, tp, "reduce_scatter", 4 * _H, "mlp_forward")
            if pp_i < job.pp - 1:
                p2p(step, "send", pp_i + 1, "send_forward")
        for m in range(job.microbatches):
            if pp_i < job.pp - 1:
                p2p(step, "recv", pp_i + 1, "recv_backward")
            for _ in range(job.layers):
                if job.tp > 1:
                    coll(step, tp, "all_gather", 4 * _H, "mlp_backward")
                    coll(step, tp, "reduce_scatter", 4 * _H, "attention_backward")
            if pp_i > 0:
                p2p(step, "send", pp_i - 1, "send_backward")
        if job.dp > 1:
            coll(step, g["dp"], "all_reduce", 16 * _H, "grad_all_reduce", "Float")
        coll(step, g["default_pg"], "all_reduce", 1, "loss_all_reduce", "Float")
    return ops


def _fault_index(job: Job, ops: list[_Op]) -> int:
    """Index in the faulty rank's schedule of the op the fault hits."""
    step = job.fault.step if job.fault.step >= 0 else job.steps - 1
    want = {"tp": ("tp",), "p2p": ("pp",), "dp": ("dp", "default_pg")}[job.fault.phase]
    for i, op in enumerate(ops):
        if (op.step == step and op.group.desc in want
                and (job.fault.phase != "p2p" or op.parts[0].name.startswith("send"))):
            return i
    raise ValueError(f"fault phase {job.fault.phase!r} has no op at step {step} on rank {job.fault.rank}")


class _Sim:
    """Discrete-event run of every rank's schedule under the fault."""

    def __init__(self, job: Job):
        self.job = job
        self.groups, self.by_rank = _groups(job)
        # Steps before the fault are all alike and complete everywhere: at scale they are replicated from a
        # one-step template (see _entries) and only the fault step onward is simulated event by event.
        fault_step = job.fault.step if job.fault.step >= 0 else job.steps - 1
        small = job.world_size * job.steps <= _SIMULATE_ALL_BELOW
        self.sim_from = 0 if small or job.fault.kind in _TIMING_FAULTS else fault_step
        self.templates = {r: _schedule(job, r, self.by_rank, range(1)) for r in range(job.world_size)}
        self.ops = {r: _schedule(job, r, self.by_rank, range(self.sim_from, job.steps)) for r in range(job.world_size)}
        # A collective ends at one instant on all its members: when the last one arrived. In a replicated step
        # that is the latest member's place in its own template (stages differ in how many ops come first).
        self.template_last: dict[tuple, int] = {}
        for template in self.templates.values():
            for i, op in enumerate(template):
                for k in op.keys:
                    self.template_last[k] = max(self.template_last.get(k, i), i)
        self.rng = random.Random(job.seed)
        self.stop_at: dict[int, int] = {}          # rank -> index it never reaches
        self.never_complete: set[tuple] = set()     # instance keys that hang with everyone in
        self.missing: set[int] = set()
        self.late_at: tuple[int, int] | None = None  # (rank, op index) that joins `delay_ms` late
        self.truth: dict = {"kind": job.fault.kind, "ranks": [], "hosts": [], "links": []}
        self._inject()

    def template_of(self, rank: int) -> list[_Op]:
        """One healthy step of `rank`'s schedule."""
        return self.templates[rank]

    def _host_ranks(self, host: str) -> list[int]:
        return [r for r in range(self.job.world_size) if self.job.host_of(r) == host]

    def _inject(self) -> None:
        job, f = self.job, self.job.fault
        if f.kind in ("none", "straggler", "straggler_host", "slow_link", "clock_offset"):
            if f.kind == "straggler":
                self.truth["ranks"] = [f.rank]
            if f.kind == "straggler_host":
                self.truth["hosts"] = [f.hosts[0]]
            if f.kind == "slow_link":
                self.truth["links"] = [sorted(f.hosts)]
            return
        ops = self.ops[f.rank]
        i = _fault_index(job, ops)
        op = ops[i]
        self.truth.update(ranks=[f.rank], op=op.name.split(" ")[0], pg_desc=op.group.desc, pg_name=op.group.name,
                          step=op.step)
        if op.keys[0][0] == "c":
            per_step = sum(1 for o in self.template_of(f.rank) if o.group.desc == op.group.desc and not o.is_p2p)
            self.truth["collective_seq_id"] = op.keys[0][2] + per_step * self.sim_from
        if f.kind == "late_arrival":
            # The rank stalls (checkpoint write, dataloader) past its peers' timeout, then joins: the peers'
            # watchdog has aborted the collective, so it never completes, though every member enqueued it.
            self.late_at = (f.rank, i)
            self.never_complete.add(op.keys[0])
            self.truth["kind"] = "straggler"
        elif f.kind in ("not_joined", "missing_dump"):
            self.stop_at[f.rank] = i
            if f.kind == "missing_dump":
                self.missing.add(f.rank)
        elif f.kind == "host_down":
            host = f.hosts[0] if f.hosts else job.host_of(f.rank)
            for r in self._host_ranks(host):
                self.stop_at[r] = _fault_index(job, self.ops[r])
                self.missing.add(r)
            self.truth.update(ranks=self._host_ranks(host), hosts=[host])
        elif f.kind in ("size_mismatch", "type_mismatch", "dtype_mismatch"):
            if f.kind == "size_mismatch":
                op.in_sizes = [[s[0] * 2] for s in op.in_sizes]
                op.out_sizes = [[s[0] * 2] for s in op.out_sizes]
            elif f.kind == "dtype_mismatch":
                op.dtype = "Float" if op.dtype != "Float" else "BFloat16"   # (dp all_reduces are Float already)
            else:
                op.name = "all_reduce" if op.name != "all_reduce" else "broadcast"
                op.out_sizes = op.in_sizes
            self.never_complete.add(op.keys[0])
            self.truth["kind"] = "mismatch"
        elif f.kind == "deadlock":
            # The step ends with dp all_reduce then world all_reduce; this rank does them the other way round.
            step = op.step
            j = next(k for k, o in enumerate(ops) if o.step == step and o.group.desc == "dp")
            ops[j], ops[j + 1] = ops[j + 1], ops[j]
            self.truth.update(op="all_reduce", pg_desc="dp")
            del self.truth["collective_seq_id"]
        elif f.kind == "dead_link":
            a, b = f.hosts
            ra, rb = set(self._host_ranks(a)), set(self._host_ranks(b))
            for r in ra:
                for o in self.ops[r]:
                    if o.step >= op.step and any(m in rb for m in self._partners(o)):
                        self.never_complete.update(o.keys)
            self.truth.update(ranks=[], hosts=[], links=[sorted((a, b))])
            for k in ("op", "pg_desc", "pg_name", "collective_seq_id"):
                self.truth.pop(k, None)
        elif f.kind == "nic_down":
            # the host's network dies: from the fault's step every op its ranks share with another host hangs,
            # while the work inside the host goes on
            (x,) = f.hosts
            for r in self._host_ranks(x):
                for o in self.ops[r]:
                    if o.step >= op.step and any(job.host_of(m) != x for m in self._partners(o)):
                        self.never_complete.update(o.keys)
            self.truth.update(ranks=[], hosts=[x], links=[])
            for k in ("op", "pg_desc", "pg_name", "collective_seq_id"):
                self.truth.pop(k, None)
        elif f.kind == "wrong_peer":
            part = op.parts[0]
            me = op.group.ranks.index(f.rank)
            intended = int(part.name.split("->")[1])
            others = [i for i in range(len(op.group.ranks)) if i not in (me, intended)]
            if not others:
                raise ValueError("wrong_peer needs a pipeline of 3+ stages")
            wrong = others[0]
            part.name = f"send {me}->{wrong}"
            key = ("p", op.group.name, me, wrong, -1)
            part.keys = op.keys = [key]
            self.truth.update(op="send", peer=op.group.ranks[wrong])
        else:
            raise ValueError(f"unknown fault kind {f.kind!r}; one of {FAULT_KINDS}")

    def run(self) -> dict[int, list[dict]]:
        """Simulate; return per rank the list of (op, state, times) records it would have recorded."""
        job = self.job
        expected: dict[tuple, int] = {}
        for r, ops in self.ops.items():
            for op in ops[: self.stop_at.get(r, len(ops))]:
                for k in op.keys:
                    expected[k] = len(op.group.ranks) if k[0] == "c" else 2
        arrived: dict[tuple, int] = defaultdict(int)            # key -> how many participants are in
        latest: dict[tuple, int] = defaultdict(int)             # key -> when the last one arrived
        pos = {r: 0 for r in self.ops}
        start = _T0 + self.sim_from * _step_ns(job)
        clock = {r: start + self.rng.randrange(10**6) for r in self.ops}
        records: dict[int, list] = {r: [] for r in self.ops}
        waiting: dict[tuple, list[int]] = defaultdict(list)
        ready = deque(sorted(self.ops))
        gap_ns = 2_000_000

        def late(rank: int, i: int) -> int:
            f = job.fault
            if ((f.kind == "straggler" and rank == f.rank)
                    or (f.kind == "straggler_host" and job.host_of(rank) == f.hosts[0])):
                return int(f.delay_ms * 1e6)
            if self.late_at == (rank, i):
                return int(f.delay_ms * 1e6)
            return 0

        while ready:
            r = ready.popleft()
            ops = self.ops[r]
            i = pos[r]
            if i >= len(ops) or i >= self.stop_at.get(r, len(ops)):
                continue
            op = ops[i]
            if not records[r] or records[r][-1]["op"] is not op:
                clock[r] += gap_ns + late(r, i) + self.rng.randrange(200_000)
                records[r].append({"op": op, "created": clock[r], "done": None})
                for k in op.keys:
                    arrived[k] += 1
                    latest[k] = max(latest[k], clock[r])
                    waiting[k].append(r)
                    if arrived[k] == expected.get(k, -1):
                        ready.extend(w for w in waiting[k] if w != r)
            if all(arrived[k] == expected.get(k, -1) and k not in self.never_complete for k in op.keys):
                start = max(latest[k] for k in op.keys)
                dur = 1_000_000 * (2 + len(op.group.ranks).bit_length())
                f = job.fault
                if f.kind == "slow_link" and self._spans(op, f.hosts):
                    dur += int(f.delay_ms * 1e6)
                records[r][-1].update(started=start, done=start + dur)
                clock[r] = max(clock[r], start + dur)
                pos[r] += 1
                ready.append(r)
        return records

    @staticmethod
    def _partners(op: _Op) -> list[int]:
        """The ranks an op needs: the whole group for a collective, the two ends for a send/recv."""
        if op.keys[0][0] == "c":
            return op.group.ranks
        return [op.group.ranks[k[i]] for k in op.keys for i in (2, 3)]

    def _spans(self, op: _Op, hosts: tuple[str, ...]) -> bool:
        on = {self.job.host_of(m) for m in self._partners(op)}
        return all(h in on for h in hosts)


_T0 = 1_700_000_000_000_000_000
# PyTorch's watchdog polls every kWatchdogThreadSleepMillis (100 ms in ProcessGroupNCCL): the writer's own
# constant, stated here, not the analyser's (the generator models the writer, not our reading of it).
_WATCHDOG_NS = 100_000_000
_TIMEOUT_MS = 600_000   # the default process-group timeout every synthetic entry records
_DUMP_AFTER_END_NS = 1_000_000_000   # a job that ran to its end dumps a moment after (`finally`)
_OP_NS = 3_000_000
_SIMULATE_ALL_BELOW = 2_000             # world_size x steps: small jobs are simulated whole
_TIMING_FAULTS = ("straggler", "straggler_host", "slow_link", "clock_offset")


def _step_ns(job: Job) -> int:
    return 2 * job.microbatches * (2 * job.layers + 2) * _OP_NS + 4 * _OP_NS


def _pieces_per_step(template: list[_Op]) -> int:
    return sum(len(op.parts) + 1 if op.is_p2p else 1 for op in template)


def _prefix_records(job: Job, template: list[_Op], first: int, stop: int, last: dict[tuple, int]) -> list[dict]:
    """Healthy steps [first, stop) replicated from the template: everything completes, on a regular clock.
    `last`: per step-0 instance key, the latest member's index in its template (`_Sim.template_last`)."""
    step_ns = _step_ns(job)
    out = []
    for step in range(first, stop):
        t = _T0 + step * step_ns
        for i, op in enumerate(template):
            created = t + i * _OP_NS
            begin = t + max(last.get(k, i) for k in op.keys) * _OP_NS
            out.append({"op": op, "created": created, "started": created + 100_000,
                        "done": begin + 100_000 + 1_000_000 * (2 + len(op.group.ranks).bit_length())})
    return out


def _entries(job: Job, rank: int, records: list[dict], by_rank: dict[int, dict[str, _Group]],
             template: list[_Op] | None = None, sim_from: int = 0, last: dict[tuple, int] | None = None,
             dump_ns: int | None = None) -> list[dict]:
    """The recorder's entries for one rank, oldest first, as far back as the ring buffer keeps them. An op in
    flight that began on the GPU (timing on) is found started by the dump itself, at `dump_ns` (`dump_moment`).

    `records` are the simulated ops from step `sim_from` on; earlier steps come from `template`, and only as
    many of them as the buffer can still hold, with every counter advanced past the steps left out.
    """
    pg_ids = {g.name: i for i, g in enumerate(by_rank[rank].values())}
    coll_seq: dict[str, int] = defaultdict(int)
    p2p_seq: dict[str, int] = defaultdict(int)
    op_ids: dict[str, int] = defaultdict(int)
    record_id = 0
    if template is not None and sim_from > 0:
        per_step = _pieces_per_step(template)
        keep_from = max(0, sim_from - (job.buffer_size // max(per_step, 1)) - 1)
        for op in template:
            counter = p2p_seq if op.is_p2p else coll_seq
            counter[op.group.name] += keep_from
            op_ids[op.group.name] += keep_from * (len(op.parts) + 1 if op.is_p2p else 1)
        record_id = per_step * keep_from
        records = _prefix_records(job, template, keep_from, sim_from, last or {}) + records
    # innermost frame first, as the recorder writes them; the frame dicts are shared between entries, as the
    # writer shares them (each entry gets its own list of them when pickled: `_writer_layout`)
    frames = {name: [{"name": n, "filename": f, "line": ln} for n, f, ln in reversed(stack)]
              for name, stack in _STACKS.items()}
    skewed = job.fault.kind == "clock_offset" and job.host_of(rank) in job.fault.hosts
    offset = int(job.fault.offset_ms * 1e6) if skewed else 0
    threads = _version_minor(job.version) >= 9
    static: dict[int, dict] = {}
    # The watchdog thread, not the GPU, stamps "discovered" times: it polls every kWatchdogThreadSleepMillis
    # (100 ms), so a start or completion is seen up to 100 ms late, at the polling phase of the group's
    # watchdog on this rank (one thread per process group).
    phases: dict[str, int] = {}

    def discovered(t: int, g: _Group) -> int:
        if g.name not in phases:
            phases[g.name] = random.Random(f"{job.seed}/{rank}/{g.name}").randrange(_WATCHDOG_NS)
        return t + (phases[g.name] - t) % _WATCHDOG_NS + offset

    def fixed(piece: _Op, g: _Group, is_p2p: bool) -> dict:
        key = id(piece)
        if key not in static:
            e = {
                "pg_id": pg_ids[g.name], "process_group": (g.name, g.desc),
                "profiling_name": f"nccl:{piece.name}",
                "input_sizes": piece.in_sizes, "input_dtypes": [piece.dtype] * len(piece.in_sizes),
                "output_sizes": piece.out_sizes, "output_dtypes": [piece.dtype] * len(piece.out_sizes),
                "timeout_ms": _TIMEOUT_MS, "is_p2p": is_p2p,
            }
            if job.with_stacks:
                e["frames"] = frames[piece.stack]
            if threads:
                e["thread_id"] = str(140000000000000 + rank)
                e["thread_name"] = "pt_main_thread"
            static[key] = e
        return static[key]

    out: list[dict] = []
    for rec in records:
        op: _Op = rec["op"]
        g = op.group
        done = rec["done"] is not None
        pieces = op.parts + [op] if op.is_p2p else [op]
        if op.is_p2p:
            p2p_seq[g.name] += 1
        else:
            coll_seq[g.name] += 1
        for piece in pieces:
            op_ids[g.name] += 1
            closer_or_coll = piece is op
            if closer_or_coll and done:
                state = "completed"
            elif closer_or_coll:
                state = "started" if job.timing else "scheduled"
            else:
                state = "scheduled"  # batch members stay 'scheduled' forever; the closer carries the state
            e = dict(fixed(piece, g, op.is_p2p and not closer_or_coll))
            e.update({
                "record_id": record_id,
                "collective_seq_id": coll_seq[g.name],
                "p2p_seq_id": p2p_seq[g.name] if op.is_p2p else 0,
                "op_id": op_ids[g.name],
                "time_created_ns": rec["created"] + offset,
                "state": state,
                "time_discovered_started_ns": (discovered(rec.get("started", rec["created"]), g) if done
                                               else (dump_ns if dump_ns is not None else rec["created"]) + offset)
                if job.timing and closer_or_coll else None,
                "time_discovered_completed_ns": discovered(rec["done"], g) if done and closer_or_coll else None,
                "retired": done and closer_or_coll,
            })
            if job.timing and closer_or_coll and done:
                e["duration_ms"] = (rec["done"] - rec["started"]) / 1e6
            record_id += 1
            out.append(e)
    return out


def _version_minor(version: str) -> int:
    try:
        return int(version.split(".")[1])
    except (IndexError, ValueError):
        return 99


def _writer_layout(entry: dict) -> dict:
    """The entry laid out as the recorder's C++ pickler writes it: each entry has its own lists and tuples,
    while strings and frame dicts are shared objects (memoized), as fixtures/writer_sharing shows. The
    simulation reuses one list per op and stack; pickled as is, those lists would be memoized too, and the
    dumps would load faster than real ones (`pickle.load` of 140 files of the 16,384 x 2,000 job, 2-frame
    stacks: 0.4-0.5 s shared, 0.9 s laid out as the writer does)."""
    # the C++ pickler memoizes strings by value; Python's pickle by object: equal strings become one object
    e = {key: sys.intern(value) if isinstance(value, str) else value for key, value in entry.items()}
    e["process_group"] = tuple(sys.intern(part) for part in e["process_group"])
    for key in ("input_sizes", "output_sizes"):
        e[key] = [list(shape) for shape in e[key]]
    for key in ("input_dtypes", "output_dtypes"):
        e[key] = [sys.intern(dtype) for dtype in e[key]]
    if "frames" in e:
        e["frames"] = list(e["frames"])
    return e


def build_dump(job: Job, rank: int, entries: list[dict], by_rank: dict[int, dict[str, _Group]]) -> dict:
    if job.backend == "gloo":
        return _as_gloo(job, entries, by_rank[rank])
    minor = _version_minor(job.version)
    kept = entries[-job.buffer_size:] if job.buffer_size else []
    if job.only_active:
        kept = [e for e in kept if e["time_discovered_completed_ns"] is None]
    groups = list(by_rank[rank].values())
    status = {}
    for i, g in enumerate(groups):
        # One work per collective and per batch of sends and receives (its closer); the counters hold the seq
        # of the latest work enqueued, started, completed: a batch's p2p seq, a collective's collective seq.
        # The writer makes a group's key at its first entry: a group the rank never used has none.
        works = [e for e in entries if e["process_group"][0] == g.name and not e["is_p2p"]]
        if not works:
            continue
        seq = [e["p2p_seq_id"] or e["collective_seq_id"] for e in works]
        status[str(i)] = {
            "last_enqueued_collective": seq[-1],
            "last_started_collective": next((q for q, e in zip(seq[::-1], works[::-1]) if e["state"] != "scheduled"),
                                            -1) if job.timing else -1,
            "last_completed_collective": next((q for q, e in zip(seq[::-1], works[::-1])
                                               if e["state"] == "completed"), -1)}
    dump = {
        "version": job.version,
        "pg_config": {g.name: {"name": g.name, "desc": g.desc, "ranks": str(g.ranks)} for g in groups},
        "pg_status": status,
        "entries": kept,
    }
    if minor >= 10:
        dump["comm_lib_version"] = "2.21.5"
    elif minor >= 7:
        dump["nccl_version"] = "2.21.5"
    return dump


def _as_gloo(job: Job, entries: list[dict], groups: dict[str, _Group]) -> dict:
    """The same run as ProcessGroupGloo's recorder writes it (as the real dumps in fixtures/ show): sends and
    receives not recorded at all, every entry 'scheduled' with no start or completion time (`retired` says it
    left the work queue), 'gloo:' profiling names, one unnamed pg_config entry with the world's ranks while the
    job has no other group (fixtures/dead_rank) and with none once it has (every 8-rank fixture: '[]'), and a
    pg_status key only for a group with a recorded entry (none for a pipeline group: fixtures/record_p2p_keys.py),
    whose counters move only at a recorded op (fixtures/pipeline_stall)."""
    recorded = [e for e in entries if not e["is_p2p"] and not e["p2p_seq_id"]]   # (no batch closers either)
    out = []
    for record_id, e in enumerate(recorded):
        g = {k: v for k, v in e.items() if k != "duration_ms"}
        g.update(record_id=record_id, profiling_name=e["profiling_name"].replace("nccl:", "gloo:", 1),
                 state="scheduled", time_discovered_started_ns=None, time_discovered_completed_ns=None,
                 retired=e["state"] == "completed")
        out.append(g)
    status = {}
    for i, grp in enumerate(groups.values()):
        # (the generator's collective groups carry no sends or receives: seqs number collectives only)
        mine = [e for e in recorded if e["process_group"][0] == grp.name]
        if not mine:
            continue
        done = {e["collective_seq_id"] for e in mine if e["state"] == "completed"}
        status[str(i)] = {"last_enqueued_collective": max(e["collective_seq_id"] for e in mine),
                          "last_started_collective": -1, "last_completed_collective": max(done, default=-1)}
    return {"version": job.version, "comm_lib_version": "",
            "pg_config": {"": {"name": "", "desc": "",
                               "ranks": str(list(range(job.world_size)) if len(groups) == 1 else [])}},
            "pg_status": status, "entries": out[-job.buffer_size:] if job.buffer_size else []}


def to_json_dump(dump: dict) -> str:
    """What `_dump_nccl_trace_json` writes: no frames, 0 for missing times, strings in pg_status."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump["pg_status"].items()}
    entries = []
    for e in dump["entries"]:
        e = {k: v for k, v in e.items() if k != "frames"}
        e["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or 0
        entries.append(e)
    if entries:
        out["entries"] = entries
    return json.dumps(out)


def link_reach(job: Job, hosts: tuple[str, str]) -> dict[str, tuple[int, int]]:
    """Per kind of group (its desc, or 'p2p' for pipeline sends and receives): how many of its groups have an
    op whose partners span both `hosts` (a slow or dead link between them slows or stops those), of how many.
    A link that reaches every group of each kind it reaches has no peer group to be compared with."""
    groups, by_rank = _groups(job)
    reach: dict[str, set] = defaultdict(set)
    total: dict[str, set] = defaultdict(set)
    for rank in range(job.world_size):
        for op in _schedule(job, rank, by_rank):
            kind = "p2p" if op.is_p2p else op.group.desc
            total[kind].add(op.group.name)
            if set(hosts) <= {job.host_of(m) for m in _Sim._partners(op)}:
                reach[kind].add(op.group.name)
    return {kind: (len(reach[kind]), len(names)) for kind, names in total.items()}


def truth_path(out_dir: str | Path) -> Path:
    """Where `generate` writes the ground truth: beside the dump folder, not in it."""
    out = Path(out_dir)
    return out.with_name(out.name + ".truth.json")


def generate(job: Job, out_dir: str | Path, *, fmt: str = "pickle", per_host_folders: bool = False,
             prefix: str = "nccl_trace_rank_", compress: bool = False) -> dict:
    """Write one dump per surviving rank under `out_dir`; return the ground truth.

    Returns:
        {"kind", "ranks", "hosts", "links", "op", "pg_desc", "collective_seq_id", "missing_ranks", ...}
    """
    writer = _Writer(job, fmt=fmt, per_host_folders=per_host_folders, prefix=prefix, compress=compress)
    writer.write(range(job.world_size), Path(out_dir))
    return writer.finish(Path(out_dir))


def generate_slices(job: Job, out_dir: str | Path, ranks_per_slice: int, **kwargs) -> Iterator[tuple[Path, range]]:
    """Like `generate`, one slice of ranks at a time: each slice is written to `out_dir/slice-NNNNN` and yielded
    (folder, ranks) before the next is written, so the caller can convert it and delete it. For jobs whose
    dumps don't fit on disk at once (131,072 ranks carry a ~1 MB world rank list each). The ground truth is
    written next to `out_dir` at the end, as by `generate`. Keyword arguments are those of `generate`."""
    writer = _Writer(job, **kwargs)
    out = Path(out_dir)
    for k, first in enumerate(range(0, job.world_size, ranks_per_slice)):
        ranks = range(first, min(first + ranks_per_slice, job.world_size))
        folder = out / f"slice-{k:05d}"
        writer.write(ranks, folder)
        yield folder, ranks
    writer.finish(out)


def dump_moment(records: dict[int, list[dict]]) -> int:
    """When the job's dumps are written: once its first op left unfinished has waited the timeout (the watchdog
    fires, and every rank dumps), or, with none, a moment after the last op finished (a dump at the end)."""
    pending = [rec["created"] for recs in records.values() for rec in recs if rec["done"] is None]
    if pending:
        return min(pending) + _TIMEOUT_MS * 1_000_000 + _WATCHDOG_NS
    ends = [rec["done"] for recs in records.values() for rec in recs]
    return max(ends, default=_T0) + _DUMP_AFTER_END_NS


class _Writer:
    """Simulates the job once, then writes any ranks' dumps on request, each file's time the dump's."""

    def __init__(self, job: Job, *, fmt: str = "pickle", per_host_folders: bool = False,
                 prefix: str = "nccl_trace_rank_", compress: bool = False):
        self.job, self.fmt, self.per_host_folders = job, fmt, per_host_folders
        self.prefix, self.compress = prefix, compress
        self.sim = _Sim(job)
        self.records = self.sim.run()
        self.dump_ns = dump_moment(self.records)

    def write(self, ranks: range, out: Path) -> None:
        job, sim = self.job, self.sim
        out.mkdir(parents=True, exist_ok=True)
        for rank in ranks:
            if rank in sim.missing:
                continue
            entries = _entries(job, rank, self.records[rank], sim.by_rank, sim.template_of(rank), sim.sim_from,
                               sim.template_last, self.dump_ns)
            dump = build_dump(job, rank, entries, sim.by_rank)
            folder = out / job.host_of(rank) if self.per_host_folders else out
            folder.mkdir(parents=True, exist_ok=True)
            if self.fmt == "json":
                data = to_json_dump(dump).encode()
            else:   # only the pickle has a layout to match (JSON copies every value)
                data = pickle.dumps(dump | {"entries": [_writer_layout(e) for e in dump["entries"]]}, protocol=2)
            if self.compress:
                data = gzip.compress(data, compresslevel=1)
            path = folder / f"{self.prefix}{rank}"
            path.write_bytes(data)
            # (the file's time is the dump's, on its host's clock, as a dump read where it was written has it)
            skew = int(job.fault.offset_ms * 1e6) if (job.fault.kind == "clock_offset"
                                                      and job.host_of(rank) in job.fault.hosts) else 0
            os.utime(path, ns=(self.dump_ns + skew, self.dump_ns + skew))

    def finish(self, out: Path) -> dict:
        job, sim = self.job, self.sim
        truth = dict(sim.truth)
        truth["missing_ranks"] = sorted(sim.missing)
        if truth["ranks"] and not truth["hosts"] and job.fault.kind not in ("dead_link",):
            truth["hosts"] = sorted({job.host_of(r) for r in truth["ranks"]})
        truth["world_size"] = job.world_size
        out.mkdir(parents=True, exist_ok=True)
        truth_path(out).write_text(json.dumps(truth, indent=1, sort_keys=True))
        return truth
