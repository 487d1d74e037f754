"""The launching dashboard: technique toggles, live charts, the memory breakdown, the child's log.

Data flows one way. The sampler thread and the run's worker only append to the screen's inbox (deques); one paint tick
on the event loop (default 4 Hz) drains it into the widgets. Keys are declarative bindings (footer, help page, command
palette, remappable through the keymap by their ids).

The screen composes, holds the dashboard's state (the configured run, the run in progress, the last result) and its
inbox, and hands each key and message to the helper it owns for that concern:

- `RunKeys` (`gpuanat.tui.run_keys`): r, s, q, and a run's start and end;
- `SearchKeys` (`gpuanat.tui.search_keys`): f and T, and what their searches report;
- `TechniqueKeys` (`gpuanat.tui.technique_keys`): the keys that change the configured run, and the capability probe's
  answer;
- `LaunchPainter` (`gpuanat.tui.launch_painter`): what the widgets show, with `LiveCharts` and `MemoryView`.

The run in progress is a `LiveRun` (`gpuanat.core.measure.live_run`); the runs themselves are the `RunBackend`'s,
started in `RunControl`'s workers, whose messages are in `gpuanat.tui.messages`.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.run.session import SharedSampler
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import Event, Ranked
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.launch_painter import LaunchPainter
from gpuanat.tui.live_charts import LiveCharts, live_charts
from gpuanat.tui.memory_view import MemoryView
from gpuanat.tui.messages import (
    CapabilitiesFound,
    DataLengthRead,
    FitFinished,
    FitStarting,
    FitTrialDone,
    RunFinished,
    RunStarted,
    TuneFinished,
    TuneRoundOrdered,
    TuneTrialDone,
)
from gpuanat.tui.run_backend import RunBackend
from gpuanat.tui.run_control import RunControl
from gpuanat.tui.run_keys import RunKeys
from gpuanat.tui.screens.dashboard import FIRST_BINDINGS, SHARED_BINDINGS, DashboardScreen
from gpuanat.tui.screens.modules import ModulesShown, shown_of_live, shown_of_result
from gpuanat.tui.search_keys import SearchKeys
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.technique_keys import TechniqueKeys
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline
from gpuanat.tui.widgets.failure_line import FailureLine
from gpuanat.tui.widgets.gpu_activity import GpuActivityLine
from gpuanat.tui.widgets.gpu_lanes import GpuLanes
from gpuanat.tui.widgets.log_pane import LogPane
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.operations_panel import OperationsPanel
from gpuanat.tui.widgets.status_line import StatusLine
from gpuanat.tui.widgets.step_strip import StepStrip
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

PAINT_INTERVAL_S = 0.25
SAMPLE_INTERVAL_S = 0.25

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
    Binding("u", "why_unavailable", "Why unavailable: each red technique's reason", id="why_unavailable", show=False),
    Binding("right_square_bracket", "step('samples', 1)", "Longer run", id="samples_up", key_display="]"),
    Binding(
        "left_square_bracket", "step('samples', -1)", "Shorter run", id="samples_down", key_display="[", show=False
    ),
    Binding("T", "tune", "Tune: the fastest set that fits (short real runs)", id="tune", show=False),
    Binding("E", "toggle_technique('engine')", "Engine", id="engine", show=False),
    Binding("W", "toggle_technique('weights_dtype')", "Weights: fp32, bf16, pure bf16", id="weights_dtype", show=False),
    Binding("L", "toggle_technique('lora')", "LoRA", id="lora", show=False),
    Binding("4", "toggle_technique('load_in_4bit')", "4-bit base (QLoRA)", id="load_in_4bit", show=False),
    Binding("K", "toggle_technique('liger')", "Liger loss", id="liger", show=False),
    Binding("Y", "toggle_technique('liger_layers')", "Liger layer kernels", id="liger_layers", show=False),
    Binding("M", "toggle_technique('preset')", "Model", id="preset", show=False),
    Binding("G", "cycle_gpus", "GPUs", id="gpus", show=False),
    Binding("D", "cycle_distributed", "Distributed", id="distributed", show=False),
    Binding("v", "toggle_timeline", "Anatomy timeline", id="timeline", show=False),
    Binding("O", "toggle_operations", "Operations anatomy: profile the next runs", id="operations", show=False),
    Binding("d", "choose_data", "Data: your file and tokenizer", id="data", show=False),
    Binding("P", "toggle_technique('padding')", "Padding: longest, max, pack", id="padding", show=False),
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
        """The configured run: what r runs."""
        self.backend = backend
        self.clock = clock
        """The dashboard's clock (the sampler's and the charts')."""
        self._sampler_factory = sampler_factory
        self._paint_interval_s = paint_interval_s
        self._sample_interval_s = sample_interval_s
        self.capabilities: Capabilities | None = None
        self.nvml: NvmlStatus | None = None
        self.last_result: RunResult | None = None
        self.operations_shown: tuple[Mapping[str, Any], int | None] | None = None
        """The operations anatomy on show and its run: the latest run's that was profiled."""
        self.sampler: Sampler | None = None
        """The dashboard's sampler, from its mount on."""
        self._live: LiveRun | None = None
        self._incoming_samples: collections.deque[Sample] = collections.deque(maxlen=10_000)
        self._incoming_events: collections.deque[Event | Ranked] = collections.deque(maxlen=100_000)
        self.run_control = RunControl(self, backend, on_event=self.receive_event, shared_sampler=self._shared_sampler)
        self.painter = LaunchPainter(self)
        self.run_keys = RunKeys(self)
        self.search_keys = SearchKeys(self, self.run_keys)
        self.technique_keys = TechniqueKeys(self, frozenset(untouched_fields))

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield GpuActivityLine(id="activity")
        with Horizontal(id="top"):
            yield TechniquesPanel(self.config, id="techniques")
            with Vertical(id="charts"):
                yield from live_charts()
                yield AnatomyTimeline(id="timeline")
                yield OperationsPanel(id="operations")
        yield FailureLine(id="failure")
        yield MemoryBar(id="memory")
        yield StepStrip(id="steps")
        yield GpuLanes(id="lanes")
        yield LogPane(id="log")
        yield Footer()

    @cached_property
    def log_pane(self) -> LogPane:
        return self.query_one(LogPane)

    @cached_property
    def step_strip(self) -> StepStrip:
        return self.query_one(StepStrip)

    @cached_property
    def live_charts(self) -> LiveCharts:
        return LiveCharts(self._charts_by_id, self.query_one(AnatomyTimeline), self.clock)

    @cached_property
    def memory_view(self) -> MemoryView:
        return MemoryView(self._memory_bar, self._show_lanes)

    @property
    def series(self) -> dict[str, TimeSeries]:
        """The charts' time series by name (device_used, run_used, gpu_util, throughput, host_rss, host_cpu)."""
        return self.live_charts.series

    def on_mount(self) -> None:
        source, self.nvml = self._sampler_factory()
        note = self.live_charts.attach(self.nvml)
        if note is not None:
            self.notify(note, timeout=8)
        self.sampler = Sampler(
            source,
            interval_s=self._sample_interval_s or SAMPLE_INTERVAL_S,
            on_sample=self._incoming_samples.append,
            clock=self.clock,
        )
        self.painter.sampler_started()
        if self._sample_interval_s is not None:
            self.sampler.start()
        self._start_paint_tick(self._paint_interval_s)
        self.run_control.probe_capabilities()
        self.fit_layout(self.app.size.height)
        self.painter.show_techniques()
        self.paint()

    def _layout_changed(self, compact: bool) -> None:
        # Compact: no log pane, two charts, no predicted bar, and a shorter techniques list.
        self.query_one(TechniquesPanel).compact = compact
        self.painter.show_techniques()

    def on_unmount(self) -> None:
        if self._live is not None:
            self._live.stop_requested.set()
        self.run_control.join(30)
        self.backend.close()
        if self.sampler is not None:
            self.sampler.stop()

    # --- what comes in: the run in progress, its events, samples -------------------------------------
    @property
    def run_in_progress(self) -> LiveRun | None:
        """The run (or search) in progress, None while idle."""
        return self._live

    def follow_run(self, live: LiveRun) -> None:
        """Show `live` as the run in progress: the events its backend delivers (`receive_event`) and the samples of its
        process paint into it until it finishes (`RunFinished`). A replay of a recorded run enters here too."""
        self._live = live

    def forget_run(self) -> LiveRun | None:
        """The run in progress has ended (after its last paint): no run is in progress; the one that was."""
        live, self._live = self._live, None
        return live

    def receive_event(self, event: Event | Ranked) -> None:
        """The run's inbox, from any thread: the next paint tick paints the event."""
        self._incoming_events.append(event)

    def sample_now(self) -> None:
        """Take one sample on the calling thread (tests drive a replayed trace this way)."""
        assert self.sampler is not None
        self._incoming_samples.append(self.sampler.sample_once())

    def _shared_sampler(self) -> SharedSampler | None:
        """The dashboard's sampler while it runs, for the runs it starts to listen to."""
        sampler = self.sampler
        return (
            SharedSampler(sampler, self.nvml)
            if sampler is not None and sampler.running and self.nvml is not None
            else None
        )

    # --- the paint tick ----------------------------------------------------------------------------
    def paint(self) -> None:
        """Drain the inbox into the widgets."""
        samples = [self._incoming_samples.popleft() for _ in range(len(self._incoming_samples))]
        events = [self._incoming_events.popleft() for _ in range(len(self._incoming_events))]
        self.painter.paint(samples, events)

    def modules_shown(self) -> ModulesShown:
        """Memory by module of the run in progress, else of the last run."""
        if self._live is not None:
            return shown_of_live(self._live)
        if self.last_result is not None:
            return shown_of_result(self.last_result)
        return ModulesShown(
            "no run yet",
            why_none="No run yet: r runs one, and the probe measures memory by module "
            "at its steps 1-3, then every 50th.",
        )

    @property
    def run_state_text(self) -> str:
        """What the status line says of the run: idle (with the prepared training process's state), its start-up,
        or its progress."""
        return self.painter.run_state()

    # --- messages from the workers, each handed to its concern's helper ---------------------------------
    def on_capabilities_found(self, message: CapabilitiesFound) -> None:
        self.technique_keys.capabilities_found(message)

    def on_data_length_read(self, message: DataLengthRead) -> None:
        self.painter.show_techniques()  # the prediction at the data's length

    def on_run_started(self, message: RunStarted) -> None:
        self.run_keys.started(message)

    def on_run_finished(self, message: RunFinished) -> None:
        self.run_keys.finished(message)

    def on_fit_starting(self, message: FitStarting) -> None:
        self.search_keys.fit_starting(message)

    def on_fit_trial_done(self, message: FitTrialDone) -> None:
        self.search_keys.fit_trial_done(message)

    def on_fit_finished(self, message: FitFinished) -> None:
        self.search_keys.fit_finished(message)

    def on_tune_trial_done(self, message: TuneTrialDone) -> None:
        self.search_keys.tune_trial_done(message)

    def on_tune_round_ordered(self, message: TuneRoundOrdered) -> None:
        self.search_keys.tune_round_ordered(message)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self.search_keys.tune_finished(message)

    # --- the keys, each handed to its concern's helper ----------------------------------------------
    def action_run(self) -> None:
        self.run_keys.run()

    def action_stop(self) -> None:
        self.run_keys.stop()

    def action_quit(self) -> None:
        self.run_keys.quit()

    def stop_and_quit(self) -> None:
        self.run_keys.stop_and_quit()

    def finish_recording(self, timeout_s: float) -> None:
        self.run_control.join(timeout_s)

    def action_fit(self) -> None:
        self.search_keys.fit()

    def action_tune(self) -> None:
        self.search_keys.tune()

    def action_toggle_technique(self, field: str) -> None:
        self.technique_keys.toggle_technique(field)

    def action_step(self, field: str, direction: int) -> None:
        self.technique_keys.step(field, direction)

    def action_why_unavailable(self) -> None:
        self.technique_keys.why_unavailable()

    def action_cycle_gpus(self) -> None:
        self.technique_keys.cycle_gpus()

    def action_cycle_distributed(self) -> None:
        self.technique_keys.cycle_distributed()

    def action_toggle_operations(self) -> None:
        self.technique_keys.toggle_operations()

    def action_choose_data(self) -> None:
        self.technique_keys.choose_data()
