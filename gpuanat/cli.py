"""The `gpuanat` command: headless subcommands (run, sweep, predict, fit, history, watch).

Exit codes: 0 ok, 1 a run failed, 2 bad input (nothing started), 3 out of GPU memory, 130 stopped (128 + the
signal's number when SIGTERM or SIGHUP stopped it: 143, 129). A history that cannot be used (HistoryError) is
reported in one line by `main`: 2 when its path or file must be fixed, 1 for a fault (busy, full, I/O).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gpuanat import __version__
from gpuanat.core.run.config import (
    Capabilities,
    ConfigError,
    RunConfig,
    expandable_segments_enabled,
    machine_unsupported_reason,
    validate_values,
)
from gpuanat.core.run.protocol import Error, Event, ModelInfo, Step
from gpuanat.core.run.stop_signals import StopSignals
from gpuanat.core.run.techniques import TECHNIQUES
from gpuanat.core.store.history import HistoryError, HistoryStore, default_db_path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OOM, EXIT_STOPPED = 0, 1, 2, 3, 130
TABLE_WIDTH_NOT_A_TERMINAL = 200
STATUS_EXIT_CODES = {"ok": EXIT_OK, "oom": EXIT_OOM, "stopped": EXIT_STOPPED, "failed": EXIT_FAILED}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports bad input in one line on stderr (no usage dump) and exits 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _add_technique_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("techniques and workload")
    for technique in TECHNIQUES:
        kwargs: dict[str, Any] = {"dest": technique.field, "default": None, "help": technique.help}
        if technique.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif technique.kind == "int":
            kwargs.update(type=int, metavar="N")
        elif technique.kind == "choice":
            kwargs.update(choices=technique.choices)
        group.add_argument(technique.flag, **kwargs)


def _add_common(parser: argparse.ArgumentParser) -> None:
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
    # Without a subcommand gpuanat opens the dashboard; these flags set its starting techniques.
    _add_technique_flags(parser)
    _add_common(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    run = commands.add_parser("run", help="train one configuration in a child process and report it",
                              description="Train one configuration in a child process (HF Trainer), show "
                                          "progress, print the docs' summary and the memory bands, record it. "
                                          "With --script, run your own training script the same way: "
                                          "gpuanat run --script train.py -- --its --own args")
    _add_technique_flags(run)
    _add_common(run)
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
    _add_technique_flags(sweep)
    _add_common(sweep)
    sweep.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    sweep.add_argument("--only", action="append", default=None, metavar="NAME",
                       help="run only this experiment (repeatable); names as in the table")

    predict = commands.add_parser(
        "predict", help="predict memory bands, peaks and the largest batch that fits, without running",
        description="Predict every memory band, the peak allocated and peak device memory, and the largest "
                    "per-device batch that fits the GPU, from the model's shape and the techniques alone "
                    "(no torch, milliseconds). A first model: issue #4 verifies and refines it.")
    _add_technique_flags(predict)
    predict.add_argument("--gpu-memory", metavar="SIZE", default=None,
                         help="GPU memory to fit, e.g. 80GiB, 24G, 40GB (default: GPU 0's total, read through NVML)")
    predict.add_argument("--json", action="store_true", help="print the prediction as one JSON object")

    fit = commands.add_parser(
        "fit", help="find the largest batch that trains without running out of GPU memory",
        description="Find the largest per-device batch that trains on this GPU with these techniques: start "
                    "from the prediction, then confirm with short real runs (a few steps each; doubling, "
                    "then bisecting). Every trial is recorded in the history.")
    _add_technique_flags(fit)
    _add_common(fit)
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
    _add_common(watch)

    history = commands.add_parser("history", help="list recorded runs",
                                  description="List recorded runs, oldest first.")
    _add_common(history)
    history.add_argument("--format", choices=("table", "md", "csv", "json"), default="table")
    history.add_argument("--json", action="store_true", help="same as --format json")
    history.add_argument("--limit", type=int, default=None, metavar="N", help="only the last N runs")
    return parser


# --- shared helpers ---------------------------------------------------------------------------------

def _fail_usage(message: str) -> NoReturn:
    print(f"gpuanat: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def detect_capabilities() -> Capabilities:
    from gpuanat.core.run.runner import probe_capabilities

    try:
        return probe_capabilities()
    except RuntimeError as error:
        _fail_usage(str(error))


def config_from_args(args: argparse.Namespace, cuda_available: bool) -> RunConfig:
    """RunConfig from the flags given; device defaults to cuda when available, and on CUDA expandable segments
    to what the user's PYTORCH_CUDA_ALLOC_CONF says (the child's allocator follows the technique)."""
    changes = {t.field: getattr(args, t.field) for t in TECHNIQUES if getattr(args, t.field, None) is not None}
    changes.setdefault("device", "cuda" if cuda_available else "cpu")
    if changes["device"] == "cuda":
        changes.setdefault("expandable_segments", expandable_segments_enabled(os.environ))
    return RunConfig(**changes)


def _open_store(args: argparse.Namespace, *, read_only: bool = False) -> HistoryStore:
    return HistoryStore(args.db.expanduser() if args.db else default_db_path(), read_only=read_only)


@dataclass
class _ProgressView:
    """Renders step events as a progress bar on stderr (rich), for the main thread only."""

    label: str

    def __post_init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        )
        self._task = self._progress.add_task(f"{self.label}: starting", total=None, rate="")
        self._progress.start()

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelInfo):
            self._progress.update(self._task, total=event.total_steps or None,
                                  description=f"{self.label}: training {event.params / 1e6:.0f}M params")
        elif isinstance(event, Step):
            rate = f"{event.samples / event.elapsed_s:.1f} samples/s" if event.elapsed_s > 0 else ""
            loss = f" loss {event.loss:.3f}" if event.loss is not None else ""
            self._progress.update(self._task, completed=event.step, rate=rate + loss)
        elif isinstance(event, Error):
            self._progress.update(self._task, description=f"{self.label}: {event.kind}")

    def close(self) -> None:
        self._progress.stop()


def _run_recorded(config: RunConfig, store: HistoryStore, signals: StopSignals, *, label: str,
                  name: str | None = None, trace_path: Path | None = None,
                  memory_snapshot: Path | None = None) -> dict[str, Any]:
    from gpuanat.core.run.config import MEMORY_SNAPSHOT_VARIABLE
    from gpuanat.core.run.session import execute_run

    env = {**os.environ, MEMORY_SNAPSHOT_VARIABLE: str(memory_snapshot.resolve())} if memory_snapshot else None
    view = _ProgressView(label)
    try:
        with signals.polled() as stop_requested:
            result = execute_run(config, store=store, log_dir=store.path.parent / "logs", name=name,
                                 on_event=view, trace_path=trace_path, env=env, stop_requested=stop_requested)
    finally:
        view.close()
    _warn_if_not_saved(result)
    return result


def _warn_if_not_saved(result: dict[str, Any] | None) -> None:
    """One line on stderr when the history refused a run's last writes (busy or full until the end)."""
    if result is not None and result.get("history_error"):
        print(f"gpuanat: warning: {result['history_error']}", file=sys.stderr)


def _exit_code(status: str, signals: StopSignals) -> int:
    """The exit code of a command whose run ended with `status`."""
    if status == "stopped" and signals.exit_code is not None:
        return signals.exit_code
    return STATUS_EXIT_CODES[status]


def print_summary(result: dict[str, Any]) -> None:
    """The docs' summary (Time, Samples/second, GPU memory occupied) plus gpuanat's measurements."""
    from gpuanat.core.measure.anatomy import BAND_NAMES
    from gpuanat.core.store.report import format_bytes, format_mb, format_number

    config = RunConfig.from_json({key: value for key, value in result["config"].items() if value is not None})
    where = result.get("gpu_name") or result.get("device_name") or result["device"]
    script = result["config"].get("script")
    if script is not None:
        arguments = " ".join(result["config"].get("args") or [])
        print(f"Run {result['run_id']}: {result['status']} — script {script} {arguments}".rstrip()
              + f" on {where or 'the machine it ran on'}")
    else:
        print(f"Run {result['run_id']}: {result['status']} — {config.model or config.preset} "
              f"{config.techniques_summary()} on {where}")
    if result.get("error"):
        print(f"  {result['error']['kind']}: {result['error']['message']}")
    print(f"Time: {format_number(result['train_runtime_s'])}")
    print(f"Samples/second: {format_number(result['samples_per_second'])}")
    print(f"GPU memory occupied: {format_mb(result['device_memory_used_bytes'])} MB.")
    steady = result["steady_samples_per_second"]
    note = (f"after {result['warmup_steps']} warm-up steps" if steady is not None
            else result["unavailable"].get("steady_samples_per_second", ""))
    print(f"Steady samples/second: {format_number(steady)} ({note})")
    print(f"Peak allocated: {format_bytes(result['peak_allocated_bytes'])}")
    if result.get("probe_cost_percent") is not None:
        print(f"gpuanat's probe: {result['probe_cost_percent']:.2f}% of the training time "
              f"({format_number(result['probe_time_s'])} s in its callbacks)")
    print("Memory bands:")
    for band in BAND_NAMES:
        value = result["bands"].get(band)
        label = band.removesuffix("_bytes").replace("_", " ")
        reason = result["unavailable"].get(band)
        print(f"  {label:<22} {format_bytes(value):>11}" + (f"  ({reason})" if value is None and reason else ""))
    print(f"Log: {result['log_path']}")


def _print_table(columns: Any, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpuanat.core.store.report import display_value

    table = Table(show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column.title, justify="right" if column.numeric else "left",
                         no_wrap=column.key != "reason")
    for row in rows:
        table.add_row(*(display_value(column.key, row.get(column.key)) for column in columns))
    # A pipe or file gets the whole table; a terminal gets its own width.
    Console(width=None if sys.stdout.isatty() else TABLE_WIDTH_NOT_A_TERMINAL).print(table)


# --- subcommands ---------------------------------------------------------------------------------

def _validated_config(args: argparse.Namespace, cuda_available: bool) -> RunConfig:
    config = config_from_args(args, cuda_available)
    try:
        validate_values(config)
    except ConfigError as error:
        _fail_usage(str(error))
    return config


def command_run_script(args: argparse.Namespace) -> int:
    from gpuanat.core.run.script_session import execute_script

    given = [t.flag for t in TECHNIQUES if getattr(args, t.field, None) is not None]
    if given:
        _fail_usage(f"{given[0]}: technique flags do not apply to --script (the script sets its own "
                    "TrainingArguments); give the script its own arguments after --")
    script: Path = args.script
    if not script.is_file():
        _fail_usage(f"--script: no such file: {script}")
    with _open_store(args) as store:
        view = _ProgressView(f"script {script.name}")
        try:
            with args.stop_signals.polled() as stop_requested:
                result = execute_script(script, args.script_args, store=store, log_dir=store.path.parent / "logs",
                                        on_event=view, trace_path=args.trace_out, stop_requested=stop_requested)
        finally:
            view.close()
    _warn_if_not_saved(result)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    if result["status"] == "oom":
        print(f"gpuanat: the script ran out of GPU memory: {(result.get('error') or {}).get('message')}",
              file=sys.stderr)
    return _exit_code(result["status"], args.stop_signals)


def command_run(args: argparse.Namespace) -> int:
    if args.script is not None:
        return command_run_script(args)
    if args.script_args:
        _fail_usage("arguments after -- are for a script: give it with --script SCRIPT.py")
    capabilities = detect_capabilities()
    config = _validated_config(args, capabilities.cuda_available)
    unsupported = machine_unsupported_reason(config, capabilities)
    if unsupported is not None:
        _fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    if args.memory_snapshot is not None:
        if config.device != "cuda":
            _fail_usage(f"--memory-snapshot: torch records its allocator's history only on CUDA, and this run is on "
                        f"{config.device}")
        if not args.memory_snapshot.parent.resolve().is_dir():
            _fail_usage(f"--memory-snapshot: no such folder: {args.memory_snapshot.parent}")
    with _open_store(args) as store:
        result = _run_recorded(config, store, args.stop_signals, label="run", trace_path=args.trace_out,
                               memory_snapshot=args.memory_snapshot)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    if args.memory_snapshot is not None:
        written = args.memory_snapshot.is_file()
        print(f"Memory snapshot: {args.memory_snapshot} (drop it on pytorch.org/memory_viz)" if written
              else f"gpuanat: no memory snapshot was written to {args.memory_snapshot} (see the log)",
              file=sys.stderr if args.json or not written else sys.stdout)
    run_error = result.get("error") or {}
    if run_error.get("kind") == "config":
        print(f"gpuanat: error: {run_error.get('flag')}: {run_error.get('message')}", file=sys.stderr)
        return EXIT_USAGE
    if result["status"] == "oom":
        from gpuanat.core.store.report import format_bytes

        print(f"gpuanat: out of GPU memory at step {run_error.get('step')} "
              f"(peak allocated {format_bytes(result['peak_allocated_bytes'])}); try a smaller --batch-size, "
              "--grad-checkpointing or --precision bf16", file=sys.stderr)
    return _exit_code(result["status"], args.stop_signals)


def command_sweep(args: argparse.Namespace) -> int:
    from gpuanat.core.store.report import SWEEP_COLUMNS, sweep_rows
    from gpuanat.core.store.sweep import BASE_TECHNIQUE_FIELDS, EXPERIMENTS

    fixed = [t.flag for t in TECHNIQUES
             if t.field in BASE_TECHNIQUE_FIELDS and t.field != "batch_size" and getattr(args, t.field) is not None]
    if fixed:
        _fail_usage(f"{fixed[0]}: the sweep sets it per experiment; use `gpuanat run` for one configuration")
    experiments = EXPERIMENTS
    if args.only:
        known = {experiment.name for experiment in EXPERIMENTS}
        for name in args.only:
            if name not in known:
                _fail_usage(f"--only: unknown experiment {name!r}; choose from {', '.join(sorted(known))}")
        experiments = tuple(experiment for experiment in EXPERIMENTS if experiment.name in args.only)
    capabilities = detect_capabilities()
    base = _validated_config(args, capabilities.cuda_available)
    results: list[dict[str, Any]] = []
    interrupted = False
    with _open_store(args) as store:
        for index, experiment in enumerate(experiments, start=1):
            config = experiment.config(base)
            label = f"[{index}/{len(experiments)}] {experiment.name}"
            unsupported = machine_unsupported_reason(config, capabilities)
            if unsupported is not None:
                results.append({"name": experiment.name, "status": "skipped", "reason": unsupported[1],
                                "config": config.to_json()})
                print(f"{label}: skipped — {unsupported[1]}", file=sys.stderr)
                continue
            result = _run_recorded(config, store, args.stop_signals, label=label, name=experiment.name)
            run_error = result.get("error")
            result["reason"] = run_error["message"].splitlines()[0] if run_error else ""
            results.append(result)
            print(f"{label}: {result['status']}", file=sys.stderr)
            if result["status"] == "stopped" or args.stop_signals.requested.is_set():
                interrupted = True
                break
    rows = sweep_rows(results)
    if args.json:
        print(json.dumps([{**result, **row} for result, row in zip(results, rows, strict=False)]))
    else:
        _print_table(SWEEP_COLUMNS, rows)
    if interrupted:
        return args.stop_signals.exit_code or EXIT_STOPPED
    return EXIT_OK if all(r["status"] in ("ok", "skipped", "oom") for r in results) else EXIT_FAILED


def command_predict(args: argparse.Namespace) -> int:
    from gpuanat.core.measure.sampler import probe_nvml
    from gpuanat.core.memory.allocation_templates import largest_batch, version_differences
    from gpuanat.core.memory.predict import (
        estimate_memory,
        fits_in,
        max_batch_caveat,
        parse_size,
        prediction_json,
    )
    from gpuanat.core.store.report import format_bytes

    config = _validated_config(args, cuda_available=True)
    if config.model is not None:
        _fail_usage("--model: predict works from the presets' shapes; use --preset")
    gpu_memory: int | None = None
    source = "--gpu-memory"
    if args.gpu_memory is not None:
        try:
            gpu_memory = parse_size(args.gpu_memory)
        except ValueError as error:
            _fail_usage(f"--gpu-memory: {error}")
    else:
        nvml = probe_nvml()
        if nvml.available and nvml.gpu_total_bytes:
            gpu_memory, source = nvml.gpu_total_bytes[0], f"NVML: {nvml.gpu_names[0]}"
        else:
            source = f"no GPU memory to fit: {nvml.reason or 'no GPU'}; give --gpu-memory"
    prediction = prediction_json(config)
    assert prediction is not None
    largest = largest_batch(config, gpu_memory) if gpu_memory is not None else None
    result: dict[str, Any] = {
        "config": config.to_json(), **prediction, "gpu_memory_bytes": gpu_memory, "gpu_memory_source": source,
        "max_batch_size": largest.batch_size if largest else None,
        "max_batch_method": largest.method if largest else None,
        "max_batch_least_left_bytes": largest.least_left_bytes if largest else None,
        "max_batch_recorded_with": largest.recorded_with if largest else None,
        "max_batch_size_model": largest.model_batch_size if largest else None,
        "max_batch_caveat": max_batch_caveat(config) if largest and largest.method == "model" else None,
    }
    if args.json:
        print(json.dumps(result))
        return EXIT_OK
    print(f"Prediction for {config.preset} {config.techniques_summary()}, seq {config.seq_len}:")
    for key in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes",
                "cuda_context_bytes", "peak_allocated_bytes", "peak_device_bytes"):
        print(f"  {key.removesuffix('_bytes').replace('_', ' '):<22} {format_bytes(result[key]):>11}")
    if gpu_memory is None:
        print(f"Largest batch that fits: — ({source})")
    else:
        fits = "fits" if fits_in(estimate_memory(config), gpu_memory) else "does NOT fit"
        how = (f"replaying a recorded run's allocations, {format_bytes(result['max_batch_least_left_bytes'])} left at "
               f"its tightest; the bytes model says {result['max_batch_size_model']}"
               if result["max_batch_method"] == "replay" else "the bytes model")
        print(f"On {format_bytes(gpu_memory)} ({source}): batch {config.batch_size} {fits}; "
              f"largest batch that fits: {result['max_batch_size']} ({how})")
        if result["max_batch_caveat"]:
            print(f"  caveat: {result['max_batch_caveat']}")
        recorded_with = result["max_batch_recorded_with"]
        if recorded_with:
            differences = version_differences(recorded_with)
            print(f"  the replayed run: {recorded_with['gpu']}, torch {recorded_with['torch']}, transformers "
                  f"{recorded_with['transformers']}" + (f" ({'; '.join(differences)}: its allocations may differ)"
                                                         if differences else ""))
    return EXIT_OK


def command_fit(args: argparse.Namespace) -> int:
    from gpuanat.core.measure.sampler import probe_nvml
    from gpuanat.core.memory.allocation_templates import largest_batch
    from gpuanat.core.memory.fit import run_fit
    from gpuanat.core.memory.predict import parse_size

    if args.trial_steps < 1:
        _fail_usage(f"--trial-steps: must be an integer ≥ 1 (got {args.trial_steps})")
    if args.max_batch < 1:
        _fail_usage(f"--max-batch: must be an integer ≥ 1 (got {args.max_batch})")
    capabilities = detect_capabilities()
    base = _validated_config(args, capabilities.cuda_available)
    unsupported = machine_unsupported_reason(base, capabilities)
    if unsupported is not None:
        _fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    gpu_memory = None
    if args.gpu_memory is not None:
        try:
            gpu_memory = parse_size(args.gpu_memory)
        except ValueError as error:
            _fail_usage(f"--gpu-memory: {error}")
    elif base.device == "cuda":
        nvml = probe_nvml()
        gpu_memory = nvml.gpu_total_bytes[0] if nvml.available and nvml.gpu_total_bytes else None
    predicted = (largest_batch(base, gpu_memory).batch_size if gpu_memory is not None and base.model is None
                 else None)
    start = predicted or base.batch_size
    print(f"fit: starting from batch {start}" + (" (the prediction)" if predicted else "") +
          f", {args.trial_steps} steps per trial, up to batch {args.max_batch}", file=sys.stderr)
    def trial_with_progress(config: RunConfig, *, store: HistoryStore, log_dir: Path, name: str) -> dict[str, Any]:
        return _run_recorded(config, store, args.stop_signals, label=name, name=name)

    def trial_done(batch_size: int, result: dict[str, Any]) -> None:
        print(f"fit: batch {batch_size}: {result['status']}", file=sys.stderr)

    with _open_store(args) as store:
        fit = run_fit(base, store=store, log_dir=store.path.parent / "logs", start=start,
                      trial_steps=args.trial_steps, max_batch=args.max_batch, run_trial=trial_with_progress,
                      on_trial=trial_done)
    if args.stop_signals.requested.is_set():
        print("gpuanat: fit stopped before it found the largest batch", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    if fit.failure is not None:
        failed = fit.failure
        message = (failed.get("error") or {}).get("message", failed["status"]).splitlines()[0]
        print(f"gpuanat: fit stopped: the trial at batch {failed['config']['batch_size']} ended {failed['status']} "
              f"({message}), not out of memory", file=sys.stderr)
        return STATUS_EXIT_CODES.get(failed["status"], EXIT_FAILED)
    largest, trials, results = fit.largest_batch_size, fit.trials, fit.results
    summary = {
        "config": base.to_json(), "largest_batch_size": largest, "predicted_max_batch_size": predicted,
        "gpu_memory_bytes": gpu_memory, "reached_max_batch": largest == args.max_batch,
        "trials": [{"batch_size": t.batch_size, "trained": t.trained, "run_id": results[t.batch_size]["run_id"],
                    "peak_allocated_bytes": results[t.batch_size]["peak_allocated_bytes"],
                    "peak_reserved_bytes": results[t.batch_size]["peak_reserved_bytes"]} for t in trials],
    }
    if args.json:
        print(json.dumps(summary))
    else:
        trained = ", ".join(f"{t.batch_size} {'ok' if t.trained else 'OOM'}" for t in trials)
        limit_note = " (the --max-batch limit; larger may fit)" if summary["reached_max_batch"] else ""
        print(f"Largest batch that trains: {largest}{limit_note}; predicted: {predicted or '—'}; trials: {trained}")
    return EXIT_OK


def command_history(args: argparse.Namespace) -> int:
    from gpuanat.core.store.report import HISTORY_COLUMNS, history_rows, render_csv, render_markdown

    output_format = "json" if args.json else args.format
    if args.limit is not None and args.limit < 1:
        _fail_usage(f"--limit: must be an integer ≥ 1 (got {args.limit})")
    with _open_store(args, read_only=True) as store:
        runs = store.runs(limit=args.limit)
    if output_format == "json":
        print(json.dumps([{"id": run.id, "kind": run.kind, "name": run.name, "status": run.status,
                           "created_at": run.created_at, "finished_at": run.finished_at, "config": run.config,
                           "result": run.result} for run in runs], indent=2))
        return EXIT_OK
    rows = history_rows(runs)
    if output_format == "md":
        sys.stdout.write(render_markdown(HISTORY_COLUMNS, rows))
    elif output_format == "csv":
        sys.stdout.write(render_csv(HISTORY_COLUMNS, rows))
    elif not runs:
        print("No runs recorded yet. Start one with `gpuanat run` (history: "
              f"{args.db or default_db_path()}).")
    else:
        _print_table(HISTORY_COLUMNS, rows)
    return EXIT_OK


def command_watch(args: argparse.Namespace) -> int:
    from gpuanat.core.measure.sampler import Sampler, open_source
    from gpuanat.core.measure.watch import WatchError, WatchSession, follow, resolve_target

    if args.interval <= 0:
        _fail_usage(f"--interval: must be a number of seconds > 0 (got {args.interval})")
    if args.duration is not None and args.duration <= 0:
        _fail_usage(f"--duration: must be a number of seconds > 0 (got {args.duration})")
    try:
        target = resolve_target(args.pid)
    except WatchError as error:
        _fail_usage(str(error))
    save_name = (args.save or None) if args.save is not None else None
    db_path = args.db.expanduser() if args.db else default_db_path()
    if not args.json:
        return _watch_dashboard(args, target, db_path)
    source, nvml = open_source(per_process=True)
    session = WatchSession(target, nvml)
    sampler = Sampler(source, interval_s=args.interval, on_sample=lambda sample: None, trace_path=args.trace_out)
    if args.save is not None:
        session.start_saving(HistoryStore(db_path), save_name)

    def emit(record: dict[str, Any]) -> None:
        if record["exited"] and session.saved_run_id is not None:
            record["saved_run_id"] = session.saved_run_id
        print(json.dumps(record), flush=True)

    ended = "stopped"
    try:
        with args.stop_signals.polled() as stop_requested:
            ended = follow(session, sampler, interval_s=args.interval, on_record=emit, duration_s=args.duration,
                           stop_requested=stop_requested)
    except KeyboardInterrupt:
        print("gpuanat: interrupted", file=sys.stderr)
        return args.stop_signals.exit_code or EXIT_STOPPED
    finally:
        sampler.stop()
        source.close()
        session.close()
        result = session.finish_saving(exited=ended == "exited")
        _warn_if_not_saved(result)
        if result is not None:
            print(f"gpuanat: saved as run {result['run_id']} ({result['status']}) in {db_path}", file=sys.stderr)
    if args.stop_signals.signal_number is not None:
        print(f"gpuanat: interrupted ({signal.Signals(args.stop_signals.signal_number).name})", file=sys.stderr)
        return args.stop_signals.exit_code
    return EXIT_OK


def _user_keymap(app_class: type) -> dict[str, str]:
    """The user's key remapping (config.toml [keymap]) for `app_class`. The file is checked whole, against
    both dashboards it configures, before anything starts: one line and exit 2 when it cannot be used."""
    from gpuanat.tui.keymap import KeymapError, app_bindings, default_config_path, gpuanat_apps, load_keymap

    try:
        keymap = load_keymap(default_config_path(), gpuanat_apps())
    except KeymapError as error:
        _fail_usage(str(error))
    ids = {binding.id for binding in app_bindings(app_class) if binding.id}
    return {binding_id: keys for binding_id, keys in keymap.items() if binding_id in ids}


def _watch_dashboard(args: argparse.Namespace, target: Any, db_path: Path) -> int:
    from gpuanat.tui.watch_app import WatchApp

    keymap = _user_keymap(WatchApp)
    if not sys.stdout.isatty():
        _fail_usage("the dashboard needs a terminal; add --json for one JSON object per sample")
    app = WatchApp(target, db_path=db_path, interval_s=args.interval, save_name=args.save or None,
                   save_on_start=args.save is not None, trace_path=args.trace_out, keymap=keymap)
    app.run()
    return EXIT_OK if app.stop_signal is None else 128 + app.stop_signal


def command_dashboard(args: argparse.Namespace) -> int:
    """The full-screen TUI."""
    from gpuanat.tui.app import GpuAnatApp

    # The device default is settled in the app once its capability probe has answered.
    config = config_from_args(args, cuda_available=True)
    try:
        validate_values(config)
    except ConfigError as error:
        _fail_usage(str(error))
    keymap = _user_keymap(GpuAnatApp)
    if not sys.stdout.isatty():
        _fail_usage("the dashboard needs a terminal; use `gpuanat run`, `sweep` or `history` in scripts")
    app = GpuAnatApp(config, db_path=args.db.expanduser() if args.db else default_db_path(), keymap=keymap)
    app.run()
    return EXIT_OK if app.stop_signal is None else 128 + app.stop_signal


def _split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """`gpuanat run --script train.py -- ARGS`: what follows the first `--` belongs to the script."""
    if "--" in argv:
        split = argv.index("--")
        return argv[:split], argv[split + 1:]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    own_args, script_args = _split_script_args(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(own_args)
    args.script_args = script_args
    if script_args and args.command != "run":
        parser.error("arguments after -- are only for `gpuanat run --script SCRIPT.py -- ARGS`")
    handlers = {"run": command_run, "sweep": command_sweep, "predict": command_predict, "fit": command_fit,
                "history": command_history, "watch": command_watch, None: command_dashboard}
    # The dashboards handle stop signals on their event loop; the headless commands here.
    args.stop_signals = StopSignals() if args.command is None else StopSignals().install()
    try:
        return handlers[args.command](args)
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
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
