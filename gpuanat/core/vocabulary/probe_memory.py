"""What the probe measured of memory, as its events carry it: the bands of one moment (`ProbeBands`), memory by
module (`ModuleMemory`), and the state at an out-of-memory failure (`OutOfMemory`, with its `LiveTensor`s). Part of the
child protocol (`protocol`), which checks and decodes them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModuleMemory:
    """One module's memory, by its path in the model (dotted, as `named_modules` names it; "" is the model itself):
    what it holds at the peak of a measured step (the end of its forward pass) or at a failure. The list the probe
    sends is its top modules and one "(the rest)" row, so the rows sum to the probe's totals."""

    module: str
    activations_bytes: int = 0
    """Distinct storages autograd saved for backward while this module's forward ran (innermost module), weights and
    the batch left out, each counted once: where it was first saved."""
    parameters_bytes: int = 0
    """Its own parameters (not its children's), distinct storages."""
    gradients_bytes: int = 0
    """Its parameters' gradients, at their maximum (complete, before the optimizer steps)."""
    optimizer_state_bytes: int = 0
    """The optimizer's state of its parameters."""


MODULES_REST = "(the rest)"
"""The row of a module list that sums the modules past its top ones."""
NO_MODULE = "(no module)"
"""The row of a module list for what no module saved or owns."""


@dataclass(frozen=True)
class ProbeBands:
    """Memory the probe measured inside the training process, in bytes.

    Weights, gradients and optimizer state are exact sums of unique tensor storages.
    """

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int | None
    activations_method: str
    """"allocator": CUDA allocated at the end of forward minus the live set and the batch;
    "saved_tensors": unique storages autograd saved for backward (CPU); "unavailable"."""
    batch_bytes: int
    measured_at_step: int
    gradients_at_forward_end_bytes: int = 0
    """Gradients alive when the forward pass ended (the memory peak): 0 unless accumulating, since the
    Trainer frees them after each optimizer step. Gradients and activations do not peak together."""
    optimizer_state_at_forward_end_bytes: int | None = None
    """Optimizer state alive when the forward pass ended: 0 in the first step (the state is created by the
    first optimizer step), else all of it. None from a probe that did not measure it."""
    forward_peak_allocated_bytes: int | None = None
    """Highest torch allocated memory during the forward pass. Above the end of forward it holds what the
    forward pass frees before it returns: with AMP and checkpointing, autocast's cache of half-precision
    weight copies, emptied when autocast exits."""
    logits_bytes: int | None = None
    """The logits the model returned in that forward pass (part of the activations): a causal LM's
    batch × seq × vocabulary. None from a probe that did not measure them."""
    buffers_at_start_bytes: int | None = None
    """Allocated before the first step beyond weights, gradients and optimizer state: buffers a distributed wrapper
    keeps all run long (DDP's gradient buckets, DeepSpeed's flat buffers); about 0 on one GPU. Not activations:
    they count in temporaries & cache. None on the CPU."""
    modules: list[ModuleMemory] | None = None
    """Memory by module at this moment: the top modules, "(the rest)" and "(no module)" (what no module's forward
    saved or owns: on a GPU the activations band's tensors that are not saved for backward, state kept outside the
    parameters), so each column sums to its band. None where modules are not followed (torch.compile)."""


@dataclass(frozen=True)
class LiveTensor:
    """One live tensor at a failure: which band it is in, the module it belongs to (or was saved in), its bytes."""

    band: str
    """"weights" | "gradients" | "optimizer state" | "activations"."""
    module: str
    bytes: int
    shape: list[int]
    dtype: str


@dataclass(frozen=True)
class OutOfMemory:
    """The allocator's state at the allocation that failed, read when it failed (CUDA's out-of-memory observer; on
    the CPU, from the error and the tensors still alive in its traceback)."""

    phase: str
    """Where the step was: "loading" (before the first step: the model moving to the device), "forward",
    "backward", "optimizer" (the optimizer's step), "between steps"."""
    failed_allocation_bytes: int | None = None
    """The allocation that failed, exact."""
    device_free_bytes: int | None = None
    """What the device had free when it failed (CUDA's count); None on the CPU."""
    device_total_bytes: int | None = None
    allocated_bytes: int | None = None
    """torch's allocated memory then (the live tensors)."""
    reserved_bytes: int | None = None
    """torch's reserved memory then (live tensors and the allocator's cache)."""
    step: int | None = None
    """The optimizer step it was in (from 1); None while loading."""
    module: str | None = None
    """The innermost module whose forward (or backward) was running, by path; None when not known."""
    operation: str | None = None
    """What asked for the memory: the source line that called into torch, or the autograd node in backward."""
    bands: ProbeBands | None = None
    """The tensor bands then; activations are the tensors saved for backward so far when they were tracked
    (`activations_method` "saved_tensors"), else allocated memory less the other bands and the batch; its
    `modules`, memory by module then."""
    nvml_device_used_bytes: int | None = None
    nvml_process_used_bytes: int | None = None
    largest_tensors: list[LiveTensor] | None = None
    """The largest live tensors then, by band and module, largest first."""
    snapshot_path: str | None = None
    """Where the allocator's snapshot of the failure was written (`--keep-oom-snapshot`), for memory_viz."""
