"""A small discrete-event simulation of every rank of a synthetic job: a collective completes when every member
has arrived, a send when its receiver has. A fault stops a rank, breaks a group or link, or skews times; the
simulation then shows exactly what the recorder would: who is blocked in what, in which state."""

from __future__ import annotations

import random
from collections import defaultdict, deque

from flightrec.testing.synth_job import FAULT_KINDS, Fault, Job
from flightrec.testing.synth_schedule import T0, Op, fault_index, process_groups, schedule, step_length_ns


class Sim:
    """Discrete-event run of every rank's schedule under the fault."""

    def __init__(self, job: Job):
        self.job = job
        self.groups, self.by_rank = process_groups(job)
        # Steps before the fault are all alike and complete everywhere: at scale they are replicated from a
        # one-step template (see entries) and only the fault step onward is simulated event by event.
        fault_step = job.fault.step if job.fault.step >= 0 else job.steps - 1
        small = job.world_size * job.steps <= _SIMULATE_ALL_BELOW
        self.sim_from = 0 if small or job.fault.kind in _TIMING_FAULTS else fault_step
        self.templates = {r: schedule(job, r, self.by_rank, range(1)) for r in range(job.world_size)}
        self.ops = {r: schedule(job, r, self.by_rank, range(self.sim_from, job.steps)) for r in range(job.world_size)}
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

    def template_of(self, rank: int) -> list[Op]:
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
        i = fault_index(job, ops)
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
                self.stop_at[r] = fault_index(job, self.ops[r])
                self.missing.add(r)
            self.truth.update(ranks=self._host_ranks(host), hosts=[host])
        elif f.kind in ("size_mismatch", "type_mismatch", "dtype_mismatch"):
            self._mismatch(op, f.kind)
        elif f.kind == "deadlock":
            # The step ends with dp all_reduce then world all_reduce; this rank does them the other way round.
            step = op.step
            j = next(k for k, o in enumerate(ops) if o.step == step and o.group.desc == "dp")
            ops[j], ops[j + 1] = ops[j + 1], ops[j]
            self.truth.update(op="all_reduce", pg_desc="dp")
            del self.truth["collective_seq_id"]
        elif f.kind in ("dead_link", "nic_down"):
            self._network_down(op, f)
        elif f.kind == "wrong_peer":
            self._wrong_peer(op, f.rank)
        else:
            raise ValueError(f"unknown fault kind {f.kind!r}; one of {FAULT_KINDS}")

    def _mismatch(self, op: Op, kind: str) -> None:
        """`op`, on the faulty rank, called with another shape, dtype or op than its peers'."""
        if kind == "size_mismatch":
            op.in_sizes = [[s[0] * 2] for s in op.in_sizes]
            op.out_sizes = [[s[0] * 2] for s in op.out_sizes]
        elif kind == "dtype_mismatch":
            op.dtype = "Float" if op.dtype != "Float" else "BFloat16"   # (dp all_reduces are Float already)
        else:
            op.name = "all_reduce" if op.name != "all_reduce" else "broadcast"
            op.out_sizes = op.in_sizes
        self.never_complete.add(op.keys[0])
        self.truth["kind"] = "mismatch"

    def _network_down(self, op: Op, f: Fault) -> None:
        """dead_link: from `op`'s step every op between the two hosts hangs. nic_down: the host's network dies,
        every op its ranks share with another host hangs, while the work inside the host goes on."""
        if f.kind == "dead_link":
            a, b = f.hosts
            ranks, cut = self._host_ranks(a), lambda m: m in set(self._host_ranks(b))
            self.truth.update(ranks=[], hosts=[], links=[sorted((a, b))])
        else:
            (x,) = f.hosts
            ranks, cut = self._host_ranks(x), lambda m: self.job.host_of(m) != x
            self.truth.update(ranks=[], hosts=[x], links=[])
        for r in ranks:
            for o in self.ops[r]:
                if o.step >= op.step and any(cut(m) for m in self._partners(o)):
                    self.never_complete.update(o.keys)
        for k in ("op", "pg_desc", "pg_name", "collective_seq_id"):
            self.truth.pop(k, None)

    def _wrong_peer(self, op: Op, rank: int) -> None:
        """`rank`'s pipeline send goes to another stage than the one waiting for it."""
        part = op.parts[0]
        me = op.group.ranks.index(rank)
        intended = int(part.name.split("->")[1])
        others = [i for i in range(len(op.group.ranks)) if i not in (me, intended)]
        if not others:
            raise ValueError("wrong_peer needs a pipeline of 3+ stages")
        wrong = others[0]
        part.name = f"send {me}->{wrong}"
        key = ("p", op.group.name, me, wrong, -1)
        part.keys = op.keys = [key]
        self.truth.update(op="send", peer=op.group.ranks[wrong])

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
        start = T0 + self.sim_from * step_length_ns(job)
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
    def _partners(op: Op) -> list[int]:
        """The ranks an op needs: the whole group for a collective, the two ends for a send/recv."""
        if op.keys[0][0] == "c":
            return op.group.ranks
        return [op.group.ranks[k[i]] for k in op.keys for i in (2, 3)]

    def _spans(self, op: Op, hosts: tuple[str, ...]) -> bool:
        on = {self.job.host_of(m) for m in self._partners(op)}
        return all(h in on for h in hosts)


_SIMULATE_ALL_BELOW = 2_000             # world_size x steps: small jobs are simulated whole


_TIMING_FAULTS = ("straggler", "straggler_host", "slow_link", "clock_offset")
