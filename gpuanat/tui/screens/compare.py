"""Runs side by side: the techniques that differ, every metric with its Δ% against the first run, and
their memory, throughput and loss curves overlaid (the loss by step)."""

from __future__ import annotations

import itertools
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label

from gpuanat.core.printable import printable
from gpuanat.core.store.compare import compare_runs, format_metric
from gpuanat.core.store.history import RunRow
from gpuanat.core.store.report import format_bytes, format_delta
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.loss_chart import LossChart


def technique_text(value: object) -> str:
    """A technique's value as the techniques panel shows it: on/off, — for none."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "—" if value is None else str(value)


def _memory_series(samples: list[dict[str, Any]], pid: int | None) -> TimeSeries:
    """This run's GPU memory over time (per-process NVML use of its training process)."""
    series = TimeSeries()
    start = samples[0]["t_s"] if samples else 0.0
    for sample in samples:
        used = sum(
            process["used_bytes"] or 0
            for gpu in sample["gpus"]
            for process in gpu["processes"]
            if process["pid"] == pid
        )
        if used:
            series.append(sample["t_s"] - start, used)
    return series


def _why_no_memory(run: Any, samples: list[dict[str, Any]]) -> str:
    """Why a finished run's memory curve is empty, as its chart says it: it can never fill."""
    nvml = (run.environment or {}).get("nvml") or {}
    if nvml and not nvml.get("available", True):
        return f"no GPU samples: {printable(str(nvml.get('reason') or 'NVML unavailable'))}"
    if not samples:
        return f"run {run.id} recorded no samples"
    return f"run {run.id}'s samples hold no GPU memory of its process"


def _throughput_series(steps: list[dict[str, Any]]) -> TimeSeries:
    series = TimeSeries()
    for previous, step in itertools.pairwise(steps):
        if step["elapsed_s"] > previous["elapsed_s"]:
            series.append(
                step["elapsed_s"], (step["samples"] - previous["samples"]) / (step["elapsed_s"] - previous["elapsed_s"])
            )
    return series


class CompareScreen(Screen[None]):
    BINDINGS = [Binding("escape,q,enter", "close", "Back", id="compare.back")]
    DEFAULT_CSS = """
    CompareScreen #compare-tables { height: auto; max-height: 60%; }
    CompareScreen DataTable { width: 1fr; height: auto; max-height: 100%; }
    CompareScreen #compare-techniques { width: auto; max-width: 50%; }  /* the metrics' deltas get the room */
    CompareScreen #compare-charts { height: 1fr; }
    CompareScreen LineChart { width: 1fr; height: 1fr; }
    """

    def __init__(
        self, runs: list[RunRow], steps: dict[int, list[dict[str, Any]]], samples: dict[int, list[dict[str, Any]]]
    ) -> None:
        super().__init__()
        self._runs, self._steps, self._samples = runs, steps, samples
        self.comparison = compare_runs(
            [run.id for run in runs], [run.config for run in runs], [run.result for run in runs]
        )

    def compose(self) -> ComposeResult:
        yield Label(
            f"Compare runs {', '.join(str(run.id) for run in self._runs)} — Δ% against run {self._runs[0].id}",
            id="compare-title",
        )
        with Horizontal(id="compare-tables"):
            yield DataTable(id="compare-techniques", cursor_type="none")
            yield DataTable(id="compare-metrics", cursor_type="none")
        with Horizontal(id="compare-charts"):
            yield LineChart("GPU memory of each run", formatter=lambda v: format_bytes(int(v)), id="compare-memory")
            yield LineChart(
                "Throughput of each run (samples/s)", formatter=lambda v: f"{v:.1f}/s", id="compare-throughput"
            )
            yield LossChart("Loss of each run by step", id="compare-loss")
        yield Footer()

    def on_mount(self) -> None:
        techniques = self.query_one("#compare-techniques", DataTable)
        techniques.add_column("differs")
        for run in self._runs:
            techniques.add_column(f"run {run.id}")
        # Text, not markup: a value may be a model path or a script's argument, shown as given.
        techniques.add_row("status", *(Text(printable(run.status)) for run in self._runs))
        for field, values in self.comparison.differing:
            techniques.add_row(field, *(Text(printable(technique_text(value))) for value in values))
        if not self.comparison.differing:
            techniques.add_row("(same techniques)", *("" for _ in self._runs))
        metrics = self.query_one("#compare-metrics", DataTable)
        metrics.add_column("metric")
        for index, run in enumerate(self._runs):
            metrics.add_column(f"run {run.id}")
            if index:
                metrics.add_column("Δ")
        for row in self.comparison.metrics:
            cells: list[str | Text] = [row.label]
            for index, value in enumerate(row.values):
                cells.append(format_metric(row.key, value))
                if index:
                    cells.append(format_delta(row.deltas_percent[index]))
            metrics.add_row(*cells)
        memory = self.query_one("#compare-memory", LineChart)
        throughput = self.query_one("#compare-throughput", LineChart)
        no_memory, no_steps = [], []
        for run in self._runs:
            pid = run.environment.get("pid")
            samples = self._samples.get(run.id, [])
            memory_series = _memory_series(samples, pid)
            memory.set_series(f"run {run.id}", memory_series)
            throughput_series = _throughput_series(self._steps.get(run.id, []))
            throughput.set_series(f"run {run.id}", throughput_series)
            if not len(memory_series):
                no_memory.append(_why_no_memory(run, samples))
            if not len(throughput_series):
                no_steps.append(f"run {run.id} recorded no steps")
        # Finished runs: a chart none of them fills says why, not "waiting" (dict.fromkeys: one NVML reason once).
        memory.empty_message = "; ".join(dict.fromkeys(no_memory))
        throughput.empty_message = "; ".join(no_steps)
        memory.refresh_data()
        throughput.refresh_data()
        self._show_losses()

    def _show_losses(self) -> None:
        """The runs' loss curves overlaid by step (their results' `loss_curve`); the chart is left out when no run
        has one (a loop that logs none, runs recorded before gpuanat kept it), as the table leaves out its rows."""
        curves = {f"run {run.id}": [(step, loss) for step, loss in run.result.loss_curve or []] for run in self._runs}
        chart = self.query_one("#compare-loss", LossChart)
        chart.display = any(curves.values())
        chart.show_curves({name: points for name, points in curves.items() if points})

    def action_close(self) -> None:
        self.dismiss(None)
