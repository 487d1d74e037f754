"""Which technique first makes a run fit its GPUs (`gpuanat predict`, issue #34): the memory techniques tried in
the order that costs least first, each on top of the ones before, until the predicted run fits.

The order is the docs' ("Efficient training on a single GPU", then the sharding of several): on several GPUs the
distributed technique first — DDP replicates everything, ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too,
FSDP2 (ZeRO-3's sharding, in torch) the weights as well — as they cost some communication and no compute; then
gradient checkpointing (a third more compute); then bf16 weights, which change the numerics; then LoRA and QLoRA,
which change what trains. A step this version cannot train (`validate_values` refuses it: LoRA under FSDP, for
one), or one that lowers nothing for this run (checkpointing where the model's state peaks, not the activations), is
left out and said so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuanat.core.memory.predict import estimate_memory, fits_in, peak_device_bytes
from gpuanat.core.run.config import RunConfig
from gpuanat.core.run.errors import ConfigError
from gpuanat.core.run.validation import validate_values

SHARDING_ORDER = ("none", "ddp", "zero1", "zero2", "fsdp", "zero3")
"""Distributed techniques by how much of the model's state each rank holds, most first."""

LORA_RANK = 16
GIB = 1024**3


@dataclass(frozen=True)
class LadderStep:
    """One technique added: its flags, and the run's predicted peak with it and all before it."""

    technique: str
    flags: str
    peak_device_bytes: int | None
    fits: bool
    refused: str | None = None
    """Why this version cannot train it (the step was then left out); None when it was tried."""

    def to_json(self) -> dict[str, object]:
        return {"technique": self.technique, "flags": self.flags, "peak_device_bytes": self.peak_device_bytes,
                "fits": self.fits, "refused": self.refused}


def _rungs(config: RunConfig) -> list[tuple[str, str, Callable[[RunConfig], RunConfig]]]:
    """(technique, flags, how it changes a config) in the ladder's order, for a run like `config`."""
    rungs: list[tuple[str, str, Callable[[RunConfig], RunConfig]]] = []
    if (config.ranks or 1) > 1:
        position = SHARDING_ORDER.index(config.distributed)
        for stage in ("zero1", "zero2", "fsdp"):
            if SHARDING_ORDER.index(stage) > position:
                rungs.append((f"shard ({stage})", f"--distributed {stage}",
                              lambda run, stage=stage: run.replace(distributed=stage)))
    if not config.grad_checkpointing:
        rungs.append(("gradient checkpointing", "--grad-checkpointing",
                      lambda run: run.replace(grad_checkpointing=True)))
    if config.weights_dtype == "fp32" and not config.lora and not config.load_in_4bit:
        rungs.append(("bf16 weights", "--precision bf16 --weights-dtype bf16",
                      lambda run: run.replace(precision="bf16", weights_dtype="bf16")))
    if not config.lora:
        rungs.append((f"LoRA rank {LORA_RANK}, its frozen base in 16 bits", f"--lora {LORA_RANK}",
                      lambda run: run.replace(lora=LORA_RANK, weights_dtype="fp32")))
    if not config.load_in_4bit:
        rungs.append(("QLoRA (4-bit base)", f"--load-in-4bit --lora {config.lora or LORA_RANK}",
                      lambda run: run.replace(load_in_4bit=True, lora=run.lora or LORA_RANK, weights_dtype="fp32")))
    return rungs


def _fits(config: RunConfig, gpu_memory_bytes: int) -> tuple[int, bool]:
    estimate = estimate_memory(config)
    return peak_device_bytes(estimate), fits_in(estimate, gpu_memory_bytes)


def fit_ladder(config: RunConfig, gpu_memory_bytes: int) -> list[LadderStep]:
    """The techniques added one by one to `config` until it fits GPUs of `gpu_memory_bytes` each; empty when it fits
    as given. A technique that lowers nothing yet is tried again after each later one (checkpointing helps once LoRA
    has made the model's state small); those that never did come last, left out. One step `fits` where any did."""
    current_peak, fits = _fits(config, gpu_memory_bytes)
    if fits:
        return []
    steps: list[LadderStep] = []
    waiting: dict[str, LadderStep] = {}
    """Techniques that lowered nothing when tried, by flags: their step as last tried."""
    current = config
    rungs = _rungs(config)
    pending = list(rungs)
    while pending:
        technique, flags, change = pending.pop(0)
        candidate = change(current)
        try:
            validate_values(candidate)
        except ConfigError as error:
            steps.append(LadderStep(technique, flags, None, False, refused=error.message))
            continue
        peak, fits = _fits(candidate, gpu_memory_bytes)
        if peak >= current_peak and not fits:  # e.g. checkpointing where the model's state, not activations, peaks
            waiting[flags] = LadderStep(technique, flags, peak, False, refused=(
                f"lowers nothing here (peak {peak / GIB:.2f} GiB with it, {current_peak / GIB:.2f} GiB without)"))
            continue
        waiting.pop(flags, None)
        steps.append(LadderStep(technique, flags, peak, fits))
        current, current_peak = candidate, peak
        if fits:
            break
        # what lowered nothing before is tried again first, cheapest first
        again = [rung for rung in rungs if rung[1] in waiting]
        pending = again + [rung for rung in pending if rung[1] not in waiting]
        for rung in again:
            waiting.pop(rung[1])
    return steps + list(waiting.values())
