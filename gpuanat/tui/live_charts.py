"""The launching dashboard's charts and anatomy timeline, fed at its paint tick on the event loop.

The samples of the dashboard's sampler and the events of the run in progress go into time series (`series`), on one
time axis, the sampler's: a run's throughput comes on its own clock (its steps' elapsed seconds) and is put on the
sampler's, so that the memory, CPU and throughput of a run read against one axis. Without NVML the memory and
utilization charts chart the run's host memory (RSS) and CPU instead.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuanat.core.measure.flops import utilization
from gpuanat.core.measure.live_run import THROUGHPUT_WINDOW_STEPS, LiveRun, gpu_of
from gpuanat.core.measure.samples import GpuSample, NvmlStatus, Sample
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.protocol import Event, Ranked, Step
from gpuanat.tui.chart_span import chart_span, show_span
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline, anatomy_points
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.loss_chart import LossChart

RUN_SERIES = ("run_used", "throughput", "host_rss", "host_cpu")
"""The series of one run, cleared when the next starts."""


def _bytes_label(value: float) -> str:
    return format_bytes(int(value))


def _percent_label(value: float) -> str:
    return f"{value:.0f}%"


def _rate_label(value: float) -> str:
    return f"{value:.1f}/s"


def live_charts() -> list[LineChart]:
    """The launching dashboard's charts, as composed: memory, utilization, throughput, and the loss by step (shown
    once the run's loop logs a loss)."""
    return [
        LineChart("GPU memory used", formatter=_bytes_label, id="memory-chart"),
        LineChart("GPU utilization", formatter=_percent_label, y_max=100, id="util-chart"),
        LineChart(
            throughput_title(None, None, None),
            formatter=_rate_label,
            id="throughput-chart",
            empty_message="a run's samples/s show here",
        ),
        LossChart(id="loss-chart"),
    ]


def throughput_title(live: LiveRun | None, rank_rate: float | None, gpu: GpuSample | None) -> str:
    """The throughput chart's title, with the model FLOPs the run achieves at that rate (on `gpu`) and its MFU."""
    title = f"Throughput (samples/s, mean of {THROUGHPUT_WINDOW_STEPS} steps)"
    if live is None or rank_rate is None:
        return title
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


TENSOR_SERIES = "tensor"
"""The utilization chart's second series, NVML GPM's tensor pipes active (issue #51): busy beside what worked."""


def add_tensor_series(util_chart: LineChart, series: TimeSeries) -> None:
    """Chart `series` (tensor pipes active, %) beside the utilization, from the first GPM reading on: a GPU or a
    trace without GPM keeps the chart as it was."""
    if TENSOR_SERIES not in util_chart.series_names:
        util_chart.set_series(TENSOR_SERIES, series)


class LiveCharts:
    """The series behind the charts and what each sample and event adds to them."""

    def __init__(
        self, charts_by_id: dict[str, LineChart], timeline: AnatomyTimeline, clock: Callable[[], float]
    ) -> None:
        self._charts_by_id = charts_by_id
        self._timeline = timeline
        self._clock = clock
        # Memory keeps its peaks when downsampled; rates are averaged.
        self.series = {
            "device_used": TimeSeries(),
            "run_used": TimeSeries(),
            "gpu_util": TimeSeries(),
            "tensor_active": TimeSeries(),
            "throughput": TimeSeries(reduce="mean"),
            "host_rss": TimeSeries(),
            "host_cpu": TimeSeries(reduce="mean"),
        }
        self.latest_sample: Sample | None = None
        self._whole_run = False

    @property
    def _charts(self) -> list[LineChart]:
        return list(self._charts_by_id.values())

    def attach(self, nvml: NvmlStatus) -> str | None:
        """Give each chart its series; without NVML, what the charts show instead, to be said once."""
        memory_chart, util_chart = self._charts_by_id["memory-chart"], self._charts_by_id["util-chart"]
        note = None
        if nvml.available:
            memory_chart.set_series("device used", self.series["device_used"])
            memory_chart.set_series("this run", self.series["run_used"])
            util_chart.set_series("GPU util", self.series["gpu_util"])
        else:
            # The GPU charts would wait forever: chart what is measurable instead, the run's host memory and CPU.
            memory_chart.title = "Host memory of the run (RSS)"
            memory_chart.set_series("run RSS", self.series["host_rss"])
            util_chart.title = "Host CPU of the run (% of one core)"
            util_chart.y_max = None  # several cores read over 100%
            util_chart.set_series("run CPU", self.series["host_cpu"])
            for chart in (memory_chart, util_chart):
                chart.empty_message = "a run's RSS and CPU show here"
            note = f"No GPU charts: {nvml.reason}. The charts show the run's host memory and CPU."
        self._charts_by_id["throughput-chart"].set_series("samples/s", self.series["throughput"])
        return note

    def clear_run(self) -> None:
        """A run (or search) is asked for: the last one's series go."""
        for name in RUN_SERIES:
            self.series[name].clear()

    def run_started(self) -> None:
        """A run's (or a search trial's) training process started: its throughput and timeline begin afresh."""
        self.series["throughput"].clear()
        self._charts_by_id["throughput-chart"].title = throughput_title(None, None, None)
        self._loss_chart.clear()
        self._timeline.clear()

    def add_sample(self, sample: Sample, live: LiveRun | None, gpu_index: int | None) -> None:
        self.latest_sample = sample
        if live is not None and live.pid is not None:  # the run's process tree (NVML or not)
            if sample.host.rss_bytes is not None:
                self.series["host_rss"].append(sample.t_s, sample.host.rss_bytes)
            if sample.host.cpu_percent is not None:
                self.series["host_cpu"].append(sample.t_s, sample.host.cpu_percent)
        gpu = gpu_of(sample, gpu_index)
        run_used = live.observe_sample(sample, gpu) if live is not None else None
        if gpu is not None:
            self._scale_memory_chart(gpu)
            if gpu.used_bytes is not None:
                self.series["device_used"].append(sample.t_s, gpu.used_bytes)
            if gpu.gpu_util_percent is not None:
                self.series["gpu_util"].append(sample.t_s, gpu.gpu_util_percent)
            if gpu.tensor_active_percent is not None:
                add_tensor_series(self._charts_by_id["util-chart"], self.series["tensor_active"])
                self.series["tensor_active"].append(sample.t_s, gpu.tensor_active_percent)
            if run_used is not None:
                self.series["run_used"].append(sample.t_s, run_used)

    def add_event(self, event: Event | Ranked, live: LiveRun) -> None:
        observed = live.observe_event(event, self.sampler_now_s)
        if observed is None:
            return
        self._add_anatomy_points(live, observed.step)
        throughput = self.series["throughput"]
        if observed.samples_per_second is not None and (
            throughput.last_t_s is None or observed.t_s > throughput.last_t_s
        ):
            throughput.append(observed.t_s, observed.samples_per_second)  # on the sampler's clock, as the other charts

    def sampler_now_s(self) -> float:
        """The sampler's time now: its latest sample's."""
        return self.latest_sample.t_s if self.latest_sample is not None else self._clock()

    def show_throughput_title(self, live: LiveRun, gpu_index: int | None) -> None:
        """The title once a paint, not at every step."""
        rate = self.series["throughput"].last
        if rate is not None:
            gpu = gpu_of(self.latest_sample, gpu_index)
            self._charts_by_id["throughput-chart"].title = throughput_title(live, rate, gpu)

    @property
    def _loss_chart(self) -> LossChart:
        chart = self._charts_by_id["loss-chart"]
        assert isinstance(chart, LossChart)
        return chart

    def show_loss(self, live: LiveRun) -> None:
        """The loss rank 0's loop logged, and its latest learning rate and gradients' norm (once a paint)."""
        logged = live.rank(0).loss
        self._loss_chart.show_curves({"loss": logged.points})
        self._loss_chart.show_latest(logged.learning_rate, logged.grad_norm)

    def repaint(self, moved: bool, whole_run: bool) -> None:
        """Every chart at the clock's time; with `moved` (new samples or events) on the one time axis of them all, the
        recent minutes or the `whole_run` (`chart_span`). Also without new samples: a plot lagging by its rate catches
        up."""
        if moved or whole_run != self._whole_run:
            self._whole_run = whole_run
            show_span(self._charts, chart_span(self.series.values(), whole_run, self._window()))
        now_s = self._clock()
        for chart in self._charts:
            chart.refresh_data(now_s)

    def _window(self) -> tuple[float, float] | None:
        """One time axis for every chart: from the first to the last sample any of them shows."""
        shown = [series for series in self.series.values() if series]
        if not shown:
            return None
        return (
            min(series.first_t_s for series in shown if series.first_t_s is not None),
            max(series.last_t_s for series in shown if series.last_t_s is not None),
        )

    def _scale_memory_chart(self, gpu: GpuSample) -> None:
        """The memory chart spans the GPU's whole memory, as the bar below does: a run's use reads against what the
        card has, not against its own maximum (where any run would look like a wall)."""
        chart = self._charts_by_id["memory-chart"]
        if gpu.total_bytes is not None and chart.y_max != gpu.total_bytes:
            self._timeline.set_total(gpu.total_bytes)
            chart.y_max = gpu.total_bytes
            chart.title = f"GPU {gpu.index} memory used (of {format_bytes(gpu.total_bytes)})"

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
        self._timeline.add_points(
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
