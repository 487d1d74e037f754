"""The memory anatomy: GPU memory split into bands that add up to what NVML reports as used.

Bands, bottom to top (DESIGN.md): other processes, CUDA context & kernels, weights, gradients,
optimizer states, activations, temporaries & allocator cache, free. The probe measures the tensor
bands inside the training process; NVML, read by the parent, gives the device and per-process use.
A band that cannot be measured is None, with the reason in `unavailable` — never a guess.

The bands are one moment's: the end of the forward pass of the probe's last measured step, when the activations
peak. Gradients and activations do not peak together: the loop frees gradients after each optimizer step, so at
that moment only accumulated gradients are alive (the gradients band), and in the first step no optimizer state
yet. So
other processes + context + weights + gradients + optimizer state + activations + temporaries & cache = NVML used,
and the space the gradients take after backward is part of the cache then. The gradients' own maximum, after
backward, is worth knowing (the model's gradient bytes) but is of another moment: results and records carry it
beside the bands as `gradients_after_backward_bytes`, never in the stack (`stack_total_bytes` sums the stack).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.vocabulary.protocol import ProbeBands

NO_GPU_READINGS = "no GPU readings"
"""How the reason a band has no value begins when no GPU reading can come at all (no NVML): the views say it rather
than wait."""

BAND_NAMES: tuple[str, ...] = (
    "other_processes_bytes",
    "cuda_context_bytes",
    "weights_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "activations_bytes",
    "temporaries_and_cache_bytes",
    "free_bytes",
)


@dataclass(frozen=True)
class MemoryBands:
    other_processes_bytes: int | None = None
    """NVML device used minus this run's per-process use."""
    cuda_context_bytes: int | None = None
    """NVML per-process use minus torch's reserved memory: context, kernels, cuBLAS workspaces."""
    weights_bytes: int | None = None
    gradients_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    activations_bytes: int | None = None
    temporaries_and_cache_bytes: int | None = None
    """Reserved memory not held by weights, optimizer state, activations and the gradients alive at the
    end of the forward pass: the batch, transient buffers and the allocator's cache (with the room the
    gradients take after backward)."""
    free_bytes: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    """Band name -> why it is None."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def values(self) -> dict[str, int | None]:
        """The bands alone, by name (`BAND_NAMES`), without why any is missing: a result's or record's `bands`."""
        return {name: getattr(self, name) for name in BAND_NAMES}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryBands:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def _difference(minuend: int | None, *subtrahends: int | None) -> int | None:
    if minuend is None or any(value is None for value in subtrahends):
        return None
    return minuend - sum(value for value in subtrahends if value is not None)


def assemble_bands(
    probe: ProbeBands | None,
    *,
    reserved_bytes: int | None,
    device_used_bytes: int | None,
    device_total_bytes: int | None,
    process_used_bytes: int | None,
    no_gpu_reason: str | None = None,
) -> MemoryBands:
    """Combine the probe's tensor bands with allocator and NVML readings taken at the same moment."""
    unavailable: dict[str, str] = {}
    tensor_bands: dict[str, int | None] = dict.fromkeys(
        ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
    )
    if probe is None:
        for name in tensor_bands:
            unavailable[name] = "the probe has not measured a step yet"
    else:
        # The optimizer state as at the end of forward, like the other bands: none yet in the first step.
        optimizer_state = (
            probe.optimizer_state_at_forward_end_bytes
            if probe.optimizer_state_at_forward_end_bytes is not None
            else probe.optimizer_state_bytes
        )
        # The gradients alive at the end of forward, like the activations: those kept by accumulation.
        tensor_bands.update(
            weights_bytes=probe.weights_bytes,
            gradients_bytes=probe.gradients_at_forward_end_bytes,
            optimizer_state_bytes=optimizer_state,
            activations_bytes=probe.activations_bytes,
        )
        if probe.activations_bytes is None:
            unavailable["activations_bytes"] = "not measurable with torch.compile on CPU"
    if no_gpu_reason is not None:
        for name in ("other_processes_bytes", "cuda_context_bytes", "temporaries_and_cache_bytes", "free_bytes"):
            unavailable[name] = no_gpu_reason
        return MemoryBands(**tensor_bands, unavailable=unavailable)

    other = _difference(device_used_bytes, process_used_bytes)
    context = _difference(process_used_bytes, reserved_bytes)
    cache = _difference(
        reserved_bytes,
        tensor_bands["weights_bytes"],
        tensor_bands["gradients_bytes"],
        tensor_bands["optimizer_state_bytes"],
        tensor_bands["activations_bytes"],
    )
    free = _difference(device_total_bytes, device_used_bytes)
    for name, value, reason in (
        ("other_processes_bytes", other, "NVML did not report this run's per-process memory"),
        ("cuda_context_bytes", context, "NVML did not report this run's per-process memory"),
        ("temporaries_and_cache_bytes", cache, "needs every tensor band and the allocator's reserved memory"),
        ("free_bytes", free, "NVML did not report device memory"),
    ):
        if value is None:
            unavailable[name] = reason
    # A negative band is a measurement that cannot be explained (readings of different moments or devices): it is
    # never shown, only reported, with the numbers that gave it.
    if other is not None and other < 0:
        unavailable["other_processes_bytes"] = (
            f"this run's processes used more ({process_used_bytes:,} B) than NVML "
            f"counted on the device ({device_used_bytes:,} B)"
        )
        other = None
    if context is not None and context < 0:
        unavailable["cuda_context_bytes"] = (
            f"torch reserved more ({reserved_bytes:,} B) than NVML counted for the process ({process_used_bytes:,} B)"
        )
        context = None
    if cache is not None and cache < 0:
        unavailable["temporaries_and_cache_bytes"] = (
            f"the tensor bands add up to more than torch reserved ({reserved_bytes:,} B), by {-cache:,} B"
        )
        cache = None
    if free is not None and free < 0:
        unavailable["free_bytes"] = f"NVML counted more used ({device_used_bytes:,} B) than total memory"
        free = None
    return MemoryBands(
        other_processes_bytes=other,
        cuda_context_bytes=context,
        **tensor_bands,
        temporaries_and_cache_bytes=cache,
        free_bytes=free,
        unavailable=unavailable,
    )


USED_BAND_NAMES = BAND_NAMES[:-1]
"""The bands that add up to the device's used memory (all but free)."""


def stack_total_bytes(bands: dict[str, Any]) -> int | None:
    """The used bands of one moment summed, to hold against NVML's device used of that moment; None when a band is
    missing (then the stack does not claim to add up)."""
    values = [value for name in USED_BAND_NAMES if (value := bands.get(name)) is not None]
    if len(values) < len(USED_BAND_NAMES):
        return None
    total: int = sum(values)
    return total


STACK_TOLERANCE_PERCENT = 1.0
"""How far the used bands' sum may be from the device used they describe."""


def stack_problems(entry: dict[str, Any], where: str = "result") -> list[str]:
    """Why the bands of a result, record or rank entry are not one moment's that add up (empty: they are): a
    negative band, a sum off the device used beside them by more than 1%, a gradients band above the gradients'
    maximum. Ranks are checked too."""
    problems = []
    bands = entry.get("bands") or {}
    for name, value in bands.items():
        if isinstance(value, int) and value < 0:
            problems.append(f"{where}: {name} is negative ({value:,} B)")
    error_percent = stack_sum_error_percent(entry)
    if error_percent is not None and abs(error_percent) > STACK_TOLERANCE_PERCENT:
        problems.append(
            f"{where}: the bands sum to {stack_total_bytes(bands):,} B, {error_percent:+.2f}% off the "
            f"device's {_device_used_bytes(entry):,} B"
        )
    after_backward, alive = entry.get("gradients_after_backward_bytes"), bands.get("gradients_bytes")
    if after_backward is not None and alive is not None and alive > after_backward:
        problems.append(
            f"{where}: gradients alive at the end of forward ({alive:,} B) exceed their maximum after "
            f"backward ({after_backward:,} B)"
        )
    for rank in entry.get("ranks") or []:
        problems.extend(stack_problems(rank, f"{where}, rank {rank.get('rank')}"))
    return problems


def stack_sum_error_percent(entry: dict[str, Any]) -> float | None:
    """How far the used bands' sum is from the device used beside them, in percent; None when one is missing."""
    total, used = stack_total_bytes(entry.get("bands") or {}), _device_used_bytes(entry)
    return 100.0 * (total - used) / used if total is not None and used else None


def _device_used_bytes(entry: dict[str, Any]) -> int | None:
    """The device reading a result's, record's or rank's bands describe (a watch record's rank calls it used_bytes)."""
    return entry.get("device_memory_used_bytes", entry.get("used_bytes"))


def gradients_after_backward_bytes(probe: ProbeBands | None) -> int | None:
    """The gradients' own maximum in the probe's last measured step, after backward: beside the bands, not in them."""
    return probe.gradients_bytes if probe is not None else None


def bands_of_one_moment(result: dict[str, Any]) -> dict[str, Any]:
    """A result or record as it is written now, from one written before the bands were one moment's (until
    gpuanat 0.1's issue #30 the stack's gradients band was their maximum after backward and the gradients alive at
    the end of forward a field beside it): the same numbers, the two swapped, for history rows and committed
    results of then. A current result is returned as it is."""
    if "gradients_at_forward_end_bytes" not in result or "gradients_after_backward_bytes" in result:
        return result
    upgraded = dict(result)
    at_forward_end = upgraded.pop("gradients_at_forward_end_bytes")
    bands = dict(upgraded.get("bands") or {})
    upgraded["gradients_after_backward_bytes"] = bands.get("gradients_bytes")
    if bands:
        bands["gradients_bytes"] = at_forward_end
        upgraded["bands"] = bands
    if isinstance(upgraded.get("ranks"), list):
        upgraded["ranks"] = [
            bands_of_one_moment(rank) if isinstance(rank, dict) else rank for rank in upgraded["ranks"]
        ]
    return upgraded
