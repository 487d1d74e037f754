"""`gpuanat tune`: the fastest training that fits, found with short real runs (gpuanat.core.run.tune)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuanat.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OOM,
    EXIT_STOPPED,
    check_values,
    detect_capabilities,
    fail_usage,
    given_fields,
    machine_config,
    metrics_endpoint,
    open_store,
    prepared_workers,
    print_table,
    run_recorded,
)
from gpuanat.core.operations.report import summary_lines as operations_summary_lines
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.searches import start_search
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import TECHNIQUES_BY_FIELD
from gpuanat.core.vocabulary.validation import MAX_BATCH_SIZE, MAX_STEPS, machine_unsupported_reason

MAX_BUDGET_MINUTES = 7 * 24 * 60.0
"""A week: a longer search is a typo."""
MIN_TRIAL_STEPS = 3
"""The probe's first 2 steps are warm-up; a steady rate needs at least one more."""


def _minutes(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _gib(value: int | None) -> str:
    from gpuanat.core.store.report import format_bytes

    return format_bytes(value)


def _parse_search(text: str | None) -> list[str] | None:
    from gpuanat.core.run.tune.space import DIMENSIONS

    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in DIMENSIONS]
    if not names or unknown:
        fail_usage(
            f"--search: {', '.join(repr(name) for name in unknown) or 'nothing given'}: choose from "
            f"{', '.join(DIMENSIONS)}, separated by commas"
        )
    return names


def _check_numbers(args: argparse.Namespace) -> None:
    if not 0 < args.budget <= MAX_BUDGET_MINUTES:
        fail_usage(f"--budget: minutes, more than 0 and at most {MAX_BUDGET_MINUTES:.0f} (got {args.budget})")
    if not MIN_TRIAL_STEPS <= args.trial_steps <= MAX_STEPS:
        fail_usage(
            f"--trial-steps: must be an integer ≥ {MIN_TRIAL_STEPS} (2 warm-up steps and at least one timed) "
            f"and ≤ {MAX_STEPS:,} (got {args.trial_steps})"
        )
    if args.max_batch is not None and not 1 <= args.max_batch <= MAX_BATCH_SIZE:
        fail_usage(f"--max-batch: must be an integer ≥ 1 and ≤ {MAX_BATCH_SIZE:,} (got {args.max_batch})")
    if args.effective_batch is not None:
        if not 1 <= args.effective_batch <= MAX_BATCH_SIZE:
            fail_usage(
                f"--effective-batch: must be an integer ≥ 1 and ≤ {MAX_BATCH_SIZE:,} (got {args.effective_batch})"
            )
        if args.grad_accum is not None:
            fail_usage("--effective-batch: the search sets --grad-accum to keep it; give one or the other")
        if args.batch_size is not None and args.effective_batch % args.batch_size:
            fail_usage(f"--effective-batch: {args.effective_batch} is not a multiple of --batch-size {args.batch_size}")


def _given_memory(args: argparse.Namespace) -> int | None:
    from gpuanat.core.memory.sizes import parse_size

    if args.gpu_memory is None:
        return None
    try:
        return parse_size(args.gpu_memory)
    except ValueError as error:
        fail_usage(f"--gpu-memory: {error}")


def _memory_limit(given: int | None, base: RunConfig, capabilities: Capabilities) -> int | None:
    """--gpu-memory; else on CUDA GPU 0's total (NVML, else torch's); on the CPU none."""
    if given is not None:
        return given
    if base.device != "cuda":
        return None
    from gpuanat.core.measure.nvml_source import nvml_status

    nvml = nvml_status()
    if nvml.available and nvml.gpu_total_bytes:
        return int(nvml.gpu_total_bytes[0])
    return capabilities.cuda_total_memory_bytes


def _trial_memory(trial: Any) -> tuple[int | None, str | None]:
    """A trial's memory from the first source it has (MEMORY_SOURCES order)."""
    from gpuanat.core.run.tune.result import MEMORY_SOURCES

    for source, _ in MEMORY_SOURCES:
        value = trial.memory_bytes(source)
        if value is not None:
            return value, source
    return None, None


def trial_json(trial: Any, source: str | None, kept: list[int]) -> dict[str, Any]:
    result = trial.result
    error = result.error
    return {
        "index": trial.index,
        "name": trial.name,
        "run_id": trial.run_id,
        "status": trial.status,
        "dimension": trial.dimension,
        "kept": trial.index in kept,
        "config": trial.config.to_json(),
        "techniques": trial.config.techniques_summary(),
        "samples_per_second": trial.samples_per_second,
        "rate_source": trial.rate_source,
        "steady_samples_per_second": result.steady_samples_per_second,
        "joules_per_sample": trial.joules_per_sample,
        "peak_memory_bytes": trial.memory_bytes(source) if source is not None else None,
        "peak_reserved_bytes": result.peak_reserved_bytes,
        "device_memory_used_bytes": result.device_memory_used_bytes,
        "process_memory_used_bytes": result.process_memory_used_bytes,
        "predicted_peak_device_bytes": result.predicted.peak_device_bytes if result.predicted else None,
        "predicted_peak_allocated_bytes": result.predicted.peak_allocated_bytes if result.predicted else None,
        "steps": result.steps,
        "wall_s": trial.wall_s,
        "error": (error.message or "").splitlines()[0] if error else None,
    }


def tune_json(
    outcome: Any, *, base: RunConfig, space: Any, budget_s: float, trial_steps: int, held: list[str]
) -> dict[str, Any]:
    from gpuanat.core.run.tune.result import MEMORY_SOURCES
    from gpuanat.core.run.tune.runs import run_command, run_flags, trial_config

    source = outcome.memory_source
    best = outcome.best
    best_json = None
    if best is not None:
        best_json = {
            **trial_json(best, source, outcome.kept),
            "run_flags": run_flags(best.config),
            "command": run_command(best.config),
            "trial_command": run_command(trial_config(best.config, trial_steps)),
            # where its GPU time went (its profiled steps), each kernel's row left out: the run in the history has them
            "operations_anatomy": {
                key: value for key, value in (best.result.operations_anatomy or {}).items() if key != "kernels"
            }
            or None,
        }
    return {
        "status": outcome.stop_reason,
        "objective": outcome.objective,
        "device": base.device,
        "gpu_memory_bytes": space.gpu_memory_bytes,
        "usable_memory_bytes": space.usable_memory_bytes,
        "budget_s": budget_s,
        "trial_steps": trial_steps,
        "elapsed_s": outcome.elapsed_s,
        "searched": list(space.dimensions),
        "held": held,
        "memory_source": source,
        "memory_source_description": dict(MEMORY_SOURCES).get(source) if source else None,
        "trials": [trial_json(trial, source, outcome.kept) for trial in outcome.trials],
        "pruned": [
            {
                "dimension": pruned.dimension,
                "config": pruned.config.to_json(),
                "techniques": pruned.config.techniques_summary(),
                "reason": pruned.reason,
                "predicted_peak_device_bytes": pruned.predicted_peak_device_bytes,
            }
            for pruned in outcome.pruned
        ],
        "front": [trial_json(trial, source, outcome.kept) for trial in outcome.front],
        "best": best_json,
    }


def _held_flags(args: argparse.Namespace, searchable: set[str]) -> list[str]:
    """The flags the user gave for techniques the search would otherwise change."""
    return [TECHNIQUES_BY_FIELD[name].flag for name in sorted(given_fields(args) & searchable)]


def _print_front(summary: dict[str, Any]) -> None:
    from gpuanat.core.store.report import Column

    columns = (
        Column("run_id", "run", numeric=True),
        Column("trial", "trial"),
        Column("rate", "samples/s", numeric=True),
        Column("memory", "peak memory", numeric=True),
        Column("techniques", "techniques", shrinks=True),
    )
    rows = [
        {
            "run_id": entry["run_id"],
            "trial": entry["name"].partition(":")[0],
            "rate": f"{entry['samples_per_second']:.2f}" + ("" if entry["rate_source"] == "steady" else " *"),
            "memory": _gib(entry["peak_memory_bytes"]),
            "techniques": entry["techniques"],
        }
        for entry in summary["front"]
    ]
    print(
        f"Pareto front: samples/s against peak memory ({summary['memory_source_description']}), "
        f"{len(summary['front'])} of {sum(1 for t in summary['trials'] if t['status'] == 'ok')} ok trials"
    )
    print_table(columns, rows)
    if any(entry["rate_source"] != "steady" for entry in summary["front"]):
        print("* the whole run's rate, warm-up included: the trial had no steady window")
    best = summary["best"]
    if best is not None:
        energy = f", {best['joules_per_sample']:.3g} J a sample" if best.get("joules_per_sample") is not None else ""
        least = " (the least energy a sample)" if summary.get("objective") == "energy" else ""
        print(
            f"Best{least}: {best['command']}  ({best['samples_per_second']:.2f} samples/s{energy}, "
            f"{_gib(best['peak_memory_bytes'])})"
        )
        print(f"As timed ({summary['trial_steps']} steps a trial): {best['trial_command']}")
        anatomy = best.get("operations_anatomy")
        if anatomy:
            print(f"Where tune {best['index']}'s time went, its profiled steps:")
            for line in operations_summary_lines(anatomy):
                print(line)


def command_tune(args: argparse.Namespace) -> int:
    from gpuanat.core.run.tune.search import run_tune
    from gpuanat.core.run.tune.space import DIMENSION_FIELDS, search_space

    _check_numbers(args)
    only = _parse_search(args.search)
    given_memory = _given_memory(args)
    data_longest_row = check_values(args)
    capabilities = detect_capabilities()
    base = machine_config(args, capabilities)
    unsupported = machine_unsupported_reason(base, capabilities)
    if unsupported is not None:
        fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    if args.objective == "energy" and base.device != "cuda":
        fail_usage(
            f"--objective energy: a trial's energy is read from NVML's energy counter, and this run trains on the "
            f"{base.device}; tune on a GPU, or leave --objective out (throughput)"
        )
    gpu_memory = _memory_limit(given_memory, base, capabilities)
    if args.effective_batch is not None and args.batch_size is not None:
        base = base.replace(grad_accum=args.effective_batch // args.batch_size)
    given = given_fields(args)
    space = search_space(
        base,
        capabilities,
        given,
        gpu_memory_bytes=gpu_memory,
        only=only,
        max_batch=args.max_batch,
        effective_batch=args.effective_batch,
    )
    searchable = {name for fields in DIMENSION_FIELDS.values() for name in fields}
    held = _held_flags(args, searchable)
    if not space.dimensions:
        fail_usage(
            "nothing to search: every technique it searches is given a flag or has no alternative here "
            "(see gpuanat tune --help)"
        )
    budget_s = args.budget * 60.0
    if gpu_memory is None:
        limit = (
            f"on the {base.device}, no memory limit: nothing is pruned by prediction (give --gpu-memory SIZE to "
            "prune as for a GPU of that size)"
        )
    elif base.device != "cuda":
        limit = (
            f"on the {base.device}, pruning by what the prediction says for a GPU of {_gib(gpu_memory)} "
            f"(--gpu-memory), {_gib(space.usable_memory_bytes)} of it usable"
        )
    else:
        limit = f"pruning by prediction to {_gib(space.usable_memory_bytes)} of the GPU's {_gib(gpu_memory)}"
    if gpu_memory is not None and base.compile:  # the user's --compile: no candidate of the search would be
        limit += (
            " (--compile: the whole model compiled is not predicted; pruned as eager, which bounds nothing: "
            "a trial that runs out of memory rules out larger batches)"
        )
    print(
        f"tune: {base.model or base.preset} seq {base.seq_len}; searching {', '.join(space.dimensions)}; "
        + (f"holding {' '.join(held)} as given; " if held else "")
        + f"{limit}; {args.trial_steps} steps a trial, budget {_minutes(budget_s)}",
        file=sys.stderr,
    )

    from gpuanat.core.run.tune.moves import tune_profiled_steps

    profiled_steps = tune_profiled_steps(args.profile_ops, args.trial_steps)

    def trial(
        config: RunConfig,
        *,
        store: HistoryStore,
        log_dir: Path,
        name: str,
        search_id: int,
        data_longest_row: int | None = None,
    ) -> RunResult:
        return run_recorded(
            config,
            store,
            args.stop_signals,
            label=name,
            name=name,
            profile_ops=profiled_steps,
            warm_workers=workers,
            metrics=metrics,
            search_id=search_id,
            tags=args.tags,
            data_longest_row=data_longest_row,
        )

    def trial_done(done: Any, progress: Any) -> None:
        memory, _ = _trial_memory(done)
        if done.ok:
            outcome = (
                f"ok, {done.samples_per_second:.2f} samples/s"
                + ("" if done.rate_source == "steady" else " (whole run)")
                + f", {_gib(memory)}"
            )
        else:
            error = done.result.error_message or ""
            outcome = (
                done.status
                + (f" ({error.splitlines()[0][:80]})" if error else "")
                + ("" if done.status == "stopped" else "; not tried this way again")
            )
        print(
            f"{done.name} — {outcome} · run {done.run_id} · {done.wall_s:.0f} s | {_minutes(progress.elapsed_s)} "
            f"of {_minutes(progress.budget_s)}, {progress.left_words(_minutes)}",
            file=sys.stderr,
        )

    def pruned(refused: Any) -> None:
        print(
            f"tune: not tried ({refused.dimension}): {refused.config.techniques_summary()}: {refused.reason}",
            file=sys.stderr,
        )

    def round_order(center: Any, reason: str) -> None:
        if reason:
            print(f"tune: moves from tune {center.index}: {reason}", file=sys.stderr)

    def kept(trial_kept: Any, gain: float) -> None:
        if trial_kept.dimension != "start":
            print(f"tune: best so far: {trial_kept.name} (+{100 * gain:.1f}%)", file=sys.stderr)

    with (
        open_store(args) as store,
        args.stop_signals.polled() as stop,
        prepared_workers() as workers,
        metrics_endpoint(args.metrics, name="tune") as metrics,
    ):
        outcome = run_tune(
            base,
            space,
            store=store,
            log_dir=store.path.parent / "logs",
            trial_steps=args.trial_steps,
            budget_s=budget_s,
            run_trial=trial,
            on_trial=trial_done,
            on_pruned=pruned,
            on_kept=kept,
            on_round=round_order,
            stop=stop,
            objective=args.objective,
            search_id=start_search(store, "tune", base),
            data_longest_row=data_longest_row,
        )
    summary = tune_json(outcome, base=base, space=space, budget_s=budget_s, trial_steps=args.trial_steps, held=held)
    why = {
        "converged": "no move helped",
        "budget": "the next trial would overrun the budget",
        "interrupted": "interrupted",
        "failed": "a trial failed (see its log)",
        "nothing fits": "the prediction says no start fits the memory",
    }[outcome.stop_reason]
    count = len(outcome.trials)
    print(
        f"tune: {why}: {count} trial{'' if count == 1 else 's'} in {_minutes(outcome.elapsed_s)}, "
        f"{len(outcome.pruned)} not tried by prediction",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(summary))
    elif summary["front"]:
        _print_front(summary)
    if outcome.stop_reason == "interrupted":
        return args.stop_signals.exit_code or EXIT_STOPPED
    if summary["best"] is None:
        statuses = {trial.status for trial in outcome.trials}
        print(
            "gpuanat: tune found nothing that trains"
            + (f" (trials: {', '.join(sorted(statuses))})" if statuses else ""),
            file=sys.stderr,
        )
        return EXIT_OOM if outcome.stop_reason == "nothing fits" or statuses == {"oom"} else EXIT_FAILED
    return EXIT_OK
