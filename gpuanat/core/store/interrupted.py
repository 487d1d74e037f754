"""Runs whose recorder died: how the history tells that the process recording a run is gone (its PID no longer
names the process that started recording), and the result such a run is finalised with, rebuilt from its steps.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from gpuanat.core.measure.anatomy import assemble_bands, gradients_after_backward_bytes
from gpuanat.core.measure.loss_curve import LOSS_FIELDS, curve_of_steps
from gpuanat.core.vocabulary.protocol import probe_bands_from_json
from gpuanat.core.vocabulary.result import Bands, RunError, RunResult

RECORDER_START_TOLERANCE_S = 1.0
"""Two readings of one process's start time agree within this (psutil derives it from the boot time and clock
ticks, both read from /proc); a PID reused by another process belongs to one that started later than that."""


def process_started_at(pid: int) -> float | None:
    """The Unix time the process started (psutil), None when there is no such process or it is a zombie."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None


def recorder_alive(pid: int | None, started_at: float | None, *, created_at: float) -> bool:
    """Whether the process that recorded a run still runs: its PID exists and belongs to a process started at
    `started_at`. Rows of schema version 1 have no start time: there the process must have started before the run
    was created (`created_at`), so a PID reused since reads as gone too."""
    if not pid:
        return False
    try:
        started = process_started_at(pid)
    except psutil.AccessDenied:
        return True
    if started is None:
        return False
    if started_at is None:
        return started <= created_at + RECORDER_START_TOLERANCE_S
    return abs(started - started_at) <= RECORDER_START_TOLERANCE_S


def result_from_steps(
    config: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    *,
    run_id: int | None = None,
    recorder_pid: int | None = None,
) -> RunResult:
    """The result of a run whose recorder stopped before it finished, rebuilt from its step records (in order)."""
    last = steps[-1] if steps else {}
    elapsed_s, samples = last.get("elapsed_s"), last.get("samples")
    losses = [step["loss"] for step in steps if step.get("loss") is not None]
    allocated = [
        value
        for step in steps
        if (value := step.get("peak_allocated_bytes") or step.get("allocated_bytes")) is not None
    ]
    reserved = [step["reserved_bytes"] for step in steps if step.get("reserved_bytes") is not None]
    with_bands = [step for step in steps if step.get("bands")]
    measured = _bands_of_step(with_bands[-1]) if with_bands else None
    recorder = f"the recorder (PID {recorder_pid})" if recorder_pid else "the recorder"
    counted = f"{len(steps)} recorded step" + ("" if len(steps) == 1 else "s")
    logged, no_loss = curve_of_steps(steps).result_values()
    return RunResult(
        run_id=run_id,
        status="interrupted",
        config=dict(config),
        steps=last.get("step", 0),
        samples=samples or 0,
        train_runtime_s=elapsed_s,
        samples_per_second=samples / elapsed_s if samples is not None and elapsed_s else None,
        train_loss=losses[-1] if losses else None,
        peak_allocated_bytes=max(allocated) if allocated else None,
        peak_reserved_bytes=max(reserved) if reserved else None,
        bands=Bands.from_json(measured[0]) if measured else None,
        gradients_after_backward_bytes=measured[1] if measured else None,
        error=RunError(
            kind="interrupted",
            message=f"{recorder} stopped before the run finished; this result was rebuilt from its {counted}",
            json_keys=("kind", "message"),
        ),
        unavailable=no_loss,
        json_keys=INTERRUPTED_RESULT_KEYS,
        **logged,
    )


INTERRUPTED_RESULT_KEYS = (
    *("run_id", "status", "config", "steps", "samples", "train_runtime_s", "samples_per_second", "train_loss"),
    *("peak_allocated_bytes", "peak_reserved_bytes", "bands", "gradients_after_backward_bytes", "error"),
    *(*LOSS_FIELDS, "unavailable"),
)
"""The keys of a result rebuilt from a run's steps, in order."""


def _bands_of_step(step: Mapping[str, Any]) -> tuple[dict[str, Any], int | None] | None:
    """The bands of one moment from a step record's probe bands and the allocator's and NVML's readings it carries,
    with the gradients' maximum after backward; None when the record's bands cannot be read."""
    try:
        probe = probe_bands_from_json(dict(step["bands"]))
    except (TypeError, ValueError, KeyError):
        return None
    nvml = step.get("nvml_device_used_bytes") is not None
    bands = assemble_bands(
        probe,
        reserved_bytes=step.get("reserved_bytes"),
        device_used_bytes=step.get("nvml_device_used_bytes"),
        device_total_bytes=None,
        process_used_bytes=step.get("nvml_process_used_bytes"),
        no_gpu_reason=None if nvml else "no NVML reading in the step records",
    )
    return (bands.values(), gradients_after_backward_bytes(probe))


def interrupted_result(stored: Mapping[str, Any], rebuilt: RunResult) -> RunResult:
    """What a partial result already stored (its JSON) says wins over the rebuilt one (its None values do not),
    except the status."""
    stored_values = {key: value for key, value in stored.items() if value is not None}
    return RunResult.from_json({**rebuilt.to_json(), **stored_values, "status": "interrupted"})
