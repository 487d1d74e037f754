"""GpuLanes: one row per GPU of a run on several GPUs — that GPU's memory as a stacked bar of its rank's bands, the
memory used of its total, its utilization (a kernel ran) and its tensor pipes' activity (NVML GPM, where read:
"95% · tensor 30%"; "t30%" on a narrow screen). Nothing is drawn for a run on one GPU (the memory bar above says it
all). One row a GPU keeps eight GPUs readable at 80×24.

A subclass of MemoryBar for its look: the same glyphs and the same colours for each band, from the theme.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.segment import Segment
from textual.geometry import Size
from textual.strip import Strip

from gpuanat.core.measure.anatomy import BAND_NAMES
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.widgets.memory_bar import BAND_GLYPHS, MemoryBar, band_component_class, split_cells


@dataclass(frozen=True)
class Lane:
    """One GPU of the run and the rank that trains on it."""

    gpu_index: int
    rank: int
    bands: Mapping[str, int | None]
    """The rank's bands (a band not measured yet is None, drawn as nothing)."""
    used_bytes: int | None
    total_bytes: int | None
    util_percent: float | None
    tensor_percent: float | None = None
    """NVML GPM's tensor pipes active (`GpuSample.tensor_active_percent`); None where not read."""


LABEL_WIDTH = 10
"""Columns before a bar: "GPU 1 r1"."""
WIDE_TENSOR_WIDTH = 60
"""From this width a lane says "· tensor 30%", below it "t30%"."""


class GpuLanes(MemoryBar):
    """The GPUs of a run on several of them, one lane each; the app sets them with `update_lanes`."""

    DEFAULT_CSS = """
    GpuLanes { height: auto; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._lanes: tuple[Lane, ...] = ()

    @property
    def lanes(self) -> tuple[Lane, ...]:
        return self._lanes

    def update_lanes(self, lanes: Sequence[Lane]) -> None:
        """Show these lanes; fewer than two shows nothing. The same lanes again cost nothing."""
        shown = tuple(lanes) if len(lanes) > 1 else ()
        if shown == self._lanes:
            return
        layout = len(shown) != len(self._lanes)
        self._lanes = shown
        self._changed(layout=layout)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lanes)

    def _build_rows(self, width: int) -> list[Strip]:
        return [self._lane_row(lane, width) for lane in self._lanes] if width > 0 else []

    def _lane_row(self, lane: Lane, width: int) -> Strip:
        label = f"GPU {lane.gpu_index} r{lane.rank}"
        segments = [Segment(f"{label:<{LABEL_WIDTH}}", self._style("memory-bar--label"))]
        util = f" {lane.util_percent:3.0f}%" if lane.util_percent is not None else "    —"
        if lane.tensor_percent is not None:
            tensor = f"{lane.tensor_percent:.0f}%"
            util += f" · tensor {tensor:>4}" if width >= WIDE_TENSOR_WIDTH else f" t{tensor:>4}"
        reading = f" {format_bytes(lane.used_bytes)}/{format_bytes(lane.total_bytes)}"
        bar_width = max(0, width - LABEL_WIDTH - len(reading) - len(util))
        values = [lane.bands.get(band) or 0 for band in BAND_NAMES]
        scale = lane.total_bytes or sum(values)
        for name, count in zip(BAND_NAMES, split_cells(values, scale, bar_width), strict=True):
            if count:
                segments.append(Segment(BAND_GLYPHS[name] * count, self._style(band_component_class(name))))
        drawn = sum(segment.cell_length for segment in segments)
        segments.append(Segment(" " * max(0, LABEL_WIDTH + bar_width - drawn)))
        segments.append(Segment(reading, self._style("memory-bar--value")))
        segments.append(Segment(util, self._style("memory-bar--label")))
        return self._finish(segments, width)
