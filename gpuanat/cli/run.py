"""`gpuanat run`: train one configuration (or the user's own script, `--script`) in a child process and report it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuanat.cli.common import (
    EXIT_USAGE,
    ProgressView,
    check_values,
    detect_capabilities,
    exit_code_for,
    fail_usage,
    machine_config,
    measurement_environment,
    metrics_endpoint,
    open_store,
    print_summary,
    run_recorded,
    warn_if_not_saved,
)
from gpuanat.core.measure.startup import process_started_monotonic_s
from gpuanat.core.printable import printable
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import TECHNIQUES
from gpuanat.core.vocabulary.validation import machine_unsupported_reason


def print_named_summary(result: RunResult, name: str | None, db: Path | None = None) -> None:
    """The run's summary, under the name it was given (`--name`; escaped, as every string from outside); `db`: the
    history given with --db. Of an out-of-memory run the bands are the failing allocation's, and the summary says
    what failed and which modules held the most activations."""
    if name is not None:
        print(f"Name: {printable(name)}")
    print_summary(result, db)


def command_run_script(args: argparse.Namespace) -> int:
    from gpuanat.core.run.script_session import execute_script

    given = [t.flag for t in TECHNIQUES if getattr(args, t.field, None) is not None]
    if given:
        fail_usage(
            f"{given[0]}: technique flags do not apply to --script (the script sets its own "
            "TrainingArguments); give the script its own arguments after --"
        )
    script: Path = args.script
    if not script.is_file():
        fail_usage(f"--script: no such file: {script}")
    check_snapshot_folders(args)
    if args.metrics is not None:  # the script's own probe serves them, as in a job gpuanat did not start
        print(
            f"gpuanat: the script's probe serves Prometheus metrics on {args.metrics[0]}:{args.metrics[1]} (its "
            "log says so once it does)",
            file=sys.stderr,
        )
    with open_store(args) as store:
        view = ProgressView(f"script {script.name}")
        try:
            with args.stop_signals.polled() as stop_requested:
                result = execute_script(
                    script,
                    args.script_args,
                    store=store,
                    log_dir=store.path.parent / "logs",
                    name=args.name,
                    on_event=view,
                    trace_path=args.trace_out,
                    stop_requested=stop_requested,
                    tags=args.tags,
                    env=measurement_environment(
                        keep_oom_snapshot=args.keep_oom_snapshot,
                        profile_ops=args.profile_ops,
                        profile_ops_trace=args.profile_ops_trace,
                        metrics=args.metrics,
                        name=args.name,
                    ),
                )
        finally:
            view.close()
    warn_if_not_saved(result)
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print_named_summary(result, args.name, args.db)
    print_kept_snapshot(result, args.json)
    if result.status == "oom":
        memory = {"cpu": "host memory (RAM)", "cuda": "GPU memory"}.get(result.device or "", "memory")
        print(f"gpuanat: the script ran out of {memory}: {result.error_message}", file=sys.stderr)
    return exit_code_for(result.status or "failed", args.stop_signals)


def check_snapshot_folders(args: argparse.Namespace) -> None:
    """`--memory-snapshot` and `--keep-oom-snapshot` write a file: their folder must exist (a script run has only the
    second)."""
    paths = (
        ("--memory-snapshot", getattr(args, "memory_snapshot", None)),
        ("--keep-oom-snapshot", args.keep_oom_snapshot),
    )
    for flag, path in paths:
        if path is not None and not path.parent.resolve().is_dir():
            fail_usage(f"{flag}: no such folder: {printable(str(path.parent))}")


def print_kept_snapshot(result: RunResult, json_output: bool) -> None:
    """Where `--keep-oom-snapshot` wrote the allocator's snapshot of the failure, when it did."""
    kept = (result.out_of_memory or {}).get("snapshot_path")
    if kept:
        print(
            f"Out-of-memory snapshot: {printable(kept)} (drop it on pytorch.org/memory_viz)",
            file=sys.stderr if json_output else sys.stdout,
        )


def check_profile_ops(args: argparse.Namespace) -> None:
    """`--profile-ops-trace` asks for a trace of profiled steps: it needs `--profile-ops` and a folder to write in."""
    trace = args.profile_ops_trace
    if trace is None:
        return
    if not args.profile_ops:
        fail_usage("--profile-ops-trace: give --profile-ops too (the trace is of the profiled steps)")
    if not trace.parent.resolve().is_dir():
        fail_usage(f"--profile-ops-trace: no such folder: {printable(str(trace.parent))}")


def command_run(args: argparse.Namespace) -> int:
    args.name = args.name or None  # `--name ""`: no name, as without the flag
    check_profile_ops(args)
    if args.script is not None:
        return command_run_script(args)
    if args.script_args:
        fail_usage("arguments after -- are for a script: give it with --script SCRIPT.py")
    data_longest_row = check_values(args)
    check_snapshot_folders(args)
    capabilities = detect_capabilities()
    config = machine_config(args, capabilities)
    unsupported = machine_unsupported_reason(config, capabilities)
    if unsupported is not None:
        fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    for flag, path in (("--memory-snapshot", args.memory_snapshot), ("--keep-oom-snapshot", args.keep_oom_snapshot)):
        if path is not None and config.device != "cuda":
            fail_usage(
                f"{flag}: torch records its allocator's history only on CUDA, and this run is on {config.device}"
            )
    with open_store(args) as store, metrics_endpoint(args.metrics, name=args.name) as metrics:
        result = run_recorded(
            config,
            store,
            args.stop_signals,
            label="run",
            name=args.name,
            trace_path=args.trace_out,
            memory_snapshot=args.memory_snapshot,
            keep_oom_snapshot=args.keep_oom_snapshot,
            requested_monotonic_s=process_started_monotonic_s(),
            profile_ops=args.profile_ops,
            profile_ops_trace=args.profile_ops_trace,
            metrics=metrics,
            tags=args.tags,
            data_longest_row=data_longest_row,
        )
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        print_named_summary(result, args.name, args.db)
    if args.memory_snapshot is not None:
        written = args.memory_snapshot.is_file()
        print(
            f"Memory snapshot: {args.memory_snapshot} (drop it on pytorch.org/memory_viz)"
            if written
            else f"gpuanat: no memory snapshot was written to {args.memory_snapshot} (see the log)",
            file=sys.stderr if args.json or not written else sys.stdout,
        )
    print_kept_snapshot(result, args.json)
    run_error = result.error
    if run_error is not None and run_error.kind == "config":
        print(f"gpuanat: error: {run_error.flag}: {run_error.message}", file=sys.stderr)
        return EXIT_USAGE
    if result.status == "oom":
        print(f"gpuanat: {out_of_memory_line(config, result)}", file=sys.stderr)
    return exit_code_for(result.status or "failed", args.stop_signals)


def out_of_memory_line(config: Any, result: RunResult) -> str:
    """What ran out (the GPU's memory, or on a CPU run the host's), at which step, and what to change."""
    from gpuanat.core.store.report import format_bytes

    step = result.error.step if result.error else None
    hint = out_of_memory_hint(config, result.device_memory_total_bytes)
    if config.device == "cpu":  # no GPU, and no CUDA allocator's peak: the summary's error says what failed
        return f"out of host memory (RAM) at step {step}; {hint}"
    failure = result.out_of_memory or {}
    allocated, failed = failure.get("allocated_bytes"), failure.get("failed_allocation_bytes")
    reached = (
        f"{format_bytes(allocated)} allocated when {format_bytes(failed)} more was asked for"
        if allocated is not None and failed is not None
        else f"peak allocated {format_bytes(result.peak_allocated_bytes)}"
    )
    return f"out of GPU memory at step {step} ({reached}); {hint}"


def out_of_memory_hint(config: Any, gpu_memory_bytes: int | None) -> str:
    """What to change after running out of memory: the fit ladder's steps up to the one predicted to fit this GPU
    (as `gpuanat predict` lists them), else the techniques that lower memory and are not on yet."""
    from gpuanat.cli.run_text import fit_hint
    from gpuanat.core.memory.fit_ladder import what_would_fit

    return fit_hint(what_would_fit(config, gpu_memory_bytes))
