"""The gpuanat dashboard: technique toggles, live charts, the memory breakdown, the child's log.

Data flows one way. The sampler thread and the run's thread only append to deques; one paint tick on
the event loop (default 4 Hz) drains them into time series and repaints what changed. Keys are
declarative bindings (footer, help panel, command palette, remappable through the keymap).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.widgets import Footer

from gpuanat.core.measure.anatomy import assemble_bands
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import GpuSample, NvmlStatus, Sample
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.fit import fit_unsupported_reason, run_fit
from gpuanat.core.memory.predict import (
    CUDA_CONTEXT_BYTES,
    cuda_context_bytes,
    estimate_memory,
    peak_reserved_bytes,
)
from gpuanat.core.memory.shapes import lora_shapes
from gpuanat.core.run.config import Capabilities, RunConfig, workload_for_device
from gpuanat.core.run.diagnose import LIVE_WINDOW_STEPS, diagnose, recent_breakdown
from gpuanat.core.run.errors import ConfigError
from gpuanat.core.run.flops import utilization
from gpuanat.core.run.presets import PRESETS
from gpuanat.core.run.protocol import Event, Hello, ModelInfo, ProbeBands, Ranked, Step
from gpuanat.core.run.runner import probe_capabilities
from gpuanat.core.run.session import SharedSampler, execute_run
from gpuanat.core.run.techniques import changed_config, next_distributed, next_gpu_count
from gpuanat.core.run.tune.runs import run_command
from gpuanat.core.run.tune.search import DEFAULT_BUDGET_MINUTES, DEFAULT_TRIAL_STEPS, run_tune
from gpuanat.core.run.tune.space import search_space
from gpuanat.core.run.validation import machine_unsupported_reason, validate_values
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.report import format_bytes
from gpuanat.core.thread_names import name_native_thread
from gpuanat.tui.dashboard_actions import FIRST_BINDINGS, SHARED_BINDINGS, DashboardActions
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline, anatomy_points
from gpuanat.tui.widgets.gpu_lanes import GpuLanes, Lane
from gpuanat.tui.widgets.line_chart import LineChart, format_duration
from gpuanat.tui.widgets.log_pane import LogPane
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.status_line import StatusLine
from gpuanat.tui.widgets.step_strip import StepStrip
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

PAINT_INTERVAL_S = 0.25
GPU_BUSY_SAMPLES_KEPT = 2400
"""NVML utilization samples a run keeps for the step strip: 10 minutes at 4 Hz."""
SAMPLE_INTERVAL_S = 0.25
FIT_TRIAL_STEPS = 3
FIT_MAX_BATCH = 1024


def _bytes_label(value: float) -> str:
    return format_bytes(int(value))


def _percent_label(value: float) -> str:
    return f"{value:.0f}%"


def _rate_label(value: float) -> str:
    return f"{value:.1f}/s"


THROUGHPUT_WINDOW_STEPS = 10
"""The throughput chart plots the mean rate of this many steps."""


class RunStarted(Message):
    def __init__(self, run_id: int, pid: int, log_path: Path, gpu_indices: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.run_id, self.pid, self.log_path, self.gpu_indices = run_id, pid, log_path, gpu_indices


class RunFinished(Message):
    def __init__(self, result: dict[str, Any] | None, failure: str | None = None) -> None:
        super().__init__()
        self.result, self.failure = result, failure


class FitTrialDone(Message):
    def __init__(self, batch_size: int, status: str) -> None:
        super().__init__()
        self.batch_size, self.status = batch_size, status


class FitStarting(Message):
    """The fit's first trial batch: the predicted largest batch (`method`), or the current batch without one."""

    def __init__(self, batch_size: int, method: str | None) -> None:
        super().__init__()
        self.batch_size, self.method = batch_size, method


class FitFinished(Message):
    def __init__(self, largest_batch_size: int | None, failure: str | None) -> None:
        super().__init__()
        self.largest_batch_size, self.failure = largest_batch_size, failure


class TuneTrialDone(Message):
    def __init__(self, name: str, status: str, samples_per_second: float | None, left_s: float) -> None:
        super().__init__()
        self.name, self.status, self.samples_per_second, self.left_s = name, status, samples_per_second, left_s


class TuneFinished(Message):
    def __init__(self, best: RunConfig | None, summary: str | None, failure: str | None) -> None:
        super().__init__()
        self.best, self.summary, self.failure = best, summary, failure


class CapabilitiesFound(Message):
    def __init__(self, capabilities: Capabilities | None, failure: str | None) -> None:
        super().__init__()
        self.capabilities, self.failure = capabilities, failure


@dataclass
class LiveRun:
    """What the dashboard knows about the run in progress."""

    config: RunConfig
    stop_requested: threading.Event
    run_id: int | None = None
    pid: int | None = None
    model: ModelInfo | None = None
    last_step: Step | None = None
    probe_bands: ProbeBands | None = None
    peak_bands: dict[str, int | None] | None = None
    """The bands at the highest device use seen so far."""
    recent_steps: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=THROUGHPUT_WINDOW_STEPS + 1))
    """(elapsed s, samples) of the last steps, for the throughput chart's mean."""
    gpu_indices: tuple[int, ...] = ()
    """NVML index of each rank's GPU (rank 0 first); empty on the CPU or without NVML."""
    rank_pids: dict[int, int] = field(default_factory=dict)
    rank_steps: dict[int, Step] = field(default_factory=dict)
    """The latest step of each rank but rank 0 (whose is `last_step`)."""
    rank_probe_bands: dict[int, ProbeBands] = field(default_factory=dict)
    """The latest measured bands of each rank but rank 0 (whose are `probe_bands`)."""
    clock_offset_s: float | None = None
    """For steps without `monotonic_s`: the sampler's time at the run's elapsed 0 s, from its first step."""
    timed_steps: collections.deque[Step] = field(
        default_factory=lambda: collections.deque(maxlen=LIVE_WINDOW_STEPS + 2))
    """Rank 0's latest steps, for the step strip's breakdown."""
    gpu_busy: collections.deque[tuple[float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=GPU_BUSY_SAMPLES_KEPT))
    """(sampler time, NVML utilization %) of rank 0's GPU, the last 10 minutes at 4 Hz."""


def run_progress(run_id: int | None, step: Step, total_steps: int | None) -> str:
    """"run 3: step 9/64 · 12s · ETA 1m13s": where the run is, how long it has trained, and — at the mean pace of
    its steps so far — how long it has left."""
    text = f"run {run_id}: step {step.step}" + (f"/{total_steps}" if total_steps else "")
    text += f" · {format_duration(step.elapsed_s)}"
    if total_steps and 0 < step.step < total_steps and step.elapsed_s > 0:
        text += f" · ETA {format_duration(step.elapsed_s / step.step * (total_steps - step.step))}"
    return text


def trainable_weights_bytes(params: int | None, trainable_params: int | None) -> int | None:
    """The bytes of the weights that train where the rest is frozen: LoRA's and QLoRA's adapters, which PEFT keeps
    in fp32; None for full fine-tuning (all of them train) or without counts."""
    if not params or trainable_params is None or trainable_params >= params:
        return None
    return 4 * trainable_params


class GpuAnatApp(DashboardActions):
    CSS_PATH = "app.tcss"
    TITLE = "gpuanat"
    BINDINGS = [
        *FIRST_BINDINGS,
        Binding("r", "run", "Run", id="run"),
        Binding("s", "stop", "Stop", id="stop"),
        Binding("g", "toggle_technique('grad_checkpointing')", "Checkpointing", id="grad_checkpointing"),
        Binding("p", "toggle_technique('precision')", "Precision", id="precision"),
        Binding("t", "toggle_technique('tf32')", "TF32", id="tf32", show=False),
        Binding("o", "toggle_technique('optim')", "Optimizer", id="optim"),
        Binding("plus,equals_sign", "step('batch_size', 1)", "Batch+", id="batch_up", key_display="+"),
        Binding("minus", "step('batch_size', -1)", "Batch-", id="batch_down", key_display="-"),
        Binding("a", "step('grad_accum', 1)", "Accum+", id="accum_up", show=False),
        Binding("A", "step('grad_accum', -1)", "Accum-", id="accum_down", show=False),
        Binding("w", "toggle_technique('workers')", "Workers", id="workers", show=False),
        Binding("m", "toggle_technique('pin_memory')", "Pin memory", id="pin_memory", show=False),
        Binding("c", "toggle_technique('compile')", "Compile: off, regions, model", id="compile", show=False),
        Binding("e", "toggle_technique('attn')", "Attention", id="attn", show=False),
        Binding("x", "toggle_technique('expandable_segments')", "Expandable segments", id="expandable_segments",
                show=False),
        Binding("f", "fit", "Fit batch", id="fit"),
        Binding("T", "tune", "Tune: the fastest set that fits (short real runs)", id="tune", show=False),
        Binding("E", "toggle_technique('engine')", "Engine", id="engine", show=False),
        Binding("L", "toggle_technique('lora')", "LoRA", id="lora", show=False),
        Binding("4", "toggle_technique('load_in_4bit')", "4-bit base (QLoRA)", id="load_in_4bit", show=False),
        Binding("K", "toggle_technique('liger')", "Liger loss", id="liger", show=False),
        Binding("M", "toggle_technique('preset')", "Model", id="preset", show=False),
        Binding("G", "cycle_gpus", "GPUs", id="gpus", show=False),
        Binding("D", "cycle_distributed", "Distributed", id="distributed", show=False),
        Binding("v", "toggle_timeline", "Anatomy timeline", id="timeline", show=False),
        *SHARED_BINDINGS,
    ]

    def __init__(
        self,
        config: RunConfig,
        *,
        db_path: Path,
        sampler_factory: Callable[[], tuple[Any, NvmlStatus]] = open_source,
        capabilities_probe: Callable[[], Capabilities] = probe_capabilities,
        clock: Callable[[], float] = time.monotonic,
        paint_interval_s: float = PAINT_INTERVAL_S,
        sample_interval_s: float | None = SAMPLE_INTERVAL_S,
        run_env: dict[str, str] | None = None,
        keymap: dict[str, str] | None = None,
        untouched_fields: Collection[str] = (),
    ) -> None:
        """Every source of data is injectable: tests pass a replayed NVML trace, a frozen clock and
        `sample_interval_s=None` (no sampler thread; they call `sample_now`). `untouched_fields` names the
        RunConfig fields the user left to the defaults (no flag given): on the CPU, once the capability probe has
        answered, the workload among them is sized for it (`workload_for_device`)."""
        super().__init__()
        self.config = config
        self._untouched_fields = frozenset(untouched_fields)
        self.db_path = db_path
        self._sampler_factory = sampler_factory
        self._capabilities_probe = capabilities_probe
        self._clock = clock
        self._paint_interval_s = paint_interval_s
        self._sample_interval_s = sample_interval_s
        self._run_env = run_env
        self.capabilities: Capabilities | None = None
        self.nvml: NvmlStatus | None = None
        self.live: LiveRun | None = None
        self.last_result: dict[str, Any] | None = None
        self.charts_paused = False
        self.compare_selection: list[int] = []
        self._incoming_samples: collections.deque[Sample] = collections.deque(maxlen=10_000)
        self._incoming_events: collections.deque[Event] = collections.deque(maxlen=100_000)
        self._sampler: Sampler | None = None
        self._sampler_started_s = clock()
        self._latest_sample: Sample | None = None
        self._quit_after_run = False
        # Memory keeps its peaks when downsampled; rates are averaged.
        self.series = {"device_used": TimeSeries(), "run_used": TimeSeries(), "gpu_util": TimeSeries(),
                       "throughput": TimeSeries(reduce="mean"), "host_rss": TimeSeries(),
                       "host_cpu": TimeSeries(reduce="mean")}
        self._run_thread: threading.Thread | None = None
        self._predicted_logits_bytes: int | None = None
        self._predicted_trainable_bytes: int | None = None
        """The configured run's adapters (fp32), computed when the configuration changes, not at each paint."""
        self._stop_dialog: ConfirmScreen | None = None
        """The "Stop run N?" question while it is open."""
        if keymap:
            self.set_keymap(keymap)

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(id="top"):
            yield TechniquesPanel(self.config, id="techniques")
            with Vertical(id="charts"):
                yield LineChart("GPU memory used", formatter=_bytes_label, id="memory-chart")
                yield LineChart("GPU utilization", formatter=_percent_label, y_max=100, id="util-chart")
                yield LineChart(f"Throughput (samples/s, mean of {THROUGHPUT_WINDOW_STEPS} steps)",
                                formatter=_rate_label, id="throughput-chart",
                                empty_message="a run's samples/s show here")
                yield AnatomyTimeline(id="timeline")
        yield MemoryBar(id="memory")
        yield StepStrip(id="steps")
        yield GpuLanes(id="lanes")
        yield LogPane(id="log")
        yield Footer()

    @cached_property
    def _log_pane(self) -> LogPane:
        return self.query_one(LogPane)

    @cached_property
    def _step_strip(self) -> StepStrip:
        return self.query_one(StepStrip)

    @cached_property
    def _anatomy_timeline(self) -> AnatomyTimeline:
        return self.query_one(AnatomyTimeline)

    def on_mount(self) -> None:
        source, self.nvml = self._sampler_factory()
        if self.nvml.available:
            memory_chart = self._charts_by_id["memory-chart"]
            memory_chart.set_series("device used", self.series["device_used"])
            memory_chart.set_series("this run", self.series["run_used"])
            self._charts_by_id["util-chart"].set_series("GPU util", self.series["gpu_util"])
        else:
            self._chart_the_host()
        self._charts_by_id["throughput-chart"].set_series("samples/s", self.series["throughput"])
        self._sampler = Sampler(source, interval_s=self._sample_interval_s or SAMPLE_INTERVAL_S,
                                on_sample=self._incoming_samples.append, clock=self._clock)
        self._sampler_started_s = self._clock()
        if self._sample_interval_s is not None:
            self._sampler.start()
        self._start_paint_tick(self._paint_interval_s)
        self._listen_for_stop_signals()
        threading.Thread(target=self._probe_capabilities, name="gpuanat-capabilities", daemon=True).start()
        self._fit_layout(self.size.height)
        self._show_techniques()
        self.paint()

    def _scale_memory_chart(self, gpu: GpuSample) -> None:
        """The memory chart spans the GPU's whole memory, as the bar below does: a run's use reads against what the
        card has, not against its own maximum (where any run would look like a wall)."""
        chart = self._charts_by_id["memory-chart"]
        if gpu.total_bytes is not None and chart.y_max != gpu.total_bytes:
            self._anatomy_timeline.set_total(gpu.total_bytes)
            chart.y_max = gpu.total_bytes
            chart.title = f"GPU {gpu.index} memory used (of {format_bytes(gpu.total_bytes)})"

    def _chart_the_host(self) -> None:
        """Without NVML the GPU charts would wait forever: chart what is measurable instead — the run's host memory
        (RSS) and CPU — and say once why."""
        assert self.nvml is not None
        memory_chart = self._charts_by_id["memory-chart"]
        memory_chart.title = "Host memory of the run (RSS)"
        memory_chart.set_series("run RSS", self.series["host_rss"])
        util_chart = self._charts_by_id["util-chart"]
        util_chart.title = "Host CPU of the run (% of one core)"
        util_chart.y_max = None  # several cores read over 100%
        util_chart.set_series("run CPU", self.series["host_cpu"])
        for chart in (memory_chart, util_chart):
            chart.empty_message = "a run's RSS and CPU show here"
        self.notify(f"No GPU charts: {self.nvml.reason}. The charts show the run's host memory and CPU.", timeout=8)

    def _layout_changed(self, compact: bool) -> None:
        # Compact: no log pane, two charts, no predicted bar, and a shorter techniques list.
        self.query_one(TechniquesPanel).compact = compact
        self._show_techniques()

    def on_unmount(self) -> None:
        self._forget_stop_signals()
        if self.live is not None:
            self.live.stop_requested.set()
        if self._run_thread is not None:
            self._run_thread.join(timeout=30)
        if self._sampler is not None:
            self._sampler.stop()

    def sample_now(self) -> None:
        """Take one sample on the calling thread (tests drive a replayed trace this way)."""
        assert self._sampler is not None
        self._incoming_samples.append(self._sampler.sample_once())

    # --- background work: threads only post messages or append to deques --------------------------
    def _post(self, message: Message) -> None:
        self.post_message(message)

    def _probe_capabilities(self) -> None:
        try:
            self.post_message(CapabilitiesFound(self._capabilities_probe(), None))
        except RuntimeError as error:
            self.post_message(CapabilitiesFound(None, str(error)))

    def _run_options(self) -> dict[str, Any]:
        """What every run the dashboard starts is given besides its config: the environment, and the dashboard's
        sampler while it runs (the run listens to its samples instead of reading NVML and the process tree again)."""
        sampler = self._sampler
        shared = (SharedSampler(sampler, self.nvml) if sampler is not None and sampler.running
                  and self.nvml is not None else None)
        return {"env": self._run_env, "shared_sampler": shared}

    def _execute(self, live: LiveRun) -> None:
        name_native_thread()
        try:
            with HistoryStore(self.db_path) as store:
                result = execute_run(
                    live.config, store=store, log_dir=self.db_path.parent / "logs",
                    on_event=self._incoming_events.append, **self._run_options(),
                    stop_requested=live.stop_requested,
                    on_start=lambda run_id, pid, log, gpus: self._post(RunStarted(run_id, pid, log, gpus)),
                )
        except Exception as error:  # the dashboard must survive any failure of a run
            self.post_message(RunFinished(None, f"{type(error).__name__}: {error}"))
        else:
            self.post_message(RunFinished(result))

    def _fit(self, live: LiveRun, gpu_total: int | None) -> None:
        try:
            predicted = (largest_batch(live.config, gpu_total) if gpu_total and live.config.model is None
                         else None)  # a replay takes a second: not on the UI thread
            start = predicted.batch_size if predicted and predicted.batch_size else live.config.batch_size
            self._post(FitStarting(start, predicted.method if predicted and predicted.batch_size else None))
            with HistoryStore(self.db_path) as store:
                fit = run_fit(
                    live.config, store=store, log_dir=self.db_path.parent / "logs", start=start,
                    trial_steps=FIT_TRIAL_STEPS, max_batch=FIT_MAX_BATCH,
                    on_trial=lambda batch_size, result: self._post(FitTrialDone(batch_size, result["status"])),
                    on_event=self._incoming_events.append, **self._run_options(), stop_requested=live.stop_requested,
                    on_start=lambda run_id, pid, log, gpus: self._post(RunStarted(run_id, pid, log, gpus)),
                )
        except Exception as error:  # the dashboard must survive any failure of a run
            self.post_message(FitFinished(None, f"{type(error).__name__}: {error}"))
            return
        failure = None
        if fit.failure is not None:
            failure = f"the trial at batch {fit.failure['config']['batch_size']} ended {fit.failure['status']}"
        self.post_message(FitFinished(fit.largest_batch_size, failure))

    def _tune(self, live: LiveRun, gpu_total: int | None, capabilities: Capabilities) -> None:
        try:
            space = search_space(live.config, capabilities, set(), gpu_memory_bytes=gpu_total)
            with HistoryStore(self.db_path) as store:
                outcome = run_tune(
                    live.config, space, store=store, log_dir=self.db_path.parent / "logs",
                    trial_steps=DEFAULT_TRIAL_STEPS, budget_s=60 * DEFAULT_BUDGET_MINUTES, stop=live.stop_requested,
                    on_trial=lambda trial, progress: self._post(TuneTrialDone(
                        trial.name, trial.status, trial.samples_per_second, progress.estimated_left_s)),
                    on_event=self._incoming_events.append, **self._run_options(), stop_requested=live.stop_requested,
                    on_start=lambda run_id, pid, log, gpus: self._post(RunStarted(run_id, pid, log, gpus)),
                )
        except Exception as error:  # the dashboard must survive any failure of a search
            self.post_message(TuneFinished(None, None, f"{type(error).__name__}: {error}"))
            return
        best = outcome.best
        if best is None:
            self.post_message(TuneFinished(None, None, f"no trial trained ({outcome.stop_reason})"))
            return
        summary = (f"{len(outcome.trials)} trials, {len(outcome.front)} on the front; best {best.name} at "
                   f"{best.samples_per_second or 0:.1f} samples/s: {run_command(best.config)}")
        self.post_message(TuneFinished(best.config, summary, None))

    # --- messages ---------------------------------------------------------------------------------
    def on_capabilities_found(self, message: CapabilitiesFound) -> None:
        self.capabilities = message.capabilities
        if message.failure:
            self.notify(message.failure, severity="error", timeout=10)
        elif self.capabilities is not None:
            notes = []
            if not self.capabilities.cuda_available and self.config.device == "cuda":
                # Expandable segments are an option of the CUDA allocator (on by default from PYTORCH_CUDA_ALLOC_CONF).
                self.config = self.config.replace(device="cpu", expandable_segments=False)
                notes.append(f"No CUDA here ({self.capabilities.reason}); runs train on the CPU.")
            self.config, workload = workload_for_device(self.config, self._untouched_fields)
            if workload is not None:
                notes.append(f"Sized for the CPU: {workload} (start gpuanat with --preset to choose).")
            if notes:
                self.notify(" ".join(notes), timeout=10)
        self._show_techniques()

    def on_run_started(self, message: RunStarted) -> None:
        if self.live is None:
            return
        self.live.run_id, self.live.pid, self.live.gpu_indices = message.run_id, message.pid, message.gpu_indices
        self.live.last_step = self.live.probe_bands = None  # a fit starts one run per trial
        self.live.rank_pids, self.live.rank_steps, self.live.rank_probe_bands = {}, {}, {}
        self.live.recent_steps.clear()
        self.live.timed_steps.clear()
        self.series["throughput"].clear()
        self._charts_by_id["throughput-chart"].title = self._throughput_title(None, None)
        self._anatomy_timeline.clear()
        if self._sampler is not None:
            self._sampler.track(message.pid)
        self._log_pane.follow(message.log_path)

    def on_run_finished(self, message: RunFinished) -> None:
        if self._stop_dialog is not None and self._stop_dialog in self.screen_stack:
            self._stop_dialog.dismiss(False)  # the run it asked about has ended: the question is moot
        self.paint()  # the run's last events and samples
        live, self.live = self.live, None
        if live is not None and live.pid is not None and self._sampler is not None:
            self._sampler.untrack(live.pid)
        if message.result is None:
            self.notify(f"The run could not be recorded: {message.failure}", severity="error", timeout=10)
        else:
            self.last_result = message.result
            status = message.result["status"]
            steady = message.result.get("steady_samples_per_second")
            detail = f", steady {steady:.1f} samples/s" if steady else ""
            severity: SeverityLevel = "information" if status == "ok" else "warning" if status == "stopped" else "error"
            self.notify(f"Run {message.result['run_id']}: {status}{detail}", severity=severity, timeout=6)
            if message.result.get("history_error"):
                self.notify(message.result["history_error"], severity="warning", timeout=15)
            self._show_result_bands(message.result)
            findings = message.result.get("diagnosis") or []
            self._step_strip.show(message.result.get("step_time_breakdown"), findings[0] if findings else None)
        self._show_techniques()
        if self._quit_after_run:
            self.exit()

    def on_tune_trial_done(self, message: TuneTrialDone) -> None:
        self._untrack_trial()
        rate = f", {message.samples_per_second:.1f} samples/s" if message.samples_per_second else ""
        self.notify(f"{message.name}: {message.status}{rate} · about {format_duration(message.left_s)} left",
                    timeout=6)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self._end_search()
        if message.best is None:
            self.notify(f"tune: {message.failure}", severity="warning", timeout=10)
        else:
            base = self.config
            self._change_config(message.best.replace(samples=base.samples, epochs=base.epochs,
                                                     max_steps=base.max_steps))
            self.notify(f"tune: {message.summary}. It is the current set now (r runs it).", timeout=15)
        self._after_search()

    def on_fit_starting(self, message: FitStarting) -> None:
        source = {"replay": " (the prediction, replayed)", "model": " (the prediction)"}.get(message.method or "", "")
        self.notify(f"fit: trials of {FIT_TRIAL_STEPS} steps from batch {message.batch_size}{source}", timeout=4)

    def _untrack_trial(self) -> None:
        """A search's trial ended: its process is not the run's to sample any more (the next trial's comes)."""
        if self.live is not None and self.live.pid is not None and self._sampler is not None:
            self._sampler.untrack(self.live.pid)

    def _end_search(self) -> None:
        """Before a search's (fit's, tune's) outcome is shown: its last events painted, no run live."""
        self.paint()
        self.live = None

    def _after_search(self) -> None:
        self._show_techniques()
        if self._quit_after_run:
            self.exit()

    def on_fit_trial_done(self, message: FitTrialDone) -> None:
        self._untrack_trial()
        outcome = {"ok": "trains", "oom": "out of memory"}.get(message.status, message.status)
        self.notify(f"fit: batch {message.batch_size} {outcome}", timeout=4)

    def on_fit_finished(self, message: FitFinished) -> None:
        self._end_search()
        if message.failure is not None or not message.largest_batch_size:
            self.notify(f"fit stopped: {message.failure or 'not even batch 1 trains'}", severity="warning",
                        timeout=8)
        else:
            self._change_config(self.config.replace(batch_size=message.largest_batch_size))
            self.notify(f"fit: the largest batch that trains is {message.largest_batch_size}; it is the batch "
                        "size now", timeout=8)
        self._after_search()

    # --- the paint tick ----------------------------------------------------------------------------
    def paint(self) -> None:
        samples = [self._incoming_samples.popleft() for _ in range(len(self._incoming_samples))]
        events = [self._incoming_events.popleft() for _ in range(len(self._incoming_events))]
        for sample in samples:
            self._add_sample(sample)
        for event in events:
            self._add_event(event)
        rate = self.series["throughput"].last  # the title once a paint, not at every step
        if events and self.live is not None and rate is not None:
            self._charts_by_id["throughput-chart"].title = self._throughput_title(self.live, rate)
        with self.batch_update():
            window, now_s = self._charts_window() if samples or events else None, self._clock()
            for chart in self._charts:  # also without new samples: a plot lagging by its rate catches up
                if samples or events:
                    chart.window = window
                chart.refresh_data(now_s)
            if self.live is not None:
                self._show_live_bands()
                if events:
                    self._show_step_strip(self.live)
            self._log_pane.poll()
            self._status_line.show(nvml=self.nvml, run_state=self._run_state(),
                                            sampler_cpu_percent=self._sampler_cpu_percent())

    def _show_step_strip(self, live: LiveRun) -> None:
        """The latest steps' time by phase and what bounds them, live."""
        breakdown = recent_breakdown(live.timed_steps, live.gpu_busy)
        findings = diagnose({"config": live.config.to_json(), "step_time_breakdown": breakdown}) if breakdown else []
        self._step_strip.show(breakdown, findings[0].to_json() if findings else None)

    def _throughput_title(self, live: LiveRun | None, rank_rate: float | None) -> str:
        """The throughput chart's title, with the model FLOPs the run achieves at that rate and its MFU."""
        title = f"Throughput (samples/s, mean of {THROUGHPUT_WINDOW_STEPS} steps)"
        if live is None or rank_rate is None:
            return title
        gpu = self._gpu_of(self._latest_sample, self._shown_gpu_index())
        ranks = max(1, len(live.gpu_indices))
        speed = utilization(live.config, rank_rate * ranks, gpu.name if gpu else None, ranks)
        if speed.achieved_tflops is None:
            return title
        achieved = (f"{speed.achieved_tflops:.1f} TFLOP/s" if speed.achieved_tflops >= 1
                    else f"{speed.achieved_tflops * 1000:.1f} GFLOP/s")
        return f"{title} · {achieved}" + (f", {100 * speed.mfu:.0f}% MFU" if speed.mfu is not None else "")

    def _add_anatomy_points(self, live: LiveRun, step: Step) -> None:
        """The step's two columns of the anatomy timeline: its peak and its end."""
        if live.model is None:
            return
        known = live.probe_bands.optimizer_state_bytes if live.probe_bands is not None else 0
        before = (step.bands.optimizer_state_at_forward_end_bytes if step.bands is not None
                  and step.bands.optimizer_state_at_forward_end_bytes is not None else 0 if step.step <= 1 else known)
        context = (live.peak_bands or {}).get("cuda_context_bytes")
        self._anatomy_timeline.add_points(anatomy_points(
            step.step, step.peak_allocated_bytes, step.allocated_bytes, step.reserved_bytes, live.model.weights_bytes,
            before, known, context))

    def _charts_window(self) -> tuple[float, float] | None:
        """One time axis for every chart: from the first to the last sample any of them shows."""
        shown = [series for series in self.series.values() if series]
        if not shown:
            return None
        return (min(series.first_t_s for series in shown if series.first_t_s is not None),
                max(series.last_t_s for series in shown if series.last_t_s is not None))

    def _shown_gpu_index(self) -> int | None:
        """The GPU the charts and the memory bar show: rank 0's of the run in progress, else of the last run."""
        if self.live is not None and self.live.gpu_indices:
            return self.live.gpu_indices[0]
        if self.last_result and self.last_result.get("gpus"):
            return self.last_result["gpus"][0]["index"]
        return None

    def _gpu_of(self, sample: Sample | None, index: int | None) -> GpuSample | None:
        """GPU `index` of `sample` (None: the first NVML lists)."""
        if sample is None or not sample.gpus:
            return None
        return next((gpu for gpu in sample.gpus if index is None or gpu.index == index), None)

    def _add_sample(self, sample: Sample) -> None:
        self._latest_sample = sample
        if self.live is not None and self.live.pid is not None:  # the run's process tree (NVML or not)
            if sample.host.rss_bytes is not None:
                self.series["host_rss"].append(sample.t_s, sample.host.rss_bytes)
            if sample.host.cpu_percent is not None:
                self.series["host_cpu"].append(sample.t_s, sample.host.cpu_percent)
        gpu = self._gpu_of(sample, self._shown_gpu_index())
        if gpu is not None:
            self._scale_memory_chart(gpu)
            if gpu.used_bytes is not None:
                self.series["device_used"].append(sample.t_s, gpu.used_bytes)
            if gpu.gpu_util_percent is not None:
                self.series["gpu_util"].append(sample.t_s, gpu.gpu_util_percent)
                if self.live is not None:
                    self.live.gpu_busy.append((sample.t_s, gpu.gpu_util_percent))
            if self.live is not None and self.live.pid is not None:
                pids = [self.live.pid, *self.live.rank_pids.values()]  # the run's processes on the GPU shown
                run_used = dataclasses.replace(sample, gpus=(gpu,)).process_used_bytes(pids)
                if run_used is not None:
                    self.series["run_used"].append(sample.t_s, run_used)
        if self.live is None and self.last_result is None and sample.gpus:
            self._show_idle_bands(sample)  # after a run, its bands stay up until the next one

    def _add_event(self, event: Event | Ranked) -> None:
        live = self.live
        if live is None:
            return
        rank = 0
        if isinstance(event, Ranked):
            rank, event = event.rank, event.event
        if isinstance(event, Hello):
            live.rank_pids[rank] = event.pid
        if rank != 0:
            if isinstance(event, Step):
                live.rank_steps[rank] = event
                if event.bands is not None:
                    live.rank_probe_bands[rank] = event.bands
            return
        if isinstance(event, ModelInfo):
            live.model = event
        elif isinstance(event, Step):
            live.last_step = event
            live.timed_steps.append(event)
            if event.bands is not None:
                live.probe_bands = event.bands
            self._add_anatomy_points(live, event)
            # The mean rate of the last steps, as the steady rate is a mean: a single step's rate jumps with the
            # loss logging and the DataLoader, and would read against the "steady" figure the run ends with.
            live.recent_steps.append((event.elapsed_s, event.samples))
            first_elapsed_s, first_samples = live.recent_steps[0]
            if event.monotonic_s is not None:  # the worker's time.monotonic(): the sampler's clock (Linux)
                t_s = event.monotonic_s
            else:  # a step without it (older recordings): placed by the latest sample when the first step came
                if live.clock_offset_s is None:
                    now_s = self._latest_sample.t_s if self._latest_sample is not None else self._clock()
                    live.clock_offset_s = now_s - event.elapsed_s
                t_s = live.clock_offset_s + event.elapsed_s
            throughput = self.series["throughput"]
            if event.elapsed_s > first_elapsed_s and (throughput.last_t_s is None or t_s > throughput.last_t_s):
                rate = (event.samples - first_samples) / (event.elapsed_s - first_elapsed_s)
                throughput.append(t_s, rate)  # on the sampler's clock, as the other charts

    # --- what the widgets show ---------------------------------------------------------------------
    def _run_state(self) -> str:
        live = self.live
        if live is None:
            return "idle" if self.last_result is None else f"idle · last run {self.last_result['status']}"
        if live.last_step is None:
            return "starting the training process…"
        return run_progress(live.run_id, live.last_step, live.model.total_steps if live.model else None)

    def _sampler_cpu_percent(self) -> float | None:
        if self._sampler is None:
            return None
        wall_s = self._clock() - self._sampler_started_s
        # Rounded as shown, so the status line repaints only when the shown figure changes.
        return round(100.0 * self._sampler.cpu_seconds / wall_s, 1) if wall_s > 1 else None

    def _gpu_total_bytes(self) -> int | None:
        sample = self._latest_sample
        if sample is not None and sample.gpus:
            return sample.gpus[0].total_bytes
        return self.capabilities.cuda_total_memory_bytes if self.capabilities else None

    def _show_techniques(self) -> None:
        try:
            validate_values(self.config)
            estimate = estimate_memory(self.config)
        except ConfigError:
            estimate = None
        context = CUDA_CONTEXT_BYTES if estimate is None else cuda_context_bytes(estimate)  # until measured here
        last_config = RunConfig.from_json(self.last_result["config"]) if self.last_result else None
        if (last_config is not None and self.last_result["bands"].get("cuda_context_bytes")
                and (last_config.ranks, last_config.distributed) == (self.config.ranks, self.config.distributed)):
            context = self.last_result["bands"]["cuda_context_bytes"]
        self.query_one(TechniquesPanel).show(self.config, capabilities=self.capabilities, estimate=estimate,
                                             gpu_total_bytes=self._gpu_total_bytes(),
                                             device_peak_bytes=None if estimate is None else
                                             peak_reserved_bytes(estimate) + context,
                                             several_gpus=self._gpu_count() > 1)
        compact = self.compact
        self._predicted_logits_bytes = estimate.logits_bytes if estimate is not None and not compact else None
        self._predicted_trainable_bytes = (
            4 * lora_shapes(PRESETS[self.config.preset], self.config).params
            if self.config.lora and self.config.model is None and not compact else None)
        now, peak, _ = self._memory_bar.logits
        self._show_logits(now, peak)
        self._show_trainable(self._memory_bar.trainable[0])  # what was measured stays
        if estimate is None or compact:
            self._memory_bar.update_predicted(None)
        else:
            on_gpu = self.config.device == "cuda"  # the activation model is of CUDA memory; none on the CPU
            self._memory_bar.update_predicted(
                {"weights_bytes": estimate.weights_bytes, "optimizer_state_bytes": estimate.optimizer_state_bytes,
                 "activations_bytes": estimate.activations_bytes if on_gpu else None,
                 "gradients_bytes": estimate.gradients_at_peak_bytes,
                 "cuda_context_bytes": context if self.config.device == "cuda" else None},
                self._gpu_total_bytes())

    def _show_logits(self, now: int | None, peak: int | None) -> None:
        """The logits row under the activations: measured, and predicted for the configured run."""
        self._memory_bar.update_logits(now, peak, self._predicted_logits_bytes)

    def _show_trainable(self, measured: int | None) -> None:
        """The weights that train, where the rest is frozen (`trainable_weights_bytes`), and the configured run's
        adapters as predicted."""
        self._memory_bar.update_trainable(measured, self._predicted_trainable_bytes)

    def _show_idle_bands(self, sample: Sample) -> None:
        gpu = sample.gpus[0]
        self._show_lanes([])
        free = gpu.total_bytes - gpu.used_bytes if gpu.total_bytes is not None and gpu.used_bytes is not None else None
        self._memory_bar.update_bands({"other_processes_bytes": gpu.used_bytes, "free_bytes": free}, None,
                                               gpu.total_bytes, {})

    def _rank_bands(self, live: LiveRun, rank: int, sample: Sample | None,
                    gpu_index: int | None) -> tuple[GpuSample | None, dict[str, Any], dict[str, str]]:
        """One rank's bands now, at the peak's accounting (gradients: those alive at the end of forward), from its
        own events and NVML's reading of its GPU and its PID; with why a band is missing."""
        gpu = self._gpu_of(sample, gpu_index)
        probe, step = ((live.probe_bands, live.last_step) if rank == 0
                       else (live.rank_probe_bands.get(rank), live.rank_steps.get(rank)))
        pid = live.rank_pids.get(rank, live.pid if rank == 0 else None)
        no_gpu = None if gpu is not None and live.config.device == "cuda" else "CPU run: no GPU memory"
        bands = assemble_bands(
            probe,
            reserved_bytes=step.reserved_bytes if step else None,
            device_used_bytes=gpu.used_bytes if gpu else None,
            device_total_bytes=gpu.total_bytes if gpu else None,
            process_used_bytes=(dataclasses.replace(sample, gpus=(gpu,)).process_used_bytes([pid])
                                if sample is not None and gpu is not None and pid else None),
            no_gpu_reason=no_gpu,
        )
        values = bands.to_json()
        unavailable = values.pop("unavailable")
        if probe is not None:
            values["gradients_bytes"] = probe.gradients_at_forward_end_bytes
        return gpu, values, unavailable

    def _show_live_bands(self) -> None:
        live, sample = self.live, self._latest_sample
        assert live is not None
        gpu, values, unavailable = self._rank_bands(live, 0, sample, self._shown_gpu_index())
        lanes = []
        for rank, index in enumerate(live.gpu_indices):
            rank_gpu, rank_values, _ = self._rank_bands(live, rank, sample, index)
            reading = rank_gpu or GpuSample(index, "", None, None, None, None, None, None, None, ())
            lanes.append(Lane(index, rank, rank_values, reading.used_bytes, reading.total_bytes,
                              reading.gpu_util_percent))
        self._show_lanes(lanes)
        used = gpu.used_bytes if gpu else None
        if used is not None and (live.peak_bands is None or used >= (live.peak_bands.get("device_used_bytes") or 0)):
            live.peak_bands = {**values, "device_used_bytes": used}
        self._memory_bar.update_bands(values, live.peak_bands, gpu.total_bytes if gpu else None, unavailable)
        logits = live.probe_bands.logits_bytes if live.probe_bands else None
        self._show_logits(logits, logits)
        self._show_trainable(trainable_weights_bytes(live.model.params, live.model.trainable_params)
                             if live.model else None)

    def _show_result_bands(self, result: dict[str, Any]) -> None:
        # The bar stacks the memory at the peak (end of forward): only accumulated gradients are alive then.
        at_peak = {**result["bands"], "gradients_bytes": result.get("gradients_at_forward_end_bytes")}
        self._memory_bar.update_bands(at_peak, at_peak, result.get("device_memory_total_bytes"),
                                               result["unavailable"])
        self._show_logits(result.get("logits_bytes"), result.get("logits_bytes"))
        self._show_trainable(trainable_weights_bytes(result.get("params"), result.get("trainable_params")))
        self._show_lanes([
            Lane(rank["gpu_index"], rank["rank"],
                 {**rank["bands"], "gradients_bytes": rank.get("gradients_at_forward_end_bytes")},
                 rank.get("device_memory_used_bytes"), rank.get("device_memory_total_bytes"), None)
            for rank in result.get("ranks") or [] if rank.get("gpu_index") is not None])

    # --- actions -----------------------------------------------------------------------------------
    def _change_config(self, config: RunConfig) -> None:
        self.config = config
        self._show_techniques()

    def action_toggle_technique(self, field: str) -> None:
        self._change_config(changed_config(self.config, field))
        try:  # a value that cannot train (Liger on a classifier, QLoRA without adapters) is said at once, not at `r`
            validate_values(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="warning", timeout=6)

    def action_step(self, field: str, direction: int) -> None:
        self._change_config(changed_config(self.config, field, direction))

    def _gpu_count(self) -> int:
        return len(self.nvml.gpu_names) if self.nvml is not None and self.nvml.available else 0

    def action_cycle_gpus(self) -> None:
        if self.config.device != "cuda" or self._gpu_count() < 2:
            self.notify(f"One GPU here ({self._gpu_count()} listed by NVML): nothing to choose."
                        if self.config.device == "cuda" else "CPU runs use no GPU.", timeout=4)
            return
        self._change_config(next_gpu_count(self.config, self._gpu_count()))

    def action_cycle_distributed(self) -> None:
        following = next_distributed(self.config)
        if following is None:
            self.notify("A distributed technique needs several GPUs: choose them with G first.", timeout=4)
            return
        self._change_config(following)

    def action_run(self) -> None:
        if not self._can_start():
            return
        self.live = LiveRun(config=self.config, stop_requested=threading.Event())
        for name in ("run_used", "throughput", "host_rss", "host_cpu"):
            self.series[name].clear()
        self._run_thread = threading.Thread(target=self._execute, args=(self.live,), name="gpuanat-run", daemon=True)
        self._run_thread.start()
        self.paint()

    def _can_start(self) -> bool:
        """Whether a run (or fit) may start now; says why not."""
        if self.live is not None:
            self.notify("A run is in progress; stop it with s first.", severity="warning")
            return False
        try:
            validate_values(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="error")
            return False
        if self.capabilities is not None:
            unsupported = machine_unsupported_reason(self.config, self.capabilities)
            if unsupported is not None:
                self.notify(f"{unsupported[0]}: {unsupported[1]}", severity="error")
                return False
        return True

    def action_fit(self) -> None:
        if not self._can_start():
            return
        cannot_fit = fit_unsupported_reason(self.config)
        if cannot_fit is not None:
            self.notify(cannot_fit, severity="error", timeout=10)
            return
        self._start_search(self._fit, "gpuanat-fit")

    def action_tune(self) -> None:
        if not self._can_start():
            return
        if self.capabilities is None:
            self.notify("tune waits for the capability probe (a few seconds after start); press T again then.",
                        severity="warning")
            return
        self.notify(f"tune: short real runs of {DEFAULT_TRIAL_STEPS} steps, at most "
                    f"{format_duration(60 * DEFAULT_BUDGET_MINUTES)}; s stops and keeps the best found so far",
                    timeout=6)
        self._start_search(self._tune, "gpuanat-tune", self.capabilities)

    def _start_search(self, search: Callable[..., None], thread_name: str, *args: Any) -> None:
        """A search of real trial runs (fit, tune) on a thread of its own: `search(live, gpu_total, *args)`."""
        gpu_total = self._gpu_total_bytes() if self.config.device == "cuda" else None
        self.live = LiveRun(config=self.config, stop_requested=threading.Event())
        for name in ("run_used", "throughput", "host_rss", "host_cpu"):
            self.series[name].clear()
        self._run_thread = threading.Thread(target=search, args=(self.live, gpu_total, *args), name=thread_name,
                                            daemon=True)
        self._run_thread.start()

    def action_stop(self) -> None:
        if self.live is None:
            self.notify("No run in progress.")
            return
        live = self.live

        def answered(stop: bool | None) -> None:
            self._stop_dialog = None
            if stop:
                live.stop_requested.set()

        self._stop_dialog = ConfirmScreen(f"Stop run {live.run_id or ''} ({live.config.techniques_summary()})?")
        self.push_screen(self._stop_dialog, answered)

    def finish_recording(self, timeout_s: float) -> None:
        if self._run_thread is not None:
            self._run_thread.join(timeout=timeout_s)

    def stop_and_quit(self) -> None:
        if self.live is None:
            self.exit()
            return
        self._quit_after_run = True
        self.live.stop_requested.set()

    async def action_quit(self) -> None:
        if self.live is None:
            self.exit()
            return
        live = self.live

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                if self.live is None:  # the run ended while the question was open
                    self.exit()
                    return
                self._quit_after_run = True
                live.stop_requested.set()

        self.push_screen(ConfirmScreen("A run is in progress. Stop it and quit?"), answered)
