"""Helpers every `gpuanat` command shares: exit codes, one-line usage errors, the config from the flags, the
history, the progress view, the run summary and tables."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpuanat.core.run.stop_signals import StopSignals
from gpuanat.core.store.history import HistoryStore, check_usable_history
from gpuanat.core.store.history_file import DB_ENV, default_db_path
from gpuanat.core.vocabulary.config import (
    Capabilities,
    RunConfig,
    distributed_for_ranks,
    expandable_segments_enabled,
    workload_for_device,
)
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.protocol import Error, Event, ModelInfo, Ranked, Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import TECHNIQUES
from gpuanat.core.vocabulary.validation import check_hub_model, machine_unsupported_reason, validate_values

if TYPE_CHECKING:
    from gpuanat.core.export.run_metrics import RunMetrics
    from gpuanat.core.run.warm import WarmWorkers

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OOM, EXIT_STOPPED = 0, 1, 2, 3, 130
TABLE_WIDTH_NOT_A_TERMINAL = 10_000
"""A pipe or a file has no width: every column is printed whole, however wide the table."""
STATUS_EXIT_CODES = {"ok": EXIT_OK, "oom": EXIT_OOM, "stopped": EXIT_STOPPED, "failed": EXIT_FAILED}


def served_in_a_browser() -> bool:
    """Whether this process draws into a browser page (started by `gpuanat serve`'s textual-serve), not a terminal."""
    return os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver")


def fail_usage(message: str) -> NoReturn:
    print(f"gpuanat: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def detect_capabilities() -> Capabilities:
    from gpuanat.core.run.runner import probe_capabilities

    try:
        return probe_capabilities()
    except RuntimeError as error:
        fail_usage(str(error))


def given_fields(args: argparse.Namespace) -> set[str]:
    """The RunConfig fields the user gave a flag for."""
    return {t.field for t in TECHNIQUES if getattr(args, t.field, None) is not None}


def untouched_fields(args: argparse.Namespace) -> set[str]:
    """The RunConfig fields left to the defaults (no flag given), which the machine may choose."""
    return {t.field for t in TECHNIQUES} - given_fields(args)


def config_from_args(args: argparse.Namespace, cuda_available: bool) -> RunConfig:
    """RunConfig from the flags given; device defaults to cuda when available, and on CUDA expandable segments
    to what the user's PYTORCH_CUDA_ALLOC_CONF says (the child's allocator follows the technique)."""
    changes = {field: getattr(args, field) for field in given_fields(args)}
    if changes.get("model") is not None:
        changes["model"] = os.path.expanduser(changes["model"])  # from_pretrained takes "~/m" for a repo id
    changes.setdefault("device", "cuda" if cuda_available else "cpu")
    if changes["device"] == "cuda":
        changes.setdefault("expandable_segments", expandable_segments_enabled(os.environ))
    return distributed_for_ranks(RunConfig(**changes), untouched_fields(args))


def history_path(args: argparse.Namespace) -> Path:
    """The history a command uses: its --db, else $GPUANAT_DB or the default one."""
    return args.db.expanduser() if args.db else default_db_path()


def open_store(args: argparse.Namespace, *, read_only: bool = False) -> HistoryStore:
    return HistoryStore(history_path(args), read_only=read_only)


def check_history_of(args: argparse.Namespace) -> None:
    """Refuse at once (HistoryError, exit 2) a history the command would use and cannot: before the dashboard opens
    or a run trains, not at `r` or after the training. The commands that write (the dashboards, run, sweep, fit,
    tune, `history --rename/--tag/--untag/--delete`, `watch --save` or with --db) need to write it; `history` and
    `explain` read it."""
    command = getattr(args, "command", None)
    if command == "history":
        writes = any(edit is not None for edit in (args.rename, args.tag, args.untag, args.delete))
    elif command == "explain":
        writes = False
    elif command == "watch":
        if args.save is None and args.db is None:
            return  # nothing to save unless asked (`--save`, or `s` in its dashboard with the history given)
        writes = True
    elif command in (None, "run", "sweep", "fit", "tune"):
        writes = True
    else:
        return
    named = args.db is not None or bool(os.environ.get(DB_ENV))
    check_usable_history(history_path(args), writes=writes, named=named)


@dataclass
class ProgressView:
    """Renders step events as a progress bar on stderr (rich), for the main thread only."""

    label: str

    def __post_init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._task = self._progress.add_task(f"{self.label}: starting", total=None, rate="")
        self._progress.start()

    def __call__(self, event: Event | Ranked) -> None:
        if isinstance(event, ModelInfo):
            trains = (
                f"{event.params / 1e6:.0f}M params"
                if event.trainable_params == event.params
                else f"{event.trainable_params / 1e6:.1f}M of {event.params / 1e6:.0f}M params"
            )
            self._progress.update(
                self._task, total=event.total_steps or None, description=f"{self.label}: training {trains}"
            )
        elif isinstance(event, Step):
            rate = f"{event.samples / event.elapsed_s:.1f} samples/s" if event.elapsed_s > 0 else ""
            loss = f" loss {event.loss:.3f}" if event.loss is not None else ""
            self._progress.update(self._task, completed=event.step, rate=rate + loss)
        elif isinstance(event, Error):
            self._progress.update(self._task, description=f"{self.label}: {event.kind}")

    def close(self) -> None:
        self._progress.stop()


def measurement_environment(
    *,
    memory_snapshot: Path | None = None,
    keep_oom_snapshot: Path | None = None,
    profile_ops: int = 0,
    profile_ops_trace: Path | None = None,
    metrics: tuple[str, int] | None = None,
    name: str | None = None,
) -> dict[str, str] | None:
    """The training process's environment when a measurement of its own was asked (`--memory-snapshot`,
    `--profile-ops`; `metrics`: its probe serves them, as in a job gpuanat did not start), else None (the parent's,
    unchanged)."""
    from gpuanat.core.vocabulary.config import (
        MEMORY_SNAPSHOT_VARIABLE,
        OOM_SNAPSHOT_VARIABLE,
        PROFILE_OPS_TRACE_VARIABLE,
        PROFILE_OPS_VARIABLE,
    )

    asked = {}
    if memory_snapshot is not None:
        asked[MEMORY_SNAPSHOT_VARIABLE] = str(memory_snapshot.resolve())
    if keep_oom_snapshot is not None:
        asked[OOM_SNAPSHOT_VARIABLE] = str(keep_oom_snapshot.resolve())
    if profile_ops:
        asked[PROFILE_OPS_VARIABLE] = str(profile_ops)
        if profile_ops_trace is not None:
            asked[PROFILE_OPS_TRACE_VARIABLE] = str(profile_ops_trace.resolve())
    if metrics is not None:
        from gpuanat.core.export.metrics import METRICS_JOB_VARIABLE, METRICS_VARIABLE, job_label

        host, port = metrics
        asked[METRICS_VARIABLE] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        asked[METRICS_JOB_VARIABLE] = job_label(name)
    return {**os.environ, **asked} if asked else None


def run_recorded(
    config: RunConfig,
    store: HistoryStore,
    signals: StopSignals,
    *,
    label: str,
    name: str | None = None,
    trace_path: Path | None = None,
    memory_snapshot: Path | None = None,
    keep_oom_snapshot: Path | None = None,
    requested_monotonic_s: float | None = None,
    profile_ops: int = 0,
    profile_ops_trace: Path | None = None,
    warm_workers: WarmWorkers | None = None,
    metrics: RunMetrics | None = None,
    search_id: int | None = None,
    tags: Sequence[str] = (),
    data_longest_row: int | None = None,
) -> RunResult:
    """One run with its progress on stderr; with `warm_workers` (sweep, tune, fit) a process prepared during the
    previous run takes it. `search_id`, `tags`, `data_longest_row`: as `execute_run` takes them."""
    from gpuanat.core.run.session import execute_run

    env = measurement_environment(
        memory_snapshot=memory_snapshot,
        keep_oom_snapshot=keep_oom_snapshot,
        profile_ops=profile_ops,
        profile_ops_trace=profile_ops_trace,
    )
    view = ProgressView(label)
    try:
        with signals.polled() as stop_requested:
            result = execute_run(
                config,
                store=store,
                log_dir=store.path.parent / "logs",
                name=name,
                on_event=view,
                trace_path=trace_path,
                env=env,
                stop_requested=stop_requested,
                requested_monotonic_s=requested_monotonic_s,
                warm_workers=warm_workers,
                metrics=metrics,
                search_id=search_id,
                tags=tags,
                data_longest_row=data_longest_row,
            )
    except ConfigError as error:  # the GPUs asked for cannot be had: nothing was started or recorded
        view.close()
        fail_usage(str(error))
    finally:
        view.close()
    warn_if_not_saved(result)
    return result


@contextlib.contextmanager
def metrics_endpoint(
    address: tuple[str, int] | None, snapshots: Callable[[], list[Any]] | None = None, name: str | None = None
) -> Iterator[RunMetrics | None]:
    """With `--metrics`: a Prometheus endpoint for the command's runs (their `RunMetrics`, yielded for execute_run), or
    for `snapshots` when given (the watch: then None is yielded); one line on stderr says where. Without: None."""
    if address is None:
        yield None
        return
    from gpuanat.core.export.metrics import MetricsServer, beyond_loopback_warning, job_label
    from gpuanat.core.export.run_metrics import RunMetrics

    source = None
    if snapshots is None:
        source = RunMetrics()
        snapshots = source.snapshots
    try:
        server = MetricsServer(address, snapshots, job=job_label(name))
    except OSError as error:
        fail_usage(f"--metrics: cannot listen on {address[0]}:{address[1]}: {error.strerror or error}")
    warning = beyond_loopback_warning(server.host, "--metrics")
    if warning:
        print(f"gpuanat: {warning}", file=sys.stderr)
    print(f"gpuanat: Prometheus metrics at {server.url}", file=sys.stderr, flush=True)
    try:
        yield source
    finally:
        server.close()


@contextlib.contextmanager
def prepared_workers() -> Iterator[WarmWorkers]:
    """Warm workers for a command of several runs, retired when it ends however it ends."""
    from gpuanat.core.run.warm import WarmWorkers

    workers = WarmWorkers()
    try:
        yield workers
    finally:
        workers.close()


def warn_if_not_saved(result: RunResult | None) -> None:
    """One line on stderr when the history refused a run's last writes (busy or full until the end)."""
    if result is not None and result.history_error:
        print(f"gpuanat: warning: {result.history_error}", file=sys.stderr)


def exit_code_for(status: str, signals: StopSignals) -> int:
    """The exit code of a command whose run ended with `status`."""
    if status == "stopped" and signals.exit_code is not None:
        return signals.exit_code
    return STATUS_EXIT_CODES[status]


def print_summary(result: RunResult, db: Path | None = None) -> None:
    """The docs' summary (Time, Samples/second, GPU memory occupied) plus gpuanat's measurements; `db`: the history
    given with --db, for the `gpuanat explain` command it names."""
    from gpuanat.cli.run_text import (
        activity_lines,
        band_lines,
        compute_text,
        loss_lines,
        run_title,
        summary_memory_lines,
    )
    from gpuanat.core.measure.diagnose import breakdown_line
    from gpuanat.core.measure.startup import startup_line
    from gpuanat.core.operations.report import summary_lines as operations_summary_lines
    from gpuanat.core.store.report import format_bytes, format_mb, format_number

    print(run_title(result))
    if result.error:
        print(f"  {result.error.kind}: {result.error.message}")
    occupied = (
        "unknown (no GPU reading)"
        if result.device_memory_used_bytes is None
        else f"{format_mb(result.device_memory_used_bytes)} MiB"
    )
    if "training" in result.unavailable:  # a script that trained nothing gpuanat could see
        print(f"Nothing measured: {result.unavailable['training']}.")
        print(f"GPU memory occupied: {occupied}.")
        print(f"Peak RSS: {format_bytes(result.peak_rss_bytes)}")
        print(f"Log: {result.log_path}")
        return
    print(f"Time: {format_number(result.train_runtime_s)}")
    print(f"Samples/second: {format_number(result.samples_per_second)}")
    print(f"GPU memory occupied: {occupied}.")
    steady = result.steady_samples_per_second
    note = (
        f"after {result.warmup_steps} warm-up steps"
        if steady is not None
        else result.unavailable.get("steady_samples_per_second", "")
    )
    print(f"Steady samples/second: {format_number(steady)} ({note})")
    if result.padding_percent is not None:  # a --data run: the data's own tokens, beside the samples
        from gpuanat.cli.data import data_line

        print(data_line(result))
    print(f"Achieved: {compute_text(result)}")
    for line in [*loss_lines(result), *activity_lines(result)]:
        print(line)
    print(f"Peak allocated: {format_bytes(result.peak_allocated_bytes)}")
    params, trainable = result.params, result.trainable_params
    if params and trainable is not None and trainable != params:  # adapters on a frozen base: say how it splits
        print(f"Parameters: {trainable:,} trainable, {params - trainable:,} frozen ({100 * trainable / params:.2f}%)")
    if result.probe_cost_percent is not None:
        print(
            f"gpuanat's probe: {result.probe_cost_percent:.2f}% of the training time "
            f"({format_number(result.probe_time_s)} s in its callbacks)"
        )
    step_time = breakdown_line(result.step_time_breakdown)
    if step_time is not None:
        caught_up = (result.step_time_breakdown or {}).get("gpu_caught_up_share")
        print(
            f"Step time: {step_time}"
            + (f"; the GPU had caught up at {100 * caught_up:.0f}% of the steps" if caught_up is not None else "")
        )
    for line in operations_summary_lines(result.operations_anatomy):
        print(line)
    for finding in result.diagnosis or []:
        print(f"Diagnosis: {finding['bottleneck']} — {finding['evidence']}. Try: {finding['fix']}")
    started = startup_line(result.wall_breakdown_s or {}, result.time_to_first_step_s)
    if started is not None:
        print(f"Start-up: {started}")
    print("Memory bands:")
    bands = result.bands.values() if result.bands is not None else None
    at_failure = isinstance(result.out_of_memory, dict)
    for line in band_lines(bands, result.unavailable, result.gradients_after_backward_bytes, at_failure=at_failure):
        print(line)
    for line in summary_memory_lines(result, db):
        print(line)
    print(f"Log: {result.log_path}")


def print_table(columns: Any, rows: list[dict[str, Any]]) -> None:
    """The rows as a table: a terminal gets what fits its width (columns cut short, then dropped, by each column's
    `keep`); a pipe or a file gets every column whole."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gpuanat.cli.output import unguarded
    from gpuanat.cli.plain_table import write_long_table
    from gpuanat.core.store.report import display_value, fit_columns

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else TABLE_WIDTH_NOT_A_TERMINAL
    shown, cut_widths = fit_columns(columns, rows, width) if sys.stdout.isatty() else (list(columns), {})
    if not write_long_table(unguarded(sys.stdout), shown, rows, cut_widths, bold_head=sys.stdout.isatty()):
        table = Table(show_edge=False, header_style="bold")
        for column in shown:
            table.add_column(
                column.title,
                justify="right" if column.numeric else "left",
                no_wrap=column.key != "reason",
                max_width=cut_widths.get(column.key),
                overflow="ellipsis",
            )
        for row in rows:  # Text, not markup: a name reads as given, brackets and all (display_value: printable)
            table.add_row(*(Text(display_value(column.key, row.get(column.key))) for column in shown))
        Console(file=unguarded(sys.stdout), width=width).print(table)  # the cells are printable; Rich adds styles
    dropped = [column.title for column in columns if column not in shown]
    if dropped:
        print(
            f"({len(dropped)} more columns at a wider terminal: {', '.join(dropped)}; all of them with "
            "--format md, csv or json)",
            file=sys.stderr,
        )


def validated_config(args: argparse.Namespace, cuda_available: bool) -> RunConfig:
    """The config the flags give, its values checked (one line and exit 2 when one is wrong)."""
    config = config_from_args(args, cuda_available)
    try:
        validate_values(config)
    except ConfigError as error:
        fail_usage(str(error))
    return config


def check_values(args: argparse.Namespace) -> int | None:
    """Refuse what is wrong whatever the machine — values, a --model that cannot be had — in one line and exit 2,
    before the capability probe, which imports torch (seconds): a bad value is answered at once. Says in one
    line when --model will be downloaded. Returns --data's longest row in tokens, which its predictions are sized
    with (`core.memory.data_length`); None without --data."""
    config = validated_config(args, cuda_available=True)  # the device is the probe's to settle
    if getattr(args, "device", None) == "cpu":  # no probe needed to know that a CUDA-only technique cannot run
        installed = "not yet probed"  # what the CPU run needs of the packages, the probe tells after this
        cpu_only = Capabilities(
            torch_version=installed,
            cuda_available=False,
            bitsandbytes_version=installed,
            peft_version=installed,
            liger_version=installed,
            deepspeed_version=installed,
            reason="--device cpu",
        )
        unsupported = machine_unsupported_reason(config.replace(device="cpu"), cpu_only)
        if unsupported is not None:
            fail_usage(f"{unsupported[0]}: {unsupported[1]}")
    if config.model is not None:
        try:
            note = check_hub_model(config.model)
        except ConfigError as error:
            fail_usage(str(error))
        if note is not None:
            print(f"gpuanat: {note}", file=sys.stderr)
    from gpuanat.cli.data import checked_longest_row

    try:
        return checked_longest_row(config)
    except ConfigError as error:
        fail_usage(str(error))


def machine_config(args: argparse.Namespace, capabilities: Capabilities) -> RunConfig:
    """The config to train on this machine: the device from the probe, and on the CPU a workload sized for it
    in place of what the user left to the defaults (one line on stderr says so). Values as in `check_values`."""
    config, workload = workload_for_device(config_from_args(args, capabilities.cuda_available), untouched_fields(args))
    if workload is not None:
        why = (
            "no CUDA GPU here" + (f" ({capabilities.reason})" if capabilities.reason else "")
            if not capabilities.cuda_available
            else "--device cpu"
        )
        print(f"gpuanat: {why}; {workload} — give --preset to choose", file=sys.stderr)
    try:
        validate_values(config)
    except ConfigError as error:
        fail_usage(str(error))
    return config


def user_keymap(app_class: type) -> dict[str, str]:
    """The user's key remapping (config.toml [keymap]) for `app_class`. The file is checked whole, against
    both dashboards it configures, before anything starts: one line and exit 2 when it cannot be used."""
    from gpuanat.tui.keymap import KeymapError, app_bindings, default_config_path, gpuanat_apps, load_keymap

    try:
        keymap = load_keymap(default_config_path(), gpuanat_apps())
    except KeymapError as error:
        fail_usage(str(error))
    ids = {binding.id for binding in app_bindings(app_class) if binding.id}
    return {binding_id: keys for binding_id, keys in keymap.items() if binding_id in ids}
