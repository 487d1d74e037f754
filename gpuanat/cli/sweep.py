"""`gpuanat sweep`: the Hugging Face docs' whole experiment table, one fresh process per experiment."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuanat.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    check_values,
    detect_capabilities,
    fail_usage,
    machine_config,
    metrics_endpoint,
    open_store,
    prepared_workers,
    print_table,
    run_recorded,
)
from gpuanat.core.vocabulary.techniques import TECHNIQUES
from gpuanat.core.vocabulary.validation import machine_unsupported_reason


def command_sweep(args: argparse.Namespace) -> int:
    from gpuanat.core.store.report import SWEEP_COLUMNS, sweep_rows, unavailable_notes
    from gpuanat.core.store.sweep import BASE_TECHNIQUE_FIELDS, EXPERIMENTS

    fixed = [
        t.flag
        for t in TECHNIQUES
        if t.field in BASE_TECHNIQUE_FIELDS and t.field != "batch_size" and getattr(args, t.field) is not None
    ]
    if fixed:
        fail_usage(f"{fixed[0]}: the sweep sets it per experiment; use `gpuanat run` for one configuration")
    experiments = EXPERIMENTS
    if args.only:
        known = {experiment.name for experiment in EXPERIMENTS}
        for name in args.only:
            if name not in known:
                fail_usage(f"--only: unknown experiment {name!r}; choose from {', '.join(sorted(known))}")
        experiments = tuple(experiment for experiment in EXPERIMENTS if experiment.name in args.only)
    data_longest_row = check_values(args)  # every experiment trains the same rows
    capabilities = detect_capabilities()
    base = machine_config(args, capabilities)  # on the CPU, every experiment trains the CPU's workload
    results: list[dict[str, Any]] = []
    interrupted = False
    with (
        open_store(args) as store,
        prepared_workers() as workers,
        metrics_endpoint(args.metrics, name="sweep") as metrics,
    ):
        for index, experiment in enumerate(experiments, start=1):
            config = experiment.config(base)
            label = f"[{index}/{len(experiments)}] {experiment.name}"
            unsupported = machine_unsupported_reason(config, capabilities)
            if unsupported is not None:
                results.append(
                    {"name": experiment.name, "status": "skipped", "reason": unsupported[1], "config": config.to_json()}
                )
                print(f"{label}: skipped — {unsupported[1]}", file=sys.stderr)
                continue
            result = run_recorded(
                config,
                store,
                args.stop_signals,
                label=label,
                name=experiment.name,
                profile_ops=args.profile_ops,
                warm_workers=workers,
                metrics=metrics,
                tags=args.tags,
                data_longest_row=data_longest_row,
            )
            # the sweep's entry: the run's result with why it did not train, one line
            reason = result.error.message.splitlines()[0] if result.error else ""
            results.append({**result.to_json(), "reason": reason})
            print(f"{label}: {result.status}", file=sys.stderr)
            if result.status == "stopped" or args.stop_signals.requested.is_set():
                interrupted = True
                break
    rows = sweep_rows(results)
    if args.json:
        print(json.dumps([{**result, **row} for result, row in zip(results, rows, strict=False)]))
    else:
        print_table(SWEEP_COLUMNS, rows)
        for note in unavailable_notes(results):
            print(note)
    if interrupted:
        return args.stop_signals.exit_code or EXIT_STOPPED
    return EXIT_OK if all(r["status"] in ("ok", "skipped", "oom") for r in results) else EXIT_FAILED
