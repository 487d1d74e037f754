"""Differences between runs: the techniques that differ and each metric with its % delta against the first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuanat.core.operations.classify import GROUP_LABELS, GROUPS
from gpuanat.core.percent import percent_delta
from gpuanat.core.store.report import format_bytes, format_loss
from gpuanat.core.vocabulary.protocol import STEP_PHASES
from gpuanat.core.vocabulary.result import Bands, RunResult

COMPARED_METRICS: tuple[tuple[str, str], ...] = (
    ("train_runtime_s", "time s"),
    ("samples_per_second", "samples/s"),
    ("steady_samples_per_second", "steady samples/s"),
    ("achieved_tflops", "TFLOP/s"),
    ("sm_active_percent", "SMs active %"),
    ("tensor_active_percent", "tensor pipes active %"),
    ("dram_bandwidth_percent", "DRAM bandwidth %"),
    ("average_power_w", "power W"),
    ("joules_per_sample", "J/sample (lower is better)"),
    ("energy_wh", "energy Wh (whole run)"),
    ("final_loss", "final loss (lower is better)"),
    ("min_loss", "min loss (lower is better)"),
    ("step_s", "step time"),
    *((f"step_{phase}_s", f"  {phase}") for phase in STEP_PHASES),
    ("peak_allocated_bytes", "peak allocated"),
    ("device_memory_used_bytes", "GPU memory used"),
    ("weights_bytes", "weights"),
    ("gradients_after_backward_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
    ("activations_bytes", "activations"),
    ("ops_device_s", "ops: GPU time/step"),
    *((f"ops_{group}_s", f"  {GROUP_LABELS[group]}") for group in GROUPS),
)
BAND_METRICS = {"weights_bytes", "optimizer_state_bytes", "activations_bytes"}
"""Compared as the stack has them; the gradients by their own maximum after backward (the stack's band is what
accumulation keeps alive at the end of forward, 0 without it)."""
STEP_TIME_METRICS = {"step_s": None, **{f"step_{phase}_s": phase for phase in STEP_PHASES}}
"""The steady step's mean time and its phases (the result's `step_time_breakdown`)."""
ACTIVITY_METRICS = {
    "sm_active_percent",
    "tensor_active_percent",
    "dram_bandwidth_percent",
    "average_power_w",
    "joules_per_sample",
    "energy_wh",
}
"""The GPU's steady activity and energy (`measure.activity`): none on a CPU run, before a GPM-capable GPU, or in a
run recorded before gpuanat read them, and then no row."""
LOSS_METRICS = {"final_loss", "min_loss"}
"""The loss the loop logged: none in a run whose loop logged none, or recorded before gpuanat kept it, and then no
row."""
OPERATIONS_METRICS = {"ops_device_s": None, **{f"ops_{group}_s": group for group in GROUPS}}
"""A profiled step's device time, and each kind of operation's (the result's `operations_anatomy`): what a technique
fused away shows as a kind's time falling."""


BYTE_METRICS = BAND_METRICS | {"peak_allocated_bytes", "device_memory_used_bytes", "gradients_after_backward_bytes"}


def format_metric(key: str, value: float | None) -> str:
    """A compared metric's value as the compare view and `history --compare` show it."""
    if value is None:
        return "—"
    if key in STEP_TIME_METRICS or key in OPERATIONS_METRICS:
        return f"{1000 * value:.1f} ms"
    if key in LOSS_METRICS:
        return format_loss(value)
    return format_bytes(int(value)) if key in BYTE_METRICS else f"{value:.2f}"


def metric_value(result: RunResult, key: str) -> float | None:
    """A compared metric's value in a run's result."""
    if key in BAND_METRICS:
        return getattr(result.bands, key) if isinstance(result.bands, Bands) else None
    if key in STEP_TIME_METRICS:
        breakdown = result.step_time_breakdown or {}
        phase = STEP_TIME_METRICS[key]
        return breakdown.get("step_s") if phase is None else (breakdown.get("per_step_s") or {}).get(phase)
    if key in OPERATIONS_METRICS:
        return _operations_seconds(result.operations_anatomy, OPERATIONS_METRICS[key])
    if key == "energy_wh":
        return result.energy_joules / 3600 if result.energy_joules is not None else None
    value: float | None = getattr(result, key)  # the other metrics are the result's fields of their names
    return value


def _operations_seconds(anatomy: Any, group: str | None) -> float | None:
    """Device seconds a profiled step of one kind of operation (`group`; None: of all)."""
    if not isinstance(anatomy, dict) or not anatomy.get("profiled_steps"):
        return None
    entry = anatomy if group is None else anatomy.get(group)
    seconds = entry.get("device_time_s" if group is None else "time_s") if isinstance(entry, dict) else None
    return seconds / anatomy["profiled_steps"] if isinstance(seconds, (int, float)) else None


@dataclass(frozen=True)
class MetricRow:
    key: str
    label: str
    values: tuple[float | None, ...]
    deltas_percent: tuple[float | None, ...]
    """Against the first run; the first entry is always None."""


@dataclass(frozen=True)
class Comparison:
    run_ids: tuple[int, ...]
    differing: tuple[tuple[str, tuple[Any, ...]], ...]
    """(config field, value in each run) for the fields that differ."""
    metrics: tuple[MetricRow, ...]


def compare_runs(run_ids: Sequence[int], configs: Sequence[dict[str, Any]], results: Sequence[RunResult]) -> Comparison:
    """Side-by-side comparison of runs; deltas are against the first."""
    fields = sorted({key for config in configs for key in config})
    differing = tuple(
        (field, tuple(config.get(field) for config in configs))
        for field in fields
        if len({repr(config.get(field)) for config in configs}) > 1
    )
    metrics = []
    for key, label in COMPARED_METRICS:
        values = tuple(metric_value(result, key) for result in results)
        optional = (
            key in STEP_TIME_METRICS or key in OPERATIONS_METRICS or key in ACTIVITY_METRICS or key in LOSS_METRICS
        )
        if optional and all(value is None for value in values):
            continue  # runs recorded before steps were timed, none profiled, or none on a GPU: no rows of dashes
        deltas = (None, *(percent_delta(value, values[0]) for value in values[1:]))
        metrics.append(MetricRow(key, label, values, deltas))
    return Comparison(tuple(run_ids), differing, tuple(metrics))
