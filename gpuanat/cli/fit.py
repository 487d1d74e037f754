"""`gpuanat fit`: the largest batch that trains, confirmed with short real runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpuanat.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    STATUS_EXIT_CODES,
    check_values,
    config_from_args,
    detect_capabilities,
    fail_usage,
    machine_config,
    metrics_endpoint,
    open_store,
    prepared_workers,
    run_recorded,
)
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.searches import start_search
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.validation import MAX_BATCH_SIZE, MAX_STEPS, machine_unsupported_reason


def command_fit(args: argparse.Namespace) -> int:
    from gpuanat.core.measure.nvml_source import nvml_status
    from gpuanat.core.memory.sizes import parse_size
    from gpuanat.core.run.fit import fit_start, fit_unsupported_reason, run_fit

    if not 1 <= args.trial_steps <= MAX_STEPS:
        fail_usage(f"--trial-steps: must be an integer ≥ 1 and ≤ {MAX_STEPS:,} (got {args.trial_steps})")
    if not 1 <= args.max_batch <= MAX_BATCH_SIZE:
        fail_usage(f"--max-batch: must be an integer ≥ 1 and ≤ {MAX_BATCH_SIZE:,} (got {args.max_batch})")
    gpu_memory = None
    if args.gpu_memory is not None:
        try:
            gpu_memory = parse_size(args.gpu_memory)
        except ValueError as error:
            fail_usage(f"--gpu-memory: {error}")
    data_longest_row = check_values(args)
    # fit needs CUDA: --device cpu says so before the capability probe, otherwise the probe does.
    capabilities = None if args.device == "cpu" else detect_capabilities()
    cannot_fit = fit_unsupported_reason(
        config_from_args(args, capabilities is not None and capabilities.cuda_available)
    )
    if cannot_fit is not None:
        fail_usage(cannot_fit)
    assert capabilities is not None
    base = machine_config(args, capabilities)
    unsupported = machine_unsupported_reason(base, capabilities)
    if unsupported is not None:
        fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    if gpu_memory is None:
        nvml = nvml_status()
        gpu_memory = nvml.gpu_total_bytes[0] if nvml.available and nvml.gpu_total_bytes else None
    starting = fit_start(base, gpu_memory, data_longest_row)
    start, predicted = starting.batch_size, starting.predicted
    print(
        f"fit: starting from batch {start}{starting.words()}, {args.trial_steps} steps per trial, up to batch "
        f"{args.max_batch}",
        file=sys.stderr,
    )

    def trial_with_progress(
        config: RunConfig, *, store: HistoryStore, log_dir: Path, name: str, search_id: int
    ) -> RunResult:
        return run_recorded(
            config,
            store,
            args.stop_signals,
            label=name,
            name=name,
            warm_workers=workers,
            metrics=metrics,
            search_id=search_id,
            tags=args.tags,
            data_longest_row=data_longest_row,
        )

    def trial_done(batch_size: int, result: RunResult) -> None:
        print(f"fit: batch {batch_size}: {result.status}", file=sys.stderr)

    with (
        open_store(args) as store,
        prepared_workers() as workers,
        metrics_endpoint(args.metrics, name="fit") as metrics,
    ):
        fit = run_fit(
            base,
            store=store,
            log_dir=store.path.parent / "logs",
            start=start,
            trial_steps=args.trial_steps,
            max_batch=args.max_batch,
            run_trial=trial_with_progress,
            on_trial=trial_done,
            search_id=start_search(store, "fit", base),
        )
    if args.stop_signals.requested.is_set():
        print("gpuanat: fit stopped before it found the largest batch", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    if fit.failure is not None:
        failed = fit.failure
        message = (failed.error.message if failed.error else str(failed.status)).splitlines()[0]
        print(
            f"gpuanat: fit stopped: the trial at batch {failed.config['batch_size']} ended {failed.status} "
            f"({message}), not out of memory",
            file=sys.stderr,
        )
        return STATUS_EXIT_CODES.get(str(failed.status), EXIT_FAILED)
    largest, trials, results = fit.largest_batch_size, fit.trials, fit.results
    summary = {
        "config": base.to_json(),
        "largest_batch_size": largest,
        "predicted_max_batch_size": predicted,
        "gpu_memory_bytes": gpu_memory,
        "reached_max_batch": largest == args.max_batch,
        "trials": [
            {
                "batch_size": t.batch_size,
                "trained": t.trained,
                "run_id": results[t.batch_size].run_id,
                "peak_allocated_bytes": results[t.batch_size].peak_allocated_bytes,
                "peak_reserved_bytes": results[t.batch_size].peak_reserved_bytes,
            }
            for t in trials
        ],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        trained = ", ".join(f"{t.batch_size} {'ok' if t.trained else 'OOM'}" for t in trials)
        limit_note = " (the --max-batch limit; larger may fit)" if summary["reached_max_batch"] else ""
        print(f"Largest batch that trains: {largest}{limit_note}; predicted: {predicted or '—'}; trials: {trained}")
    return EXIT_OK
