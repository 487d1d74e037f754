"""An out-of-memory failure in a result: which readings its bands are held against (those of the failing
allocation, not the run's peaks), and the failure itself as the result's `out_of_memory` and `modules`.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gpuanat.core.vocabulary.protocol import Error, ProbeBands

PHASE_WORDS = {
    "loading": "while loading",
    "forward": "in the forward",
    "backward": "in the backward",
    "optimizer": "in the optimizer step",
    "between steps": "between steps",
}
"""An out-of-memory failure's phase (`OutOfMemory.phase`), as a sentence that says where it failed reads it (the CLI's
summary and explain, the dashboard's failure line)."""


@dataclass(frozen=True)
class Readings:
    """The allocator's reserved memory and NVML's device, process and total memory that a set of bands describes."""

    reserved_bytes: int | None
    device_used_bytes: int | None
    process_used_bytes: int | None
    device_total_bytes: int | None


def bands_readings(peaks: Readings, error: Error | None) -> Readings:
    """The readings the bands are held against: the run's `peaks`, unless it ran out of memory and its probe read
    the failing allocation's (then the bands are that moment's, and so are the readings)."""
    failure = error.out_of_memory if error is not None else None
    if failure is None or failure.reserved_bytes is None:
        return peaks
    if failure.nvml_device_used_bytes is None or failure.nvml_process_used_bytes is None:
        return dataclasses.replace(peaks, reserved_bytes=failure.reserved_bytes)
    return Readings(
        reserved_bytes=failure.reserved_bytes,
        device_used_bytes=failure.nvml_device_used_bytes,
        process_used_bytes=failure.nvml_process_used_bytes,
        device_total_bytes=failure.device_total_bytes or peaks.device_total_bytes,
    )


def read_the_gpu(error: Error | None) -> bool:
    """Whether the probe read NVML's device memory at the failing allocation of an out-of-memory `error`: then the
    bands of that moment are whole without a sample of the GPU (a watch or a dashboard that has none)."""
    failure = error.out_of_memory if error is not None else None
    return failure is not None and failure.nvml_device_used_bytes is not None


def out_of_memory_json(error: Error | None, rank: int) -> dict[str, Any] | None:
    """A result's `out_of_memory`: the failing allocation (`protocol.OutOfMemory` but its bands, which are the
    failing rank's `bands`) and that `rank`; None when the run did not run out of memory or its probe did not say
    where."""
    if error is None or error.out_of_memory is None:
        return None
    failure = dataclasses.asdict(error.out_of_memory)
    failure.pop("bands")
    return {"rank": rank, **failure}


def modules_json(bands: ProbeBands | None) -> list[dict[str, Any]] | None:
    """A result's `modules`: memory by module of the bands it shows; None where the probe did not follow modules."""
    if bands is None or bands.modules is None:
        return None
    return [dataclasses.asdict(row) for row in bands.modules]
