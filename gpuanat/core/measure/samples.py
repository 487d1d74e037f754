"""The samples a source returns: one GPU, the tracked host processes, and the whole read at one instant.

`Sample` and its parts are frozen dataclasses with `to_json`/`from_json`, so a `Sampler` can record them as
JSON lines and `ReplaySource` can read them back. `NvmlStatus` says whether NVML works here and `SampleSource`
is what a `Sampler` reads from; the sources themselves live in `nvml_source`, `process_tree` and `replay`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from gpuanat.core.measure.nvml_events import xid_text


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


ACTIVITY_READINGS = (
    "sm_active_percent",
    "sm_occupancy_percent",
    "tensor_active_percent",
    "tensor_16bit_active_percent",
    "dram_bandwidth_percent",
    "gpm_unavailable",
    "energy_mj",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "memory_clock_mhz",
    "clocks_event_reasons",
)
"""GpuSample's readings of how busy the GPU really is, its energy counter and clocks (issue #51), added since its
first traces were recorded: left out of its JSON when None."""


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
    sm_active_percent: float | None = None
    """NVML GPM (`gpm.GPM_METRICS`), over the last GPM interval: share of time the SMs had a warp resident."""
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    """Share of time the tensor pipes (any precision) were active: what "busy" means for a matmul-bound step."""
    tensor_16bit_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None
    gpm_unavailable: str | None = None
    """Why the GPM readings are None (an older GPU, MIG, no permission); None where they were read."""
    energy_mj: int | None = None
    """NVML's energy counter, millijoules since the driver loaded (nvmlDeviceGetTotalEnergyConsumption), in the
    samples that read it (every `nvml_source.ENERGY_REFRESH_S`)."""
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    """The highest SM clock the GPU runs at (nvmlDeviceGetMaxClockInfo): what a throttled clock is held below."""
    memory_clock_mhz: int | None = None
    clocks_event_reasons: int | None = None
    """NVML's clocks event (throttle) reasons bitmask (`gpm.throttle_names`)."""
    nvml_error: str | None = None
    """What failed where this GPU has no readings: "GPU 1 lost (NVML: GPU is lost)", "GPU 0 not answering (an NVML
    call did not return within 2 s)" (`nvml_guard`); None while it answers."""
    xid_errors: tuple[int, ...] | None = None
    """The XID errors the driver reported for this GPU in the last `nvml_events.XID_CARRY_S`; None where none was
    (or the driver reports no events)."""

    @property
    def faults(self) -> tuple[str, ...]:
        """What went wrong on this GPU, in words: its `nvml_error` and its XIDs ("GPU 0 reported XID 79 (…)")."""
        xids = tuple(xid_text(self.index, xid) for xid in self.xid_errors or ())
        return (self.nvml_error, *xids) if self.nvml_error else xids

    def to_json(self) -> dict[str, Any]:
        fields = _flat_fields(self)  # taken at every sample: not dataclasses.asdict, which deep-copies each field
        for name in (*ACTIVITY_READINGS, "nvml_error", "xid_errors"):  # traces recorded without them stay so
            if fields[name] is None:
                del fields[name]
        if self.xid_errors is not None:
            fields["xid_errors"] = list(self.xid_errors)
        fields["processes"] = [_flat_fields(process) for process in self.processes]
        if self.process_utilization is None:
            del fields["process_utilization"]  # traces recorded without it stay as they were
        else:
            fields["process_utilization"] = [_flat_fields(entry) for entry in self.process_utilization]
        return fields

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        utilization = d.get("process_utilization")
        return cls(
            **{
                **d,
                "processes": tuple(ProcessGpuMemory(**p) for p in d["processes"]),
                "xid_errors": None if d.get("xid_errors") is None else tuple(d["xid_errors"]),
                "process_utilization": None
                if utilization is None
                else tuple(ProcessUtilization(**entry) for entry in utilization),
            }
        )


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
        return cls(
            cpu_percent=d["cpu_percent"],
            rss_bytes=d["rss_bytes"],
            processes=tuple(HostProcess(**process) for process in d.get("processes", ())),
        )


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
