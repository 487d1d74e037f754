"""What torch's caching allocator reserves for a run, from replaying the run's derived allocation stream
(`allocation_stream`) through the allocator's rules (`allocator`): the reserve above the peak allocated memory (what
nvidia-smi shows beyond the tensors), and whether the run fits a GPU — the allocator at the limit giving its cached
segments back and trying again, as torch's does.

The bytes model's peak allocated memory is the better-checked number (docs/memory-model.md); the stream's own peak
differs from it by a few percent (it lists the larger tensors one by one and leaves small ones out). So the reserve
is the replay's reserved less the stream's own peak, added to the bytes model's peak; and the fit replays the stream
against the allocator's capacity less that difference. Pure Python, no torch: about 0.01-0.05 s a replay.
"""

from __future__ import annotations

import functools

from gpuanat.core.memory.allocation_stream import AllocationStream, stream_for
from gpuanat.core.memory.allocator import replay
from gpuanat.core.memory.bands.precision import is_mixed
from gpuanat.core.memory.model_config import UnreadableModel, architecture_of
from gpuanat.core.vocabulary.config import RunConfig

MIB = 1 << 20
UNBOUNDED_BYTES = 1 << 50
"""A capacity no run reaches: the reserve the allocator builds when memory is not short."""
UNAVAILABLE_TO_ALLOCATOR_BYTES = {False: 1247 * MIB, True: 1263 * MIB}
"""An H100's NVML total less what torch's allocator could reserve, with fp32 and with mixed precision (whose kernels
take 16 MiB more), read at the end of recorded runs (docs/allocator-replay.md; benchmarks/results/h100/allocator/)."""


@functools.lru_cache(maxsize=256)
def _stream(config: RunConfig) -> AllocationStream | None:
    try:
        return stream_for(config, architecture_of(config))
    except UnreadableModel:
        return None


@functools.lru_cache(maxsize=256)
def reserve_above_peak_bytes(config: RunConfig) -> int | None:
    """What the allocator holds above the most allocated at once, where memory is not short; None where no stream
    describes the run (`allocation_stream.stream_for`)."""
    stream = _stream(config)
    if stream is None:
        return None
    replayed = replay(stream.operations, stream.sizes, UNBOUNDED_BYTES, expandable_segments=config.expandable_segments)
    return max(0, replayed.peak_reserved_bytes - stream.peak_allocated_bytes)


def allocator_capacity_bytes(config: RunConfig, gpu_memory_bytes: int) -> int:
    """What torch's allocator can reserve on a GPU of `gpu_memory_bytes` (NVML's total)."""
    return gpu_memory_bytes - UNAVAILABLE_TO_ALLOCATOR_BYTES[is_mixed(config)]


@functools.lru_cache(maxsize=1024)
def fits_replayed(config: RunConfig, peak_allocated_bytes: int, gpu_memory_bytes: int) -> bool | None:
    """Whether the run fits: its stream replayed against the allocator's capacity, shifted by what the bytes model's
    peak (`peak_allocated_bytes`) has above the stream's. None where no stream describes the run."""
    stream = _stream(config)
    if stream is None:
        return None
    capacity = allocator_capacity_bytes(config, gpu_memory_bytes) - (peak_allocated_bytes - stream.peak_allocated_bytes)
    if capacity <= 0:
        return False
    return replay(stream.operations, stream.sizes, capacity, expandable_segments=config.expandable_segments).fits
