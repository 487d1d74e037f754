"""How busy a run kept its GPU over its steady steps, and what that cost in energy (issue #51): the medians of NVML
GPM's readings (`gpm`: SMs active, occupancy, tensor pipes active, DRAM bandwidth) over the steady window, the
average power over it from NVML's energy counter, the energy per sample and per token at the steady rate, and the
whole run's energy; and whether its clocks were held down (`THROTTLE_FIELDS`). Each value None has its reason, for
the result's `unavailable`. (The energy counter is read every `nvml_source.ENERGY_REFRESH_S`: a steady window with
fewer than two of its reads takes the mean of the power readings instead.)"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.samples import GpuSample
from gpuanat.core.vocabulary.result import RunResult

ACTIVITY_PERCENTS = ("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent")
"""The GPM readings a result carries, as steady-window medians."""
ENERGY_FIELDS = ("average_power_w", "energy_joules", "joules_per_sample", "joules_per_token")
ACTIVITY_FIELDS = (*ACTIVITY_PERCENTS, *ENERGY_FIELDS)
THROTTLE_FIELDS = ("sm_clock_mhz", "max_sm_clock_mhz", "throttled_percent", "throttle_reasons")
"""The clocks over the steady steps: the SM clock's median, the GPU's highest SM clock, the share of samples with a
throttling reason set (`gpm.THROTTLING_REASONS`), and that share by reason ({} when none was)."""


@dataclass(frozen=True)
class Activity:
    values: dict[str, float | None]
    """`ACTIVITY_FIELDS` and `THROTTLE_FIELDS` but the reasons, by name."""
    throttle_reasons: dict[str, float] | None
    """Percent of the steady samples each throttling reason was set in, by its name (`gpm.throttle_names`)."""
    unavailable: dict[str, str]
    """Why each None value is."""

    def fill(self, result: RunResult) -> None:
        """Set these values in `result`, and their reasons in its `unavailable`."""
        for name, value in self.values.items():
            setattr(result, name, value)
        result.throttle_reasons = self.throttle_reasons
        result.unavailable |= self.unavailable


def steady_activity(
    readings: Sequence[tuple[float, GpuSample]],
    window: tuple[float, float] | None,
    steady_samples_per_second: float | None,
    seq_len: float,
    no_gpu_reason: str | None = None,
) -> Activity:
    """The activity of the GPU read in `readings` ((sampler time, the GPU's sample), in order) over `window`
    (the steady steps on the sampler's clock; None: no steady window), and the energy at the steady rate."""
    values: dict[str, float | None] = dict.fromkeys((*ACTIVITY_FIELDS, *THROTTLE_FIELDS[:-1]))
    if no_gpu_reason is not None or not readings:
        reason = no_gpu_reason or "NVML gave no reading during the run"
        return Activity(values, None, dict.fromkeys((*ACTIVITY_FIELDS, *THROTTLE_FIELDS), reason))
    unavailable: dict[str, str] = {}
    energy = [(t_s, gpu.energy_mj) for t_s, gpu in readings if gpu.energy_mj is not None]
    if len(energy) >= 2:
        values["energy_joules"] = (energy[-1][1] - energy[0][1]) / 1000.0
    else:
        unavailable["energy_joules"] = "NVML's energy counter is not readable on this GPU"
    steady = [(t_s, gpu) for t_s, gpu in readings if window is not None and window[0] <= t_s <= window[1]]
    if not steady:
        reason = "no steady steps to read over" if window is None else "no sample fell in the steady steps"
        unavailable |= {name: reason for name in (*ACTIVITY_PERCENTS, "average_power_w", *THROTTLE_FIELDS)}
        throttle: dict[str, float] | None = None
    else:
        throttle = _throttle(steady, values, unavailable)
        gpm_reason = next((gpu.gpm_unavailable for _t, gpu in steady if gpu.gpm_unavailable), None)
        for name in ACTIVITY_PERCENTS:
            percents = [getattr(gpu, name) for _t, gpu in steady if getattr(gpu, name) is not None]
            if percents:
                values[name] = statistics.median(percents)
            else:
                unavailable[name] = gpm_reason or "NVML GPM gave no reading (it needs a Hopper or later GPU)"
        in_window = [(t_s, mj) for t_s, mj in energy if window is not None and window[0] <= t_s <= window[1]]
        if len(in_window) >= 2 and in_window[-1][0] > in_window[0][0]:
            values["average_power_w"] = (
                (in_window[-1][1] - in_window[0][1]) / 1000.0 / (in_window[-1][0] - in_window[0][0])
            )
        else:  # a window shorter than the counter's once-a-second reads: the power readings' mean
            watts = [gpu.power_w for _t, gpu in steady if gpu.power_w is not None]
            if watts:
                values["average_power_w"] = statistics.fmean(watts)
            else:
                unavailable["average_power_w"] = "no energy or power reading in the steady steps"
    power = values["average_power_w"]
    if power is not None and steady_samples_per_second:
        values["joules_per_sample"] = power / steady_samples_per_second
        values["joules_per_token"] = power / (steady_samples_per_second * seq_len)
    else:
        reason = "no steady samples/s" if power is not None else "no steady power"
        unavailable |= {"joules_per_sample": reason, "joules_per_token": reason}
    return Activity(values, throttle, unavailable)


def _throttle(
    steady: Sequence[tuple[float, GpuSample]], values: dict[str, float | None], unavailable: dict[str, str]
) -> dict[str, float] | None:
    """The steady samples' SM clock median and throttling share into `values`; the share of each reason."""
    clocks = [gpu.sm_clock_mhz for _t, gpu in steady if gpu.sm_clock_mhz is not None]
    if clocks:
        values["sm_clock_mhz"] = statistics.median(clocks)
    else:
        unavailable["sm_clock_mhz"] = "NVML gave no SM clock in the steady steps"
    highest = [gpu.max_sm_clock_mhz for _t, gpu in steady if gpu.max_sm_clock_mhz is not None]
    if highest:
        values["max_sm_clock_mhz"] = max(highest)
    else:
        unavailable["max_sm_clock_mhz"] = "NVML gave no maximum SM clock for this GPU"
    masks = [gpu.clocks_event_reasons for _t, gpu in steady if gpu.clocks_event_reasons is not None]
    if not masks:
        reason = "NVML gave no clocks event (throttle) reasons in the steady steps"
        unavailable |= {"throttled_percent": reason, "throttle_reasons": reason}
        return None
    named = [throttle_names(mask) for mask in masks]
    values["throttled_percent"] = 100.0 * sum(1 for names in named if names) / len(masks)
    counts: dict[str, int] = {}
    for names in named:
        for name in names:
            counts[name] = counts.get(name, 0) + 1
    return {name: 100.0 * count / len(masks) for name, count in sorted(counts.items(), key=lambda item: -item[1])}
