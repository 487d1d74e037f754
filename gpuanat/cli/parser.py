"""The `gpuanat` command line: every subcommand, its flags and its help."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, NoReturn

import shtab

from gpuanat import __version__
from gpuanat.cli.common import EXIT_USAGE
from gpuanat.cli.history_parser import history_subparser
from gpuanat.cli.tune_parser import add_tune_options, tune_subparser
from gpuanat.core.printable import printable
from gpuanat.core.vocabulary.config import (
    CPU_WORKLOAD,
    DASHBOARD_CPU_SAMPLES,
    DEFAULT_PROFILE_OPS_STEPS,
    OOM_SNAPSHOT_EVENTS,
    PROFILED_TRIAL_MIN_STEPS,
    TRIAL_PROFILED_STEPS,
    RunConfig,
)
from gpuanat.core.vocabulary.techniques import TECHNIQUES, Technique

CONFIG_DEFAULTS = {field.name: field.default for field in dataclasses.fields(RunConfig)}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad input in one line on stderr (no usage dump) and exits 2, with the same
    `gpuanat: error:` prefix as gpuanat's own checks."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("gpuanat").strip()
        self.exit(EXIT_USAGE, f"gpuanat: error: {command + ': ' if command else ''}{message}\n")


def run_name(text: str) -> str:
    """A run's name as given, control characters and all (shown escaped); one that is not UTF-8 is refused, since
    the history keeps names as text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f"the name {printable(text)!s} is not UTF-8 text, which the history keeps names as; give it in UTF-8"
        ) from None
    return text


def tag_text(text: str) -> str:
    """A tag as given (UTF-8 text, not blank), kept exactly and shown escaped."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a tag cannot be empty or blank; give it some text, e.g. --tag baseline")
    try:
        return run_name(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"the tag {printable(text)!s} is not UTF-8 text, which the history keeps tags as; give it in UTF-8"
        ) from None


def add_run_tags(parser: argparse.ArgumentParser, what: str) -> None:
    """`--tag NAME` (repeatable) on the commands that record runs: every run `what` records carries it."""
    parser.add_argument(
        "--tag",
        dest="tags",
        type=tag_text,
        action="append",
        default=[],
        metavar="NAME",
        help=f"tag {what} NAME in the history (repeatable); `gpuanat history --tagged NAME` lists them",
    )


def profiled_steps(text: str) -> int:
    """`--profile-ops N`: a step count from 1 to 50."""
    if not text.isdigit() or not 1 <= int(text) <= 50:
        raise argparse.ArgumentTypeError(f"profile 1 to 50 steps, not {printable(text)}")
    return int(text)


def add_profile_ops(parser: argparse.ArgumentParser, *, trace: bool) -> None:
    """`--profile-ops [N]` (and `--profile-ops-trace FILE` where one run writes one trace)."""
    parser.add_argument(
        "--profile-ops",
        type=profiled_steps,
        nargs="?",
        const=DEFAULT_PROFILE_OPS_STEPS,
        default=0,
        metavar="N",
        help=f"profile N steps after warm-up ({DEFAULT_PROFILE_OPS_STEPS} without N) with "
        "torch.profiler and show the operations anatomy: GPU time and FLOPs by kind of "
        "operation (contractions, normalizations, element-wise, ...) beside the paper's "
        "BERT-large table; the profiled steps are left out of the steady samples/s",
    )
    if trace:
        parser.add_argument(
            "--profile-ops-trace",
            type=Path,
            default=None,
            metavar="FILE.json",
            help="with --profile-ops: also write the profiled steps' Chrome/Perfetto trace here "
            "(for ui.perfetto.dev or Holistic Trace Analysis)",
        )


def _with_default(technique: Technique) -> str:
    """The technique's help, ending with its default where the help does not say it already."""
    default = CONFIG_DEFAULTS.get(technique.field)
    if "default" in technique.help or default is None:
        return technique.help
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    cpu_default = CPU_WORKLOAD.get(technique.field)
    if cpu_default is not None:  # the workload follows the machine when left to the defaults (`workload_for_device`)
        dashboard = f"; {DASHBOARD_CPU_SAMPLES} in the dashboard" if technique.field == "samples" else ""
        return (
            f"{technique.help} (default: {shown} with CUDA; on a machine without CUDA, {cpu_default}{dashboard}, "
            "unless --preset or --model is given)"
            if technique.field != "preset"
            else f"{technique.help} (default: {shown} with CUDA; on a machine without CUDA, {cpu_default})"
        )
    return f"{technique.help} (default: {shown})"


def add_technique_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("techniques and workload")
    for technique in TECHNIQUES:
        kwargs: dict[str, Any] = {"dest": technique.field, "default": None, "help": _with_default(technique)}
        if technique.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif technique.kind == "int":
            kwargs.update(type=int, metavar="N")
        elif technique.kind == "float":
            kwargs.update(type=float, metavar="P")
        elif technique.kind == "choice":
            kwargs.update(choices=technique.choices)
        group.add_argument(technique.flag, **kwargs)


def metrics_address(text: str) -> tuple[str, int]:
    from gpuanat.core.export.metrics import parse_address

    try:
        return parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_metrics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics",
        type=metrics_address,
        default=None,
        metavar="[HOST:]PORT",
        help="serve every rank's anatomy as Prometheus metrics at http://HOST:PORT/metrics while it "
        "runs (HOST default 127.0.0.1; 0 picks a free port); labels match DCGM exporter's",
    )


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: a port from 1 to 65535")
    return int(text)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        type=Path,
        default=None,
        help="history database (default: $GPUANAT_DB, else $XDG_DATA_HOME/gpuanat/history.sqlite)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpuanat",
        description="GPU anatomy: where transformer training memory goes and how fast it trains, per "
        "technique. Without a command, opens the live dashboard (keys toggle techniques, r runs, "
        "? shows every key); the commands run headless and print tables or JSON.",
        epilog="Examples:\n  gpuanat run --precision bf16 --batch-size 8\n  gpuanat sweep --max-steps 60\n"
        "  gpuanat history --format md\n  gpuanat tune --budget 12\n"
        "  gpuanat run --preset tiny --device cpu --seq-len 64",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuanat {__version__}")
    shtab.add_argument_to(
        parser,
        ["--print-completion"],
        help='print a shell completion script: eval "$(gpuanat --print-completion bash)" (also zsh, tcsh)',
    )
    # Without a subcommand gpuanat opens the dashboard; these flags set its starting techniques.
    add_technique_flags(parser)
    add_common(parser)
    add_metrics(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    run = commands.add_parser(
        "run",
        help="train one configuration in a child process and report it",
        description="Train one configuration in a child process (HF Trainer), show "
        "progress, print the docs' summary and the memory bands, record it. "
        "With --script, run your own training script the same way: "
        "gpuanat run --script train.py -- --its --own args",
    )
    add_technique_flags(run)
    add_common(run)
    add_metrics(run)
    run.add_argument("--json", action="store_true", help="print the result as one JSON object (last stdout line)")
    run.add_argument(
        "--name",
        type=run_name,
        default=None,
        metavar="TEXT",
        help="record the run in the history under this name (with --script too, whose runs are named "
        "`script FILE.py` otherwise); kept as given, shown with any control characters escaped",
    )
    run.add_argument(
        "--trace-out", type=Path, default=None, help="also write every NVML/host sample as JSON lines to this file"
    )
    run.add_argument(
        "--memory-snapshot",
        type=Path,
        default=None,
        metavar="FILE.pickle",
        help="record torch's allocator history (CUDA only) and write it here when the run ends, out "
        "of memory included: every allocation with its Python stack, for pytorch.org/memory_viz",
    )
    run.add_argument(
        "--keep-oom-snapshot",
        type=Path,
        default=None,
        metavar="FILE.pickle",
        help="if the run runs out of GPU memory, write the allocator's snapshot here at the failing allocation "
        f"(CUDA only; its last {OOM_SNAPSHOT_EVENTS:,} allocations with their Python stacks, so it stays tens of "
        "MB), for pytorch.org/memory_viz; nothing is written when the run fits",
    )
    run.add_argument(
        "--script",
        type=Path,
        default=None,
        metavar="SCRIPT.py",
        help="run your own training script instead (`gpuanat run --script train.py -- ARGS`): gpuanat's "
        "probe is attached to every HF Trainer it creates, without editing it; the technique "
        "flags do not apply (the script sets its own TrainingArguments)",
    )
    add_profile_ops(run, trace=True)
    add_run_tags(run, "the run")

    sweep = commands.add_parser(
        "sweep",
        help="run the HF docs' whole experiment table, one fresh process each",
        description="Run the docs' experiment table (vanilla, accumulation, checkpointing, fp16, bf16, tf32, "
        "Adafactor, 8-bit Adam and their combinations), each in a fresh process, and print one "
        "table with Δ%% against vanilla. --batch-size sets the effective batch (default 4): "
        "accumulating experiments train 1 × that many steps. The experiments set precision, "
        "tf32, optimizer, checkpointing and accumulation themselves.",
    )
    add_technique_flags(sweep)
    add_common(sweep)
    add_metrics(sweep)
    sweep.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    sweep.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help="run only this experiment (repeatable); names as in the table",
    )
    add_profile_ops(sweep, trace=False)
    add_run_tags(sweep, "every experiment's run")

    predict = commands.add_parser(
        "predict",
        help="predict memory bands, peaks and the largest batch that fits, without running",
        description="Predict every memory band, the peak allocated and peak device memory, and the largest "
        "per-device batch that fits the GPU, from the model's shape and the techniques alone "
        "(no torch, milliseconds). Where a run of the same techniques was recorded, the largest batch "
        "comes from replaying its allocations (docs/allocator-replay.md); else from the bytes model "
        "(docs/memory-model.md).",
    )
    add_technique_flags(predict)
    predict.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        default=None,
        help="GPU memory to fit, e.g. 80GiB, 24G, 40GB (default: GPU 0's total, read through NVML)",
    )
    predict.add_argument("--json", action="store_true", help="print the prediction as one JSON object")

    fit = commands.add_parser(
        "fit",
        help="find the largest batch that trains without running out of GPU memory",
        description="Find the largest per-device batch that trains on this GPU with these techniques: start "
        "from the prediction, then confirm with short real runs (a few steps each; doubling, "
        "then bisecting). Every trial is recorded in the history.",
    )
    add_technique_flags(fit)
    add_common(fit)
    add_metrics(fit)
    fit.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        default=None,
        help="memory the prediction should fit (default: GPU 0's total, read through NVML)",
    )
    fit.add_argument("--trial-steps", type=int, default=3, metavar="N", help="optimizer steps per trial (3)")
    fit.add_argument("--max-batch", type=int, default=4096, metavar="N", help="stop searching at this batch (4096)")
    fit.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_run_tags(fit, "every trial")

    tune = tune_subparser(commands)
    add_technique_flags(tune)
    add_common(tune)
    add_metrics(tune)
    add_tune_options(tune)
    add_profile_ops(tune, trace=False)
    tune.set_defaults(profile_ops=None)  # `tune_profiled_steps`: the default depends on --trial-steps
    tune.add_argument(
        "--no-profile-ops",
        dest="profile_ops",
        action="store_const",
        const=0,
        help=f"profile no step of the trials (default: {TRIAL_PROFILED_STEPS} steps of each trial of at least "
        f"{PROFILED_TRIAL_MIN_STEPS} steps, whose operations anatomy orders the next round's moves: the largest "
        "groups that are not math first)",
    )
    add_run_tags(tune, "every trial")

    watch = commands.add_parser(
        "watch",
        help="watch any process by PID: GPU memory and utilization, host CPU/RSS, its anatomy if published",
        description="Watch a training process gpuanat did not start (a colleague's job, a torchrun launched from a "
        "script, a notebook kernel) and its children: NVML per-process GPU memory on every GPU it uses, "
        "GPU utilization (per process where NVML can say, else device-wide, labelled), host CPU % and "
        "RSS, the process tree and the device's other processes. If the script adds gpuanat's probe for "
        "its loop — trainer.add_callback(gpuanat.probe.AnatomyCallback()) for HF Trainer and TRL, "
        "Trainer(callbacks=[gpuanat.probe.LightningAnatomyCallback()]) for Lightning, "
        "gpuanat.probe.track(model, optimizer) around a loop of its own — its memory bands "
        "(weights, gradients, optimizer state, activations) and throughput show too, as for runs "
        "gpuanat launched: the probe publishes them to $XDG_RUNTIME_DIR/gpuanat/PID.jsonl (else "
        "/tmp/gpuanat-UID/), a file only that user can read; until then the watch names the probe "
        "the script needs, or says it waits for it. Without --json opens the dashboard.",
        epilog="Examples:\n  gpuanat watch 12345\n  gpuanat watch 12345 --json --duration 60 > samples.jsonl\n"
        "  gpuanat watch 12345 --json --save bert-large-colleague\n\n"
        "Exit codes: 0 ok (the process exited, or --duration passed), 2 bad PID or usage (one line on stderr), "
        "130 interrupted.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    watch.add_argument("pid", type=int, metavar="PID", help="the process to watch (its children are included)")
    watch.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per sample on stdout instead of opening the dashboard; ends when "
        "the process exits (with a final record that says so) or after --duration",
    )
    watch.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    watch.add_argument("--interval", type=float, default=0.25, metavar="S", help="seconds between samples (0.25)")
    watch.add_argument(
        "--save",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        type=run_name,
        help="record the watched session in the history as a run of kind `watched` (optionally "
        "named), to compare it with launched runs; the name is kept as given and shown with "
        "any control characters escaped",
    )
    watch.add_argument(
        "--trace-out", type=Path, default=None, help="also write every NVML/host sample as JSON lines to this file"
    )
    add_common(watch)
    add_metrics(watch)

    serve = commands.add_parser(
        "serve",
        help="the dashboard (or `watch PID`) in a browser, behind a token",
        description="Serve the dashboard in a browser through textual-serve: one dashboard, drawn in every tab\n"
        "that opens the URL (at the smallest tab's size; keys from any tab). Bound to 127.0.0.1 by default\n"
        "(reach it with ssh -L); every page needs the token printed at start (…/?token=…). Closing the tab leaves the\n"
        "dashboard and its run going, as tmux outlives an SSH drop: the run trains on and is recorded;\n"
        "open the URL again to see it. q in the page ends the dashboard; stopping the server (ctrl+c)\n"
        "stops a run in progress and records it. Needs pip install 'gpuanat[serve]'.",
        epilog="Examples:\n  gpuanat serve\n  gpuanat serve -- --preset gpt2 --precision bf16\n"
        "  gpuanat serve watch 4242\n  gpuanat serve --port 8080\n\n"
        "Then, on your laptop: ssh -L 8000:localhost:8000 GPU-BOX, and open the printed URL.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; another one warns: the page can start runs)",
    )
    serve.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    serve.add_argument(
        "--debug",
        action="store_true",
        help="log at debug level: every request, connection and tab (textual-serve's, aiohttp's and gpuanat's "
        "loggers); the token is never written",
    )
    serve.add_argument(
        "served",
        nargs=argparse.REMAINDER,
        metavar="watch PID",
        help="serve `gpuanat watch PID` instead of the dashboard; dashboard flags go after --",
    )

    explain = commands.add_parser(
        "explain",
        help="where a recorded run's memory was, and why it ran out of memory",
        description="Explain a recorded run (the last one unless RUN is given): where its GPU memory was, by band\n"
        "and by module — at the allocation that failed for a run that ran out of memory, else at its peak. For\n"
        "an out-of-memory run also: what failed (the allocation's size, the phase, step, module and operation\n"
        "that asked for it), how far over the GPU it was, the largest live tensors, what the prediction made\n"
        "before the run said against what the run reached, and what is predicted to fit, as a `gpuanat run`\n"
        "command to paste (the fit ladder's cheapest step, as `gpuanat predict` lists it). A run recorded by an\n"
        "earlier gpuanat is explained from what it has, and what it lacks is said. Reads the history, never\n"
        "writes it; --db reads one copied from another machine.",
        epilog="Examples:\n  gpuanat explain\n  gpuanat explain 12\n  gpuanat explain 12 --db gpu-box-history.sqlite"
        "\n  gpuanat explain --json | jq .out_of_memory.module\n\n"
        "Exit codes: 0 explained, 2 no such run, a RUN that is not a number, an empty or unusable history "
        "(one line on stderr).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument(
        "run",
        nargs="?",
        default=None,
        metavar="RUN",
        help="the run's number, as `gpuanat history` lists it (default: the last run)",
    )
    add_common(explain)
    explain.add_argument("--json", action="store_true", help="print the explanation as one JSON object (strings exact)")

    history_subparser(commands, add_common, run_name, tag_text)
    return parser
