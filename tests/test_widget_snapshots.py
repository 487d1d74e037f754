"""SVG snapshots of LineChart and MemoryBar at 80x24 with bert-large numbers, under the default and ansi-dark themes.

Regenerate after an intended visual change with `pytest tests/test_widget_snapshots.py --snapshot-update`
and look at the SVGs under tests/__snapshots__/ before committing them.
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from gpuanat.core.store.report import format_bytes
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.memory_bar import MemoryBar

MIB = 1024**2
GIB = 1024**3
H100_TOTAL_BYTES = 81559 * MIB
BERT_LARGE_BANDS = {
    "other_processes_bytes": 300 * MIB,
    "cuda_context_bytes": 527 * MIB,
    "weights_bytes": 1340583944,
    "gradients_bytes": 1340575752,
    "optimizer_state_bytes": 2681153076,
    "activations_bytes": 3415548828,
    "temporaries_and_cache_bytes": 1900 * MIB,
}
THEMES = ["textual-dark", "ansi-dark"]


def training_memory() -> tuple[TimeSeries, TimeSeries]:
    """Four minutes at 4 Hz: load weights, the first step adds optimizer state, then a forward/backward sawtooth."""
    device, run = TimeSeries(), TimeSeries()
    other = BERT_LARGE_BANDS["other_processes_bytes"]
    for index in range(960):
        t_s = index * 0.25
        run_bytes = 0
        if t_s >= 5:
            run_bytes = BERT_LARGE_BANDS["cuda_context_bytes"] + BERT_LARGE_BANDS["weights_bytes"]
        if t_s >= 20:
            step_phase = (index % 12) / 12
            run_bytes += BERT_LARGE_BANDS["optimizer_state_bytes"] + BERT_LARGE_BANDS["temporaries_and_cache_bytes"]
            run_bytes += int(BERT_LARGE_BANDS["activations_bytes"] * step_phase)
        run.append(t_s, run_bytes)
        device.append(t_s, other + run_bytes)
    return device, run


def training_throughput() -> TimeSeries:
    """samples/s with warm-up and a deterministic jitter, averaged when downsampled."""
    rate = TimeSeries(reduce="mean")
    for step in range(400):
        t_s = 20 + step * 0.52
        warm_up = min(1.0, step / 40)
        rate.append(t_s, 57.1 * warm_up + ((step * 37) % 11 - 5) * 0.4)
    return rate


class ChartsApp(App[None]):
    CSS = "#memory { height: 14; } #throughput { height: 10; }"

    def __init__(self, theme: str) -> None:
        super().__init__()
        self.theme = theme

    def compose(self) -> ComposeResult:
        yield LineChart("GPU memory used", formatter=lambda value: format_bytes(int(value)), id="memory")
        yield LineChart("Throughput", formatter=lambda value: f"{value:.1f}/s", id="throughput")

    def on_mount(self) -> None:
        device, run = training_memory()
        memory = self.query_one("#memory", LineChart)
        memory.set_series("device used", device)
        memory.set_series("this run", run)
        self.query_one("#throughput", LineChart).set_series("samples/s", training_throughput())


class MemoryApp(App[None]):
    def __init__(self, theme: str) -> None:
        super().__init__()
        self.theme = theme

    def compose(self) -> ComposeResult:
        yield MemoryBar(id="gpu")
        yield MemoryBar(id="cpu")

    def on_mount(self) -> None:
        used = sum(BERT_LARGE_BANDS.values())
        measured = dict(BERT_LARGE_BANDS, free_bytes=H100_TOTAL_BYTES - used)
        peak = dict(measured, activations_bytes=3600 * MIB, temporaries_and_cache_bytes=2100 * MIB)
        gpu = self.query_one("#gpu", MemoryBar)
        gpu.update_bands(measured, peak, H100_TOTAL_BYTES, {})
        gpu.update_predicted(
            {
                "cuda_context_bytes": 500 * MIB,
                "weights_bytes": 1340583944,
                "gradients_bytes": 1340575752,
                "optimizer_state_bytes": 2681153076,
                "activations_bytes": 3 * GIB,
            },
            H100_TOTAL_BYTES,
        )
        no_gpu = "CPU run: no GPU memory"
        self.query_one("#cpu", MemoryBar).update_bands(
            {"weights_bytes": 1340583944, "gradients_bytes": 1340575752, "optimizer_state_bytes": 2681153076},
            None,
            None,
            {
                "other_processes_bytes": no_gpu,
                "cuda_context_bytes": no_gpu,
                "temporaries_and_cache_bytes": no_gpu,
                "free_bytes": no_gpu,
                "activations_bytes": "not measurable with torch.compile on CPU",
            },
        )


@pytest.mark.parametrize("theme", THEMES)
def test_line_chart_snapshot(snap_compare, theme):
    assert snap_compare(ChartsApp(theme), terminal_size=(80, 24))


@pytest.mark.parametrize("theme", THEMES)
def test_memory_bar_snapshot(snap_compare, theme):
    assert snap_compare(MemoryApp(theme), terminal_size=(80, 24))
