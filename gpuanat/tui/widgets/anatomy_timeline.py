"""AnatomyTimeline: the memory bands of a run as a stacked timeline, two columns a step, live.

Each optimizer step adds two columns: the step's peak (the end of the forward pass: weights, optimizer state as it
was, and what the step's peak held above them — the activations) and the step's end (weights, optimizer state, and
what is still allocated above them: gradients and left-overs). Between the two, the activations rise and fall
every step, and the optimizer state appears after step 1. Above the allocated memory, the cache torch reserved;
under everything, the CUDA context. The newest steps are on the right; the y-axis spans the GPU's memory.

The points are computed by `anatomy_points` from what every step reports (`Step.peak_allocated_bytes`,
`allocated_bytes`, `reserved_bytes`), the weights and optimizer state the probe measured exactly, and the context;
the widget only draws them. Colours are the memory bar's (the theme's), one component class a band.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.memory_bar import BAND_COLOURS_CSS, band_component_class

TIMELINE_BANDS = (
    "cuda_context_bytes",
    "weights_bytes",
    "optimizer_state_bytes",
    "activations_bytes",
    "gradients_bytes",
    "temporaries_and_cache_bytes",
)
"""Bottom to top. At a step's peak the allocated memory above weights and optimizer state is the activations; at
its end it is the gradients (and what else outlives the step)."""
FULL_BLOCK = "█"
SHORT_LABELS = {
    "cuda_context_bytes": "context",
    "weights_bytes": "weights",
    "optimizer_state_bytes": "optimizer",
    "activations_bytes": "activations",
    "gradients_bytes": "gradients",
    "temporaries_and_cache_bytes": "cache",
}


@dataclass(frozen=True)
class AnatomyPoint:
    step: int
    at_peak: bool
    """True: the step's peak (the end of its forward pass); False: the step's end."""
    bands: Mapping[str, int]


def anatomy_points(
    step: int,
    peak_allocated_bytes: int | None,
    allocated_bytes: int | None,
    reserved_bytes: int | None,
    weights_bytes: int,
    optimizer_before_bytes: int,
    optimizer_after_bytes: int,
    context_bytes: int | None,
) -> list[AnatomyPoint]:
    """The two points of one step; none without the allocator's readings (a CPU run)."""
    if peak_allocated_bytes is None or allocated_bytes is None or reserved_bytes is None:
        return []
    context = context_bytes or 0
    at_peak = {
        "cuda_context_bytes": context,
        "weights_bytes": weights_bytes,
        "optimizer_state_bytes": optimizer_before_bytes,
        "activations_bytes": max(0, peak_allocated_bytes - weights_bytes - optimizer_before_bytes),
        "gradients_bytes": 0,
        "temporaries_and_cache_bytes": max(0, reserved_bytes - peak_allocated_bytes),
    }
    at_end = {
        "cuda_context_bytes": context,
        "weights_bytes": weights_bytes,
        "optimizer_state_bytes": optimizer_after_bytes,
        "activations_bytes": 0,
        "gradients_bytes": max(0, allocated_bytes - weights_bytes - optimizer_after_bytes),
        "temporaries_and_cache_bytes": max(0, reserved_bytes - allocated_bytes),
    }
    return [AnatomyPoint(step, True, at_peak), AnatomyPoint(step, False, at_end)]


def stack_cells(bands: Mapping[str, int], scale: int, rows: int) -> list[str | None]:
    """The band of each cell of one column, bottom row first (None: empty): each band's top edge rounded to the
    nearest cell, so the stack's height is its total's and a band under half a cell takes none."""
    cells: list[str | None] = [None] * rows
    if scale <= 0 or rows <= 0:
        return cells
    bottom_cell = 0
    total = 0
    for band in TIMELINE_BANDS:
        total += max(0, bands.get(band, 0))
        top_cell = min(rows, round(total * rows / scale))
        for row in range(bottom_cell, top_cell):
            cells[row] = band
        bottom_cell = max(bottom_cell, top_cell)
    return cells


class AnatomyTimeline(Widget):
    """The bands of a run over its last steps, stacked, two columns a step."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *(band_component_class(band) for band in TIMELINE_BANDS),
        "anatomy-timeline--title",
        "anatomy-timeline--axis",
        "anatomy-timeline--empty",
    }

    DEFAULT_CSS = (
        """
    AnatomyTimeline {
        height: 1fr;"""
        + BAND_COLOURS_CSS
        + """
        & > .anatomy-timeline--title { color: $text; text-style: bold; }
        & > .anatomy-timeline--axis { color: $text-muted; }
        & > .anatomy-timeline--empty { color: $text-muted; text-style: italic; }
        &:ansi > .anatomy-timeline--axis { color: ansi_bright_black; }
        &:ansi > .anatomy-timeline--empty { color: ansi_bright_black; }
    }
    """
    )

    MAX_POINTS = 1000

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._points: list[AnatomyPoint] = []
        self._total_bytes: int | None = None
        self.empty_message = "a run's bands over its steps show here (they need CUDA's allocator readings)"
        self._version = 0
        self._rows: list[Strip] = []
        self._rows_key: tuple[int, int, int] | None = None
        self._base_style = Style()

    @property
    def points(self) -> Sequence[AnatomyPoint]:
        return self._points

    def add_points(self, points: Sequence[AnatomyPoint]) -> None:
        if points:
            self._points = [*self._points, *points][-self.MAX_POINTS :]
            self._changed()

    def clear(self) -> None:
        self._points = []
        self._changed()

    def set_total(self, total_bytes: int | None) -> None:
        """The GPU's memory, named on the y-axis; the axis itself spans the largest stack shown, so that a run's
        dynamics read at any size (the memory chart and bar show it against the whole card)."""
        if total_bytes != self._total_bytes:
            self._total_bytes = total_bytes
            self._changed()

    def _changed(self) -> None:
        self._version += 1
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._rows_key = None

    def render_line(self, y: int) -> Strip:
        width, height = self.size
        key = (width, height, self._version)
        if key != self._rows_key:
            self._base_style = self.rich_style
            self._rows = self._build_rows(width, height)
            self._rows_key = key
        return self._rows[y] if y < len(self._rows) else Strip.blank(width, self.rich_style)

    def _style(self, component: str) -> Style:
        return self.get_component_rich_style(component)

    def _finish(self, segments: list[Segment], width: int) -> Strip:
        return Strip(segments).adjust_cell_length(width, self._base_style)

    def _build_rows(self, width: int, height: int) -> list[Strip]:
        if width <= 0 or height <= 0:
            return []
        label_width = 14
        plot_width = max(0, width - label_width - 1)
        shown = self._points[-plot_width:] if plot_width else []
        steps = sorted({point.step for point in shown})
        title = " Anatomy over time" + (
            f" · steps {steps[0]}-{steps[-1]}, each at its peak and its end" if steps else ""
        )
        rows = [self._finish([Segment(title, self._style("anatomy-timeline--title"))], width)]
        legend: list[Segment] = []
        for band in TIMELINE_BANDS:
            legend += [
                Segment(" ", self._base_style),
                Segment(FULL_BLOCK, self._style(band_component_class(band))),
                Segment(f" {SHORT_LABELS[band]}", self._style("anatomy-timeline--axis")),
            ]
        rows.append(self._finish(legend, width))
        plot_rows = max(0, height - 3)
        if not shown:
            blank = Strip.blank(width, self._base_style)
            message = self._finish([Segment(f" {self.empty_message}", self._style("anatomy-timeline--empty"))], width)
            rows += [message if row == plot_rows // 2 else blank for row in range(plot_rows)]
            return [*rows, blank] if height >= 2 else rows
        scale = max(sum(point.bands.values()) for point in shown)
        columns = [stack_cells(point.bands, scale, plot_rows) for point in shown]
        axis_style = self._style("anatomy-timeline--axis")
        for row in range(plot_rows - 1, -1, -1):
            label = format_bytes(scale) if row == plot_rows - 1 else "0 MiB" if row == 0 else ""
            if row == plot_rows - 2 and self._total_bytes:
                label = f"of {format_bytes(self._total_bytes)}"
            segments = [Segment(f"{label:>{label_width - 1}}┤" if label else f"{'':>{label_width - 1}}│", axis_style)]
            for cells in columns:
                cell_band = cells[row]
                segments.append(
                    Segment(FULL_BLOCK, self._style(band_component_class(cell_band)))
                    if cell_band
                    else Segment(" ", self._base_style)
                )
            rows.append(self._finish(segments, width))
        if height >= 2:
            first, last = f"step {steps[0]}", f"step {steps[-1]}"
            fill = "─" * max(1, len(shown) - len(first) - len(last) - 3)
            rows.append(self._finish([Segment(f"{'':>{label_width - 1}}└ {first} {fill} {last}", axis_style)], width))
        return rows
