"""The `gpuanat` command line: every subcommand, its flags and its help."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, NoReturn

import shtab

from gpuanat import __version__
from gpuanat.cli.common import EXIT_USAGE
from gpuanat.core.run.config import RunConfig
from gpuanat.core.run.techniques import TECHNIQUES

CONFIG_DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad input in one line on stderr (no usage dump) and exits 2, with the same
    `gpuanat: error:` prefix as gpuanat's own checks."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("gpuanat").strip()
        self.exit(EXIT_USAGE, f"gpuanat: error: {command + ': ' if command else ''}{message}\n")


def _with_default(technique: Any) -> str:
    """The technique's help, ending with its default where the help does not say it already."""
    default = CONFIG_DEFAULTS.get(technique.field)
    if "default" in technique.help or default is None:
        return technique.help
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{technique.help} (default: {shown})"


def add_technique_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("techniques and workload")
    for technique in TECHNIQUES:
        kwargs: dict[str, Any] = {"dest": technique.field, "default": None, "help": _with_default(technique)}
        if technique.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif technique.kind == "int":
            kwargs.update(type=int, metavar="N")
        elif technique.kind == "choice":
            kwargs.update(choices=technique.choices)
        group.add_argument(technique.flag, **kwargs)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", type=Path, default=None,
                        help="history database (default: $GPUANAT_DB, else $XDG_DATA_HOME/gpuanat/history.sqlite)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpuanat",
        description="GPU anatomy: where transformer training memory goes and how fast it trains, per "
                    "technique. Without a command, opens the live dashboard (keys toggle techniques, r runs, "
                    "? shows every key); the commands run headless and print tables or JSON.",
        epilog="Examples:\n  gpuanat run --precision bf16 --batch-size 8\n  gpuanat sweep --max-steps 60\n"
               "  gpuanat history --format md\n  gpuanat run --preset tiny --device cpu --seq-len 64",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuanat {__version__}")
    shtab.add_argument_to(parser, ["--print-completion"],
                          help="print a shell completion script: eval \"$(gpuanat --print-completion bash)\" (also "
                               "zsh, tcsh)")
    # Without a subcommand gpuanat opens the dashboard; these flags set its starting techniques.
    add_technique_flags(parser)
    add_common(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    run = commands.add_parser("run", help="train one configuration in a child process and report it",
                              description="Train one configuration in a child process (HF Trainer), show "
                                          "progress, print the docs' summary and the memory bands, record it. "
                                          "With --script, run your own training script the same way: "
                                          "gpuanat run --script train.py -- --its --own args")
    add_technique_flags(run)
    add_common(run)
    run.add_argument("--json", action="store_true", help="print the result as one JSON object (last stdout line)")
    run.add_argument("--trace-out", type=Path, default=None,
                     help="also write every NVML/host sample as JSON lines to this file")
    run.add_argument("--memory-snapshot", type=Path, default=None, metavar="FILE.pickle",
                     help="record torch's allocator history (CUDA only) and write it here when the run ends, out "
                          "of memory included: every allocation with its Python stack, for pytorch.org/memory_viz")
    run.add_argument("--script", type=Path, default=None, metavar="SCRIPT.py",
                     help="run your own training script instead (`gpuanat run --script train.py -- ARGS`): gpuanat's "
                          "probe is attached to every HF Trainer it creates, without editing it; the technique "
                          "flags do not apply (the script sets its own TrainingArguments)")

    sweep = commands.add_parser(
        "sweep", help="run the HF docs' whole experiment table, one fresh process each",
        description="Run the docs' experiment table (vanilla, accumulation, checkpointing, fp16, bf16, tf32, "
                    "Adafactor, 8-bit Adam and their combinations), each in a fresh process, and print one "
                    "table with Δ%% against vanilla. --batch-size sets the effective batch (default 4): "
                    "accumulating experiments train 1 × that many steps. The experiments set precision, "
                    "tf32, optimizer, checkpointing and accumulation themselves.")
    add_technique_flags(sweep)
    add_common(sweep)
    sweep.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    sweep.add_argument("--only", action="append", default=None, metavar="NAME",
                       help="run only this experiment (repeatable); names as in the table")

    predict = commands.add_parser(
        "predict", help="predict memory bands, peaks and the largest batch that fits, without running",
        description="Predict every memory band, the peak allocated and peak device memory, and the largest "
                    "per-device batch that fits the GPU, from the model's shape and the techniques alone "
                    "(no torch, milliseconds). Where a run of the same techniques was recorded, the largest batch "
                    "comes from replaying its allocations (docs/allocator-replay.md); else from the bytes model "
                    "(docs/memory-model.md).")
    add_technique_flags(predict)
    predict.add_argument("--gpu-memory", metavar="SIZE", default=None,
                         help="GPU memory to fit, e.g. 80GiB, 24G, 40GB (default: GPU 0's total, read through NVML)")
    predict.add_argument("--json", action="store_true", help="print the prediction as one JSON object")

    fit = commands.add_parser(
        "fit", help="find the largest batch that trains without running out of GPU memory",
        description="Find the largest per-device batch that trains on this GPU with these techniques: start "
                    "from the prediction, then confirm with short real runs (a few steps each; doubling, "
                    "then bisecting). Every trial is recorded in the history.")
    add_technique_flags(fit)
    add_common(fit)
    fit.add_argument("--gpu-memory", metavar="SIZE", default=None,
                     help="memory the prediction should fit (default: GPU 0's total, read through NVML)")
    fit.add_argument("--trial-steps", type=int, default=3, metavar="N", help="optimizer steps per trial (3)")
    fit.add_argument("--max-batch", type=int, default=4096, metavar="N", help="stop searching at this batch (4096)")
    fit.add_argument("--json", action="store_true", help="print the result as one JSON object")

    watch = commands.add_parser(
        "watch", help="watch any process by PID: GPU memory and utilization, host CPU/RSS, its anatomy if published",
        description="Watch a training process gpuanat did not start (a colleague's job, a torchrun launched from a "
                    "script, a notebook kernel) and its children: NVML per-process GPU memory on every GPU it uses, "
                    "GPU utilization (per process where NVML can say, else device-wide, labelled), host CPU % and "
                    "RSS, the process tree and the device's other processes. If the script adds gpuanat's probe — "
                    "one line, trainer.add_callback(gpuanat.probe.AnatomyCallback()) — its memory bands "
                    "(weights, gradients, optimizer state, activations) and throughput show too, as for runs "
                    "gpuanat launched: the callback publishes them to $XDG_RUNTIME_DIR/gpuanat/PID.jsonl (else "
                    "/tmp/gpuanat-UID/), a file only that user can read. Without --json opens the dashboard.",
        epilog="Examples:\n  gpuanat watch 12345\n  gpuanat watch 12345 --json --duration 60 > samples.jsonl\n"
               "  gpuanat watch 12345 --json --save bert-large-colleague\n\n"
               "Exit codes: 0 ok (the process exited, or --duration passed), 2 bad PID or usage (one line on stderr), "
               "130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    watch.add_argument("pid", type=int, metavar="PID", help="the process to watch (its children are included)")
    watch.add_argument("--json", action="store_true",
                       help="print one JSON object per sample on stdout instead of opening the dashboard; ends when "
                            "the process exits (with a final record that says so) or after --duration")
    watch.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    watch.add_argument("--interval", type=float, default=0.25, metavar="S", help="seconds between samples (0.25)")
    watch.add_argument("--save", nargs="?", const="", default=None, metavar="NAME",
                       help="record the watched session in the history as a run of kind `watched` (optionally "
                            "named), to compare it with launched runs")
    watch.add_argument("--trace-out", type=Path, default=None,
                       help="also write every NVML/host sample as JSON lines to this file")
    add_common(watch)

    history = commands.add_parser("history", help="list recorded runs",
                                  description="List recorded runs, oldest first.")
    add_common(history)
    history.add_argument("--format", choices=("table", "md", "csv", "json"), default="table")
    history.add_argument("--json", action="store_true", help="same as --format json")
    history.add_argument("--limit", type=int, default=None, metavar="N", help="only the last N runs")
    return parser
