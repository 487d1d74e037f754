"""GPU and host sampling: what NVML and psutil say about the device and the tracked processes.

A `Sampler` owns one background thread that reads a source every `interval_s` and hands each
`Sample` to a callback; it never touches the UI. Sources:

- `NvmlSource`: the real device through NVML (pynvml, imported lazily so this module loads
  without it), plus host metrics of the tracked processes;
- `HostOnlySource`: host metrics only, for machines where NVML is unavailable;
- `ReplaySource`: plays back a JSON-lines trace that a `Sampler` recorded (`trace_path`), so
  tests run the real sampling code on data recorded on a real GPU;
- `ReplayGpuSource`: the GPUs of a recorded trace with live host metrics, so tests watch a real
  process through recorded NVML data.

`probe_nvml()` says whether NVML works here and, when it does not, why, in words a user can act
on; `open_source()` picks the best source accordingly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TextIO

import psutil

from gpuanat.core.thread_names import name_native_thread

DEFAULT_DESCENDANTS_REFRESH_S = 1.0
"""How often the process tree under the tracked pids is re-walked. Walking it reads /proc/*/stat for
every process on the machine (1.9 ms of CPU at 190 processes on the H100 machine), too much to do at 4 Hz;
DataLoader workers and other descendants are picked up within this delay, or within
`DESCENDANTS_REFRESH_MAX_S` once the tree has stayed the same."""

DESCENDANTS_REFRESH_MAX_S = 4.0
"""The longest wait between walks: each walk that finds the tree unchanged doubles the wait up to this, and a
change (a process new or gone, other tracked pids) brings it back to the refresh interval."""

PROCESS_UTILIZATION_REFRESH_S = 1.0
"""How often each process's GPU utilization is read. NVML's nvmlDeviceGetProcessUtilization cost 2.3 ms of CPU a
call on the H100 (the memory, utilization, power, temperature and process list together 0.05 ms;
benchmarks/results/h100/watch_cost/sampler_cost.json): read at every 0.25 s sample it was half the watch's sampling.
Each read is NVML's mean since the previous one, and the samples between carry it."""


def _flat_fields(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, in their order, as they are (those of the samples are numbers, strings, None
    and tuples that the callers convert)."""
    return {field.name: getattr(instance, field.name) for field in dataclasses.fields(instance)}


@dataclass(frozen=True)
class ProcessGpuMemory:
    """One compute process as NVML lists it on one GPU."""

    pid: int
    """As NVML reports it: the host PID namespace, which differs from ours inside a container."""
    used_bytes: int | None
    """None when NVML does not report it (MIG, no permission)."""


@dataclass(frozen=True)
class ProcessUtilization:
    """One process's share of one GPU over the last sample period (nvmlDeviceGetProcessUtilization)."""

    pid: int
    """In NVML's PID namespace, like `ProcessGpuMemory.pid`."""
    sm_util_percent: float
    """Share of the period in which this process's kernels ran."""
    memory_util_percent: float


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. Every reading is None when NVML could not give it."""

    index: int
    name: str
    used_bytes: int | None
    """NVML memory info v2 `used`, which excludes driver-reserved memory. With only v1 available
    it is v1 `used`, which includes the reserved memory (and `reserved_bytes` is None)."""
    total_bytes: int | None
    reserved_bytes: int | None
    """v2 `reserved`: set aside by the driver and firmware; None when only v1 is available."""
    gpu_util_percent: float | None
    """Share of the last sample period in which a kernel ran (not how busy the SMs were)."""
    memory_util_percent: float | None
    """Share of the last sample period in which device memory was read or written."""
    power_w: float | None
    temperature_c: float | None
    processes: tuple[ProcessGpuMemory, ...]
    """Every compute process NVML lists on this GPU; empty also when the list could not be read."""
    process_utilization: tuple[ProcessUtilization, ...] | None = None
    """Per-process utilization since the previous read, for the processes that used the GPU in that time;
    None when it was not read (the default) or this GPU does not report it."""

    def to_json(self) -> dict[str, Any]:
        fields = _flat_fields(self)  # taken at every sample: not dataclasses.asdict, which deep-copies each field
        fields["processes"] = [_flat_fields(process) for process in self.processes]
        if self.process_utilization is None:
            del fields["process_utilization"]  # traces recorded without it stay as they were
        else:
            fields["process_utilization"] = [_flat_fields(entry) for entry in self.process_utilization]
        return fields

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        utilization = d.get("process_utilization")
        return cls(**{**d, "processes": tuple(ProcessGpuMemory(**p) for p in d["processes"]),
                      "process_utilization": None if utilization is None
                      else tuple(ProcessUtilization(**entry) for entry in utilization)})


@dataclass(frozen=True)
class HostProcess:
    """One process of the tracked tree, as psutil read it."""

    pid: int
    parent_pid: int | None
    name: str
    cpu_percent: float
    rss_bytes: int


@dataclass(frozen=True)
class HostSample:
    """CPU and memory of the tracked processes and all their descendants, summed."""

    cpu_percent: float | None
    """Percent of one core, so a process busy on 4 cores reads 400. A process read for the first
    time counts 0.0 (psutil needs two readings to know a rate). None when nothing could be read."""
    rss_bytes: int | None
    processes: tuple[HostProcess, ...] = ()
    """Each process that was measured, when the source was asked for them (`per_process=True`)."""

    def to_json(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"cpu_percent": self.cpu_percent, "rss_bytes": self.rss_bytes}
        if self.processes:
            fields["processes"] = [_flat_fields(process) for process in self.processes]
        return fields

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostSample:
        return cls(cpu_percent=d["cpu_percent"], rss_bytes=d["rss_bytes"],
                   processes=tuple(HostProcess(**process) for process in d.get("processes", ())))


@dataclass(frozen=True)
class Sample:
    """Everything one read of a source returns."""

    t_s: float
    """Seconds on the sampler's clock (monotonic); the recorded time when replaying a trace."""
    gpus: tuple[GpuSample, ...]
    host: HostSample

    def process_used_bytes(self, pids: Iterable[int]) -> int | None:
        """GPU memory NVML reports for `pids`, summed over all GPUs.

        None when there is no GPU, or when none of `pids` has a reported usage: not on a GPU yet,
        MIG or no permission, or PIDs from another PID namespace than NVML's.
        """
        wanted = set(pids)
        reported = [
            process.used_bytes
            for gpu in self.gpus
            for process in gpu.processes
            if process.pid in wanted and process.used_bytes is not None
        ]
        return sum(reported) if reported else None

    def to_json(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "gpus": [gpu.to_json() for gpu in self.gpus],
            "host": self.host.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Sample:
        return cls(
            t_s=d["t_s"],
            gpus=tuple(GpuSample.from_json(gpu) for gpu in d["gpus"]),
            host=HostSample.from_json(d["host"]),
        )


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML works on this machine, and what it found."""

    available: bool
    reason: str | None
    """Why NVML is not available, as a sentence for the user; None when it is."""
    driver_version: str | None
    cuda_driver_version: int | None
    """As NVML gives it: 12040 means CUDA 12.4."""
    gpu_names: tuple[str, ...]
    gpu_total_bytes: tuple[int, ...] = ()
    """Total memory of each GPU (NVML memory info), in the order of `gpu_names`."""


class SampleSource(Protocol):
    """What the `Sampler` reads from."""

    keeps_recorded_time: ClassVar[bool]
    """True when `read` returns recorded timestamps that must be kept (replay); False for live
    sources, whose samples the `Sampler` stamps with its own clock."""

    def read(self, pids: Iterable[int]) -> Sample:
        """One sample, with host metrics for `pids` and their descendants."""
        ...

    def close(self) -> None: ...


_NVML_REASONS = {
    "NVMLError_LibraryNotFound": (
        "NVML not found: no NVIDIA driver on this machine (libnvidia-ml.so.1 could not be loaded)"
    ),
    "NVMLError_DriverNotLoaded": (
        "NVIDIA driver not loaded: the NVML library is installed but the kernel module is not running"
    ),
    "NVMLError_LibRmVersionMismatch": (
        "driver/library version mismatch: the loaded NVIDIA kernel module and the NVML library differ,"
        " usually after a driver upgrade without a reboot"
    ),
    "NVMLError_NotSupported": "NVML not supported by this driver or device",
    "NVMLError_NoPermission": "no permission to use NVML: check access to /dev/nvidia*",
    "NVMLError_GpuIsLost": "the GPU is lost (fell off the bus or stopped responding): check dmesg",
    "NVMLError_FunctionNotFound": "the NVIDIA driver is too old for this pynvml: a function is missing",
    "NVMLError_Uninitialized": "NVML could not be initialised",
}


def _nvml_reason(error: Exception) -> str:
    return _NVML_REASONS.get(type(error).__name__, f"NVML error: {error}")


def _unavailable(reason: str) -> NvmlStatus:
    return NvmlStatus(available=False, reason=reason, driver_version=None, cuda_driver_version=None, gpu_names=())


def probe_nvml() -> NvmlStatus:
    """Initialise NVML, describe what it sees and shut it down again. Never raises."""
    try:
        import pynvml
    except ImportError:
        return _unavailable("pynvml is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return _unavailable(_nvml_reason(error))
    # Anything unexpected from a broken driver stack must still become a status, never a crash.
    except Exception as error:
        return _unavailable(f"NVML could not be initialised: {type(error).__name__}: {error}")
    try:
        driver_version = _nvml_or_none(pynvml, pynvml.nvmlSystemGetDriverVersion)
        cuda_driver_version = _nvml_or_none(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
        handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]
        gpu_names = tuple(_device_name(pynvml, handle, index) for index, handle in enumerate(handles))
        gpu_total_bytes = tuple(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) for handle in handles)
    except pynvml.NVMLError as error:
        return _unavailable(_nvml_reason(error))
    except Exception as error:
        return _unavailable(f"NVML failed while listing GPUs: {type(error).__name__}: {error}")
    finally:
        _shutdown_nvml(pynvml)
    return NvmlStatus(
        available=bool(gpu_names),
        reason=None if gpu_names else "NVML works but lists no NVIDIA GPU",
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
        gpu_names=gpu_names,
        gpu_total_bytes=gpu_total_bytes,
    )


def _shutdown_nvml(pynvml: Any) -> None:
    # Shutting down a half-broken NVML has nothing left to release.
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()


def _nvml_or_none(pynvml: Any, read: Callable[..., Any], *args: Any) -> Any:
    """`read(*args)`, or None when NVML reports an error for this one reading."""
    try:
        return read(*args)
    except pynvml.NVMLError:
        return None


def nvml_memory_info(pynvml: Any, handle: Any) -> Any:
    """The device's memory: NVML's v2 reading, which separates the driver's reserved memory, where the driver
    gives it, else v1 (no `reserved`); None when NVML reports an error."""
    memory = _nvml_or_none(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle, pynvml.nvmlMemory_v2)
    return memory if memory is not None else _nvml_or_none(pynvml, pynvml.nvmlDeviceGetMemoryInfo, handle)


def nvml_processes(pynvml: Any, handle: Any) -> list[Any]:
    """The compute processes NVML lists on the device (pid, usedGpuMemory); empty when it reports an error."""
    return _nvml_or_none(pynvml, pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []


def _device_name(pynvml: Any, handle: Any, index: int) -> str:
    name = _nvml_or_none(pynvml, pynvml.nvmlDeviceGetName, handle)
    return name if name is not None else f"GPU {index}"


class _HostProcessMeter:
    """CPU and RSS of the tracked pids and their descendants, through cached psutil processes.

    psutil's `cpu_percent` is the CPU time since the previous call on the same `Process` object,
    so the objects are kept between reads; a process met for the first time reads 0.0.
    """

    def __init__(self, descendants_refresh_s: float, per_process: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._descendants_refresh_s = descendants_refresh_s
        self._per_process = per_process
        self._clock = clock
        self._processes: dict[int, psutil.Process] = {}
        self._roots: frozenset[int] = frozenset()
        self._tree_walked_at_s = -math.inf
        self._walk_wait_s = descendants_refresh_s

    def measure(self, pids: Iterable[int]) -> HostSample:
        roots = frozenset(pids)
        now_s = self._clock()
        if roots != self._roots or now_s - self._tree_walked_at_s >= self._walk_wait_s:
            walked = self._walk_tree(roots)
            unchanged = roots == self._roots and walked.keys() == self._processes.keys()
            self._walk_wait_s = (min(2 * self._walk_wait_s, max(DESCENDANTS_REFRESH_MAX_S, self._descendants_refresh_s))
                                 if unchanged else self._descendants_refresh_s)
            self._processes = walked
            self._roots = roots
            self._tree_walked_at_s = now_s
        cpu_percent = 0.0
        rss_bytes = 0
        measured = 0
        details: list[HostProcess] = []
        for pid, process in list(self._processes.items()):
            try:
                with process.oneshot():
                    process_cpu_percent = process.cpu_percent(interval=None)
                    process_rss_bytes = process.memory_info().rss
                    if self._per_process:
                        details.append(HostProcess(pid=pid, parent_pid=process.ppid(), name=process.name(),
                                                   cpu_percent=process_cpu_percent, rss_bytes=process_rss_bytes))
            except psutil.NoSuchProcess:
                del self._processes[pid]
                continue
            except psutil.AccessDenied:
                continue
            cpu_percent += process_cpu_percent
            rss_bytes += process_rss_bytes
            measured += 1
        if not measured:
            return HostSample(cpu_percent=None, rss_bytes=None)
        return HostSample(cpu_percent=cpu_percent, rss_bytes=rss_bytes, processes=tuple(details))

    def _walk_tree(self, roots: frozenset[int]) -> dict[int, psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in roots:
            root = self._processes.get(pid)
            try:
                if root is None or not root.is_running():
                    root = psutil.Process(pid)
                found[pid] = root
                descendants = root.children(recursive=True)
            except psutil.Error:
                continue
            for child in descendants:
                cached = self._processes.get(child.pid)
                # psutil compares pid and creation time, so a reused pid is a new process.
                found[child.pid] = cached if cached == child else child
        return found

    def clear(self) -> None:
        self._processes = {}
        self._roots = frozenset()
        self._tree_walked_at_s = -math.inf
        self._walk_wait_s = self._descendants_refresh_s


class HostOnlySource:
    """Host metrics of the tracked processes when NVML is unavailable: `gpus` is always empty.

    With `per_process=True` each sample also lists every process of the tree (`HostSample.processes`)."""

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(self, *, descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S,
                 per_process: bool = False) -> None:
        self._host = _HostProcessMeter(descendants_refresh_s, per_process)

    def read(self, pids: Iterable[int]) -> Sample:
        return Sample(t_s=time.monotonic(), gpus=(), host=self._host.measure(pids))

    def close(self) -> None:
        self._host.clear()


class NvmlSource:
    """Every GPU through NVML, plus host metrics of the tracked processes.

    The constructor initialises NVML and raises `pynvml.NVMLError` when that fails (`open_source`
    falls back to `HostOnlySource`). After that, an NVML error on any one reading makes that
    reading None; `read` itself does not raise. `per_process=True` lists each tracked process
    (`HostSample.processes`) and reads per-process GPU utilization (`GpuSample.process_utilization`)
    once every `PROCESS_UTILIZATION_REFRESH_S`.
    """

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(self, *, descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S,
                 per_process: bool = False, nvml: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`nvml` is the NVML binding (default: `pynvml`); `clock` paces the per-process utilization reads
        (`PROCESS_UTILIZATION_REFRESH_S`) and stamps the samples."""
        if nvml is None:
            import pynvml as nvml

        pynvml = self._nvml = nvml
        self._clock = clock
        pynvml.nvmlInit()
        self._closed = False
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:
            self.close()
            raise
        self._devices = [(index, handle, _device_name(pynvml, handle, index)) for index, handle in enumerate(handles)]
        self._host = _HostProcessMeter(descendants_refresh_s, per_process)
        self._per_process = per_process
        self._utilization_seen_us = dict.fromkeys(range(len(handles)), 0)
        """Per GPU, the newest per-process utilization timestamp read so far (NVML's microseconds)."""
        self._process_utilization: dict[int, tuple[ProcessUtilization, ...] | None] = {}
        """Per GPU, the last per-process utilization read, carried by the samples until the next read."""
        self._process_utilization_read_at_s = -math.inf

    def read(self, pids: Iterable[int]) -> Sample:
        t_s = self._clock()
        if self._per_process and t_s - self._process_utilization_read_at_s >= PROCESS_UTILIZATION_REFRESH_S:
            self._process_utilization_read_at_s = t_s
            self._process_utilization = {index: self._read_process_utilization(index, handle)
                                         for index, handle, _name in self._devices}
        gpus = tuple(self._read_gpu(index, handle, name) for index, handle, name in self._devices)
        return Sample(t_s=t_s, gpus=gpus, host=self._host.measure(pids))

    def _read_gpu(self, index: int, handle: Any, name: str) -> GpuSample:
        nvml = self._nvml
        memory = nvml_memory_info(nvml, handle)
        reserved_bytes = getattr(memory, "reserved", None)
        utilization = _nvml_or_none(nvml, nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = _nvml_or_none(nvml, nvml.nvmlDeviceGetPowerUsage, handle)
        processes = nvml_processes(nvml, handle)
        return GpuSample(
            index=index,
            name=name,
            used_bytes=int(memory.used) if memory is not None else None,
            total_bytes=int(memory.total) if memory is not None else None,
            reserved_bytes=int(reserved_bytes) if reserved_bytes is not None else None,
            gpu_util_percent=float(utilization.gpu) if utilization is not None else None,
            memory_util_percent=float(utilization.memory) if utilization is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            temperature_c=self._read_temperature_c(handle),
            processes=tuple(
                ProcessGpuMemory(
                    pid=int(process.pid),
                    used_bytes=int(process.usedGpuMemory) if process.usedGpuMemory is not None else None,
                )
                for process in processes
            ),
            process_utilization=self._process_utilization.get(index),
        )

    def _read_process_utilization(self, index: int, handle: Any) -> tuple[ProcessUtilization, ...] | None:
        """Each process's mean SM and memory utilization over NVML's samples since the previous read."""
        nvml = self._nvml
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, self._utilization_seen_us[index])
        except nvml.NVMLError as error:
            # NOT_FOUND: no process used the GPU since the previous read, which is a reading of zero.
            return () if type(error).__name__ == "NVMLError_NotFound" else None
        by_pid: dict[int, list[tuple[float, float]]] = {}
        for sample in samples:
            by_pid.setdefault(int(sample.pid), []).append((float(sample.smUtil), float(sample.memUtil)))
            self._utilization_seen_us[index] = max(self._utilization_seen_us[index], int(sample.timeStamp))
        return tuple(
            ProcessUtilization(pid=pid, sm_util_percent=sum(sm for sm, _ in values) / len(values),
                               memory_util_percent=sum(memory for _, memory in values) / len(values))
            for pid, values in sorted(by_pid.items())
        )

    def _read_temperature_c(self, handle: Any) -> float | None:
        nvml = self._nvml
        # nvmlDeviceGetTemperatureV is the current call; older drivers and pynvml releases only
        # have the deprecated nvmlDeviceGetTemperature.
        temperature = None
        if hasattr(nvml, "nvmlDeviceGetTemperatureV"):
            temperature = _nvml_or_none(nvml, nvml.nvmlDeviceGetTemperatureV, handle, nvml.NVML_TEMPERATURE_GPU)
        if temperature is None:
            temperature = _nvml_or_none(nvml, nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        return float(temperature) if temperature is not None else None

    def close(self) -> None:
        """Shut NVML down; idempotent."""
        if not self._closed:
            self._closed = True
            _shutdown_nvml(self._nvml)


class ReplaySource:
    """Plays back a trace recorded by `Sampler(trace_path=...)`: one `Sample.to_json` per line.

    Each `read` returns the next recorded sample with its recorded `t_s` and host metrics (the
    `pids` argument is ignored), and raises `StopIteration` after the last one. The whole trace is
    parsed up front, so a malformed line fails the constructor with its line number.
    """

    keeps_recorded_time: ClassVar[bool] = True

    def __init__(self, path: Path | str, *, remap_pids: dict[int, int] | None = None) -> None:
        """`remap_pids` maps recorded GPU process PIDs onto others, e.g. the recorded training
        PID onto a live one, so code that looks up its own PID finds the recorded usage."""
        self.path = Path(path)
        self._remap_pids = dict(remap_pids or {})
        self._samples = self._load()
        self._next: Iterator[Sample] = iter(self._samples)

    def _load(self) -> list[Sample]:
        samples = []
        with self.path.open(encoding="utf-8") as trace:
            for line_number, line in enumerate(trace, start=1):
                if not line.strip():
                    continue
                try:
                    sample = Sample.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError) as error:
                    raise ValueError(f"{self.path}:{line_number}: not a recorded sample: {error}") from error
                samples.append(self._remapped(sample))
        return samples

    def _remapped(self, sample: Sample) -> Sample:
        if not self._remap_pids:
            return sample
        gpus = tuple(
            dataclasses.replace(
                gpu,
                processes=tuple(
                    dataclasses.replace(process, pid=self._remap_pids.get(process.pid, process.pid))
                    for process in gpu.processes
                ),
                process_utilization=None if gpu.process_utilization is None else tuple(
                    dataclasses.replace(entry, pid=self._remap_pids.get(entry.pid, entry.pid))
                    for entry in gpu.process_utilization
                ),
            )
            for gpu in sample.gpus
        )
        return dataclasses.replace(sample, gpus=gpus)

    def __len__(self) -> int:
        return len(self._samples)

    def read(self, pids: Iterable[int]) -> Sample:
        return next(self._next)

    def close(self) -> None:
        self._next = iter(())


class ReplayGpuSource:
    """The GPUs of a recorded trace, one sample per read, with live host metrics of the tracked processes.

    Tests watch a real process through real NVML data this way. Samples are stamped live; `read` raises
    `StopIteration` after the last recorded one.
    """

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(self, replay: ReplaySource, *, per_process: bool = True,
                 descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S) -> None:
        self._replay = replay
        self._host = _HostProcessMeter(descendants_refresh_s, per_process)

    def read(self, pids: Iterable[int]) -> Sample:
        pids = frozenset(pids)
        recorded = self._replay.read(pids)
        return Sample(t_s=time.monotonic(), gpus=recorded.gpus, host=self._host.measure(pids))

    def close(self) -> None:
        self._replay.close()
        self._host.clear()


class Sampler:
    """Reads a source every `interval_s` on a background thread and passes each sample to `on_sample`.

    `on_sample` runs on the sampler thread: it must hand the sample over (post a message, append
    to a buffer) and never touch the UI. An exception from the source or the callback is kept in
    `last_error` and sampling goes on; the thread ends by itself only when a replayed trace ends.
    The source is the caller's: `stop` does not close it.
    """

    def __init__(
        self,
        source: SampleSource,
        *,
        interval_s: float = 0.25,
        on_sample: Callable[[Sample], None],
        clock: Callable[[], float] = time.monotonic,
        trace_path: Path | None = None,
    ) -> None:
        """`clock` stamps live samples (`t_s`); the pacing of reads always uses real time.
        `trace_path`, when given, gets every sample appended as one JSON line, flushed per line:
        this is how traces are recorded on a GPU machine for `ReplaySource`."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._source = source
        self._interval_s = interval_s
        self._on_sample = on_sample
        self._clock = clock
        self._trace_path = trace_path
        self._trace_file: TextIO | None = None
        self._pids: set[int] = set()
        self._pids_lock = threading.Lock()
        self._listeners: tuple[Callable[[Sample], None], ...] = ()
        # Serialises reads, trace writes and closing the trace between the thread and sample_once.
        self._read_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_seconds = 0.0
        self._last_error: str | None = None

    def track(self, pid: int) -> None:
        """Include `pid` and its descendants in host metrics from the next read on."""
        with self._pids_lock:
            self._pids.add(pid)

    def untrack(self, pid: int) -> None:
        with self._pids_lock:
            self._pids.discard(pid)

    def add_listener(self, listener: Callable[[Sample], None]) -> None:
        """Also hand each sample the thread takes to `listener` (after `on_sample`), until `remove_listener`: a
        second consumer, such as a run inside the dashboard, shares the reads instead of making its own."""
        with self._pids_lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[Sample], None]) -> None:
        with self._pids_lock:
            self._listeners = tuple(known for known in self._listeners if known != listener)

    def sample_once(self) -> Sample:
        """Read the source now, on the calling thread (recorded to the trace like any sample)."""
        with self._pids_lock:
            pids = frozenset(self._pids)
        with self._read_lock:
            sample = self._source.read(pids)
            if not self._source.keeps_recorded_time:
                sample = dataclasses.replace(sample, t_s=self._clock())
            if self._trace_path is not None:
                if self._trace_file is None:
                    self._trace_file = self._trace_path.open("a", encoding="utf-8")
                self._trace_file.write(json.dumps(sample.to_json(), separators=(",", ":")) + "\n")
                self._trace_file.flush()
        return sample

    def start(self) -> None:
        if self.running:
            raise RuntimeError("sampler is already running")
        self._stop_requested.clear()
        self._thread = threading.Thread(target=self._run, name="gpuanat-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, wait for it, and close the trace file. Idempotent."""
        self._stop_requested.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None
        with self._read_lock:
            if self._trace_file is not None:
                self._trace_file.close()
                self._trace_file = None

    @property
    def running(self) -> bool:
        """True while the thread is alive: after `start`, until `stop` or the end of a replay."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def cpu_seconds(self) -> float:
        """CPU time the sampler thread itself used (reads, trace writes, callbacks), all runs."""
        return self._cpu_seconds

    @property
    def last_error(self) -> str | None:
        """The most recent exception from the source or `on_sample`, as text; None if none yet."""
        return self._last_error

    def _run(self) -> None:
        name_native_thread()
        cpu_at_start_s = self._cpu_seconds
        thread_time_at_start_s = time.thread_time()
        next_read_s = time.monotonic()
        while not self._stop_requested.is_set():
            try:
                sample = self.sample_once()
                for consumer in (self._on_sample, *self._listeners):
                    try:
                        consumer(sample)
                    # The thread must outlive a failing callback, and the other consumers still get the sample.
                    except Exception as error:
                        self._last_error = f"{type(error).__name__}: {error}"
            except StopIteration:
                break
            # The thread must outlive a failing device; the app shows last_error.
            except Exception as error:
                self._last_error = f"{type(error).__name__}: {error}"
            self._cpu_seconds = cpu_at_start_s + time.thread_time() - thread_time_at_start_s
            next_read_s += self._interval_s
            now_s = time.monotonic()
            # After a read slower than the interval, skip the missed ticks instead of bursting.
            next_read_s = max(next_read_s, now_s)
            self._stop_requested.wait(next_read_s - now_s)
        self._cpu_seconds = cpu_at_start_s + time.thread_time() - thread_time_at_start_s


def open_source(prefer_nvml: bool = True, *, per_process: bool = False) -> tuple[SampleSource, NvmlStatus]:
    """`NvmlSource` when NVML works here, else `HostOnlySource`; the status describes the source.

    With `prefer_nvml=False` NVML is not touched at all (for machines where it hangs or misleads);
    `per_process` is passed to the source (each tracked process, per-process GPU utilization).
    """
    if not prefer_nvml:
        return HostOnlySource(per_process=per_process), _unavailable("NVML not used: turned off by the caller")
    status = probe_nvml()
    if not status.available:
        return HostOnlySource(per_process=per_process), status
    try:
        return NvmlSource(per_process=per_process), status
    except Exception as error:
        return HostOnlySource(per_process=per_process), _unavailable(f"NVML failed to start: {_nvml_reason(error)}")
