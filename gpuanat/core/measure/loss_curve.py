"""A run's loss over its steps, from what its loop logged: each `Step` (and `Done`, as a loop logs after its step's
end) carries the latest logged loss, learning rate and gradients' norm with `loss_step`, the step of that log. Here
they become the points of the curve (one a log, however many events repeat it, in whatever subset of the steps a
publication carries), the last and the lowest loss, and the curve a result keeps: at most `LOSS_CURVE_POINTS`,
downsampled keeping each bucket's lowest and highest point so that the curve's shape survives.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

LOSS_CURVE_POINTS = 500
"""The most points a result's `loss_curve` has: enough for any chart a terminal draws, small in the history."""
KEPT_POINTS = 4 * LOSS_CURVE_POINTS
"""Points kept while a run goes on: past this they are downsampled to `LOSS_CURVE_POINTS` (a run logging every
step for days stays this small)."""
NO_LOSS_REASON = "the loop logged no loss"
NOT_A_NUMBER_REASON = "the last logged loss was NaN or infinite"
LOSS_FIELDS = ("final_loss", "min_loss", "loss_curve")
"""The result's fields of the loss, in order."""

Point = tuple[int, float]


class Logged(Protocol):
    """What carries a log's values: `protocol.Step`, `protocol.Done`, a stored step record read back."""

    @property
    def loss_step(self) -> int | None: ...
    @property
    def loss(self) -> float | None: ...
    @property
    def learning_rate(self) -> float | None: ...
    @property
    def grad_norm(self) -> float | None: ...


def downsampled(points: Sequence[Point], limit: int = LOSS_CURVE_POINTS) -> list[Point]:
    """At most `limit` of `points` (in step order): the first and the last, and between them, in equal buckets, each
    bucket's lowest and highest loss, in step order."""
    if len(points) <= limit:
        return list(points)
    inner, buckets = points[1:-1], max(1, (limit - 2) // 2)
    kept = [points[0]]
    for index in range(buckets):
        bucket = inner[index * len(inner) // buckets : (index + 1) * len(inner) // buckets]
        if bucket:
            extremes = {min(bucket, key=lambda point: point[1]), max(bucket, key=lambda point: point[1])}
            kept.extend(sorted(extremes))
    kept.append(points[-1])
    return kept


@dataclass
class LossCurve:
    """The logged points of one training process's run, and its latest logged values."""

    points: list[Point] = field(default_factory=list)
    """(step, loss) of each log with a finite loss, in step order; downsampled past `KEPT_POINTS`."""
    logged_step: int | None = None
    """The step of the latest log."""
    loss: float | None = None
    """The latest logged loss; None before the first, or when it was NaN or infinite (null in the events)."""
    min_loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None

    def observe(self, event: Logged) -> bool:
        """Take the logged values an event carries; True when they are a log not seen before."""
        return self.add(event.loss_step, event.loss, event.learning_rate, event.grad_norm)

    def add(
        self, step: int | None, loss: float | None, learning_rate: float | None = None, grad_norm: float | None = None
    ) -> bool:
        """The values logged at `step` (None: no log yet); True when that log was not seen before."""
        if step is None or (self.logged_step is not None and step <= self.logged_step):
            return False
        self.logged_step, self.loss, self.learning_rate, self.grad_norm = step, loss, learning_rate, grad_norm
        if loss is not None:
            self.points.append((step, loss))
            self.min_loss = loss if self.min_loss is None else min(self.min_loss, loss)
            if len(self.points) > KEPT_POINTS:
                self.points = downsampled(self.points)
        return True

    def result_values(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The result's `final_loss`, `min_loss` and `loss_curve` (a list of [step, loss]), and why any is None."""
        values: dict[str, Any] = {
            "final_loss": self.loss,
            "min_loss": self.min_loss,
            "loss_curve": [[step, loss] for step, loss in downsampled(self.points)] if self.points else None,
        }
        reason = NO_LOSS_REASON if not self.points else NOT_A_NUMBER_REASON
        return values, {name: reason for name, value in values.items() if value is None}


def curve_of_steps(steps: Sequence[Any]) -> LossCurve:
    """The curve of stored step records (`Step` as JSON, in order), as a recorder that died left them. Records written
    before the steps carried `loss_step` carry each log's loss on from the step it arrived at: there a loss is placed
    at the first step that carried it."""
    curve = LossCurve()
    dated = any("loss_step" in record for record in steps)
    previous: object = None
    for record in steps:
        loss = record.get("loss")
        if dated:
            step = record.get("loss_step")
        else:  # a step with no loss (none logged yet, or NaN) is left out: the two read alike
            step = record.get("step") if isinstance(loss, (int, float)) and loss != previous else None
            previous = loss if step is not None else previous
        if isinstance(step, int) and (loss is None or isinstance(loss, (int, float))):
            curve.add(step, None if loss is None else float(loss))
    return curve
