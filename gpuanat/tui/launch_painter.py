"""What the launching dashboard's widgets show, painted on the event loop: the paint tick's work (the charts, the
memory bar, the step strip, the log, the status line), the configured run's techniques and prediction, the operations
panel, and a finished run's result.

The dashboard (`gpuanat.tui.screens.launch`) drains its inbox of samples and events at each tick and hands them here;
`LiveCharts` and `MemoryView` paint the charts and the bar. Nothing here starts, stops or changes a run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuanat.core.measure.diagnose import diagnose, recent_breakdown
from gpuanat.core.measure.failure import out_of_memory_json
from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.samples import GpuSample, Sample
from gpuanat.core.measure.startup import startup_progress, startup_status
from gpuanat.core.memory.compiled import compile_unpredicted_reason
from gpuanat.core.memory.data_length import at_data_length
from gpuanat.core.memory.model_config import UnreadableModel
from gpuanat.core.memory.predict import CUDA_CONTEXT_BYTES, cuda_context_bytes, estimate_memory, peak_reserved_bytes
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.protocol import Event, Ranked, Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.validation import validate_values
from gpuanat.tui.widgets.line_chart import format_duration
from gpuanat.tui.widgets.operations_panel import OperationsPanel
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

if TYPE_CHECKING:
    from gpuanat.tui.screens.launch import LaunchDashboard

WORKER_STATES = {"preparing": "training process warming up…", "ready": "training process warm"}
"""The status line's word for the prepared worker (gpuanat.core.run.warm), while no run is in progress."""
WORKER_NOTES = {
    "preparing": "preparing the next training process ahead (torch and transformers imports)",
    "ready": "the next training process is ready: r starts training without the imports",
}


def live_failure(live: LiveRun) -> dict[str, Any] | None:
    """The run in progress's out-of-memory failure (its first rank's that ran out), as a result's `out_of_memory`;
    None also where the loop caught it and measured a later step (a batch-size finder that retries smaller)."""
    for rank in sorted(live.ranks):
        state = live.ranks[rank]
        error = state.error
        failure = error.out_of_memory if error is not None else None
        if failure is not None and (failure.bands is None or failure.bands is state.probe_bands):
            return out_of_memory_json(error, rank)
    return None


def run_progress(run_id: int | None, step: Step, total_steps: int | None) -> str:
    """ "run 3: step 9/64 · 12s · ETA 1m13s": where the run is, how long it has trained, and — at the mean pace of
    its steps so far — how long it has left."""
    text = f"run {run_id}: step {step.step}" + (f"/{total_steps}" if total_steps else "")
    text += f" · {format_duration(step.elapsed_s)}"
    if total_steps and 0 < step.step < total_steps and step.elapsed_s > 0:
        text += f" · ETA {format_duration(step.elapsed_s / step.step * (total_steps - step.step))}"
    return text


class LaunchPainter:
    """The launching dashboard's painting, and what it remembers between ticks (the start-up parts logged, the
    prepared worker's status shown, the operations on show)."""

    def __init__(self, dashboard: LaunchDashboard) -> None:
        self._dashboard = dashboard
        self._startup_parts_logged = 0
        self._live_operations: object = None
        self._worker_status: str | None = None
        """The prepared worker's last status shown ("preparing", "ready"), to log its changes once."""
        self._sampler_started_s = dashboard.clock()

    # --- what the dashboard tells it ---------------------------------------------------------------
    def sampler_started(self) -> None:
        """The dashboard's sampler has started: its CPU share counts from now."""
        self._sampler_started_s = self._dashboard.clock()

    def start_up_begins(self) -> None:
        """A run's (or a search's next trial's) start-up begins: its parts are logged afresh, and the last run's
        failure goes."""
        self._startup_parts_logged = 0
        self._show_failure(None, None)

    def process_started(self) -> None:
        """A run's training process runs: the prepared one, if any, is used up (its next status is logged)."""
        self._worker_status = None

    # --- the paint tick ----------------------------------------------------------------------------
    def paint(self, samples: Sequence[Sample], events: Sequence[Event | Ranked]) -> None:
        """Paint what came in since the last tick: `samples` from the sampler, `events` from the run in progress."""
        dashboard = self._dashboard
        charts = dashboard.live_charts
        live = dashboard.run_in_progress
        gpu_index = self.shown_gpu_index()
        for sample in samples:
            charts.add_sample(sample, live, gpu_index)
            if live is None and dashboard.last_result is None and sample.gpus:
                dashboard.memory_view.show_idle(sample)  # after a run, its bands stay up until the next one
        if live is not None:
            for event in events:
                charts.add_event(event, live)
            if events:
                charts.show_throughput_title(live, gpu_index)
                charts.show_loss(live)
        with dashboard.app.batch_update():
            charts.repaint(bool(samples or events), dashboard.charts_whole_run)
            if live is not None:
                dashboard.memory_view.show_live(live, charts.latest_sample, gpu_index)
                if events:
                    self._show_step_strip(live)
                    self._show_live_operations(live)
                    self._show_failure(live_failure(live), live.run_id)
                    dashboard.paint_modules()
            dashboard.log_pane.poll()
            if live is not None:
                self._log_startup(live)
            latest_gpus = charts.latest_sample.gpus if charts.latest_sample is not None else ()
            dashboard.status_line.show(
                nvml=dashboard.nvml,
                run_state=self.run_state(),
                sampler_cpu_percent=self._sampler_cpu_percent(),
                gpu_faults=tuple(fault for gpu in latest_gpus for fault in gpu.faults),
            )
            if samples:
                latest = charts.latest_sample
                dashboard.show_activity(self._shown_gpus(latest), latest.t_s if latest else None)

    def _show_failure(self, failure: Mapping[str, Any] | None, run_id: int | None) -> None:
        """What failed when the run ran out of memory, above the bar, which then shows that moment."""
        self._dashboard.failure_line.show(failure, run_id)
        self._dashboard.memory_view.show_moment(at_failure=failure is not None)

    def _show_step_strip(self, live: LiveRun) -> None:
        """The latest steps' time by phase and what bounds them, live."""
        breakdown = recent_breakdown(live.timed_steps, live.gpu_busy)
        findings = diagnose(RunResult(config=live.config.to_json(), step_time_breakdown=breakdown)) if breakdown else []
        self._dashboard.step_strip.show(breakdown, findings[0].to_json() if findings else None)

    def _log_startup(self, live: LiveRun) -> None:
        """Each part of the run's start-up, as it passes, in the log (the status line shows the one under way)."""
        passed, _ = startup_progress(live.startup_points, time.monotonic())
        logged = self._startup_parts_logged
        for part, seconds in passed[logged:]:
            self._dashboard.log_pane.note(f"gpuanat · start-up: {part} {seconds:.1f} s")
        self._startup_parts_logged = max(logged, len(passed))

    def _show_live_operations(self, live: LiveRun) -> None:
        """The run in progress has been profiled: its anatomy shows at once."""
        operations = live.rank(0).operations
        if operations is not None and self._live_operations is not operations:
            self._live_operations = operations
            self._dashboard.operations_shown = (operations_anatomy(operations), live.run_id)
            self.show_operations()

    def shown_gpu_index(self) -> int | None:
        """The GPU the charts and the memory bar show: rank 0's of the run in progress, else of the last run."""
        live, last_result = self._dashboard.run_in_progress, self._dashboard.last_result
        if live is not None and live.gpu_indices:
            return live.gpu_indices[0]
        if last_result and last_result.gpus:
            index: int | None = last_result.gpus[0]["index"]
            return index
        return None

    def _shown_gpus(self, sample: Sample | None) -> list[GpuSample]:
        """The GPUs whose activity shows: the run's in progress, else the one the charts show (else the first)."""
        if sample is None or not sample.gpus:
            return []
        live = self._dashboard.run_in_progress
        wanted = list(live.gpu_indices) if live is not None and live.gpu_indices else [self.shown_gpu_index()]
        by_index = {gpu.index: gpu for gpu in sample.gpus}
        shown = [by_index[index] for index in wanted if index in by_index]
        return shown or [sample.gpus[0]]

    # --- the status line ---------------------------------------------------------------------------
    def run_state(self) -> str:
        """What the status line says of the run: idle (and the prepared worker's state), starting, or its progress."""
        live, last_result = self._dashboard.run_in_progress, self._dashboard.last_result
        if live is None:
            idle = "idle" if last_result is None else f"idle · last run {last_result.status}"
            worker = self._prepared_worker_status()
            return idle if worker is None else f"{idle} · {WORKER_STATES[worker]}"
        failure = live_failure(live)
        if failure is not None:
            return f"run {live.run_id}: out of memory" + (f" at step {failure['step']}" if failure.get("step") else "")
        if live.last_step is None:
            return (f"run {live.run_id}: " if live.run_id is not None else "run: ") + startup_status(
                live.startup_points, time.monotonic()
            )
        return run_progress(live.run_id, live.last_step, live.model.total_steps if live.model else None)

    def _prepared_worker_status(self) -> str | None:
        """The prepared training process's status ("preparing", "ready" or None); its changes go to the log once."""
        status = self._dashboard.backend.prepared_status()
        if status != self._worker_status and status is not None:
            self._dashboard.log_pane.note(f"gpuanat · {WORKER_NOTES[status]}")
        self._worker_status = status
        return status

    def _sampler_cpu_percent(self) -> float | None:
        sampler = self._dashboard.sampler
        if sampler is None:
            return None
        wall_s = self._dashboard.clock() - self._sampler_started_s
        # Rounded as shown, so the status line repaints only when the shown figure changes.
        return round(100.0 * sampler.cpu_seconds / wall_s, 1) if wall_s > 1 else None

    # --- the GPU ----------------------------------------------------------------------------------
    def gpu_total_bytes(self) -> int | None:
        """The shown GPU's memory: as sampled, else as the capability probe found it."""
        sample = self._dashboard.live_charts.latest_sample
        if sample is not None and sample.gpus:
            return sample.gpus[0].total_bytes
        capabilities = self._dashboard.capabilities
        return capabilities.cuda_total_memory_bytes if capabilities else None

    def gpu_count(self) -> int:
        """The GPUs NVML lists (0 without NVML)."""
        nvml = self._dashboard.nvml
        return len(nvml.gpu_names) if nvml is not None and nvml.available else 0

    # --- the configured run, the operations, a run's result ---------------------------------------------
    def show_techniques(self) -> None:
        """Show the configured run: its techniques and its predicted memory, of a --data run at its longest batch's
        length once a worker has read the data (until then at --seq-len)."""
        dashboard = self._dashboard
        config, last_result = dashboard.config, dashboard.last_result
        sized = at_data_length(config, dashboard.run_control.data_lengths.known(config))
        try:
            validate_values(config)
            estimate = estimate_memory(sized)
        except (ConfigError, UnreadableModel):  # a --model this model cannot describe: no predicted column
            estimate = None
        # the whole model compiled: the eager bytes model is no prediction of it (on the CPU only the exact tensor bands
        # are shown, which compiling does not change)
        not_predicted = compile_unpredicted_reason(config) if config.device == "cuda" else None
        if not_predicted is not None:
            estimate = None
        context = CUDA_CONTEXT_BYTES if estimate is None else cuda_context_bytes(estimate)  # until measured here
        last_config = RunConfig.from_json(last_result.config) if last_result else None
        if (
            last_result is not None
            and last_config is not None
            and last_result.bands is not None
            and last_result.bands.cuda_context_bytes
            and (last_config.ranks, last_config.distributed) == (config.ranks, config.distributed)
        ):
            context = last_result.bands.cuda_context_bytes
        dashboard.query_one(TechniquesPanel).show(
            config,
            capabilities=dashboard.capabilities,
            estimate=estimate,
            gpu_total_bytes=self.gpu_total_bytes(),
            device_peak_bytes=None if estimate is None else peak_reserved_bytes(estimate) + context,
            several_gpus=self.gpu_count() > 1,
            not_predicted=not_predicted,
            predicted_seq_len=sized.seq_len if sized.seq_len != config.seq_len else None,
        )
        dashboard.memory_view.show_predicted(config, estimate, context, self.gpu_total_bytes(), dashboard.compact)

    def show_operations(self) -> None:
        """The operations panel: the anatomy on show, and whether the next runs profile theirs."""
        anatomy, run_id = self._dashboard.operations_shown or (None, None)
        steps = self._dashboard.run_control.profile_ops_steps
        note = (
            f"The next run profiles {steps} steps after warm-up (O: off)."
            if steps
            else "O: profile the next run's operations."
        )
        self._dashboard.query_one(OperationsPanel).show(anatomy, run_id, note)

    def show_result(self, result: RunResult) -> None:
        """A finished run's measured bands, its operations anatomy if profiled, and its steps' breakdown."""
        dashboard = self._dashboard
        dashboard.memory_view.show_result(result)
        self._show_failure(result.out_of_memory, result.run_id)
        dashboard.paint_modules()
        if result.operations_anatomy:
            dashboard.operations_shown = (result.operations_anatomy, result.run_id)
        self.show_operations()
        findings = result.diagnosis or []
        dashboard.step_strip.show(result.step_time_breakdown, findings[0] if findings else None)
