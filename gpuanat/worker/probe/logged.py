"""What a training loop logged last: its loss, learning rate and gradients' norm, and the step of that log. The
probe carries them on every `Step` (and on `Done`: a loop logs after its step's end, so the last step's log reaches
no `Step`), from which gpuanat draws the loss curve and takes the final and lowest loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


def logged_number(value: Any) -> float | None:
    """A logged value as a float (a tensor read detached: the loop's loss still holds its graph, and float() of it
    warns in the user's output); None for what is no number. NaN and infinity stay: they travel as null."""
    if isinstance(value, torch.Tensor):
        return float(value.detach()) if value.numel() == 1 else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass
class LoggedValues:
    """The latest value of each, and the step whose log last gave any of them; a value a log leaves out keeps its
    earlier one (a loop that logs its learning rate less often than its loss)."""

    step: int | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None

    def update(self, step: int, loss: Any, learning_rate: Any = None, grad_norm: Any = None) -> None:
        """Step `step` logged these (None: not this time). A tensor is read here, which waits for its GPU work."""
        values = {"loss": loss, "learning_rate": learning_rate, "grad_norm": grad_norm}
        read = {name: logged_number(value) for name, value in values.items() if value is not None}
        if not read:
            return
        self.step = step
        for name, number in read.items():
            setattr(self, name, number)

    def fields(self) -> dict[str, Any]:
        """`Step`'s and `Done`'s fields of them (a NaN or infinity is made null by the protocol's encoder)."""
        return {
            "loss": self.loss,
            "loss_step": self.step,
            "learning_rate": self.learning_rate,
            "grad_norm": self.grad_norm,
        }
