"""NVML that fails on demand: a recorded trace played back through pynvml's names, and faults injected at that
boundary, so a real `gpuanat watch`, dashboard or run meets a GPU that falls over where no GPU is.

Two environment variables, read only by `binding_from_environment` (which `nvml_source` asks):
- `GPUANAT_NVML_REPLAY=TRACE.jsonl`: NVML is `TraceNvml` over a trace a `Sampler` recorded (`--trace-out`): each
  GPU of the trace, its readings advancing one recorded sample per read, from the start again at its end.
- `GPUANAT_NVML_FAULTS=PLAN.json`: the binding (the replay, else pynvml) is wrapped in `FaultyNvml`, which makes
  calls fail as the plan says: `{"faults": [{"gpu": 1, "error": "GPU_IS_LOST", "from_sample": 8,
  "until_sample": 20}, {"gpu": 0, "block_s": 5, "from_sample": 30}]}`. `error` is any NVML_ERROR_ name of pynvml
  (GPU_IS_LOST, UNKNOWN, TIMEOUT, DRIVER_NOT_LOADED, ...): every call on that GPU (and its handle lookup) raises it
  in the samples `from_sample <= n < until_sample` (no `until_sample`: for good); `gpu` null means every call, NVML's
  initialisation included. `block_s` makes the first call on that GPU from `from_sample` on block that long, as a
  driver that stops answering; `xid` has the driver report that XID for the GPU once, at `from_sample`. Samples
  are counted by `NvmlSource`'s reads (`gpuanat_sample_begins`), from 0; `"from_sample": -1, "until_sample": 0` is
  the calls at start-up, before the first sample (`nvml_guard.within_deadline`).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPLAY_VARIABLE = "GPUANAT_NVML_REPLAY"
FAULTS_VARIABLE = "GPUANAT_NVML_FAULTS"


def _nvml_error(name: str) -> Exception:
    import pynvml

    code = getattr(pynvml, f"NVML_ERROR_{name}", None)
    if not isinstance(code, int):
        raise ValueError(f"unknown NVML error {name!r} (one of pynvml's NVML_ERROR_ names: GPU_IS_LOST, UNKNOWN, …)")
    error: Exception = pynvml.NVMLError(code)
    return error


class TraceNvml:
    """NVML's readings from a recorded trace, through pynvml's names (what `NvmlSource` calls). The readings follow
    the trace one sample per `gpuanat_sample_begins`; the GPUs are those of the trace's first sample."""

    def __init__(self, trace: Path) -> None:
        import pynvml

        self.NVMLError = pynvml.NVMLError
        self.nvmlMemory_v2 = pynvml.nvmlMemory_v2
        self.NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
        self.nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
        self._trace_name = trace.name
        self.samples = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines() if line.strip()]
        self.samples = [sample for sample in self.samples if sample.get("gpus")]
        if not self.samples:
            raise ValueError(f"{trace}: no sample with a GPU in this trace")
        self.at = -1
        """The recorded sample the readings come from (the first before any read)."""

    def gpuanat_sample_begins(self) -> None:
        self.at = (self.at + 1) % len(self.samples)

    def _gpu(self, handle: int) -> dict[str, Any]:
        gpus = self.samples[max(self.at, 0)]["gpus"]
        return dict(gpus[handle]) if handle < len(gpus) else dict(self.samples[0]["gpus"][handle])

    def _not_recorded(self) -> Exception:
        return _nvml_error("NOT_SUPPORTED")

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return f"replayed from {self._trace_name}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        raise self._not_recorded()

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, event_set: object) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        raise _nvml_error("TIMEOUT")  # a recording has no events: `FaultyNvml` makes them

    def nvmlEventSetFree(self, event_set: object) -> None:
        pass

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetCount(self) -> int:
        return len(self.samples[0]["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._gpu(handle)["name"])

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: object = None) -> Any:
        gpu = self._gpu(handle)
        if gpu["used_bytes"] is None:
            raise self._not_recorded()
        return _Reading(used=gpu["used_bytes"], total=gpu["total_bytes"], reserved=gpu.get("reserved_bytes"))

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        if gpu["gpu_util_percent"] is None:
            raise self._not_recorded()
        return _Reading(gpu=gpu["gpu_util_percent"], memory=gpu["memory_util_percent"])

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        power_w = self._gpu(handle)["power_w"]
        if power_w is None:
            raise self._not_recorded()
        return round(float(power_w) * 1000)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> float:
        temperature = self._gpu(handle)["temperature_c"]
        if temperature is None:
            raise self._not_recorded()
        return float(temperature)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        processes = self._gpu(handle)["processes"]
        return [_Reading(pid=entry["pid"], usedGpuMemory=entry["used_bytes"]) for entry in processes]

    def nvmlDeviceGetProcessUtilization(self, handle: int, since_us: int) -> list[Any]:
        entries = self._gpu(handle).get("process_utilization")
        if not entries:
            raise _nvml_error("NOT_FOUND")
        stamp_us = 1_000_000 + 250_000 * self.at
        return [
            _Reading(pid=e["pid"], smUtil=e["sm_util_percent"], memUtil=e["memory_util_percent"], timeStamp=stamp_us)
            for e in entries
        ]


class _Reading:
    """One NVML structure's fields, as attributes."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


@dataclass(frozen=True)
class Fault:
    gpu: int | None
    """The GPU index whose calls fail; None: every call, NVML's initialisation included."""
    from_sample: int
    until_sample: int | None
    error: str | None
    """An NVML_ERROR_ name of pynvml; None with `block_s` or `xid`."""
    block_s: float | None
    xid: int | None = None

    def active(self, sample: int) -> bool:
        return self.from_sample <= sample and (self.until_sample is None or sample < self.until_sample)


def load_plan(path: Path) -> list[Fault]:
    """The faults of a plan file (the module's docstring); ValueError where it says something else."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["faults"]
        faults = [
            Fault(
                gpu=None if entry.get("gpu") is None else int(entry["gpu"]),
                from_sample=int(entry.get("from_sample", 0)),
                until_sample=None if entry.get("until_sample") is None else int(entry["until_sample"]),
                error=None if entry.get("error") is None else str(entry["error"]).upper(),
                block_s=None if entry.get("block_s") is None else float(entry["block_s"]),
                xid=None if entry.get("xid") is None else int(entry["xid"]),
            )
            for entry in entries
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a fault plan ({type(error).__name__}: {error})") from error
    for fault in faults:
        if sum(what is not None for what in (fault.error, fault.block_s, fault.xid)) != 1:
            raise ValueError(f"{path}: each fault needs one of error, block_s and xid")
        if fault.xid is not None and fault.gpu is None:
            raise ValueError(f"{path}: an xid is reported for one GPU: give its gpu")
        if fault.error is not None:
            _nvml_error(fault.error)  # an unknown name is said now, not at the fault
    return faults


class FaultyNvml:
    """An NVML binding whose calls fail as `faults` say; everything else is the wrapped binding's."""

    def __init__(self, nvml: Any, faults: list[Fault], *, sleep: Callable[[float], None] = time.sleep) -> None:
        self._nvml = nvml
        self._faults = faults
        self._sleep = sleep
        self._blocked: set[int] = set()
        """The faults that blocked or reported their XID already (each does once)."""
        self._handles: dict[int, Any] = {}
        self._index_of: dict[int, int] = {}
        """Each handle's GPU index, by the handle's id (pynvml's handles are ctypes pointers)."""
        self._lock = threading.Lock()
        self.sample = -1
        """The sample being read, from 0 (-1 before the first)."""

    def gpuanat_sample_begins(self) -> None:
        self.sample += 1
        begins = getattr(self._nvml, "gpuanat_sample_begins", None)
        if begins is not None:
            begins()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(attribute) or isinstance(attribute, type):
            return attribute
        return functools.partial(self._call, name, attribute)

    def _call(self, name: str, call: Callable[..., Any], *args: Any) -> Any:
        if name in ("nvmlShutdown", "nvmlDeviceGetIndex"):  # NVML answers these from what it holds, not the GPU
            return call(*args)
        if name == "nvmlEventSetWait_v2" and (event := self._xid_event()) is not None:
            return event
        gpu = args[0] if name == "nvmlDeviceGetHandleByIndex" else self._index_of.get(id(args[0])) if args else None
        for number, fault in enumerate(self._faults):
            if not fault.active(self.sample) or (fault.gpu is not None and fault.gpu != gpu):
                continue
            if fault.xid is not None:
                continue
            if fault.block_s is not None:
                with self._lock:
                    first = number not in self._blocked
                    self._blocked.add(number)
                if first:
                    self._sleep(fault.block_s)
            elif fault.error is not None:
                raise _nvml_error(fault.error)
        result = call(*args)
        if name == "nvmlDeviceGetHandleByIndex":
            self._index_of[id(result)] = int(args[0])
            self._handles[int(args[0])] = result
        return result

    def _xid_event(self) -> Any:
        """The event of an XID fault due now and not yet reported, as nvmlEventSetWait_v2 gives it; else None."""
        for number, fault in enumerate(self._faults):
            if fault.xid is not None and fault.active(self.sample) and fault.gpu in self._handles:
                with self._lock:
                    if number in self._blocked:
                        continue
                    self._blocked.add(number)
                kind = getattr(self._nvml, "nvmlEventTypeXidCriticalError", 8)
                return _Reading(device=self._handles[fault.gpu], eventType=kind, eventData=fault.xid, gpuInstanceId=0)
        return None


def binding_from_environment(environ: dict[str, str] | None = None) -> Any:
    """The NVML binding the environment asks for (the module's docstring): None where it asks for none (pynvml);
    ValueError where a file it names cannot be used."""
    environ = dict(os.environ) if environ is None else environ
    replay, plan = environ.get(REPLAY_VARIABLE), environ.get(FAULTS_VARIABLE)
    if not replay and not plan:
        return None
    try:
        binding: Any = TraceNvml(Path(replay)) if replay else None
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{REPLAY_VARIABLE}: {type(error).__name__}: {error}") from error
    if plan:
        if binding is None:
            import pynvml

            binding = pynvml
        binding = FaultyNvml(binding, load_plan(Path(plan)))
    return binding
