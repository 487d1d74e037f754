"""Which technique first makes a run fit its GPUs (`gpuanat predict`, issue #34): the memory techniques tried in
the order that costs least first, each on top of the ones before, until the predicted run fits.

The order is the docs' ("Efficient training on a single GPU", then the sharding of several): on several GPUs the
distributed technique first — DDP replicates everything, ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too,
FSDP2 (ZeRO-3's sharding, in torch) the weights as well — as they cost some communication and no compute; then
gradient checkpointing (a third more compute); then bf16 weights, which change the numerics, and pure bf16 (no
autocast: every activation 16-bit, faster too: docs/pure-bf16.md); then LoRA and QLoRA,
which change what trains. The whole model compiled (`--compile`) is not predicted (`compiled`): its ladder begins
with its regions compiled in its place, predicted as eager, so that no step is a compiled model's memory read from the
eager bytes model. A step this version cannot train (`validate_values` refuses it: LoRA under FSDP, for
one), or one that lowers nothing for this run (checkpointing where the model's state peaks, not the activations), is
left out and said so.

`what_would_fit` is what a run that ran out of memory is told to change (`gpuanat run`'s hint, `gpuanat explain`):
the ladder's steps up to the one predicted to fit, else the techniques that lower memory and are not on yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gpuanat.core.memory.compiled import compile_unpredicted_reason
from gpuanat.core.memory.model_config import UnreadableModel
from gpuanat.core.memory.predict import estimate_memory, fits_in, max_batch_size, peak_device_bytes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.techniques import BY_SHARDING, with_compile_mode, with_distributed, with_weights_mode
from gpuanat.core.vocabulary.validation import refusal, validate_values

LORA_RANK = 16
GIB = 1024**3
REGIONS_FLAGS = "--compile-regions, not --compile"
"""The first step of a whole compiled model's ladder: a flag in place of another, not one added (`what_would_fit`
says it as an idea, not as flags to append)."""


@dataclass(frozen=True)
class LadderStep:
    """One technique added: its flags, and the run's predicted peak with it and all before it."""

    technique: str
    flags: str
    """What to add to the command line of the step before (or of the run as given, for the first)."""
    peak_device_bytes: int | None
    fits: bool
    refused: str | None = None
    """Why the step was left out: this version cannot train it, or it lowers nothing here; None when taken."""

    def to_json(self) -> dict[str, object]:
        return {
            "technique": self.technique,
            "flags": self.flags,
            "peak_device_bytes": self.peak_device_bytes,
            "fits": self.fits,
            "refused": self.refused,
        }


@dataclass(frozen=True)
class Rung:
    """A technique of the ladder: how it changes a config, and the flags that say so."""

    technique: str
    change: Callable[[RunConfig], RunConfig]
    flags: Callable[[RunConfig], str]
    """The flags that turn the config before into the changed one."""


def _lora_flags(run: RunConfig, extra: str = "") -> str:
    """LoRA's flags on top of `run`: its frozen base is 16-bit already, so bf16 weights go back to fp32."""
    base = (" --weights-dtype fp32" if run.weights_dtype != "fp32" else "") + ("" if run.autocast else " --autocast")
    return f"{extra}--lora {run.lora or LORA_RANK}{base}"


def _distributed_flags(run: RunConfig, stage: str) -> str:
    return f"--distributed {stage}" + (" --engine trainer" if run.engine != "trainer" else "")


def _rungs(config: RunConfig) -> list[Rung]:
    """The ladder's techniques in order, for a run like `config`."""
    rungs: list[Rung] = []
    if compile_unpredicted_reason(config) is not None:  # first, so that every later step is predicted
        rungs.append(
            Rung(
                "compiled regions, not the whole model",
                lambda run: with_compile_mode(run, "regions"),
                lambda run: REGIONS_FLAGS,
            )
        )
    if (config.ranks or 1) > 1:
        for stage in BY_SHARDING[BY_SHARDING.index(config.distributed) + 1 : BY_SHARDING.index("fsdp") + 1]:
            rungs.append(
                Rung(
                    f"shard ({stage})",
                    functools.partial(with_distributed, technique=stage),
                    functools.partial(_distributed_flags, stage=stage),
                )
            )
    if not config.grad_checkpointing:
        rungs.append(
            Rung(
                "gradient checkpointing",
                lambda run: run.replace(grad_checkpointing=True),
                lambda run: "--grad-checkpointing",
            )
        )
    if config.weights_dtype == "fp32" and not config.lora and not config.load_in_4bit:
        rungs.append(
            Rung(
                "bf16 weights",
                lambda run: run.replace(precision="bf16", weights_dtype="bf16"),
                lambda run: "--precision bf16 --weights-dtype bf16",
            )
        )
    # on one GPU (on several, the sharding before it computes in 16 bits without autocast already)
    if config.autocast and (config.ranks or 1) == 1 and not config.lora and not config.load_in_4bit:
        rungs.append(
            Rung(
                "pure bf16 (no autocast: every activation 16-bit)",
                lambda run: with_weights_mode(run, "pure-bf16"),
                lambda run: (
                    "--no-autocast"
                    if run.weights_dtype == "bf16"
                    else "--precision bf16 --weights-dtype bf16 --no-autocast"
                ),
            )
        )
    if not config.lora:
        rungs.append(
            Rung(
                f"LoRA rank {LORA_RANK}, its frozen base in 16 bits",
                lambda run: run.replace(lora=LORA_RANK, weights_dtype="fp32", autocast=True),
                _lora_flags,
            )
        )
    if not config.load_in_4bit:
        rungs.append(
            Rung(
                "QLoRA (4-bit base)",
                lambda run: run.replace(
                    load_in_4bit=True, lora=run.lora or LORA_RANK, weights_dtype="fp32", autocast=True
                ),
                lambda run: _lora_flags(run, "--load-in-4bit ") if not run.lora else "--load-in-4bit",
            )
        )
    return rungs


def _fits(config: RunConfig, gpu_memory_bytes: int) -> tuple[int, bool]:
    estimate = estimate_memory(config)
    return peak_device_bytes(estimate), fits_in(estimate, gpu_memory_bytes)


def fit_ladder(config: RunConfig, gpu_memory_bytes: int) -> list[LadderStep]:
    """The techniques added one by one to `config` until it fits GPUs of `gpu_memory_bytes` each; empty when it fits
    as given. A technique that lowers nothing yet is tried again after each later one (checkpointing helps once LoRA
    has made the model's state small); those that never did come last, left out. One step `fits` where any did.
    With the whole model compiled, whose memory is not predicted, it is never empty: its first step compiles the
    regions in its place, and every step after keeps them."""
    current_peak: int | None = None
    """None: the run as given is not predicted, so its first step lowers something from unknown."""
    if compile_unpredicted_reason(config) is None:
        current_peak, fits = _fits(config, gpu_memory_bytes)
        if fits:
            return []
    steps: list[LadderStep] = []
    waiting: dict[str, LadderStep] = {}
    """Techniques that lowered nothing when tried, by name: their step as last tried."""
    current = config
    rungs = _rungs(config)
    pending = list(rungs)
    while pending:
        rung = pending.pop(0)
        candidate, flags = rung.change(current), rung.flags(current)
        refused = refusal(candidate)
        if refused is not None:
            steps.append(LadderStep(rung.technique, flags, None, False, refused=refused.message))
            continue
        peak, fits = _fits(candidate, gpu_memory_bytes)
        # e.g. checkpointing where the model's state, not activations, peaks
        if current_peak is not None and peak >= current_peak and not fits:
            waiting[rung.technique] = LadderStep(
                rung.technique,
                flags,
                peak,
                False,
                refused=(
                    f"lowers nothing here (peak {peak / GIB:.2f} GiB with it, {current_peak / GIB:.2f} GiB without)"
                ),
            )
            continue
        waiting.pop(rung.technique, None)
        steps.append(LadderStep(rung.technique, flags, peak, fits))
        current, current_peak = candidate, peak
        if fits:
            break
        # what lowered nothing before is tried again first, cheapest first
        again = [waiting_rung for waiting_rung in rungs if waiting_rung.technique in waiting]
        pending = again + [other for other in pending if other.technique not in waiting]
        for waiting_rung in again:
            waiting.pop(waiting_rung.technique)
    return steps + list(waiting.values())


@dataclass(frozen=True)
class FitSuggestion:
    """What to change after running out of memory (`gpuanat run`'s hint, `gpuanat explain`): the fit ladder's steps up
    to the one predicted to fit, else the changes that lower memory and are not on yet."""

    flags: tuple[str, ...] = ()
    """The fit ladder's steps up to the first predicted to fit, each one's flags, in order: add them all. Empty when
    no step is predicted to fit."""
    ideas: tuple[str, ...] = ()
    """Where no step is predicted to fit: the changes that lower memory and are not on yet, a smaller batch first."""
    fits_as_is: bool = False
    """The memory model predicts the run fits as it is, so it has no step to offer (it missed)."""
    not_predicted: str | None = None
    """Why the memory model could not predict the run here (its model's config cannot be read, or a value is unknown
    to this version); None when it could."""
    gpu_memory_bytes: int | None = None
    """The GPU's memory the ladder was held against; None when it is not known (a CPU run): then no ladder."""
    max_batch_size: int | None = None
    """Where no step is predicted to fit: the largest smaller batch predicted to fit with the run's techniques (the
    bytes model's, as `gpuanat predict` gives it without a recorded run); None when none is, or it was not asked."""

    def to_json(self) -> dict[str, object]:
        return {
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "flags": list(self.flags),
            "max_batch_size": self.max_batch_size,
            "ideas": list(self.ideas),
            "fits_as_is": self.fits_as_is,
            "not_predicted": self.not_predicted,
        }


def what_would_fit(config: RunConfig, gpu_memory_bytes: int | None) -> FitSuggestion:
    """What to change in `config`, which ran out of memory on a GPU of `gpu_memory_bytes` (None: its size is not
    known): the fit ladder's steps up to the one predicted to fit it, as `gpuanat predict` lists them; else the
    largest batch predicted to fit, and the techniques that lower memory and are not on yet. With the whole model
    compiled, not predicted: no flags and no batch, and its regions compiled in its place the first idea after a
    smaller batch."""
    fits_as_is, batch = False, None
    not_predicted = compile_unpredicted_reason(config)
    if gpu_memory_bytes and not_predicted is None:
        try:
            validate_values(config)  # a run recorded by another gpuanat may name a preset or a value unknown here
            ladder = fit_ladder(config, gpu_memory_bytes)
        except ConfigError as error:
            not_predicted = f"this gpuanat cannot train it: {error}"
        except UnreadableModel as error:
            not_predicted = str(error)
        else:
            steps = [step for step in ladder if step.refused is None]
            if steps and steps[-1].fits:
                return FitSuggestion(flags=tuple(step.flags for step in steps), gpu_memory_bytes=gpu_memory_bytes)
            fits_as_is = not ladder
            largest = 0 if fits_as_is else max_batch_size(config, gpu_memory_bytes)
            batch = largest if 0 < largest < config.batch_size else None
    ideas = [f"--batch-size {batch} (predicted to fit)" if batch else "a smaller --batch-size"]
    if config.compile:
        ideas.append("--compile-regions in place of --compile (predicted as eager)")
    if not config.grad_checkpointing:
        ideas.append("--grad-checkpointing")
    if config.precision == "fp32":
        ideas.append("--precision bf16")
    return FitSuggestion(
        ideas=tuple(ideas),
        fits_as_is=fits_as_is,
        not_predicted=not_predicted,
        max_batch_size=batch,
        gpu_memory_bytes=gpu_memory_bytes or None,
    )
