"""The memory anatomy: GPU memory split into bands that add up to what NVML reports as used.

Bands, bottom to top (DESIGN.md): other processes, CUDA context & kernels, weights, gradients,
optimizer states, activations, temporaries & allocator cache, free. The probe measures the tensor
bands inside the training process; NVML, read by the parent, gives the device and per-process use.
A band that cannot be measured is None, with the reason in `unavailable` — never a guess.

The tensor bands are the sizes of each kind of tensor. Gradients and activations do not peak
together: the Trainer frees gradients after each optimizer step, so at the end of the forward pass —
the peak — only accumulated gradients are alive, and in the first step no optimizer state yet. The
other bands are taken at that moment, so
other processes + context + weights + gradients alive at the peak + optimizer state + activations +
temporaries & cache = NVML device used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.run.protocol import ProbeBands

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
    end of the forward pass (the peak): the batch, transient buffers and the allocator's cache."""
    free_bytes: int | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    """Band name -> why it is None."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
        ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes"))
    if probe is None:
        for name in tensor_bands:
            unavailable[name] = "the probe has not measured a step yet"
    else:
        # The optimizer state as at the end of forward, like the other bands: none yet in the first step.
        optimizer_state = (probe.optimizer_state_at_forward_end_bytes
                           if probe.optimizer_state_at_forward_end_bytes is not None else probe.optimizer_state_bytes)
        tensor_bands.update(weights_bytes=probe.weights_bytes, gradients_bytes=probe.gradients_bytes,
                            optimizer_state_bytes=optimizer_state, activations_bytes=probe.activations_bytes)
        if probe.activations_bytes is None:
            unavailable["activations_bytes"] = "not measurable with torch.compile on CPU"
    if no_gpu_reason is not None:
        for name in ("other_processes_bytes", "cuda_context_bytes", "temporaries_and_cache_bytes", "free_bytes"):
            unavailable[name] = no_gpu_reason
        return MemoryBands(**tensor_bands, unavailable=unavailable)

    other = _difference(device_used_bytes, process_used_bytes)
    context = _difference(process_used_bytes, reserved_bytes)
    # At the peak (end of forward) only the gradients kept by accumulation are alive, not all of them.
    gradients_at_peak = probe.gradients_at_forward_end_bytes if probe is not None else None
    cache = _difference(reserved_bytes, tensor_bands["weights_bytes"], gradients_at_peak,
                        tensor_bands["optimizer_state_bytes"], tensor_bands["activations_bytes"])
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
        unavailable["other_processes_bytes"] = (f"this run's processes used more ({process_used_bytes:,} B) than NVML "
                                                f"counted on the device ({device_used_bytes:,} B)")
        other = None
    if context is not None and context < 0:
        unavailable["cuda_context_bytes"] = (f"torch reserved more ({reserved_bytes:,} B) than NVML counted for the "
                                             f"process ({process_used_bytes:,} B)")
        context = None
    if cache is not None and cache < 0:
        unavailable["temporaries_and_cache_bytes"] = (f"the tensor bands add up to more than torch reserved "
                                                      f"({reserved_bytes:,} B), by {-cache:,} B")
        cache = None
    if free is not None and free < 0:
        unavailable["free_bytes"] = f"NVML counted more used ({device_used_bytes:,} B) than total memory"
        free = None
    return MemoryBands(other_processes_bytes=other, cuda_context_bytes=context, **tensor_bands,
                       temporaries_and_cache_bytes=cache, free_bytes=free, unavailable=unavailable)
