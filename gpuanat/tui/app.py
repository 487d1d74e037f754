"""The gpuanat dashboard: technique toggles, live charts, the memory breakdown, the child's log.

Data flows one way. The sampler thread and the run's thread only append to deques; one paint tick on
the event loop (default 4 Hz) drains them into time series and repaints what changed. Keys are
declarative bindings (footer, help panel, command palette, remappable through the keymap).

The app composes and paints. The run in progress is a `LiveRun` (`gpuanat.core.measure.live_run`), which the paint
tick feeds each event and sample; the run's thread is `RunControl`'s; the threads' messages are in
`gpuanat.tui.messages`; the keys' actions are `TechniqueActions`, `RunActions` and `SearchActions` (fit, tune); the
memory bar and the GPU lanes are painted by `MemoryView`.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection
from functools import cached_property
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Footer

from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.measure.diagnose import diagnose, recent_breakdown
from gpuanat.core.measure.flops import utilization
from gpuanat.core.measure.live_run import THROUGHPUT_WINDOW_STEPS, LiveRun, gpu_of
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import GpuSample, NvmlStatus, Sample
from gpuanat.core.measure.startup import REQUESTED, startup_status
from gpuanat.core.memory.model_config import UnreadableModel
from gpuanat.core.memory.predict import CUDA_CONTEXT_BYTES, cuda_context_bytes, estimate_memory, peak_reserved_bytes
from gpuanat.core.run.runner import probe_capabilities
from gpuanat.core.run.session import SharedSampler
from gpuanat.core.run.warm import WarmWorkers
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.config import Capabilities, RunConfig, workload_for_device
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.protocol import Event, Ranked, Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.validation import validate_values
from gpuanat.tui.dashboard_actions import FIRST_BINDINGS, SHARED_BINDINGS
from gpuanat.tui.memory_view import MemoryView
from gpuanat.tui.messages import CapabilitiesFound, RunFinished, RunStarted
from gpuanat.tui.run_control import RunControl
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.searches import SearchActions
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline, anatomy_points
from gpuanat.tui.widgets.gpu_lanes import GpuLanes
from gpuanat.tui.widgets.line_chart import LineChart, format_duration
from gpuanat.tui.widgets.log_pane import LogPane
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.operations_panel import OperationsPanel
from gpuanat.tui.widgets.status_line import StatusLine
from gpuanat.tui.widgets.step_strip import StepStrip
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

PAINT_INTERVAL_S = 0.25
SAMPLE_INTERVAL_S = 0.25


def _bytes_label(value: float) -> str:
    return format_bytes(int(value))


def _percent_label(value: float) -> str:
    return f"{value:.0f}%"


def _rate_label(value: float) -> str:
    return f"{value:.1f}/s"


def run_progress(run_id: int | None, step: Step, total_steps: int | None) -> str:
    """ "run 3: step 9/64 · 12s · ETA 1m13s": where the run is, how long it has trained, and — at the mean pace of
    its steps so far — how long it has left."""
    text = f"run {run_id}: step {step.step}" + (f"/{total_steps}" if total_steps else "")
    text += f" · {format_duration(step.elapsed_s)}"
    if total_steps and 0 < step.step < total_steps and step.elapsed_s > 0:
        text += f" · ETA {format_duration(step.elapsed_s / step.step * (total_steps - step.step))}"
    return text


WORKER_STATES = {"preparing": "training process warming up…", "ready": "training process warm"}
"""The status line's word for the prepared worker (gpuanat.core.run.warm), while no run is in progress."""
WORKER_NOTES = {
    "preparing": "preparing the next training process ahead (torch and transformers imports)",
    "ready": "the next training process is ready: r starts training without the imports",
}


class GpuAnatApp(SearchActions):
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
        Binding(
            "x", "toggle_technique('expandable_segments')", "Expandable segments", id="expandable_segments", show=False
        ),
        Binding("f", "fit", "Fit batch", id="fit"),
        Binding("T", "tune", "Tune: the fastest set that fits (short real runs)", id="tune", show=False),
        Binding("E", "toggle_technique('engine')", "Engine", id="engine", show=False),
        Binding("W", "toggle_technique('weights_dtype')", "Weights dtype", id="weights_dtype", show=False),
        Binding("L", "toggle_technique('lora')", "LoRA", id="lora", show=False),
        Binding("4", "toggle_technique('load_in_4bit')", "4-bit base (QLoRA)", id="load_in_4bit", show=False),
        Binding("K", "toggle_technique('liger')", "Liger loss", id="liger", show=False),
        Binding("Y", "toggle_technique('liger_layers')", "Liger layer kernels", id="liger_layers", show=False),
        Binding("M", "toggle_technique('preset')", "Model", id="preset", show=False),
        Binding("G", "cycle_gpus", "GPUs", id="gpus", show=False),
        Binding("D", "cycle_distributed", "Distributed", id="distributed", show=False),
        Binding("v", "toggle_timeline", "Anatomy timeline", id="timeline", show=False),
        Binding("O", "toggle_operations", "Operations anatomy: profile the next runs", id="operations", show=False),
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
        warm_workers: WarmWorkers | None = None,
        metrics: RunMetrics | None = None,
    ) -> None:
        """Every source of data is injectable: tests pass a replayed NVML trace, a frozen clock and
        `sample_interval_s=None` (no sampler thread; they call `sample_now`). `untouched_fields` names the
        RunConfig fields the user left to the defaults (no flag given): on the CPU, once the capability probe has
        answered, the workload among them is sized for it (`workload_for_device`). With `warm_workers` the next
        training process is kept prepared while the user chooses (gpuanat.core.run.warm), and closed when the app ends;
        `metrics` is told about every run the app starts (the `--metrics` endpoint's source)."""
        super().__init__()
        self.config = config
        self._untouched_fields = frozenset(untouched_fields)
        self.db_path = db_path
        self._sampler_factory = sampler_factory
        self._capabilities_probe = capabilities_probe
        self._clock = clock
        self._paint_interval_s = paint_interval_s
        self._sample_interval_s = sample_interval_s
        self.capabilities: Capabilities | None = None
        self.nvml: NvmlStatus | None = None
        self.live: LiveRun | None = None
        self.last_result: RunResult | None = None
        self.charts_paused = False
        self.compare_selection: list[int] = []
        self._incoming_samples: collections.deque[Sample] = collections.deque(maxlen=10_000)
        self._incoming_events: collections.deque[Event] = collections.deque(maxlen=100_000)
        self._sampler: Sampler | None = None
        self._sampler_started_s = clock()
        self._latest_sample: Sample | None = None
        self._quit_after_run = False
        # Memory keeps its peaks when downsampled; rates are averaged.
        self.series = {
            "device_used": TimeSeries(),
            "run_used": TimeSeries(),
            "gpu_util": TimeSeries(),
            "throughput": TimeSeries(reduce="mean"),
            "host_rss": TimeSeries(),
            "host_cpu": TimeSeries(reduce="mean"),
        }
        self._run_control = RunControl(
            db_path,
            post=self.post_message,
            on_event=self._incoming_events.append,
            run_env=run_env,
            shared_sampler=self._shared_sampler,
            warm_workers=warm_workers,
            metrics=metrics,
        )
        self._worker_status: str | None = None
        """The prepared worker's last status shown ("preparing", "ready"), to log its changes once."""
        self._stop_dialog: ConfirmScreen | None = None
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
                yield LineChart(
                    f"Throughput (samples/s, mean of {THROUGHPUT_WINDOW_STEPS} steps)",
                    formatter=_rate_label,
                    id="throughput-chart",
                    empty_message="a run's samples/s show here",
                )
                yield AnatomyTimeline(id="timeline")
                yield OperationsPanel(id="operations")
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

    @cached_property
    def _memory_view(self) -> MemoryView:
        return MemoryView(self._memory_bar, self._show_lanes)

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
        self._sampler = Sampler(
            source,
            interval_s=self._sample_interval_s or SAMPLE_INTERVAL_S,
            on_sample=self._incoming_samples.append,
            clock=self._clock,
        )
        self._sampler_started_s = self._clock()
        if self._sample_interval_s is not None:
            self._sampler.start()
        self._start_paint_tick(self._paint_interval_s)
        self._listen_for_stop_signals()
        self._run_control.probe_capabilities(self._capabilities_probe)
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
        self._run_control.join(30)
        if self._run_control.warm_workers is not None:
            self._run_control.warm_workers.close()
        if self._sampler is not None:
            self._sampler.stop()

    def sample_now(self) -> None:
        """Take one sample on the calling thread (tests drive a replayed trace this way)."""
        assert self._sampler is not None
        self._incoming_samples.append(self._sampler.sample_once())

    def _shared_sampler(self) -> SharedSampler | None:
        """The dashboard's sampler while it runs, for the runs it starts to listen to."""
        sampler = self._sampler
        return (
            SharedSampler(sampler, self.nvml)
            if sampler is not None and sampler.running and self.nvml is not None
            else None
        )

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
            self._run_control.prepare_worker(self.config)
        self._show_techniques()

    def on_run_started(self, message: RunStarted) -> None:
        if self.live is None:
            return
        self.live.observe_start(message.run_id, message.pid, message.gpu_indices)
        if "spawned" in self.live.parent_points:  # a search's next trial: its start-up begins now
            self.live.parent_points[REQUESTED] = time.monotonic()
            self._startup_parts_logged = 0
        self.live.parent_points["spawned"] = time.monotonic()
        self.series["throughput"].clear()
        self._charts_by_id["throughput-chart"].title = self._throughput_title(None, None)
        self._anatomy_timeline.clear()
        if self._sampler is not None:
            self._sampler.track(message.pid)
        self._log_pane.follow(message.log_path)
        if message.start_note is not None:
            self._log_pane.note(f"gpuanat · {message.start_note}")
        self._worker_status = None

    def on_run_finished(self, message: RunFinished) -> None:
        if self._stop_dialog is not None and self._stop_dialog in self.screen_stack:
            self._stop_dialog.dismiss(False)  # the run it asked about has ended: the question is moot
        self.paint()  # the run's last events and samples
        live, self.live = self.live, None
        if live is not None and live.pid is not None and self._sampler is not None:
            self._sampler.untrack(live.pid)
        self._run_control.prepare_worker(self.config)  # for the configuration chosen meanwhile (kept when it suits)
        if message.result is None:
            self.notify(f"The run could not be recorded: {message.failure}", severity="error", timeout=10)
        else:
            self.last_result = message.result
            status = message.result.status
            steady = message.result.steady_samples_per_second
            detail = f", steady {steady:.1f} samples/s" if steady else ""
            severity: SeverityLevel = "information" if status == "ok" else "warning" if status == "stopped" else "error"
            self.notify(f"Run {message.result.run_id}: {status}{detail}", severity=severity, timeout=6)
            if message.result.history_error:
                self.notify(message.result.history_error, severity="warning", timeout=15)
            self._memory_view.show_result(message.result)
            if message.result.operations_anatomy:
                self.operations_shown = (message.result.operations_anatomy, message.result.run_id)
            self._show_operations()
            findings = message.result.diagnosis or []
            self._step_strip.show(message.result.step_time_breakdown, findings[0] if findings else None)
        self._show_techniques()
        if self._quit_after_run:
            self.exit()

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
                self._memory_view.show_live(self.live, self._latest_sample, self._shown_gpu_index())
                if events:
                    self._show_step_strip(self.live)
                    self._show_live_operations(self.live)
            self._log_pane.poll()
            if self.live is not None:
                self._log_startup(self.live)
            self._status_line.show(
                nvml=self.nvml, run_state=self._run_state(), sampler_cpu_percent=self._sampler_cpu_percent()
            )

    def _show_step_strip(self, live: LiveRun) -> None:
        """The latest steps' time by phase and what bounds them, live."""
        breakdown = recent_breakdown(live.timed_steps, live.gpu_busy)
        findings = diagnose(RunResult(config=live.config.to_json(), step_time_breakdown=breakdown)) if breakdown else []
        self._step_strip.show(breakdown, findings[0].to_json() if findings else None)

    def _throughput_title(self, live: LiveRun | None, rank_rate: float | None) -> str:
        """The throughput chart's title, with the model FLOPs the run achieves at that rate and its MFU."""
        title = f"Throughput (samples/s, mean of {THROUGHPUT_WINDOW_STEPS} steps)"
        if live is None or rank_rate is None:
            return title
        gpu = gpu_of(self._latest_sample, self._shown_gpu_index())
        ranks = max(1, len(live.gpu_indices))
        model = next((rank.model for rank in live.ranks.values() if rank.model is not None), None)
        speed = utilization(live.config, rank_rate * ranks, gpu.name if gpu else None, ranks, model=model)
        if speed.achieved_tflops is None:
            return title
        achieved = (
            f"{speed.achieved_tflops:.1f} TFLOP/s"
            if speed.achieved_tflops >= 1
            else f"{speed.achieved_tflops * 1000:.1f} GFLOP/s"
        )
        return f"{title} · {achieved}" + (f", {100 * speed.mfu:.0f}% MFU" if speed.mfu is not None else "")

    def _add_anatomy_points(self, live: LiveRun, step: Step) -> None:
        """The step's two columns of the anatomy timeline: its peak and its end."""
        if live.model is None:
            return
        known = live.probe_bands.optimizer_state_bytes if live.probe_bands is not None else 0
        before = (
            step.bands.optimizer_state_at_forward_end_bytes
            if step.bands is not None and step.bands.optimizer_state_at_forward_end_bytes is not None
            else 0
            if step.step <= 1
            else known
        )
        context = (live.peak_bands or {}).get("cuda_context_bytes")
        self._anatomy_timeline.add_points(
            anatomy_points(
                step.step,
                step.peak_allocated_bytes,
                step.allocated_bytes,
                step.reserved_bytes,
                live.model.weights_bytes,
                before,
                known,
                context,
            )
        )

    def _charts_window(self) -> tuple[float, float] | None:
        """One time axis for every chart: from the first to the last sample any of them shows."""
        shown = [series for series in self.series.values() if series]
        if not shown:
            return None
        return (
            min(series.first_t_s for series in shown if series.first_t_s is not None),
            max(series.last_t_s for series in shown if series.last_t_s is not None),
        )

    def _shown_gpu_index(self) -> int | None:
        """The GPU the charts and the memory bar show: rank 0's of the run in progress, else of the last run."""
        if self.live is not None and self.live.gpu_indices:
            return self.live.gpu_indices[0]
        if self.last_result and self.last_result.gpus:
            return self.last_result.gpus[0]["index"]
        return None

    def _add_sample(self, sample: Sample) -> None:
        self._latest_sample = sample
        if self.live is not None and self.live.pid is not None:  # the run's process tree (NVML or not)
            if sample.host.rss_bytes is not None:
                self.series["host_rss"].append(sample.t_s, sample.host.rss_bytes)
            if sample.host.cpu_percent is not None:
                self.series["host_cpu"].append(sample.t_s, sample.host.cpu_percent)
        gpu = gpu_of(sample, self._shown_gpu_index())
        run_used = self.live.observe_sample(sample, gpu) if self.live is not None else None
        if gpu is not None:
            self._scale_memory_chart(gpu)
            if gpu.used_bytes is not None:
                self.series["device_used"].append(sample.t_s, gpu.used_bytes)
            if gpu.gpu_util_percent is not None:
                self.series["gpu_util"].append(sample.t_s, gpu.gpu_util_percent)
            if run_used is not None:
                self.series["run_used"].append(sample.t_s, run_used)
        if self.live is None and self.last_result is None and sample.gpus:
            self._memory_view.show_idle(sample)  # after a run, its bands stay up until the next one

    def _add_event(self, event: Event | Ranked) -> None:
        live = self.live
        if live is None:
            return
        observed = live.observe_event(event, self._sampler_now_s)
        if observed is None:
            return
        self._add_anatomy_points(live, observed.step)
        throughput = self.series["throughput"]
        if observed.samples_per_second is not None and (
            throughput.last_t_s is None or observed.t_s > throughput.last_t_s
        ):
            throughput.append(observed.t_s, observed.samples_per_second)  # on the sampler's clock, as the other charts

    def _sampler_now_s(self) -> float:
        """The sampler's time now: its latest sample's."""
        return self._latest_sample.t_s if self._latest_sample is not None else self._clock()

    # --- what the widgets show ---------------------------------------------------------------------
    def _run_state(self) -> str:
        live = self.live
        if live is None:
            idle = "idle" if self.last_result is None else f"idle · last run {self.last_result.status}"
            worker = self._prepared_worker_status()
            return idle if worker is None else f"{idle} · {WORKER_STATES[worker]}"
        if live.last_step is None:
            return (f"run {live.run_id}: " if live.run_id is not None else "run: ") + startup_status(
                live.startup_points, time.monotonic()
            )
        return run_progress(live.run_id, live.last_step, live.model.total_steps if live.model else None)

    def _prepared_worker_status(self) -> str | None:
        """The prepared training process's status ("preparing", "ready" or None); its changes go to the log once."""
        warm_workers = self._run_control.warm_workers
        status = warm_workers.status() if warm_workers is not None else None
        if status != self._worker_status and status is not None:
            self._log_pane.note(f"gpuanat · {WORKER_NOTES[status]}")
        self._worker_status = status
        return status

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
        except (ConfigError, UnreadableModel):  # a --model this model cannot describe: no predicted column
            estimate = None
        context = CUDA_CONTEXT_BYTES if estimate is None else cuda_context_bytes(estimate)  # until measured here
        last_config = RunConfig.from_json(self.last_result.config) if self.last_result else None
        if (
            last_config is not None
            and self.last_result is not None
            and self.last_result.bands
            and self.last_result.bands.cuda_context_bytes
            and (last_config.ranks, last_config.distributed) == (self.config.ranks, self.config.distributed)
        ):
            context = self.last_result.bands.cuda_context_bytes
        self.query_one(TechniquesPanel).show(
            self.config,
            capabilities=self.capabilities,
            estimate=estimate,
            gpu_total_bytes=self._gpu_total_bytes(),
            device_peak_bytes=None if estimate is None else peak_reserved_bytes(estimate) + context,
            several_gpus=self._gpu_count() > 1,
        )
        self._memory_view.show_predicted(self.config, estimate, context, self._gpu_total_bytes(), self.compact)
