"""What a synthetic job is (its layout, hosts and schedule's size) and the fault to inject into it."""

from __future__ import annotations

from dataclasses import dataclass, field

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
