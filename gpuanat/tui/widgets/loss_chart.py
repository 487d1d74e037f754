"""LossChart: the loss over the steps, as the loop logged it — one curve for a run, or several overlaid (the compare
view) — with the latest learning rate and gradients' norm in its title where the loop logs them.

A `LineChart` by step instead of time: its x-axis names the first and last step, and it stays off the dashboard's
time axis (`shares_time_axis`). A loss moves within a narrow band far above zero, so the y-axis starts at a round
value below the lowest loss instead of at zero: the curves are stored less that floor, and the labels add it back.
The floor moves (and the curves are stored again) only when a loss falls below it, a few times a run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

from gpuanat.core.store.report import format_loss
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.line_chart import LineChart

LOSS_TITLE = "Loss by step"
LOSS_WAITING = "the loss shows here once the loop logs one"
FLOOR_MARGIN = 0.1
"""The floor lies this share of the curves' range below their lowest loss, rounded down."""


def loss_floor(lowest: float, highest: float) -> float:
    """A round y-axis floor below `lowest` (0 for a loss at or below 0): `FLOOR_MARGIN` of the range below it, rounded
    down to a tenth of the range's order of magnitude, so that it moves only when the loss falls past it."""
    if lowest <= 0:
        return 0.0
    spread = highest - lowest if highest > lowest else abs(lowest) * FLOOR_MARGIN
    unit = 10.0 ** (math.floor(math.log10(spread)) - 1)
    return max(0.0, math.floor((lowest - FLOOR_MARGIN * spread) / unit) * unit)


def latest_values(learning_rate: float | None, grad_norm: float | None) -> str:
    """The title's latest learning rate and gradients' norm: "lr 5e-05 · grad norm 1.23"; "" when neither is logged."""
    parts = [f"lr {learning_rate:.3g}" if learning_rate is not None else None]
    parts.append(f"grad norm {grad_norm:.3g}" if grad_norm is not None else None)
    return " · ".join(part for part in parts if part)


class LossChart(LineChart):
    """Curves of (step, loss), named, on one axis from the first logged step to the last; the `-logged` class once
    one has a point (a dashboard shows the chart then)."""

    shares_time_axis: ClassVar[bool] = False

    def __init__(
        self,
        title: str = LOSS_TITLE,
        *,
        empty_message: str = LOSS_WAITING,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(title, formatter=self._label, empty_message=empty_message, id=id, classes=classes)
        self._base_title = title
        self._floor = 0.0
        self._curves_key: object = None
        self.curves: dict[str, list[tuple[float, float]]] = {}
        """The curves shown, by name, as given."""

    def _label(self, value: float) -> str:
        return format_loss(value + self._floor)

    def x_axis_labels(self, start_s: float, end_s: float) -> tuple[str, str]:
        return f"step {start_s:.0f}", f"{end_s:.0f}"

    def refresh_data(self, now_s: float | None = None) -> None:
        """As `LineChart`'s, but nothing while hidden (a dashboard hides it until the first log): shown, it is drawn
        whole, from the curves as they are then."""
        if self.display:
            super().refresh_data(now_s)

    def show_curves(self, curves: Mapping[str, Sequence[tuple[float, float]]]) -> None:
        """Show these curves ((step, loss) points in step order, by name): stored again only when they changed."""
        key = tuple((name, len(points), tuple(points[-1]) if points else None) for name, points in curves.items())
        if key == self._curves_key:
            return
        self._curves_key = key
        self.curves = {name: [(step, loss) for step, loss in points] for name, points in curves.items()}
        losses = [loss for points in curves.values() for _, loss in points]
        floor = loss_floor(min(losses), max(losses)) if losses else 0.0
        if floor != self._floor:
            self._floor = floor
            self.formatter = self._label  # the axis and legend labels change with the floor
        self.set_class(bool(losses), "-logged")
        for name, points in curves.items():
            series = TimeSeries(reduce="mean")
            for step, loss in points:
                series.append(step, loss - floor)
            self.set_series(name, series)

    def show_latest(self, learning_rate: float | None, grad_norm: float | None) -> None:
        """The title with the latest learning rate and gradients' norm the loop logged."""
        latest = latest_values(learning_rate, grad_norm)
        self.title = f"{self._base_title} · {latest}" if latest else self._base_title

    def clear(self) -> None:
        """A new run: no curve until its loop logs."""
        self._curves_key, self._floor, self.curves = None, 0.0, {}
        self._series.clear()
        self.remove_class("-logged")
        self.title = self._base_title
        self.refresh_data()
