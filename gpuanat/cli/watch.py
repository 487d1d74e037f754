"""`gpuanat watch PID`: any process's GPU memory, utilization and host use, its anatomy where published."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from gpuanat.cli.common import (
    EXIT_OK,
    EXIT_STOPPED,
    fail_usage,
    history_path,
    metrics_endpoint,
    served_in_a_browser,
    user_keymap,
    warn_if_not_saved,
)
from gpuanat.core.store.history import HistoryStore


def command_watch(args: argparse.Namespace) -> int:
    from gpuanat.core.watch.target import WatchError, resolve_target

    if args.interval <= 0:
        fail_usage(f"--interval: must be a number of seconds > 0 (got {args.interval})")
    if args.duration is not None and args.duration <= 0:
        fail_usage(f"--duration: must be a number of seconds > 0 (got {args.duration})")
    try:
        target = resolve_target(args.pid)
    except WatchError as error:
        fail_usage(str(error))
    save_name = (args.save or None) if args.save is not None else None
    db_path = history_path(args)
    watch_metrics = _watch_metrics(args)
    snapshots = watch_metrics.snapshots if watch_metrics is not None else None
    with metrics_endpoint(args.metrics, snapshots, name=f"watch {args.pid}"):
        if not args.json:
            return _watch_dashboard(args, target, db_path, watch_metrics)
        return _watch_json(args, target, db_path, save_name, watch_metrics)


def _watch_metrics(args: argparse.Namespace) -> Any:
    """With --metrics, what the endpoint reads: the latest record, with the GPUs' UUIDs as NVML lists them."""
    if args.metrics is None:
        return None
    from gpuanat.core.export.watch_metrics import WatchMetrics
    from gpuanat.core.measure.gpus import read_gpus

    return WatchMetrics({gpu.index: gpu.uuid for gpu in read_gpus()})


def _watch_json(args: argparse.Namespace, target: Any, db_path: Path, save_name: str | None, watch_metrics: Any) -> int:
    from gpuanat.core.measure.nvml_source import open_source
    from gpuanat.core.measure.sampler import Sampler
    from gpuanat.core.watch.session import WatchSession, follow

    source, nvml = open_source(per_process=True)
    session = WatchSession(target, nvml)
    sampler = Sampler(source, interval_s=args.interval, on_sample=lambda sample: None, trace_path=args.trace_out)
    if args.save is not None:
        session.start_saving(HistoryStore(db_path), save_name)

    def emit(record: dict[str, Any]) -> None:
        if record["exited"] and session.saved_run_id is not None:
            record["saved_run_id"] = session.saved_run_id
        print(json.dumps(record), flush=True)
        if watch_metrics is not None:
            watch_metrics.observe(record)

    ended = "stopped"
    try:
        with args.stop_signals.polled() as stop_requested:
            ended = follow(
                session,
                sampler,
                interval_s=args.interval,
                on_record=emit,
                duration_s=args.duration,
                stop_requested=stop_requested,
            )
    except KeyboardInterrupt:
        print("gpuanat: interrupted", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    finally:
        sampler.stop()
        source.close()
        session.close()
        result = session.finish_saving(exited=ended == "exited")
        warn_if_not_saved(result)
        if result is not None:
            print(f"gpuanat: saved as run {result.run_id} ({result.status}) in {db_path}", file=sys.stderr)
    if args.stop_signals.signal_number is not None:
        print(f"gpuanat: interrupted ({signal.Signals(args.stop_signals.signal_number).name})", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    return EXIT_OK


def _watch_dashboard(args: argparse.Namespace, target: Any, db_path: Path, watch_metrics: Any) -> int:
    from gpuanat.tui.watch_app import WatchApp

    keymap = user_keymap(WatchApp)
    if not sys.stdout.isatty() and not served_in_a_browser():
        fail_usage("the dashboard needs a terminal; add --json for one JSON object per sample")
    app = WatchApp(
        target,
        db_path=db_path,
        interval_s=args.interval,
        save_name=args.save or None,
        save_on_start=args.save is not None,
        trace_path=args.trace_out,
        keymap=keymap,
        on_record=watch_metrics.observe if watch_metrics is not None else None,
    )
    app.run()
    return EXIT_OK if app.stop_signal is None else 128 + app.stop_signal
