"""The `gpuanat` command: the live dashboard, and headless subcommands (run, sweep, predict, fit, tune,
history, explain, watch), one module each.

Exit codes: 0 ok, 1 a run failed, 2 bad input (nothing started), 3 out of memory (the GPU's, or on a CPU run the
host's), 130 stopped (128 + the signal's number when SIGTERM or SIGHUP stopped it: 143, 129). A history that cannot
be used (HistoryError) is reported in one line by `main`: 2 when its path or file must be fixed, 1 for a fault (busy,
full, I/O). Whatever a command prints is made printable on its way out (`gpuanat.cli.output`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sqlite3
import sys
from collections.abc import Callable

from gpuanat.cli.common import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, check_history_of
from gpuanat.cli.output import printable_output
from gpuanat.cli.parser import build_parser
from gpuanat.core.run.stop_signals import StopSignals
from gpuanat.core.store.history_errors import HistoryError


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """`gpuanat run --script train.py -- ARGS`: what follows the first `--` belongs to the script."""
    if "--" in argv:
        split = argv.index("--")
        return argv[:split], argv[split + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    with printable_output():  # nothing from outside reaches the terminal raw, whatever a command prints
        return _run_command(argv)


def _run_command(argv: list[str] | None) -> int:
    parser = build_parser()
    own_args, script_args = split_script_args(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(own_args)
    except BrokenPipeError:  # --print-completion or --help into a reader that stopped early
        return _reader_gone()
    args.script_args = script_args
    if args.command == "serve":  # `gpuanat serve -- FLAGS`: the served dashboard's flags
        args.served, script_args = [*args.served, *script_args], []
    if script_args and args.command != "run":
        parser.error("arguments after -- are only for `gpuanat run --script SCRIPT.py -- ARGS`")
    # The dashboards handle stop signals on their event loop; the headless commands here.
    args.stop_signals = StopSignals() if args.command is None else StopSignals().install()
    try:
        check_history_of(args)
        return _handler(args.command)(args)
    except HistoryError as error:
        print(f"gpuanat: error: {error}", file=sys.stderr)
        return error.exit_code
    except sqlite3.Error as error:  # HistoryStore turns its own into HistoryError; this is the last guard
        print(f"gpuanat: error: history: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("gpuanat: interrupted", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    except BrokenPipeError:
        return _reader_gone()
    finally:
        args.stop_signals.ignore_from_now()


HANDLERS: dict[str | None, str] = {
    **{command: f"{command}:command_{command}" for command in ("run", "sweep", "predict", "fit", "tune", "history")},
    **{command: f"{command}:command_{command}" for command in ("explain", "watch", "serve")},
    None: "dashboard:command_dashboard",
}
"""Each command's module under gpuanat.cli and its function: imported when the command runs, so that a command
loads only what it needs (`gpuanat history` neither the runner nor the dashboard)."""


def _handler(command: str | None) -> Callable[[argparse.Namespace], int]:
    module, function = HANDLERS[command].split(":")
    handler: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(f"gpuanat.cli.{module}"), function)
    return handler


def _reader_gone() -> int:
    """stdout's reader stopped early (`gpuanat history --json | head -1`): what it read is what it wanted, so that
    is no failure. Further writes, at exit too, go nowhere."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK
