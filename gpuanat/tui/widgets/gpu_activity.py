"""GpuActivityLine: how busy each GPU really is, one row a GPU, under the status line — NVML's "busy" (a kernel ran)
beside the tensor pipes' activity (NVML GPM), then SMs active, DRAM bandwidth, power, temperature, the SM clock and
a throttle reason when one is set: "GPU 0 busy 100% · tensor 94% · SM 96% · DRAM 9% · 695 W · 61°C · 1755 MHz ·
power cap".

Where GPM gives nothing the tensor reading says "—", and the widget's tooltip says why (`gpm_unavailable`). At 80
columns the readings that matter least go first (DRAM, then SM, the clock, the temperature, the power); busy,
tensor and the throttle reason stay. A trace recorded before gpuanat read GPM and the clocks has none of these
readings: then there is no row (see `has_activity`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip

from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.samples import GpuSample
from gpuanat.core.printable import printable
from gpuanat.tui.widgets.cached_rows import CachedRows, text_line_row

SHORT_THROTTLE_NAMES = {
    "software power cap": "power cap",
    "hardware slowdown": "hw slowdown",
    "software thermal slowdown": "thermal slowdown",
    "hardware thermal slowdown": "hw thermal slowdown",
    "hardware power brake slowdown": "power brake",
}
"""NVML's throttle reasons (`gpm.throttle_names`) in the few words a row has room for."""
ACTIVITY_FIELDS = (
    "sm_active_percent",
    "tensor_active_percent",
    "dram_bandwidth_percent",
    "gpm_unavailable",
    "sm_clock_mhz",
    "clocks_event_reasons",
)
"""The readings a sample of gpuanat's NVML source always has one of (a GPM reading or why not, the clocks)."""


@dataclass(frozen=True)
class GpuActivity:
    """One GPU's readings as the row shows them (names as in `GpuSample`)."""

    index: int
    gpu_util_percent: float | None
    tensor_active_percent: float | None
    sm_active_percent: float | None
    dram_bandwidth_percent: float | None
    gpm_unavailable: str | None
    power_w: float | None
    temperature_c: float | None
    sm_clock_mhz: int | None
    clocks_event_reasons: int | None

    @classmethod
    def of(cls, reading: GpuSample | Mapping[str, Any]) -> GpuActivity:
        """From a `GpuSample`, or from a watch record's GPU entry (the same names; its device-wide utilization is
        `device_util_percent`)."""
        if isinstance(reading, Mapping):
            fields: dict[str, Any] = {name: reading.get(name) for name in cls.__dataclass_fields__}
            fields["gpu_util_percent"] = reading.get("device_util_percent")
            return cls(**fields)
        return cls(**{name: getattr(reading, name) for name in cls.__dataclass_fields__})


def has_activity(reading: GpuSample | Mapping[str, Any]) -> bool:
    """Whether the reading comes from a source that reads GPM and the clocks (every live one does)."""
    if isinstance(reading, Mapping):
        return any(reading.get(name) is not None for name in ACTIVITY_FIELDS)
    return any(getattr(reading, name) is not None for name in ACTIVITY_FIELDS)


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}%"


class GpuActivityLine(CachedRows):
    """The GPUs' activity, one row each; the dashboards set them with `show`."""

    COMPONENT_CLASSES = {"gpu-activity--label", "gpu-activity--muted", "gpu-activity--tensor", "gpu-activity--throttle"}
    DEFAULT_CSS = """
    GpuActivityLine { height: auto; padding: 0 1; color: $text; }
    GpuActivityLine > .gpu-activity--label { color: $text-muted; }
    GpuActivityLine > .gpu-activity--muted { color: $text-muted; }
    GpuActivityLine > .gpu-activity--tensor { color: $accent; text-style: bold; }
    GpuActivityLine > .gpu-activity--throttle { color: $warning; text-style: bold; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[tuple[Any, ...], ...] = ()
        self.display = False  # until a reading comes

    @property
    def rows_shown(self) -> int:
        return len(self._shown)

    def show(self, activities: Sequence[GpuActivity]) -> None:
        """These GPUs' rows (none: the widget takes no room); rounded as shown, so a reading that moves no figure
        repaints nothing."""
        shown = tuple(_rounded(activity) for activity in activities)
        reasons = sorted({activity.gpm_unavailable for activity in activities if activity.gpm_unavailable})
        tooltip = "; ".join(printable(reason) for reason in reasons) or None
        if tooltip != self.tooltip:
            self.tooltip = tooltip
        self.display = bool(shown)
        if shown != self._shown:
            layout = len(shown) != len(self._shown)
            self._shown = shown
            self.repaint_changes(layout=layout)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._shown)

    def rows_key(self) -> Hashable:
        return self._shown

    def build_rows(self, width: int, height: int) -> list[Strip]:
        inner = max(0, width - 2)  # the padding's two cells
        return [text_line_row(self, self.row_text(row, inner), width, y) for y, row in enumerate(self._shown)]

    def row_text(self, row: tuple[Any, ...], width: int) -> Text:
        """One GPU's row within `width` cells: the least needed readings left out first."""
        optional = ["dram", "sm", "clock", "temperature", "power"]
        text = self._row(row, set())
        left_out: set[str] = set()
        while text.cell_len > width and optional:
            left_out.add(optional.pop(0))
            text = self._row(row, left_out)
        if text.cell_len > width:
            text.truncate(max(0, width - 1))
            text.append("…")
        return text

    def _row(self, row: tuple[Any, ...], left_out: set[str]) -> Text:
        index, busy, tensor, sm, dram, power, temperature, clock, throttle = row
        label, muted = self.component_style("gpu-activity--label"), self.component_style("gpu-activity--muted")
        text = Text(f"GPU {index} ", style=label)
        text.append("busy ", style=muted)
        text.append(_percent(busy))
        text.append(" · tensor ", style=muted)
        text.append(_percent(tensor), style=self.component_style("gpu-activity--tensor"))
        parts = [
            ("sm", "SM ", sm, _percent(sm)),
            ("dram", "DRAM ", dram, _percent(dram)),
            ("power", "", power, f"{power} W"),
            ("temperature", "", temperature, f"{temperature}°C"),
            ("clock", "", clock, f"{clock} MHz"),
        ]
        for name, prefix, value, shown in parts:
            if name in left_out or value is None:
                continue
            text.append(f" · {prefix}", style=muted)
            text.append(shown)
        if throttle:
            text.append(" · ", style=muted)
            text.append(throttle, style=self.component_style("gpu-activity--throttle"))
        return text


def _rounded(activity: GpuActivity) -> tuple[Any, ...]:
    """The row's figures as shown (whole percent, watt, degree, MHz) and its throttle reasons in words."""

    def whole(value: float | None) -> int | None:
        return None if value is None else round(value)

    throttle = ", ".join(SHORT_THROTTLE_NAMES.get(name, name) for name in throttle_names(activity.clocks_event_reasons))
    return (
        activity.index,
        whole(activity.gpu_util_percent),
        whole(activity.tensor_active_percent),
        whole(activity.sm_active_percent),
        whole(activity.dram_bandwidth_percent),
        whole(activity.power_w),
        whole(activity.temperature_c),
        activity.sm_clock_mhz,
        throttle,
    )
