"""The watch dashboard's screen: `gpuanat watch PID` — the same charts and memory bar as the launching dashboard,
focused on a process gpuanat did not start.

In place of the techniques panel it shows the watched process (tree, other GPU processes, PID namespace
note); there are no launch or technique keys. The sampler thread turns each sample into a record through the
`WatchSession` (reads of NVML, psutil and the publication file happen there) and appends it to a deque; one
paint tick on the event loop drains the deque into the charts. `s` records the session into the history as
a run of kind `watched`, so the compare view can put it beside launched runs; once the process has exited, a worker
saves what was observed.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer

from gpuanat.core.measure.loss_curve import LossCurve
from gpuanat.core.measure.nvml_events import xid_text
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.printable import printable
from gpuanat.core.store.report import format_bytes
from gpuanat.core.thread_names import name_native_thread
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchTarget
from gpuanat.tui.chart_span import chart_span, show_span
from gpuanat.tui.live_charts import add_tensor_series
from gpuanat.tui.messages import WatchSaved
from gpuanat.tui.screens.dashboard import FIRST_BINDINGS, SHARED_BINDINGS, DashboardScreen
from gpuanat.tui.screens.modules import NOT_FOLLOWED, ModulesShown
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.failure_line import FailureLine
from gpuanat.tui.widgets.gpu_activity import GpuActivityLine
from gpuanat.tui.widgets.gpu_lanes import GpuLanes, Lane
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.loss_chart import LossChart
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.operations_panel import OperationsPanel
from gpuanat.tui.widgets.process_panel import ProcessPanel
from gpuanat.tui.widgets.status_line import StatusLine

PAINT_INTERVAL_S = 0.25
SAMPLE_INTERVAL_S = 0.25
WATCH_PROFILE_NOTE = (
    "The probe profiles its operations when asked: GPUANAT_PROFILE_OPS=3 in the script's "
    "environment, or profile_ops=3 on its probe."
)
UTIL_TITLES = {
    "process": "GPU utilization (this process)",
    "device": "GPU utilization (whole device)",
    None: "GPU utilization",
}


def _bytes_label(value: float) -> str:
    return format_bytes(int(value))


WATCH_BINDINGS = [
    *FIRST_BINDINGS,
    Binding("s", "save", "Save to history", id="save_watched"),
    Binding("O", "toggle_operations", "Operations anatomy (when the probe profiled them)", id="operations", show=False),
    *SHARED_BINDINGS,
]
"""The watch dashboard's keys, each with its id (the keymap remaps by id): its app's bindings (`WatchApp.BINDINGS`),
handed to this screen."""


class WatchDashboard(DashboardScreen):
    """The dashboard of a process gpuanat did not start (`gpuanat watch PID`)."""

    def __init__(
        self,
        target: WatchTarget,
        *,
        db_path: Path,
        sampler_factory: Callable[[], tuple[Any, NvmlStatus]] = lambda: open_source(per_process=True),
        session_factory: Callable[[WatchTarget, NvmlStatus], WatchSession] | None = None,
        clock: Callable[[], float] = time.monotonic,
        paint_interval_s: float = PAINT_INTERVAL_S,
        interval_s: float | None = SAMPLE_INTERVAL_S,
        save_name: str | None = None,
        save_on_start: bool = False,
        trace_path: Path | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Every source is injectable: tests pass a replayed NVML trace, a frozen clock and `interval_s=None`
        (no sampler thread; they call `sample_now`). `on_record` also gets each record, on the sampler's thread (the
        metrics endpoint's source)."""
        super().__init__(db_path=db_path)
        self.target = target
        self._sampler_factory = sampler_factory
        self._session_factory = session_factory or (lambda target, nvml: WatchSession(target, nvml, clock=clock))
        self._clock = clock
        self._paint_interval_s = paint_interval_s
        self._interval_s = interval_s
        self._save_name = save_name
        self._save_on_start = save_on_start
        self._trace_path = trace_path
        self._on_record = on_record
        self.nvml: NvmlStatus | None = None
        self.session: WatchSession | None = None
        self.saved_run_id: int | None = None
        self.last_record: dict[str, Any] | None = None
        self.exited = False
        self._incoming: collections.deque[dict[str, Any]] = collections.deque(maxlen=10_000)
        self._sampler: Sampler | None = None
        self._source: Any = None
        self._started_s = clock()
        self._peak_bands: dict[str, int | None] | None = None
        self._peak_device_used_bytes = -1
        self._operations_anatomy: dict[str, Any] | None = None
        self._modules: list[dict[str, Any]] | None = None
        """Memory by module of the watched run's latest measured bands (records carry it when new)."""
        self._modules_step: int | None = None
        self._failure: dict[str, Any] | None = None
        """The watched run's out-of-memory failure, once published."""
        self._operations_shown = False
        self.loss = LossCurve()
        """What the watched loop logged, from the records (the latest log each carries)."""
        self.series = {
            "device_used": TimeSeries(),
            "process_used": TimeSeries(),
            "gpu_util": TimeSeries(),
            "tensor_active": TimeSeries(),
            "cpu": TimeSeries(reduce="mean"),
            "throughput": TimeSeries(reduce="mean"),
        }

    # --- layout ---------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield GpuActivityLine(id="activity")
        with Horizontal(id="top"):
            yield ProcessPanel(id="processes")
            with Vertical(id="charts"):
                yield LineChart("GPU memory", formatter=_bytes_label, id="memory-chart")
                yield LineChart(UTIL_TITLES[None], formatter=lambda value: f"{value:.0f}%", y_max=100, id="util-chart")
                yield LineChart("Host CPU (% of one core)", formatter=lambda value: f"{value:.0f}%", id="cpu-chart")
                yield LineChart(
                    "Throughput (samples/s, when published)",
                    formatter=lambda value: f"{value:.1f}/s",
                    id="throughput-chart",
                )
                yield LossChart(id="loss-chart")
                yield OperationsPanel(id="operations")
        yield FailureLine(id="failure")
        yield MemoryBar(id="memory")
        yield GpuLanes(id="lanes")
        yield Footer()

    @cached_property
    def _process_panel(self) -> ProcessPanel:
        return self.query_one(ProcessPanel)

    def on_mount(self) -> None:
        memory_chart = self._charts_by_id["memory-chart"]
        memory_chart.set_series("device used", self.series["device_used"])
        memory_chart.set_series("this process", self.series["process_used"])
        self._charts_by_id["util-chart"].set_series("GPU util", self.series["gpu_util"])
        self._charts_by_id["cpu-chart"].set_series("CPU", self.series["cpu"])
        self._charts_by_id["throughput-chart"].set_series("samples/s", self.series["throughput"])
        self._source, self.nvml = self._sampler_factory()
        if not self.nvml.available:  # the GPU charts can never fill: they say why instead of waiting
            for chart_id in ("memory-chart", "util-chart"):
                self._charts_by_id[chart_id].empty_message = f"no GPU samples: {printable(self.nvml.reason)}"
        self.session = self._session_factory(self.target, self.nvml)
        self._sampler = Sampler(
            self._source,
            interval_s=self._interval_s or SAMPLE_INTERVAL_S,
            on_sample=self.receive_sample,
            clock=self._clock,
            trace_path=self._trace_path,
        )
        self._sampler.track(self.target.pid)
        if self._interval_s is not None:
            self._sampler.start()
        if self._save_on_start:  # after the start: a sampler that is not running means the process has exited
            self.action_save()
        self._start_paint_tick(self._paint_interval_s)
        self.fit_layout(self.app.size.height)
        self.paint()

    def finish_recording(self, timeout_s: float) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        if self.session is not None:
            self.session.finish_saving(exited=self.exited)

    def on_unmount(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        if self.session is not None:
            self.session.finish_saving(exited=self.exited)
            self.session.close()
        if self._source is not None:
            self._source.close()

    # --- the sampler thread: records into the deque, nothing else --------------------------------------
    def receive_sample(self, sample: Sample) -> None:
        """The sampler's callback, on its thread (or the caller's): the sample made a record, for the next paint."""
        session = self.session
        assert session is not None and self._sampler is not None
        if self.exited:
            return
        if not session.alive():
            self.exited = True
            self._incoming.append(session.final_record())
            self._tell(self._incoming[-1])
            session.finish_saving(exited=True)
            self._sampler.stop()
            return
        self._incoming.append(session.handle(sample))
        self._tell(self._incoming[-1])

    def _tell(self, record: dict[str, Any]) -> None:
        if self._on_record is not None:
            self._on_record(record)

    def sample_now(self) -> Sample:
        """Take one sample on the calling thread (tests drive a replayed trace this way); the sample taken."""
        assert self._sampler is not None
        sample = self._sampler.sample_once()
        self.receive_sample(sample)
        return sample

    # --- the paint tick ----------------------------------------------------------------------------
    def paint(self) -> None:
        records = [self._incoming.popleft() for _ in range(len(self._incoming))]
        for record in records:
            self._add_record(record)
        if records:
            self.paint_modules()
        with self.app.batch_update():
            latest = self.last_record
            if records and latest is not None and "gpus" in latest:  # the latest record's GPUs, how busy
                main = _main_gpu(latest)
                used = [gpu for gpu in latest["gpus"] if gpu["uses_it"]]
                self.show_activity(used or ([main] if main is not None else []), latest.get("t"))
            show_span(self._charts, chart_span(self.series.values(), self.charts_whole_run, None))
            now_s = self._clock()
            for chart in self._charts:  # also without new samples: a plot lagging by its rate catches up
                chart.refresh_data(now_s)
            self._process_panel.show(self.last_record, self.target.command or self.target.name)
            latest_gpus = latest.get("gpus", []) if latest is not None else []
            self.status_line.show(
                nvml=self.nvml,
                run_state=self.state_text,
                sampler_cpu_percent=self._sampler_cpu_percent(),
                gpu_faults=tuple(fault for gpu in latest_gpus for fault in _gpu_faults(gpu)),
            )

    def _add_record(self, record: dict[str, Any]) -> None:
        self._add_anatomy(record)
        if record["exited"]:
            if record.get("bands"):  # the failing allocation's, where the process ran out of memory
                main = _main_gpu(self.last_record) if self.last_record and "gpus" in self.last_record else None
                total = main["total_bytes"] if main else None
                self._memory_bar.update_bands(record["bands"], self._peak_bands, total, record["bands_unavailable"])
            self.last_record = {
                **(
                    self.last_record
                    or {"pid": record["pid"], "published": False, "publication_reason": "", "processes": []}
                ),
                "exited": True,
            }
            return
        self.last_record = record
        if record.get("operations_anatomy"):
            self._show_operations(record["operations_anatomy"])
        t_s = record["t"]
        main = _main_gpu(record)
        if main is not None and main["used_bytes"] is not None:
            self.series["device_used"].append(t_s, main["used_bytes"])
        if record["gpu_memory_bytes"] is not None:
            self.series["process_used"].append(t_s, record["gpu_memory_bytes"])
        if record["gpu_util_percent"] is not None:
            self.series["gpu_util"].append(t_s, record["gpu_util_percent"])
            self._charts_by_id["util-chart"].title = UTIL_TITLES[record["gpu_util_scope"]]
        tensor = next((gpu["tensor_active_percent"] for gpu in record["gpus"] if gpu["uses_it"]), None)
        if tensor is None and main is not None:
            tensor = main.get("tensor_active_percent")
        if tensor is not None:
            add_tensor_series(self._charts_by_id["util-chart"], self.series["tensor_active"])
            self.series["tensor_active"].append(t_s, tensor)
        if record["cpu_percent"] is not None:
            self.series["cpu"].append(t_s, record["cpu_percent"])
        throughput = self.series["throughput"]
        if record["samples_per_second"] is not None and (throughput.last_t_s is None or t_s > throughput.last_t_s):
            throughput.append(t_s, record["samples_per_second"])
        self._show_bands(record, main)
        self._show_loss(record)

    def _show_loss(self, record: dict[str, Any]) -> None:
        """A log the record brings, onto the loss chart (shown from the first)."""
        step = record.get("loss_step")
        if step is not None and self.loss.logged_step is not None and step < self.loss.logged_step:
            self.loss = LossCurve()  # the process trains again, from its first step
        if self.loss.add(step, record.get("loss"), record.get("learning_rate"), record.get("grad_norm")):
            chart = self.query_one("#loss-chart", LossChart)
            chart.show_curves({"loss": self.loss.points})
            chart.show_latest(self.loss.learning_rate, self.loss.grad_norm)

    def _add_anatomy(self, record: dict[str, Any]) -> None:
        """Memory by module and an out-of-memory failure, from the records that bring them (the final one too)."""
        if record.get("modules") is not None:
            self._modules = record["modules"]
            self._modules_step = record.get("bands_measured_at_step", self._modules_step)
            if record.get("out_of_memory") is None and not record["exited"]:
                self._show_failure(None)  # a later step's: the loop caught the failure and went on
        if record.get("out_of_memory") is not None:
            self._show_failure(record["out_of_memory"])

    def _show_failure(self, failure: dict[str, Any] | None) -> None:
        """The watched run's out-of-memory failure above the bar, whose bands are then that moment's; None: none."""
        self._failure = failure
        self.failure_line.show(failure)
        self._memory_bar.show_moment(at_failure=failure is not None)

    def modules_shown(self) -> ModulesShown:
        """Memory by module of the watched run: its latest measured bands', or its failure's."""
        who = f"PID {self.target.pid}"
        if self._failure is not None:
            moment = f"{who}, at the failing allocation"
            return ModulesShown(moment, self._modules, self._failure, f"{who}: {NOT_FOLLOWED}")
        if self._modules is None:
            published = self.last_record is not None and self.last_record.get("published")
            why = (
                f"{who} has published no measured step with memory by module yet (the probe measures it at steps "
                "1-3, then every 50th)"
                if published
                else f"{who} publishes no probe events: memory by module needs the probe (see the process panel)"
            )
            return ModulesShown(who, why_none=why)
        step = f", at step {self._modules_step}'s peak (its forward pass's end)" if self._modules_step else ""
        return ModulesShown(f"{who}{step}", self._modules)

    def action_toggle_operations(self) -> None:
        """`O`: the operations anatomy the watched probe published, in the charts' place; again: the charts."""
        self.app.screen.toggle_class("-operations")  # on the screen on top, as `v`'s class (`action_toggle_timeline`)
        if not self._operations_shown:
            self._show_operations(None)

    def _show_operations(self, anatomy: dict[str, Any] | None) -> None:
        self._operations_anatomy = anatomy
        self._operations_shown = True
        self.query_one(OperationsPanel).show(anatomy, None, WATCH_PROFILE_NOTE)

    def _show_bands(self, record: dict[str, Any], main: dict[str, Any] | None) -> None:
        total = main["total_bytes"] if main else None
        used = main["used_bytes"] if main else None
        unattributed = None
        if record["bands"] is not None:
            bands = dict(record["bands"])
            unavailable = dict(record["bands_unavailable"] or {})
        else:
            reason = record["publication_reason"]
            bands = {
                "other_processes_bytes": main["other_processes_bytes"] if main else None,
                "free_bytes": total - used if total is not None and used is not None else None,
            }
            no_gpu = record["gpu_memory_reason"] or "no GPU"
            unavailable = {
                name: reason
                for name in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
            }
            unavailable.update(
                cuda_context_bytes="needs torch's reserved memory, which only the probe reports",
                temporaries_and_cache_bytes="needs the probe's tensor bands",
            )
            if main is None:
                unavailable.update(other_processes_bytes=no_gpu, free_bytes=no_gpu)
            unattributed = record["gpu_memory_bytes"] if main is not None else None
        if used is not None and used >= self._peak_device_used_bytes:
            self._peak_device_used_bytes = used
            self._peak_bands = dict(bands)
        self._memory_bar.update_bands(bands, self._peak_bands, total, unavailable, unattributed)
        self._memory_bar.update_gradients_after_backward(record.get("gradients_after_backward_bytes"), None)
        gpus = {gpu["index"]: gpu for gpu in record.get("gpus") or []}
        self._show_lanes(
            [  # every publishing rank of a distributed job, on its own GPU, with that GPU's busy and tensor readings
                Lane(
                    rank["gpu_index"],
                    rank["rank"],
                    rank["bands"],
                    rank["used_bytes"],
                    rank["total_bytes"],
                    gpus.get(rank["gpu_index"], {}).get("device_util_percent"),
                    gpus.get(rank["gpu_index"], {}).get("tensor_active_percent"),
                )
                for rank in record.get("ranks") or []
                if rank["gpu_index"] is not None
            ]
        )

    @property
    def state_text(self) -> str:
        """What the status line says of the watched process."""
        record = self.last_record
        who = f"PID {self.target.pid} {self.target.name}"
        if record is None:
            return f"watching {who}…"
        if record.get("exited"):
            return f"{who} has exited"
        parts = [f"watching {who}"]
        if record.get("step") is not None:
            total = f"/{record['total_steps']}" if record.get("total_steps") else ""
            parts.append(f"step {record['step']}{total}")
        if record.get("samples_per_second") is not None:
            parts.append(f"{record['samples_per_second']:.1f} samples/s")
        if self.saved_run_id is not None:
            parts.append(f"saving as run {self.saved_run_id}")
        return " · ".join(parts)

    def _sampler_cpu_percent(self) -> float | None:
        if self._sampler is None:
            return None
        wall_s = self._clock() - self._started_s
        return round(100.0 * self._sampler.cpu_seconds / wall_s, 1) if wall_s > 1 else None

    # --- actions -----------------------------------------------------------------------------------
    def action_save(self) -> None:
        session = self.session
        if session is None:
            return
        if self.saved_run_id is not None:
            self.notify(f"Already recording into the history as run {self.saved_run_id}.")
            return

        def saved(run_id: int | None, failure: str | None) -> None:
            self.post_message(WatchSaved(run_id, failure))

        session.request_save(self.db_path, self._save_name, saved)
        if self.exited or (self._sampler is not None and not self._sampler.running and self._interval_s is not None):
            self._save_after_exit(session, saved)

    @work(thread=True, exclusive=True, group="save", name="gpuanat-save", exit_on_error=False)
    def _save_after_exit(self, session: WatchSession, saved: Callable[[int | None, str | None], None]) -> None:
        """The process is gone, so no sample will serve the request: save what was observed, in a worker."""
        from gpuanat.core.store.history import HistoryStore

        name_native_thread("gpuanat-save")
        try:
            run_id = session.start_saving(HistoryStore(self.db_path), self._save_name)
            session.finish_saving(exited=True)
        except Exception as error:  # the dashboard outlives a broken history file
            saved(None, f"{type(error).__name__}: {error}")
        else:
            saved(run_id, None)

    def on_watch_saved(self, message: WatchSaved) -> None:
        if message.run_id is None:
            self.notify(f"Could not save to the history: {message.failure}", severity="error", timeout=8)
            return
        self.saved_run_id = message.run_id
        ending = "" if self.exited else " (until the process exits or you quit)"
        self.notify(
            f"Recording into the history as run {message.run_id}{ending}; h lists it, enter compares.", timeout=6
        )


def _main_gpu(record: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU the charts and the memory bar show: rank 0's where the job's ranks publish, else the first GPU the
    process uses, else the first GPU."""
    rank_gpus = [rank["gpu_index"] for rank in record.get("ranks") or [] if rank["gpu_index"] is not None]
    gpus = record["gpus"]
    return next((gpu for gpu in gpus if rank_gpus and gpu["index"] == rank_gpus[0]), None) or next(
        (gpu for gpu in gpus if gpu["uses_it"]), gpus[0] if gpus else None
    )


def _gpu_faults(gpu: dict[str, Any]) -> tuple[str, ...]:
    """What went wrong on a record's GPU, in words (`GpuSample.faults`)."""
    xids = tuple(xid_text(gpu["index"], xid) for xid in gpu.get("xid_errors") or ())
    return (gpu["nvml_error"], *xids) if gpu.get("nvml_error") else xids
