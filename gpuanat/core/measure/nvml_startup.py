"""NVML at start-up, with a deadline: a driver that stops answering while gpuanat starts delays it by
STARTUP_DEADLINE_S, then gpuanat goes on without the GPU's readings and says why ("GPU 0 not answering (NVML did not
return within 2 s at start-up)").

The sampler's reads have their deadline (`nvml_guard`); the calls before them — NVML's initialisation, the GPU count,
each GPU's handle, name and memory (`probe_nvml`), the source's set-up (`NvmlSource`: GPM support, clocks, XID events),
the GPUs a run is given (`gpus.read_gpus`) — go through the same guard here: `open_source` for the dashboard, `watch`
and runs, `nvml_status` for `predict`, `fit` and `tune`, `read_gpus`. Each uses the binding the environment asks for
(`nvml_faults`: a replayed trace, injected faults), so a fault plan reaches every one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpuanat.core.measure.nvml_faults import binding_from_environment
from gpuanat.core.measure.nvml_guard import NVML_DEADLINE_S, NvmlGuard, NvmlProgress
from gpuanat.core.measure.nvml_source import NvmlSource, _nvml_reason, _unavailable, probe_nvml
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import NvmlStatus, SampleSource

STARTUP_DEADLINE_S = NVML_DEADLINE_S
"""How long each start-up step waits for NVML before gpuanat goes on without it."""
T = TypeVar("T")


def within_deadline(call: Callable[[], T], deadline_s: float = STARTUP_DEADLINE_S) -> T | None:
    """`call()`'s result (its exception raised here), or None where it did not return within `deadline_s`: then it
    is left running on a daemon thread of its own ("gpuanat-nvml"), which does not hold the process at its exit."""
    guard = NvmlGuard(deadline_s)
    try:
        result: T | None = guard.run(call)
        return result
    finally:
        guard.close()


def not_answering(progress: NvmlProgress, deadline_s: float = STARTUP_DEADLINE_S) -> str:
    """ "GPU 0 not answering (NVML did not return within 2 s at start-up)"."""
    return f"{progress.at} not answering (NVML did not return within {deadline_s:g} s at start-up)"


def nvml_status(deadline_s: float = STARTUP_DEADLINE_S) -> NvmlStatus:
    """`probe_nvml` of the binding the environment asks for, within `deadline_s`: unavailable, saying which GPU did
    not answer, where it did not return."""
    try:
        binding = binding_from_environment()
    except ValueError as error:
        return _unavailable(str(error))
    return _probe(binding, deadline_s)


def _probe(binding: Any, deadline_s: float) -> NvmlStatus:
    progress = NvmlProgress()
    status = within_deadline(lambda: probe_nvml(binding, progress), deadline_s)
    return status if status is not None else _unavailable(not_answering(progress, deadline_s))


def open_source(
    prefer_nvml: bool = True, *, per_process: bool = False, deadline_s: float = STARTUP_DEADLINE_S
) -> tuple[SampleSource, NvmlStatus]:
    """`NvmlSource` when NVML works here, else `HostOnlySource`; the status describes the source.

    With `prefer_nvml=False` NVML is not touched at all (for machines where it hangs or misleads);
    `per_process` is passed to the source (each tracked process, per-process GPU utilization). The environment
    may ask for a recorded NVML or injected faults instead of the driver (`nvml_faults`: GPUANAT_NVML_REPLAY,
    GPUANAT_NVML_FAULTS). NVML that does not answer within `deadline_s` at a step of the start-up gives the host's
    source, its status saying so.
    """
    if not prefer_nvml:
        return HostOnlySource(per_process=per_process), _unavailable("NVML not used: turned off by the caller")
    try:
        binding = binding_from_environment()
    except ValueError as error:
        return HostOnlySource(per_process=per_process), _unavailable(str(error))
    status = _probe(binding, deadline_s)
    if not status.available:
        return HostOnlySource(per_process=per_process), status
    try:
        source = within_deadline(lambda: NvmlSource(per_process=per_process, nvml=binding, deadline_s=deadline_s))
    except Exception as error:
        return HostOnlySource(per_process=per_process), _unavailable(f"NVML failed to start: {_nvml_reason(error)}")
    if source is None:
        return HostOnlySource(per_process=per_process), _unavailable(not_answering(NvmlProgress(), deadline_s))
    return source, status
