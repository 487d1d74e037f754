"""How busy the GPU's units were, not only whether a kernel ran: NVML's GPU Performance Monitoring (GPM, Hopper and
later) over the interval between two samples — SMs active, their occupancy, the tensor pipes active (any precision,
and the 16-bit HMMA pipes), DRAM bandwidth — and the clocks, throttle reasons and energy counter each GPU reports.

NVML's "utilization" is the share of time a kernel ran: on the H100 bert-large bf16 at batch 64 read 94.5% with
the tensor pipes active 30% (issue #51). GPM needs two samples: `GpmReader.read` takes one each call and gives the
metrics since the previous one (None on the first). pynvml is passed in; nothing here imports it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

GPM_METRICS = {
    "sm_active_percent": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy_percent": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active_percent": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "tensor_16bit_active_percent": "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
    "dram_bandwidth_percent": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
"""The readings, by the name gpuanat gives them, and NVML's metric for each (percent of the interval, or of the SMs'
warp slots for occupancy, or of peak bandwidth)."""

CLOCKS_EVENT_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}
"""NVML's clocks event (throttle) reasons, by bit (nvmlClocksEventReason*)."""
THROTTLING_REASONS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""The reasons that slow a busy GPU down: power and thermal caps, hardware slowdowns (idle and settings are not)."""


def throttle_names(reasons: int | None) -> list[str]:
    """The throttle reasons set in NVML's bitmask (`THROTTLING_REASONS` only), in words."""
    if not reasons:
        return []
    return [name for bit, name in CLOCKS_EVENT_REASONS.items() if reasons & bit & THROTTLING_REASONS]


@dataclass(frozen=True)
class GpmReading:
    sm_active_percent: float | None
    sm_occupancy_percent: float | None
    tensor_active_percent: float | None
    tensor_16bit_active_percent: float | None
    dram_bandwidth_percent: float | None


class GpmReader:
    """GPM on one GPU: `read` gives the metrics since its previous call; `unavailable_reason` says why there are none
    (an older GPU, MIG, no permission, a driver or pynvml without GPM)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self._previous: Any = None
        self._spare: Any = None
        self.unavailable_reason: str | None = None
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            self.unavailable_reason = "this NVML binding has no GPM (nvidia-ml-py 12.535 or later has it)"
            return
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
            if not getattr(support, "isSupportedDevice", 0):
                self.unavailable_reason = "this GPU has no GPM counters (NVML GPM needs a Hopper or later GPU)"
                return
            self._metric_ids = {name: getattr(nvml, constant) for name, constant in GPM_METRICS.items()}
            self._previous = nvml.nvmlGpmSampleAlloc()
            self._spare = nvml.nvmlGpmSampleAlloc()
            nvml.nvmlGpmSampleGet(handle, self._previous)
        except Exception as error:  # an NVMLError, or a pynvml without GPM
            self.unavailable_reason = f"NVML GPM unavailable: {type(error).__name__}: {error}".strip()
            self._previous = None

    def read(self) -> GpmReading | None:
        """The metrics over the interval since the previous call (or since the reader was made)."""
        if self._previous is None:
            return None
        nvml = self._nvml
        try:
            nvml.nvmlGpmSampleGet(self._handle, self._spare)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._metric_ids)
            request.sample1, request.sample2 = self._previous, self._spare
            for slot, metric_id in enumerate(self._metric_ids.values()):
                request.metrics[slot].metricId = metric_id
            nvml.nvmlGpmMetricsGet(request)
        except Exception as error:
            self.unavailable_reason = f"NVML GPM failed: {type(error).__name__}: {error}".strip()
            return None
        self._previous, self._spare = self._spare, self._previous
        values = {name: _percent(request.metrics[slot]) for slot, name in enumerate(self._metric_ids)}
        return GpmReading(**values)

    def close(self) -> None:
        for sample in (self._previous, self._spare):
            if sample is not None:
                with contextlib.suppress(Exception):  # freeing at shutdown: nothing to do about a failure
                    self._nvml.nvmlGpmSampleFree(sample)
        self._previous = self._spare = None


def _percent(metric: Any) -> float | None:
    """A metric's value, None where NVML flagged it (nvmlReturn in the metric) or it is out of range."""
    if getattr(metric, "nvmlReturn", 0):
        return None
    value = float(metric.value)
    return value if 0.0 <= value <= 100.0 + 1e-6 else None
