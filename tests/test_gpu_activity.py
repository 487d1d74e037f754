"""Is the GPU really busy (issue #51): gpuanat's own sampler (`NvmlSource` with NVML GPM) recorded on the H100 while a
GEMM-, an element-wise- and a launch-bound step ran (benchmarks/gpm/gpm_check.sh; tests/data/gpm_h100_*.jsonl), beside
an NVML GPM sampler written apart from gpuanat (benchmarks/gpm/independent_gpm.py). The recorded samples go back
through `Sample.from_json` and `measure.activity.steady_activity`, the code a run's result uses; no GPU here."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest
from conftest import REPO

from gpuanat.core.measure.activity import ACTIVITY_PERCENTS, steady_activity
from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.samples import Sample

DATA = REPO / "tests" / "data"


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


RECORDED = _lines("gpm_h100_workloads.jsonl")
INDEPENDENT = _lines("gpm_h100_independent.jsonl")
WINDOWS = {window["kind"]: window for window in _lines("gpm_h100_windows.jsonl")}


def _window(kind: str) -> tuple[float, float]:
    """The step's wall window, less its first 2 s and last 1 s (GPM's 1 s intervals straddle its edges)."""
    window = WINDOWS[kind]
    return window["start_wall_s"] + 2, window["end_wall_s"] - 1


def _readings() -> list[tuple[float, Sample]]:
    """(wall time, the sample as gpuanat read it), through the samples' own JSON reader."""
    return [(line["wall_s"], Sample.from_json({k: v for k, v in line.items() if k != "wall_s"})) for line in RECORDED]


@pytest.mark.parametrize("kind", ["gemm", "elementwise", "launch"])
def test_gpuanats_gpm_medians_are_an_independent_samplers_within_3_points(kind):
    start, end = _window(kind)
    samples = _readings()
    # the sampler's own clock over the same wall window
    to_sampler = {wall: sample.t_s for wall, sample in samples}
    inside = [wall for wall in to_sampler if start <= wall <= end]
    window = (to_sampler[min(inside)], to_sampler[max(inside)])
    activity = steady_activity([(s.t_s, s.gpus[0]) for _w, s in samples], window, None, 1)
    independent = [line for line in INDEPENDENT if start <= line["wall_s"] <= end]
    assert len(inside) >= 60 and len(independent) >= 15
    for name in ACTIVITY_PERCENTS:
        theirs = statistics.median(line[name] for line in independent)
        assert activity.values[name] == pytest.approx(theirs, abs=3.0), (kind, name)
    # the energy counter's rate over the window against theirs
    theirs_w = (
        (independent[-1]["energy_mj"] - independent[0]["energy_mj"])
        / 1000
        / (independent[-1]["wall_s"] - independent[0]["wall_s"])
    )
    assert activity.values["average_power_w"] == pytest.approx(theirs_w, rel=0.03)


def test_busy_is_not_working_a_launch_bound_step_reads_30_percent_utilization_with_its_sms_idle():
    """What the issue is about, as recorded: NVML's utilization counts a kernel running; GPM says what ran."""
    samples = _readings()

    def medians(kind: str) -> dict[str, float]:
        start, end = _window(kind)
        gpus = [sample.gpus[0] for wall, sample in samples if start <= wall <= end]
        return {
            name: statistics.median(getattr(gpu, name) for gpu in gpus)
            for name in ("gpu_util_percent", "sm_active_percent", "tensor_active_percent", "dram_bandwidth_percent")
        }

    gemm, elementwise, launch = medians("gemm"), medians("elementwise"), medians("launch")
    assert gemm["gpu_util_percent"] == elementwise["gpu_util_percent"] == 100.0
    assert gemm["tensor_active_percent"] > 90 and elementwise["tensor_active_percent"] == 0.0
    assert elementwise["dram_bandwidth_percent"] > 85 > gemm["dram_bandwidth_percent"]
    assert launch["gpu_util_percent"] > 25 and launch["sm_active_percent"] < 1


def test_energy_per_sample_is_the_steady_power_over_the_steady_rate():
    samples = _readings()
    start, end = _window("gemm")
    readings = [(s.t_s, s.gpus[0]) for _w, s in samples]
    window = (min(s.t_s for w, s in samples if w >= start), max(s.t_s for w, s in samples if w <= end))
    activity = steady_activity(readings, window, 40.0, 512)
    power = activity.values["average_power_w"]
    assert power is not None and 400 < power < 800  # an H100 at work
    assert activity.values["joules_per_sample"] == pytest.approx(power / 40.0)
    assert activity.values["joules_per_token"] == pytest.approx(power / 40.0 / 512)
    whole = readings[-1][1].energy_mj - readings[0][1].energy_mj
    assert activity.values["energy_joules"] == pytest.approx(whole / 1000)
    assert activity.unavailable == {
        "max_sm_clock_mhz": "NVML gave no maximum SM clock for this GPU"
    }  # recorded before read


def test_without_gpm_or_a_gpu_every_value_says_why():
    samples = _readings()
    readings = [(s.t_s, s.gpus[0]) for _w, s in samples]
    no_window = steady_activity(readings, None, 40.0, 512)
    assert set(no_window.unavailable) >= {*ACTIVITY_PERCENTS, "average_power_w", "joules_per_sample"}
    assert no_window.values["energy_joules"] is not None  # the run's energy needs no steady window
    cpu = steady_activity([], None, None, 512, no_gpu_reason="CPU run: no GPU")
    assert set(cpu.unavailable.values()) == {"CPU run: no GPU"} and not any(cpu.values.values())
    unread = dict.fromkeys((*ACTIVITY_PERCENTS, "tensor_16bit_active_percent"))
    older = [
        (t, dataclasses.replace(gpu, **unread, gpm_unavailable="this GPU has no GPM counters")) for t, gpu in readings
    ]
    window = (older[10][0], older[-10][0])
    without_gpm = steady_activity(older, window, 40.0, 512)
    assert without_gpm.unavailable["tensor_active_percent"] == "this GPU has no GPM counters"
    assert without_gpm.values["average_power_w"] is not None


def test_throttle_reasons_name_only_what_slows_a_busy_gpu():
    assert throttle_names(0x1) == []  # idle
    assert throttle_names(0x4 | 0x40) == ["software power cap", "hardware thermal slowdown"]
    assert throttle_names(None) == []
    recorded = {sample.gpus[0].clocks_event_reasons for _w, sample in _readings()}
    assert recorded <= {0, 1, 4} and recorded  # idle between steps, at most the power cap while working


def test_a_steady_window_shorter_than_the_energy_counters_reads_takes_the_power_readings_mean():
    """The counter is read every 5 s (`nvml_source.ENERGY_REFRESH_S`): a short trial's steady steps may hold one read
    or none; its power is then the mean of the samples' power readings, as recorded during the GEMM step."""
    samples = _readings()
    start, end = _window("gemm")
    inside = [(s.t_s, s.gpus[0]) for wall, s in samples if start <= wall <= end]
    short = [(t, dataclasses.replace(gpu, energy_mj=None)) for t, gpu in inside[:3]]  # 0.75 s, no counter read
    activity = steady_activity(short, (short[0][0], short[-1][0]), 40.0, 512)
    watts = [gpu.power_w for _t, gpu in short]
    assert activity.values["average_power_w"] == pytest.approx(sum(watts) / len(watts))
    assert activity.values["joules_per_sample"] == pytest.approx(sum(watts) / len(watts) / 40.0)
    assert "energy_joules" in activity.unavailable  # the run's own energy needs the counter


def test_the_gemm_steps_clocks_held_down_by_the_power_cap_are_counted_the_launch_bound_steps_not():
    """The GEMM step drew the H100's 700 W limit and NVML set its software power cap reason (clocks 1,380-1,440 MHz of
    1,980); the launch-bound step drew a fraction of it. The result's throttle summary over each step's window."""
    samples = _readings()

    def throttle(kind: str) -> tuple[dict, dict | None]:
        start, end = _window(kind)
        inside = [(s.t_s, s.gpus[0]) for wall, s in samples if start <= wall <= end]
        masks = [gpu.clocks_event_reasons for _t, gpu in inside]
        activity = steady_activity([(s.t_s, s.gpus[0]) for _w, s in samples], (inside[0][0], inside[-1][0]), 40.0, 1)
        capped = 100 * sum(1 for mask in masks if mask & 0x4) / len(masks)
        clocks = statistics.median(gpu.sm_clock_mhz for _t, gpu in inside)
        assert activity.values["throttled_percent"] == pytest.approx(capped)
        assert activity.values["sm_clock_mhz"] == clocks
        return activity.values, activity.throttle_reasons

    gemm, gemm_reasons = throttle("gemm")
    assert gemm["throttled_percent"] > 50 and gemm_reasons == {"software power cap": gemm["throttled_percent"]}
    assert gemm["sm_clock_mhz"] < 1500  # held down from its 1,980 MHz
    launch, launch_reasons = throttle("launch")
    assert launch["throttled_percent"] == 0.0 and launch_reasons == {}
    cpu = steady_activity([], None, None, 1, no_gpu_reason="CPU run: no GPU")
    assert cpu.throttle_reasons is None
    assert {cpu.unavailable[name] for name in ("sm_clock_mhz", "throttled_percent", "throttle_reasons")} == {
        "CPU run: no GPU"
    }
