"""Which moves a round of `tune` tries first: what the kept run's operations anatomy and its main bottleneck say
its time goes to.

The operations anatomy (`operations_anatomy`, from the trial's profiled steps) splits the GPU's time by kind of
operation; the tensor contractions are the math, everything else moves memory. A round first tries what attacks the
largest groups that are not contractions, each at least `ANATOMY_SHARE_FLOOR` of the profiled time: element-wise
kernels and normalizations shrink with pure bf16 (half the bytes a kernel moves) and fuse under compiled regions or
Liger's layer kernels; the optimizer's own kernels shrink with 8-bit states or bf16 ones; memory copies are the data
path. Then the moves the diagnosis's bottleneck names (`FIRST_MOVES_FOR`), then the others in their usual order.
Plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuanat.core.operations.classify import GROUP_LABELS
from gpuanat.core.vocabulary.config import PROFILED_TRIAL_MIN_STEPS, TRIAL_PROFILED_STEPS
from gpuanat.core.vocabulary.result import RunResult

FIRST_MOVES_FOR: dict[str, tuple[str, ...]] = {
    "gpu-bound": ("compile", "engine", "liger"),
    "host-bound": ("batch", "engine", "compile"),
    "input-bound": ("workers",),
    "memory-bound": ("distributed", "grad-checkpointing", "optim", "expandable-segments"),
}
"""The moves a round tries first, by the kept run's main bottleneck (`diagnose`): what its fix names. A GPU-bound
run gains from less GPU work a sample (fused kernels) and from a loop that leaves the GPU no gap: HF Trainer
synchronises once a step, the Accelerate loop does not (bert-large bf16 batch 128 on the H100: 310 → 324 samples/s
eager, 335 → 354 with compiled regions; benchmarks/results/h100/compile_speed/). The default order reaches both last:
an 8.6-minute search there kept compiled regions, then ran out of budget before the engine
(benchmarks/results/h100/tune3/)."""
MOVES_FOR_GROUP: dict[str, tuple[str, ...]] = {
    "elementwise": ("weights", "compile", "liger"),
    "normalizations": ("compile", "liger", "weights"),
    "optimizer": ("weights", "optim"),
    "memory_copies": ("workers",),
}
"""What attacks each group of the operations anatomy that is not math: bert-large bf16 batch 64 on the H100 spent
26% of its GPU time in element-wise kernels and 13% in normalizations (benchmarks/results/h100/tune54/)."""
ANATOMY_SHARE_FLOOR = 0.05
"""A group below this share of the profiled GPU time orders nothing."""
ANATOMY_FIRST_BOTTLENECKS = (None, "gpu-bound")
"""Where the anatomy's moves come before the bottleneck's: a run the GPU's work limits (or with no diagnosis). A
host-, input- or memory-bound run's first moves are its bottleneck's."""


@dataclass(frozen=True)
class MoveOrder:
    """The dimensions in the order a round tries them, and why."""

    dimensions: list[str]
    reason: str
    """"element-wise 26%, normalizations 13% of the profiled time; gpu-bound → weights, compile, liger, engine
    first"; empty when the run has neither an anatomy with a group to attack nor a diagnosis."""


def tune_profiled_steps(asked: int | None, trial_steps: int) -> int:
    """Steps of each trial profiled for its operations anatomy: `--profile-ops N` as given (0: --no-profile-ops),
    else `TRIAL_PROFILED_STEPS` of a trial of at least `PROFILED_TRIAL_MIN_STEPS` steps, none of a shorter one."""
    if asked is not None:
        return asked
    return TRIAL_PROFILED_STEPS if trial_steps >= PROFILED_TRIAL_MIN_STEPS else 0


def groups_to_attack(anatomy: dict[str, Any] | None) -> list[tuple[str, float]]:
    """(group, share of the profiled GPU time) of the groups `MOVES_FOR_GROUP` answers, at least
    `ANATOMY_SHARE_FLOOR` each, the largest first."""
    if not anatomy:
        return []
    shares = []
    for group in MOVES_FOR_GROUP:
        entry = anatomy.get(group)
        share = entry.get("time_share") if isinstance(entry, dict) else None
        if isinstance(share, (int, float)) and share >= ANATOMY_SHARE_FLOOR:
            shares.append((group, float(share)))
    return sorted(shares, key=lambda item: item[1], reverse=True)


def move_order(dimensions: Sequence[str], center_result: RunResult) -> MoveOrder:
    """`dimensions` with the moves the kept run's anatomy and bottleneck answer first, the others in their order."""
    findings = center_result.diagnosis or []
    bottleneck = findings[0].get("bottleneck") if findings else None
    groups = groups_to_attack(center_result.operations_anatomy)
    anatomy_moves = [move for group, _ in groups for move in MOVES_FOR_GROUP[group]]
    bottleneck_moves = list(FIRST_MOVES_FOR.get(bottleneck or "", ()))
    if bottleneck in ANATOMY_FIRST_BOTTLENECKS:
        first = anatomy_moves + bottleneck_moves
    else:
        first = bottleneck_moves + anatomy_moves
    first = [dimension for dimension in dict.fromkeys(first) if dimension in dimensions]
    ordered = first + [dimension for dimension in dimensions if dimension not in first]
    causes = []
    if groups:
        shares = ", ".join(f"{GROUP_LABELS[group]} {share:.0%}" for group, share in groups)
        causes.append(f"{shares} of the profiled time")
    if bottleneck:
        causes.append(str(bottleneck))
    if not causes:
        reason = ""
    elif first:
        reason = f"{'; '.join(causes)} → {', '.join(first)} first"
    else:
        reason = f"{'; '.join(causes)}: none of their moves is searched"
    return MoveOrder(ordered, reason)
