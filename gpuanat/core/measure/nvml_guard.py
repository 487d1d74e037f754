"""NVML calls with a deadline: a driver that stops answering stalls one thread of ours, never the sampler.

A call into NVML cannot be interrupted. `NvmlGuard.run` hands each read to a thread of its own ("gpuanat-nvml") and
waits at most `deadline_s`: past it, the read is left running and `run` returns None at once until it returns, so
the sampler, `watch --json` and the dashboard go on with samples that say the GPU is not answering. `device_fault`
tells the NVML errors that mean the GPU (or the driver) is gone from those that mean one reading is missing;
`GpuFaultLog` sums up the faults a run's samples carried, for its result. The calls at start-up, before any
sample — NVML's initialisation, the GPU list, the source's set-up, the GPUs a run is given — go through
`within_deadline`: a driver that stops answering then delays gpuanat's start by STARTUP_DEADLINE_S, and gpuanat goes
on without the GPU's readings, saying which one did not answer (`not_answering`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuanat.core.measure.samples import Sample
from gpuanat.core.thread_names import name_native_thread

NVML_DEADLINE_S = 2.0
"""How long a sample waits for NVML before it says the GPU is not answering. A whole read takes well under 10 ms
on an H100 (benchmarks/results/h100/watch_cost/sampler_cost.json)."""

DEVICE_FAULTS = {
    "NVMLError_GpuIsLost": "lost",
    "NVMLError_ResetRequired": "needs a reset",
    "NVMLError_Unknown": "not readable",
    "NVMLError_Timeout": "not readable",
    "NVMLError_Uninitialized": "not readable",
    "NVMLError_DriverNotLoaded": "not readable",
    "NVMLError_LibRmVersionMismatch": "not readable",
}
"""NVML's errors that mean the GPU or the driver failed, not one reading (NOT_SUPPORTED, NO_PERMISSION are that),
and what each says of the GPU."""


def device_fault(index: int, error: Exception) -> str | None:
    """ "GPU 1 lost (NVML: GPU is lost)" where `error` says the GPU or the driver failed; None for any other error."""
    state = DEVICE_FAULTS.get(type(error).__name__)
    return f"GPU {index} {state} (NVML: {error})" if state is not None else None


class NvmlProgress:
    """What a series of NVML calls asks about now — "NVML" (its initialisation, the GPU count) or "GPU 1" — so that a
    caller that stopped waiting can say which GPU does not answer."""

    def __init__(self) -> None:
        self.at = "NVML"


STARTUP_DEADLINE_S = NVML_DEADLINE_S
"""How long each step of the start-up (NVML's initialisation and GPU list, the source's set-up, the GPUs a run is
given) waits for NVML before gpuanat goes on without it (`within_deadline`)."""
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


class _Call:
    def __init__(self, read: Callable[[], Any]) -> None:
        self.read = read
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.started_s = time.monotonic()


class NvmlGuard:
    """Runs NVML reads on one thread of their own, each waited for at most `deadline_s`."""

    def __init__(self, deadline_s: float = NVML_DEADLINE_S) -> None:
        self._deadline_s = deadline_s
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stuck: _Call | None = None
        self.cpu_seconds = 0.0
        """CPU time the reads took on the guard's thread."""

    def run(self, read: Callable[[], Any]) -> Any:
        """`read()`'s result (its exception raised here), or None where it did not return within the deadline or
        an earlier read has still not returned."""
        if self._stuck is not None:
            if not self._stuck.done.is_set():
                return None
            self._stuck = None  # it returned: what it read is stale, read again
        call = _Call(read)
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="gpuanat-nvml", daemon=True)
            self._thread.start()
        self._calls.put(call)
        if not call.done.wait(self._deadline_s):
            self._stuck = call
            return None
        if call.error is not None:
            raise call.error
        return call.result

    @property
    def stuck_for_s(self) -> float | None:
        """How long the read that did not return has been waiting; None when none is."""
        stuck = self._stuck
        return time.monotonic() - stuck.started_s if stuck is not None and not stuck.done.is_set() else None

    def close(self) -> None:
        """Let the thread end once it is free (a stuck one is a daemon: it does not hold the process)."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    def _serve(self) -> None:
        name_native_thread()
        while (call := self._calls.get()) is not None:
            started = time.thread_time()
            try:
                call.result = call.read()
            # handed to the caller, which raises it on its own thread
            except BaseException as error:
                call.error = error
            self.cpu_seconds += time.thread_time() - started
            call.done.set()


FAULTS_KEPT = 16
"""The distinct faults a `GpuFaultLog` counts; a fault past them is counted with the samples only."""


class GpuFaultLog:
    """The GPU faults a run's samples carried (`GpuSample.faults`: NVML errors, XIDs), each with the samples it was
    in."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._samples = 0
        self._faulty_at_end = False

    def observe(self, sample: Sample) -> None:
        self._samples += 1
        faults = [fault for gpu in sample.gpus for fault in gpu.faults]
        for fault in faults:
            if fault in self._counts or len(self._counts) < FAULTS_KEPT:
                self._counts[fault] = self._counts.get(fault, 0) + 1
        self._faulty_at_end = bool(faults)

    def summary(self) -> str | None:
        """ "GPU 1 lost (NVML: GPU is lost) in 10 of 40 samples; recovered", or None where no sample had a fault."""
        if not self._counts:
            return None
        faults = "; ".join(f"{fault} in {count} of {self._samples} samples" for fault, count in self._counts.items())
        return f"{faults}; {'still failing at the end' if self._faulty_at_end else 'recovered'}"
