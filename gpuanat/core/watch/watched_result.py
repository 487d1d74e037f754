"""A watched run's result, in the terms of `gpuanat run --json`, so the history and compare read it as they read a
launched run's: what the watch's records (`WatchRecords`) observed of the run's probe, its processes and its GPU.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from typing import Any

from gpuanat.core.measure.activity import ACTIVITY_FIELDS, THROTTLE_FIELDS, Activity, steady_activity
from gpuanat.core.measure.anatomy import assemble_bands, gradients_after_backward_bytes
from gpuanat.core.measure.failure import Readings, bands_readings, modules_json, out_of_memory_json
from gpuanat.core.measure.loss_curve import LOSS_FIELDS
from gpuanat.core.measure.result import probe_cost_percent
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.vocabulary.result import Bands, RankResult, RunError, RunResult
from gpuanat.core.watch.records import WatchRecords

WATCH_RESULT_KEYS = (
    "run_id",
    "name",
    "kind",
    "status",
    "config",
    "params",
    "train_runtime_s",
    "samples_per_second",
    "steady_samples_per_second",
    "warmup_steps",
    "steps",
    "samples",
    "train_loss",
    "probe_time_s",
    "probe_time_by_part_s",
    "probe_cost_percent",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "device_memory_used_bytes",
    "process_memory_used_bytes",
    "device_memory_total_bytes",
    "peak_rss_bytes",
    "peak_cpu_percent",
    "device",
    "device_name",
    "gpu_name",
    "versions",
    "bands",
    "gradients_after_backward_bytes",
    "unavailable",
    "published",
    "watched_s",
    "pid_namespace_note",
    "error",
    "log_path",
    "malformed_events",
    "ranks",
    "operations_anatomy",
    *("modules", "out_of_memory"),
    *ACTIVITY_FIELDS,
    *THROTTLE_FIELDS,
    *LOSS_FIELDS,
)
"""The keys of a watched run's result (`watched_result`), in order."""


def _activity(records: WatchRecords) -> Activity:
    """The main GPU's activity over the run's steady steps (`measure.activity`), as a launched run's result has it."""
    observed, run = records.observed, records.observed.run
    done, last_step, hello = run.done, run.last_step, run.hello
    ends = run.step_ends_s
    start_s = ends.get(done.warmup_steps or 0) if done and ends else None
    tokens_per_sample = last_step.tokens / last_step.samples if last_step and last_step.samples else 1.0
    no_gpu = (
        "CPU run: no GPU"
        if hello and hello.device != "cuda"
        else None
        if observed.gpu_name
        else (records.last_record or {}).get("gpu_memory_reason") or "no GPU readings"
    )
    return steady_activity(
        list(observed.gpu_readings),
        (start_s, max(ends.values())) if start_s is not None else None,
        done.steady_samples_per_second if done else None,
        tokens_per_sample,
        no_gpu_reason=no_gpu,
    )


def watched_result(records: WatchRecords, *, exited: bool, run_id: int | None, name: str | None) -> RunResult:
    """The watched run's result in the terms of `gpuanat run --json`, so history and compare read it; `run_id`
    and `name` are its history run's, None when it is not saved."""
    observed, run = records.observed, records.observed.run
    done, last_step = run.done, run.last_step
    status = "ok" if done is not None and done.status == "ok" else "exited" if exited else "detached"
    unavailable: dict[str, str] = {}
    bands: dict[str, Any] = {}
    if observed.publisher_pid is not None:
        readings = bands_readings(
            Readings(
                (done.peak_reserved_bytes if done else None) or run.peak_reserved_bytes,
                observed.peak_device_used_bytes,
                observed.peak_gpu_memory_bytes,
                observed.device_total_bytes,
            ),
            run.error,
        )
        memory = assemble_bands(
            run.probe_bands,
            reserved_bytes=readings.reserved_bytes,
            device_used_bytes=readings.device_used_bytes,
            device_total_bytes=readings.device_total_bytes,
            process_used_bytes=readings.process_used_bytes,
            no_gpu_reason=(
                "CPU run: it uses no GPU memory"
                if run.hello and run.hello.device != "cuda"
                else None
                if observed.gpu_name
                else "no GPU readings"
            ),
        )
        bands = memory.values()
        unavailable.update(memory.unavailable)
    else:
        unavailable["bands"] = records.publication_reason()
    train_runtime_s = done.train_runtime_s if done else (last_step.elapsed_s if last_step else None)
    samples_per_second = (
        done.samples_per_second
        if done
        else (last_step.samples / last_step.elapsed_s if last_step and last_step.elapsed_s > 0 else None)
    )
    if done is None or done.steady_samples_per_second is None:
        unavailable["steady_samples_per_second"] = (
            done.steady_reason if done else None
        ) or "the run had not finished training when the watch ended"
    if observed.peak_gpu_memory_bytes is None:
        unavailable["device_memory_used_bytes"] = (records.last_record or {}).get("gpu_memory_reason") or "no GPU"
    hello = run.hello
    result = RunResult(
        run_id=run_id,
        name=name,
        kind=records.kind,
        status=status,
        config=records.config(),
        params=run.model.params if run.model else None,
        train_runtime_s=train_runtime_s,
        samples_per_second=samples_per_second,
        steady_samples_per_second=done.steady_samples_per_second if done else None,
        warmup_steps=done.warmup_steps if done else None,
        steps=done.steps if done else (last_step.step if last_step else 0),
        samples=done.samples if done else (last_step.samples if last_step else 0),
        train_loss=done.train_loss if done else None,
        probe_time_s=done.probe_time_s if done else None,
        probe_time_by_part_s=done.probe_time_by_part_s if done else None,
        probe_cost_percent=probe_cost_percent(done),
        peak_allocated_bytes=done.peak_allocated_bytes if done else None,
        peak_reserved_bytes=(done.peak_reserved_bytes if done else None) or run.peak_reserved_bytes,
        device_memory_used_bytes=observed.peak_device_used_bytes,
        process_memory_used_bytes=observed.peak_gpu_memory_bytes,
        device_memory_total_bytes=observed.device_total_bytes,
        peak_rss_bytes=observed.peak_rss_bytes,
        peak_cpu_percent=observed.peak_cpu_percent,
        device=hello.device if hello else None,
        device_name=hello.device_name if hello else None,
        gpu_name=observed.gpu_name,
        versions=hello.versions if hello else {},
        bands=Bands.from_json(bands),
        gradients_after_backward_bytes=gradients_after_backward_bytes(run.probe_bands),
        unavailable=unavailable,
        published=observed.publisher_pid is not None,
        watched_s=records.watched_s(),
        pid_namespace_note=records.mapping.note,
        error=(
            RunError(kind=run.error.kind, message=run.error.message, step=run.error.step, flag=run.error.flag)
            if run.error
            else None
        ),
        log_path=None,
        malformed_events=observed.malformed,
        ranks=[RankResult.from_json(rank) for rank in (records.last_record or {}).get("ranks", [])],
        operations_anatomy=operations_anatomy(run.operations) if run.operations else None,
        modules=modules_json(run.probe_bands),
        out_of_memory=out_of_memory_json(run.error, 0),
        json_keys=WATCH_RESULT_KEYS,
    )
    _activity(records).fill(result)
    losses, no_loss = run.loss.result_values()
    for key, value in losses.items():
        setattr(result, key, value)
    result.unavailable |= no_loss
    return result
