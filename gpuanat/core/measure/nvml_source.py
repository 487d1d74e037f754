"""The device through NVML: whether NVML works here, its readings, and the source that reads every GPU.

pynvml is imported lazily, so this module loads without it. `probe_nvml()` says whether NVML works here and,
when it does not, why, in words a user can act on; `NvmlSource` reads every GPU plus the host metrics of the
tracked processes; `open_source()` picks it when NVML works, else `HostOnlySource`. `nvml_memory_info` and
`nvml_processes` are the readings the probe worker and the GPU list share with `NvmlSource`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from gpuanat.core.measure.gpm import GpmReader, GpmReading
from gpuanat.core.measure.nvml_events import XID_CARRY_S, XidReader
from gpuanat.core.measure.nvml_faults import binding_from_environment
from gpuanat.core.measure.nvml_guard import (
    NVML_DEADLINE_S,
    STARTUP_DEADLINE_S,
    NvmlGuard,
    NvmlProgress,
    device_fault,
    not_answering,
    within_deadline,
)
from gpuanat.core.measure.process_tree import DEFAULT_DESCENDANTS_REFRESH_S, HostOnlySource, HostProcessMeter
from gpuanat.core.measure.samples import (
    GpuSample,
    NvmlStatus,
    ProcessGpuMemory,
    ProcessUtilization,
    Sample,
    SampleSource,
)

GPM_REFRESH_S = 1.0
"""How often each GPU's GPM counters are read (each reading is the interval since the previous one, as NVML's own
`nvidia-smi dmon --gpm-metrics` samples them; the samples between carry it)."""
ENERGY_REFRESH_S = 5.0
"""How often each GPU's energy counter is read (only the sample that read it has it: a rate needs the time it was
read). A read cost 3.1 ms of CPU on the H100 (benchmarks/results/h100/gpm/read_cost.json), the rest of a sample 0.15
ms: once a second it was most of the sampler's time on two GPUs. A steady window with fewer than two reads takes
the power readings' mean instead (`measure.activity`)."""
PROCESS_UTILIZATION_REFRESH_S = 1.0
"""How often each process's GPU utilization is read. NVML's nvmlDeviceGetProcessUtilization cost 2.3 ms of CPU a
call on the H100 (the memory, utilization, power, temperature and process list together 0.05 ms;
benchmarks/results/h100/watch_cost/sampler_cost.json): read at every 0.25 s sample it was half the watch's sampling.
Each read is NVML's mean since the previous one, and the samples between carry it."""
REINIT_S = 2.0
"""While a GPU is lost or the driver fails, how often NVML is initialised again and the GPUs' handles (and GPM
readers) made anew: a GPU that comes back after a reset or a driver restart answers only through a new handle."""


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


def probe_nvml(nvml: Any = None, progress: NvmlProgress | None = None) -> NvmlStatus:
    """Initialise NVML (`nvml`, default: `pynvml`), describe what it sees and shut it down again. Never raises.
    `progress` is kept at what it asks NVML about ("NVML", then "GPU 0", …), for a caller that stops waiting."""
    progress = progress or NvmlProgress()
    pynvml: Any = nvml
    if pynvml is None:
        try:
            import pynvml as default_nvml
        except ImportError:
            return _unavailable("pynvml is not installed (pip install nvidia-ml-py)")
        pynvml = default_nvml
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
        names, totals = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            progress.at = f"GPU {index}"
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            names.append(_device_name(pynvml, handle, index))
            totals.append(int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
        gpu_names, gpu_total_bytes = tuple(names), tuple(totals)
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


def _optional_reading(pynvml: Any, name: str, *args: Any) -> Any:
    """A reading older drivers or bindings may lack: None where the call is missing or NVML reports an error."""
    read = getattr(pynvml, name, None)
    return _nvml_or_none(pynvml, read, *args) if read is not None else None


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


class NvmlSource:
    """Every GPU through NVML, plus host metrics of the tracked processes.

    The constructor initialises NVML and raises `pynvml.NVMLError` when that fails (`open_source`
    falls back to `HostOnlySource`). After that, an NVML error on any one reading makes that
    reading None; `read` itself does not raise. `per_process=True` lists each tracked process
    (`HostSample.processes`) and reads per-process GPU utilization (`GpuSample.process_utilization`)
    once every `PROCESS_UTILIZATION_REFRESH_S`.
    """

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(
        self,
        *,
        descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S,
        per_process: bool = False,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        deadline_s: float = NVML_DEADLINE_S,
    ) -> None:
        """`nvml` is the NVML binding (default: `pynvml`); `clock` paces the per-process utilization reads
        (`PROCESS_UTILIZATION_REFRESH_S`) and stamps the samples; `deadline_s` is how long a read waits for NVML
        before its sample says the GPU is not answering (`nvml_guard`)."""
        if nvml is None:
            import pynvml as default_nvml

            nvml = default_nvml
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
        self._host = HostProcessMeter(descendants_refresh_s, per_process)
        self._per_process = per_process
        self._utilization_seen_us = dict.fromkeys(range(len(handles)), 0)
        """Per GPU, the newest per-process utilization timestamp read so far (NVML's microseconds)."""
        self._process_utilization: dict[int, tuple[ProcessUtilization, ...] | None] = {}
        """Per GPU, the last per-process utilization read, carried by the samples until the next read."""
        self._process_utilization_read_at_s = -math.inf
        self._gpm = {index: GpmReader(pynvml, handle) for index, handle, _name in self._devices}
        sm = getattr(pynvml, "NVML_CLOCK_SM", 1)
        self._max_sm_clock_mhz: dict[int, int | None] = {}
        for index, handle, _name in self._devices:  # read once: it does not change
            highest = _optional_reading(pynvml, "nvmlDeviceGetMaxClockInfo", handle, sm)
            self._max_sm_clock_mhz[index] = int(highest) if highest is not None else None
        self._gpm_readings: dict[int, GpmReading | None] = {}
        """Per GPU, the last GPM reading, carried by the samples until the next (`GPM_REFRESH_S`)."""
        self._gpm_read_at_s = -math.inf
        self._gpm_due = True
        self._energy_read_at_s = -math.inf
        self._energy_due = True
        self._guard = NvmlGuard(deadline_s)
        self._deadline_s = deadline_s
        self._faults: dict[int, str] = {}
        """Per GPU, what failed at its last read ("GPU 1 lost (NVML: GPU is lost)"), until it answers again."""
        self._reinit_at_s = -math.inf
        self._reading_index: int | None = None
        self._xids = XidReader(pynvml, [(index, handle) for index, handle, _name in self._devices])
        self._recent_xids: dict[int, tuple[float, tuple[int, ...]]] = {}
        """Per GPU, when the driver last reported XIDs and which (the last 8), carried for `XID_CARRY_S`."""
        self._now_s = 0.0

    @property
    def helper_cpu_seconds(self) -> float:
        """CPU time NVML's reads took on the guard's thread (the sampler counts it as its own)."""
        return self._guard.cpu_seconds

    def read(self, pids: Iterable[int]) -> Sample:
        t_s = self._clock()
        gpus = self._guard.run(lambda: self._read_gpus(t_s))
        if gpus is None:
            gpus = self._not_answering()
        return Sample(t_s=t_s, gpus=gpus, host=self._host.measure(pids))

    def _not_answering(self) -> tuple[GpuSample, ...]:
        """The GPUs while an NVML call has not returned: no readings, and which GPU it waits on."""
        stuck = self._reading_index
        return tuple(
            _no_readings(
                index,
                name,
                f"GPU {index} not answering (an NVML call did not return within {self._deadline_s:g} s)"
                if index == stuck or stuck is None
                else f"GPU {index} not read (NVML is waiting on GPU {stuck})",
            )
            for index, _handle, name in self._devices
        )

    def _read_gpus(self, t_s: float) -> tuple[GpuSample, ...]:
        """Every GPU, on the guard's thread; a GPU that failed is said so, and NVML started anew to bring it back."""
        begins = getattr(self._nvml, "gpuanat_sample_begins", None)
        if begins is not None:  # a binding that replays a recording or injects faults counts the samples
            begins()
        if self._faults and t_s - self._reinit_at_s >= REINIT_S:
            self._reinit_at_s = t_s
            self._reinitialise()
        self._now_s = t_s
        for index, xids in self._xids.read().items():
            _at, earlier = self._recent_xids.get(index, (t_s, ()))
            self._recent_xids[index] = (t_s, (*earlier, *xids)[-8:])
        if self._per_process and t_s - self._process_utilization_read_at_s >= PROCESS_UTILIZATION_REFRESH_S:
            self._process_utilization_read_at_s = t_s
            self._process_utilization = {
                index: self._read_process_utilization(index, handle) for index, handle, _name in self._devices
            }
        self._gpm_due = t_s - self._gpm_read_at_s >= GPM_REFRESH_S
        self._energy_due = t_s - self._energy_read_at_s >= ENERGY_REFRESH_S
        if self._energy_due:
            self._energy_read_at_s = t_s
        if self._gpm_due:
            self._gpm_read_at_s = t_s
            self._gpm_readings = {
                index: reader.read() for index, reader in self._gpm.items() if index not in self._faults
            }
        gpus = tuple(self._read_gpu(index, handle, name) for index, handle, name in self._devices)
        self._reading_index = None
        return gpus

    def _reinitialise(self) -> None:
        """NVML initialised again and each GPU's handle looked up anew; a GPU still failing keeps its fault."""
        nvml = self._nvml
        self._xids.close()  # its event set is NVML's: freed before NVML shuts down
        _shutdown_nvml(nvml)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError:
            return  # the driver is still gone: each GPU's read says so
        devices = []
        for index, handle, name in self._devices:
            fresh = _nvml_or_none(nvml, nvml.nvmlDeviceGetHandleByIndex, index)
            if fresh is not None:
                handle = fresh
                self._gpm[index].close()
                self._gpm[index] = GpmReader(nvml, handle)
            devices.append((index, handle, name))
        self._devices = devices
        self._xids = XidReader(nvml, [(index, handle) for index, handle, _name in devices])

    def _xid_errors(self, index: int) -> tuple[int, ...] | None:
        at_s, xids = self._recent_xids.get(index, (-math.inf, ()))
        return xids if self._now_s - at_s <= XID_CARRY_S else None

    def _read_gpu(self, index: int, handle: Any, name: str) -> GpuSample:
        nvml = self._nvml
        self._reading_index = index
        try:
            memory = _memory_or_fault(nvml, handle)
        except nvml.NVMLError as error:
            fault = device_fault(index, error) or f"GPU {index} not read (NVML: {error})"
            self._faults[index] = fault
            return dataclasses.replace(_no_readings(index, name, fault), xid_errors=self._xid_errors(index))
        if self._faults.pop(index, None) is not None:  # back: its GPM counters start over
            self._gpm[index].close()
            self._gpm[index] = GpmReader(nvml, handle)
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
            xid_errors=self._xid_errors(index),
            **self._read_activity(index, handle),
        )

    def _read_activity(self, index: int, handle: Any) -> dict[str, Any]:
        """GPM's last reading (`gpm`), the energy counter, the clocks and the throttle reasons."""
        nvml = self._nvml
        gpm = self._gpm_readings.get(index)
        reader = self._gpm[index]
        readings: dict[str, Any] = dataclasses.asdict(gpm) if gpm is not None else {}
        if gpm is None and reader.unavailable_reason:
            readings["gpm_unavailable"] = reader.unavailable_reason
        # the energy counter cost 3.1 ms of CPU a read on the H100, the other readings 2-80 µs: every
        # `ENERGY_REFRESH_S`, and only in that sample, at its time
        energy = _optional_reading(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle) if self._energy_due else None
        sm_clock = _optional_reading(nvml, "nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_SM", 1))
        memory_clock = _optional_reading(nvml, "nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_MEM", 2))
        reasons = _optional_reading(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = _optional_reading(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return {
            **readings,
            "energy_mj": int(energy) if energy is not None else None,
            "sm_clock_mhz": int(sm_clock) if sm_clock is not None else None,
            "max_sm_clock_mhz": self._max_sm_clock_mhz.get(index),
            "memory_clock_mhz": int(memory_clock) if memory_clock is not None else None,
            "clocks_event_reasons": int(reasons) if reasons is not None else None,
        }

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
            ProcessUtilization(
                pid=pid,
                sm_util_percent=sum(sm for sm, _ in values) / len(values),
                memory_util_percent=sum(memory for _, memory in values) / len(values),
            )
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
        """Shut NVML down; idempotent. Where an NVML call has not returned, NVML is left as it is (the process
        ends without waiting for it)."""
        if not self._closed:
            self._closed = True
            guard = getattr(self, "_guard", None)
            if guard is None:  # the constructor failed before the guard
                _shutdown_nvml(self._nvml)
                return
            guard.run(self._close_nvml)
            guard.close()

    def _close_nvml(self) -> bool:
        for reader in self._gpm.values():
            reader.close()
        self._xids.close()
        _shutdown_nvml(self._nvml)
        return True


def _memory_or_fault(nvml: Any, handle: Any) -> Any:
    """`nvml_memory_info`, but raising the errors that say the GPU or the driver failed (`device_fault`)."""
    for args in ((handle, nvml.nvmlMemory_v2), (handle,)):
        try:
            return nvml.nvmlDeviceGetMemoryInfo(*args)
        except nvml.NVMLError as error:
            if device_fault(0, error) is not None:
                raise
    return None


def _no_readings(index: int, name: str, fault: str) -> GpuSample:
    return GpuSample(
        index=index,
        name=name,
        used_bytes=None,
        total_bytes=None,
        reserved_bytes=None,
        gpu_util_percent=None,
        memory_util_percent=None,
        power_w=None,
        temperature_c=None,
        processes=(),
        nvml_error=fault,
    )


def nvml_status(deadline_s: float = STARTUP_DEADLINE_S) -> NvmlStatus:
    """`probe_nvml` of the binding the environment asks for (`nvml_faults`), within `deadline_s`: unavailable, saying
    which GPU did not answer, where it did not return (`nvml_guard.within_deadline`)."""
    try:
        binding = binding_from_environment()
    except ValueError as error:
        return _unavailable(str(error))
    return _probe_within(binding, deadline_s)


def _probe_within(binding: Any, deadline_s: float) -> NvmlStatus:
    progress = NvmlProgress()
    status = within_deadline(lambda: probe_nvml(binding, progress), deadline_s)
    return status if status is not None else _unavailable(not_answering(progress, deadline_s))


def open_source(
    prefer_nvml: bool = True, *, per_process: bool = False, deadline_s: float = STARTUP_DEADLINE_S
) -> tuple[SampleSource, NvmlStatus]:
    """`NvmlSource` when NVML works here, else `HostOnlySource`; the status describes the source. With
    `prefer_nvml=False` NVML is not touched at all (for machines where it hangs or misleads); `per_process` is passed
    to the source (each tracked process, per-process GPU utilization). The environment may ask for a recorded NVML or
    injected faults instead of the driver (`nvml_faults`). NVML that does not answer within `deadline_s` at a step of
    the start-up (`nvml_status`, the source's set-up) gives the host's source, its status saying which GPU did not."""
    if not prefer_nvml:
        return HostOnlySource(per_process=per_process), _unavailable("NVML not used: turned off by the caller")
    try:
        binding = binding_from_environment()
    except ValueError as error:
        return HostOnlySource(per_process=per_process), _unavailable(str(error))
    status = _probe_within(binding, deadline_s)
    if not status.available:
        return HostOnlySource(per_process=per_process), status
    try:
        source = within_deadline(
            lambda: NvmlSource(per_process=per_process, nvml=binding, deadline_s=deadline_s), deadline_s
        )
    except Exception as error:
        return HostOnlySource(per_process=per_process), _unavailable(f"NVML failed to start: {_nvml_reason(error)}")
    if source is None:
        return HostOnlySource(per_process=per_process), _unavailable(not_answering(NvmlProgress(), deadline_s))
    return source, status
