"""Whether an exception is the training process running out of memory, and of which allocation.

A GPU run runs out of memory with torch's `OutOfMemoryError` (the caching allocator's); a CPU run with a plain
`RuntimeError` from torch's CPU allocator ("[enforce fail at alloc_cpu.cpp:…] … DefaultCPUAllocator: can't allocate
memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)"), or Python's own `MemoryError`
(numpy's, and C++'s `std::bad_alloc` through pybind11, are subclasses or translations of it). The training child,
the script runner and the probe all end such a run as `oom` (exit 3), whichever memory ran out.

It imports no torch: an error of torch's exists only once torch is imported, so the class is looked up where it is.
"""

from __future__ import annotations

import re
import sys

HOST_ALLOCATOR_FAILURES = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
"""What torch's CPU allocator says when the host has no memory for a tensor (POSIX, and Windows)."""
_EXACT_SIZE = re.compile(r"you tried to allocate (\d+) bytes")
"""The CPU allocator's exact byte count. CUDA's message rounds ("Tried to allocate 20.00 MiB"): not matched."""


def is_gpu_out_of_memory(error: BaseException) -> bool:
    """Torch's `OutOfMemoryError` (`torch.cuda.OutOfMemoryError` is the same class): a device allocator's."""
    torch = sys.modules.get("torch")
    device_error = getattr(torch, "OutOfMemoryError", None)
    return device_error is not None and isinstance(error, device_error)


def is_host_out_of_memory(error: BaseException) -> bool:
    """The host's memory (RAM) ran out: torch's CPU allocator failed, or Python raised `MemoryError`."""
    if isinstance(error, MemoryError):
        return True
    text = str(error) if isinstance(error, RuntimeError) and not is_gpu_out_of_memory(error) else ""
    return any(failure in text for failure in HOST_ALLOCATOR_FAILURES)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is running out of memory: the GPU's (CUDA) or the host's (torch's CPU allocator, MemoryError)."""
    return is_gpu_out_of_memory(error) or is_host_out_of_memory(error)


def failed_allocation_bytes(error: BaseException | str) -> int | None:
    """The exact size of the allocation that failed, from torch's CPU allocator's message ("you tried to allocate N
    bytes"; `error` may be that message); None where the message has no exact count (CUDA's is rounded to two
    decimals of a unit; `MemoryError` says nothing)."""
    match = _EXACT_SIZE.search(str(error))
    return int(match.group(1)) if match else None


def out_of_memory_message(error: BaseException) -> str:
    """One line that says what ran out: torch's first line for a GPU, and for the host "out of host memory (RAM): "
    and what failed (the CPU allocator's message without its source location, or the exception's name)."""
    text = str(error)
    if not is_host_out_of_memory(error):
        return _first_line(text, error)
    for failure in HOST_ALLOCATOR_FAILURES:
        if failure in text:
            text = text[text.index(failure) :]
            break
    return f"out of host memory (RAM): {_first_line(text, error)}"


def _first_line(text: str, error: BaseException) -> str:
    return next((line for line in text.splitlines() if line.strip()), type(error).__name__)
