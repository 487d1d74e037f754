"""The device's memory counters, read from inside the training process: torch's caching allocator (one read of its
statistics) and NVML's view of this process's GPU (`NvmlReader`), taken at the same instant as the allocator's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from gpuanat.core.measure.nvml_source import nvml_memory_info, nvml_processes


def allocator_bytes(device: torch.device) -> tuple[int, int, int]:
    """(allocated, peak allocated since the last reset, reserved) from one read of the allocator's counters:
    `torch.cuda.memory_allocated` and friends each build and flatten the whole statistics dictionary."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    allocated = stats.get("allocated_bytes", {}).get("all", {})
    return (
        allocated.get("current", 0),
        allocated.get("peak", 0),
        stats.get("reserved_bytes", {}).get("all", {}).get("current", 0),
    )


class NvmlReader:
    """NVML's view of the training GPU, read from inside the training process: device memory used (v2,
    the same reading as the parent's sampler) and this process's own use."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, device: torch.device) -> NvmlReader | None:
        """The reader for `device`, found by UUID (so CUDA_VISIBLE_DEVICES does not matter); None where NVML
        is missing or does not know the device (then the steps carry no NVML reading)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no driver library, or nvidia-ml-py missing: the parent says why
            return None
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid))
        except Exception:
            pynvml.nvmlShutdown()
            return None

    def read(self) -> tuple[int | None, int | None]:
        """(device used, this process's used) in bytes; None for what NVML does not give."""
        memory = nvml_memory_info(self._nvml, self._handle)
        if memory is None:
            return None, None
        own = [
            process.usedGpuMemory for process in nvml_processes(self._nvml, self._handle) if process.pid == os.getpid()
        ]
        return int(memory.used), (int(own[0]) if own and own[0] is not None else None)

    def identity(self) -> tuple[int | None, str | None, str | None, int | None]:
        """The GPU's NVML index, UUID, name and total bytes (the metrics' labels)."""
        from gpuanat.core.export.probe_metrics import gpu_identity

        return gpu_identity(self._nvml, self._handle)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
