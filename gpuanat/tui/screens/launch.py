"""The launching dashboard: technique toggles, live charts, the memory breakdown, the child's log.

Data flows one way. The sampler thread and the run's worker only append to deques; one paint tick on the event loop
(default 4 Hz) drains them into the charts (`LiveCharts`) and repaints what changed. Keys are declarative bindings
(footer, help page, command palette, remappable through the keymap by their ids).

The screen composes and paints. The run in progress is a `LiveRun` (`gpuanat.core.measure.live_run`), which the paint
tick feeds each event and sample; the runs themselves are the `RunBackend`'s, started in `RunControl`'s workers, whose
messages are in `gpuanat.tui.messages`; the memory bar and the GPU lanes are painted by `MemoryView`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Collection, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Footer

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.memory.fit import fit_unsupported_reason
from gpuanat.core.memory.model_config import UnreadableModel
from gpuanat.core.memory.predict import CUDA_CONTEXT_BYTES, cuda_context_bytes, estimate_memory, peak_reserved_bytes
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.run.config import DEFAULT_PROFILE_OPS_STEPS, Capabilities, RunConfig, workload_for_device
from gpuanat.core.run.diagnose import diagnose, recent_breakdown
from gpuanat.core.run.errors import ConfigError
from gpuanat.core.run.protocol import Event, Ranked, Step
from gpuanat.core.run.session import SharedSampler
from gpuanat.core.run.startup import REQUESTED, startup_progress, startup_status
from gpuanat.core.run.techniques import changed_config, next_distributed, next_gpu_count
from gpuanat.core.run.tune.search import DEFAULT_BUDGET_MINUTES, DEFAULT_TRIAL_STEPS
from gpuanat.core.run.validation import machine_unsupported_reason, validate_values
from gpuanat.tui.live_charts import LiveCharts, live_charts
from gpuanat.tui.memory_view import MemoryView
from gpuanat.tui.messages import (
    CapabilitiesFound,
    FitFinished,
    FitStarting,
    FitTrialDone,
    RunFinished,
    RunStarted,
    TuneFinished,
    TuneTrialDone,
)
from gpuanat.tui.run_backend import RunBackend
from gpuanat.tui.run_control import RunControl
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.screens.dashboard import FIRST_BINDINGS, SHARED_BINDINGS, DashboardScreen
from gpuanat.tui.searches import FIT_TRIAL_STEPS, fit_search, tune_search
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline
from gpuanat.tui.widgets.gpu_lanes import GpuLanes
from gpuanat.tui.widgets.line_chart import format_duration
from gpuanat.tui.widgets.log_pane import LogPane
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.operations_panel import OperationsPanel
from gpuanat.tui.widgets.status_line import StatusLine
from gpuanat.tui.widgets.step_strip import StepStrip
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

PAINT_INTERVAL_S = 0.25
SAMPLE_INTERVAL_S = 0.25
WORKER_STATES = {"preparing": "training process warming up…", "ready": "training process warm"}
"""The status line's word for the prepared worker (gpuanat.core.run.warm), while no run is in progress."""
WORKER_NOTES = {
    "preparing": "preparing the next training process ahead (torch and transformers imports)",
    "ready": "the next training process is ready: r starts training without the imports",
}


def run_progress(run_id: int | None, step: Step, total_steps: int | None) -> str:
    """ "run 3: step 9/64 · 12s · ETA 1m13s": where the run is, how long it has trained, and — at the mean pace of
    its steps so far — how long it has left."""
    text = f"run {run_id}: step {step.step}" + (f"/{total_steps}" if total_steps else "")
    text += f" · {format_duration(step.elapsed_s)}"
    if total_steps and 0 < step.step < total_steps and step.elapsed_s > 0:
        text += f" · ETA {format_duration(step.elapsed_s / step.step * (total_steps - step.step))}"
    return text


LAUNCH_BINDINGS = [
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
"""The launching dashboard's keys, each with its id (the keymap remaps by id). They are its app's bindings
(`GpuAnatApp.BINDINGS`), so that they stay in force, and in the footer, under the history and compare panes; the app
hands each key's action to this screen."""


class LaunchDashboard(DashboardScreen):
    """The dashboard of the runs it launches (`gpuanat`)."""

    def __init__(
        self,
        config: RunConfig,
        *,
        db_path: Path,
        backend: RunBackend,
        sampler_factory: Callable[[], tuple[Any, NvmlStatus]],
        clock: Callable[[], float] = time.monotonic,
        paint_interval_s: float = PAINT_INTERVAL_S,
        sample_interval_s: float | None = SAMPLE_INTERVAL_S,
        untouched_fields: Collection[str] = (),
    ) -> None:
        """Every source of data is injectable: tests pass a replayed NVML trace, a frozen clock and
        `sample_interval_s=None` (no sampler thread; they call `sample_now`), and a backend of real or recorded runs.
        `untouched_fields` names the RunConfig fields the user left to the defaults (no flag given): on the CPU, once
        the capability probe has answered, the workload among them is sized for it (`workload_for_device`)."""
        super().__init__(db_path=db_path)
        self.config = config
        self.backend = backend
        self.clock = clock
        """The dashboard's clock (the sampler's and the charts')."""
        self._untouched_fields = frozenset(untouched_fields)
        self._sampler_factory = sampler_factory
        self._paint_interval_s = paint_interval_s
        self._sample_interval_s = sample_interval_s
        self.capabilities: Capabilities | None = None
        self.nvml: NvmlStatus | None = None
        self.last_result: dict[str, Any] | None = None
        self.operations_shown: tuple[Mapping[str, Any], int | None] | None = None
        """The operations anatomy on show and its run: the latest run's that was profiled."""
        self._live: LiveRun | None = None
        self._incoming_samples: collections.deque[Sample] = collections.deque(maxlen=10_000)
        self._incoming_events: collections.deque[Event | Ranked] = collections.deque(maxlen=100_000)
        self._sampler: Sampler | None = None
        self._sampler_started_s = clock()
        self._quit_after_run = False
        self._startup_parts_logged = 0
        self._live_operations: object = None
        self._worker_status: str | None = None
        """The prepared worker's last status shown ("preparing", "ready"), to log its changes once."""
        self._stop_dialog: ConfirmScreen | None = None
        """The "Stop run N?" question while it is open."""
        self._run_control = RunControl(self, backend, on_event=self.receive_event, shared_sampler=self._shared_sampler)

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with Horizontal(id="top"):
            yield TechniquesPanel(self.config, id="techniques")
            with Vertical(id="charts"):
                yield from live_charts()
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
    def _live_charts(self) -> LiveCharts:
        return LiveCharts(self._charts_by_id, self.query_one(AnatomyTimeline), self.clock)

    @cached_property
    def _memory_view(self) -> MemoryView:
        return MemoryView(self._memory_bar, self._show_lanes)

    @property
    def series(self) -> dict[str, TimeSeries]:
        """The charts' time series by name (device_used, run_used, gpu_util, throughput, host_rss, host_cpu)."""
        return self._live_charts.series

    def on_mount(self) -> None:
        source, self.nvml = self._sampler_factory()
        note = self._live_charts.attach(self.nvml)
        if note is not None:
            self.notify(note, timeout=8)
        self._sampler = Sampler(
            source,
            interval_s=self._sample_interval_s or SAMPLE_INTERVAL_S,
            on_sample=self._incoming_samples.append,
            clock=self.clock,
        )
        self._sampler_started_s = self.clock()
        if self._sample_interval_s is not None:
            self._sampler.start()
        self._start_paint_tick(self._paint_interval_s)
        self._run_control.probe_capabilities()
        self.fit_layout(self.app.size.height)
        self._show_techniques()
        self.paint()

    def _layout_changed(self, compact: bool) -> None:
        # Compact: no log pane, two charts, no predicted bar, and a shorter techniques list.
        self.query_one(TechniquesPanel).compact = compact
        self._show_techniques()

    def on_unmount(self) -> None:
        if self._live is not None:
            self._live.stop_requested.set()
        self._run_control.join(30)
        self.backend.close()
        if self._sampler is not None:
            self._sampler.stop()

    # --- what comes in: the run in progress, its events, samples -------------------------------------
    @property
    def run_in_progress(self) -> LiveRun | None:
        """The run (or search) in progress, None while idle."""
        return self._live

    def follow_run(self, live: LiveRun) -> None:
        """Show `live` as the run in progress: the events its backend delivers (`receive_event`) and the samples of its
        process paint into it until it finishes (`RunFinished`). A replay of a recorded run enters here too."""
        self._live = live

    def receive_event(self, event: Event | Ranked) -> None:
        """The run's inbox, from any thread: the next paint tick paints the event."""
        self._incoming_events.append(event)

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
        if self._live is None:
            return
        self._live.observe_start(message.run_id, message.pid, message.gpu_indices)
        if "spawned" in self._live.parent_points:  # a search's next trial: its start-up begins now
            self._live.parent_points[REQUESTED] = time.monotonic()
            self._startup_parts_logged = 0
        self._live.parent_points["spawned"] = time.monotonic()
        self._live_charts.run_started()
        if self._sampler is not None:
            self._sampler.track(message.pid)
        self._log_pane.follow(message.log_path)
        if message.start_note is not None:
            self._log_pane.note(f"gpuanat · {message.start_note}")
        self._worker_status = None

    def on_run_finished(self, message: RunFinished) -> None:
        if self._stop_dialog is not None and self._stop_dialog in self.app.screen_stack:
            self._stop_dialog.dismiss(False)  # the run it asked about has ended: the question is moot
        self.paint()  # the run's last events and samples
        live, self._live = self._live, None
        if live is not None and live.pid is not None and self._sampler is not None:
            self._sampler.untrack(live.pid)
        self._run_control.prepare_worker(self.config)  # for the configuration chosen meanwhile (kept when it suits)
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
            self._memory_view.show_result(message.result)
            if message.result.get("operations_anatomy"):
                self.operations_shown = (message.result["operations_anatomy"], message.result["run_id"])
            self._show_operations()
            findings = message.result.get("diagnosis") or []
            self._step_strip.show(message.result.get("step_time_breakdown"), findings[0] if findings else None)
        self._show_techniques()
        if self._quit_after_run:
            self.app.exit()

    def on_fit_starting(self, message: FitStarting) -> None:
        source = {"replay": " (the prediction, replayed)", "model": " (the prediction)"}.get(message.method or "", "")
        self.notify(f"fit: trials of {FIT_TRIAL_STEPS} steps from batch {message.batch_size}{source}", timeout=4)

    def on_fit_trial_done(self, message: FitTrialDone) -> None:
        self._untrack_trial()
        outcome = {"ok": "trains", "oom": "out of memory"}.get(message.status, message.status)
        self.notify(f"fit: batch {message.batch_size} {outcome}", timeout=4)

    def on_fit_finished(self, message: FitFinished) -> None:
        self._end_search()
        if message.failure is not None or not message.largest_batch_size:
            self.notify(f"fit stopped: {message.failure or 'not even batch 1 trains'}", severity="warning", timeout=8)
        else:
            self._change_config(self.config.replace(batch_size=message.largest_batch_size))
            self.notify(
                f"fit: the largest batch that trains is {message.largest_batch_size}; it is the batch size now",
                timeout=8,
            )
        self._after_search()

    def on_tune_trial_done(self, message: TuneTrialDone) -> None:
        self._untrack_trial()
        rate = f", {message.samples_per_second:.1f} samples/s" if message.samples_per_second else ""
        self.notify(f"{message.name}: {message.status}{rate} · about {format_duration(message.left_s)} left", timeout=6)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self._end_search()
        if message.best is None:
            self.notify(f"tune: {message.failure}", severity="warning", timeout=10)
        else:
            base = self.config
            self._change_config(
                message.best.replace(samples=base.samples, epochs=base.epochs, max_steps=base.max_steps)
            )
            self.notify(f"tune: {message.summary}. It is the current set now (r runs it).", timeout=15)
        self._after_search()

    def _untrack_trial(self) -> None:
        """A search's trial ended: its process is not the run's to sample any more (the next trial's comes)."""
        if self._live is not None and self._live.pid is not None and self._sampler is not None:
            self._sampler.untrack(self._live.pid)

    def _end_search(self) -> None:
        """Before a search's (fit's, tune's) outcome is shown: its last events painted, no run live."""
        self.paint()
        self._live = None

    def _after_search(self) -> None:
        self._show_techniques()
        if self._quit_after_run:
            self.app.exit()

    # --- the paint tick ----------------------------------------------------------------------------
    def paint(self) -> None:
        samples = [self._incoming_samples.popleft() for _ in range(len(self._incoming_samples))]
        events = [self._incoming_events.popleft() for _ in range(len(self._incoming_events))]
        charts = self._live_charts
        for sample in samples:
            charts.add_sample(sample, self._live, self._shown_gpu_index())
            if self._live is None and self.last_result is None and sample.gpus:
                self._memory_view.show_idle(sample)  # after a run, its bands stay up until the next one
        if self._live is not None:
            for event in events:
                charts.add_event(event, self._live)
            if events:
                charts.show_throughput_title(self._live, self._shown_gpu_index())
        with self.app.batch_update():
            charts.repaint(bool(samples or events))
            live = self._live
            if live is not None:
                self._memory_view.show_live(live, charts.latest_sample, self._shown_gpu_index())
                if events:
                    self._show_step_strip(live)
                    self._show_live_operations(live)
            self._log_pane.poll()
            if live is not None:
                self._log_startup(live)
            self._status_line.show(
                nvml=self.nvml, run_state=self._run_state(), sampler_cpu_percent=self._sampler_cpu_percent()
            )

    def _show_step_strip(self, live: LiveRun) -> None:
        """The latest steps' time by phase and what bounds them, live."""
        breakdown = recent_breakdown(live.timed_steps, live.gpu_busy)
        findings = diagnose({"config": live.config.to_json(), "step_time_breakdown": breakdown}) if breakdown else []
        self._step_strip.show(breakdown, findings[0].to_json() if findings else None)

    def _log_startup(self, live: LiveRun) -> None:
        """Each part of the run's start-up, as it passes, in the log (the status line shows the one under way)."""
        passed, _ = startup_progress(live.startup_points, time.monotonic())
        logged = self._startup_parts_logged
        for part, seconds in passed[logged:]:
            self._log_pane.note(f"gpuanat · start-up: {part} {seconds:.1f} s")
        self._startup_parts_logged = max(logged, len(passed))

    def _show_live_operations(self, live: LiveRun) -> None:
        """The run in progress has been profiled: its anatomy shows at once."""
        operations = live.rank(0).operations
        if operations is not None and self._live_operations is not operations:
            self._live_operations = operations
            self.operations_shown = (operations_anatomy(operations), live.run_id)
            self._show_operations()

    def _shown_gpu_index(self) -> int | None:
        """The GPU the charts and the memory bar show: rank 0's of the run in progress, else of the last run."""
        if self._live is not None and self._live.gpu_indices:
            return self._live.gpu_indices[0]
        if self.last_result and self.last_result.get("gpus"):
            return self.last_result["gpus"][0]["index"]
        return None

    # --- what the widgets show ---------------------------------------------------------------------
    def _run_state(self) -> str:
        live = self._live
        if live is None:
            idle = "idle" if self.last_result is None else f"idle · last run {self.last_result['status']}"
            worker = self._prepared_worker_status()
            return idle if worker is None else f"{idle} · {WORKER_STATES[worker]}"
        if live.last_step is None:
            return (f"run {live.run_id}: " if live.run_id is not None else "run: ") + startup_status(
                live.startup_points, time.monotonic()
            )
        return run_progress(live.run_id, live.last_step, live.model.total_steps if live.model else None)

    def _prepared_worker_status(self) -> str | None:
        """The prepared training process's status ("preparing", "ready" or None); its changes go to the log once."""
        status = self.backend.prepared_status()
        if status != self._worker_status and status is not None:
            self._log_pane.note(f"gpuanat · {WORKER_NOTES[status]}")
        self._worker_status = status
        return status

    def _sampler_cpu_percent(self) -> float | None:
        if self._sampler is None:
            return None
        wall_s = self.clock() - self._sampler_started_s
        # Rounded as shown, so the status line repaints only when the shown figure changes.
        return round(100.0 * self._sampler.cpu_seconds / wall_s, 1) if wall_s > 1 else None

    def _gpu_total_bytes(self) -> int | None:
        sample = self._live_charts.latest_sample
        if sample is not None and sample.gpus:
            return sample.gpus[0].total_bytes
        return self.capabilities.cuda_total_memory_bytes if self.capabilities else None

    def _gpu_count(self) -> int:
        return len(self.nvml.gpu_names) if self.nvml is not None and self.nvml.available else 0

    def _show_techniques(self) -> None:
        """Show the configured run: its techniques and its predicted memory."""
        try:
            validate_values(self.config)
            estimate = estimate_memory(self.config)
        except (ConfigError, UnreadableModel):  # a --model this model cannot describe: no predicted column
            estimate = None
        context = CUDA_CONTEXT_BYTES if estimate is None else cuda_context_bytes(estimate)  # until measured here
        last_config = RunConfig.from_json(self.last_result["config"]) if self.last_result else None
        if (
            self.last_result is not None
            and last_config is not None
            and self.last_result["bands"].get("cuda_context_bytes")
            and (last_config.ranks, last_config.distributed) == (self.config.ranks, self.config.distributed)
        ):
            context = self.last_result["bands"]["cuda_context_bytes"]
        self.query_one(TechniquesPanel).show(
            self.config,
            capabilities=self.capabilities,
            estimate=estimate,
            gpu_total_bytes=self._gpu_total_bytes(),
            device_peak_bytes=None if estimate is None else peak_reserved_bytes(estimate) + context,
            several_gpus=self._gpu_count() > 1,
        )
        self._memory_view.show_predicted(self.config, estimate, context, self._gpu_total_bytes(), self.compact)

    def _show_operations(self) -> None:
        anatomy, run_id = self.operations_shown or (None, None)
        steps = self._run_control.profile_ops_steps
        note = (
            f"The next run profiles {steps} steps after warm-up (O: off)."
            if steps
            else "O: profile the next run's operations."
        )
        self.query_one(OperationsPanel).show(anatomy, run_id, note)

    # --- the technique keys: each changes the configured run, shown at once ---------------------------
    def _change_config(self, config: RunConfig) -> None:
        self.config = config
        self._show_techniques()
        if self._live is None:  # the prepared process must suit the run (its GPUs): kept when it does
            self._run_control.prepare_worker(config)

    def action_toggle_technique(self, field: str) -> None:
        self._change_config(changed_config(self.config, field))
        try:  # a value that cannot train (Liger on a classifier, QLoRA without adapters) is said at once, not at `r`
            validate_values(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="warning", timeout=6)

    def action_step(self, field: str, direction: int) -> None:
        self._change_config(changed_config(self.config, field, direction))

    def action_cycle_gpus(self) -> None:
        if self.config.device != "cuda" or self._gpu_count() < 2:
            self.notify(
                f"One GPU here ({self._gpu_count()} listed by NVML): nothing to choose."
                if self.config.device == "cuda"
                else "CPU runs use no GPU.",
                timeout=4,
            )
            return
        self._change_config(next_gpu_count(self.config, self._gpu_count()))

    def action_cycle_distributed(self) -> None:
        following = next_distributed(self.config)
        if following is None:
            self.notify("A distributed technique needs several GPUs: choose them with G first.", timeout=4)
            return
        self._change_config(following)

    def action_toggle_operations(self) -> None:
        """`O`: the next runs profile their operations and the panel takes the charts' place; again: off."""
        steps = 0 if self._run_control.profile_ops_steps else DEFAULT_PROFILE_OPS_STEPS
        self._run_control.profile_ops_steps = steps
        self.set_class(bool(steps), "-operations")
        self._show_operations()
        self.notify(
            f"Operations anatomy: the next runs profile {steps} steps after warm-up, left out of their "
            "steady samples/s (O: off)."
            if steps
            else "Operations profiling off; the charts are back.",
            timeout=4,
        )

    # --- the run keys: r runs, s stops, q quits (stopping first); f fits, T tunes ----------------------
    def action_run(self) -> None:
        if not self._can_start():
            return
        self.follow_run(LiveRun(config=self.config, stop_requested=threading.Event()))
        assert self._live is not None
        self._live.parent_points[REQUESTED] = time.monotonic()
        self._startup_parts_logged = 0
        self._live_charts.clear_run()
        self._run_control.start_run(self._live)
        self.paint()

    def _can_start(self) -> bool:
        """Whether a run (or search) may start now; says why not."""
        if self._live is not None:
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
        self._start_search(fit_search, "gpuanat-fit")

    def action_tune(self) -> None:
        if not self._can_start():
            return
        if self.capabilities is None:
            self.notify(
                "tune waits for the capability probe (a few seconds after start); press T again then.",
                severity="warning",
            )
            return
        self.notify(
            f"tune: short real runs of {DEFAULT_TRIAL_STEPS} steps, at most "
            f"{format_duration(60 * DEFAULT_BUDGET_MINUTES)}; s stops and keeps the best found so far",
            timeout=6,
        )
        self._start_search(tune_search, "gpuanat-tune", self.capabilities)

    def _start_search(self, search: Callable[..., None], name: str, *args: Any) -> None:
        """A search of real trial runs (fit, tune) in the run worker: `search(control, live, gpu_total, *args)`."""
        gpu_total = self._gpu_total_bytes() if self.config.device == "cuda" else None
        live = LiveRun(config=self.config, stop_requested=threading.Event())
        self.follow_run(live)
        self._live_charts.clear_run()
        self._run_control.start_search(search, name, live, gpu_total, *args)

    def action_stop(self) -> None:
        if self._live is None:
            self.notify("No run in progress.")
            return
        live = self._live

        def answered(stop: bool | None) -> None:
            self._stop_dialog = None
            if stop:
                live.stop_requested.set()

        self._stop_dialog = ConfirmScreen(f"Stop run {live.run_id or ''} ({live.config.techniques_summary()})?")
        self.app.push_screen(self._stop_dialog, answered)

    def finish_recording(self, timeout_s: float) -> None:
        self._run_control.join(timeout_s)

    def stop_and_quit(self) -> None:
        if self._live is None:
            self.app.exit()
            return
        self._quit_after_run = True
        self._live.stop_requested.set()

    def action_quit(self) -> None:
        if self._live is None:
            self.app.exit()
            return
        live = self._live

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                if self._live is None:  # the run ended while the question was open
                    self.app.exit()
                    return
                self._quit_after_run = True
                live.stop_requested.set()

        self.app.push_screen(ConfirmScreen("A run is in progress. Stop it and quit?"), answered)
