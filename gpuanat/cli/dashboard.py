"""`gpuanat` without a command: the live dashboard."""

from __future__ import annotations

import argparse
import sys

from gpuanat.cli.common import (
    EXIT_OK,
    check_values,
    config_from_args,
    fail_usage,
    history_path,
    metrics_endpoint,
    served_in_a_browser,
    untouched_fields,
    user_keymap,
)


def command_dashboard(args: argparse.Namespace) -> int:
    """The full-screen TUI."""
    from gpuanat.core.run.warm import WarmWorkers
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend

    # The device default, and on the CPU the workload the user left to the defaults, are settled in the app once
    # its capability probe has answered.
    check_values(args)
    config = config_from_args(args, cuda_available=True)
    keymap = user_keymap(GpuAnatApp)
    if not sys.stdout.isatty() and not served_in_a_browser():
        fail_usage("the dashboard needs a terminal; use `gpuanat run`, `sweep` or `history` in scripts")
    with metrics_endpoint(args.metrics, name="dashboard") as metrics:
        db_path = history_path(args)
        app = GpuAnatApp(
            config,
            db_path=db_path,
            backend=LocalRunBackend(db_path, warm_workers=WarmWorkers(), metrics=metrics),
            keymap=keymap,
            untouched_fields=untouched_fields(args),
        )
        app.run()
    return EXIT_OK if app.stop_signal is None else 128 + app.stop_signal
