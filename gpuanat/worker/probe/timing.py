"""Where each step's time goes on the host, phase by phase (`STEP_PHASES`): stamps the probe takes at the training
loop's step boundaries and in the model's forward hooks, with no synchronisation.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gpuanat.core.vocabulary.protocol import STEP_PHASES


class StepPhases:
    """Times each step's phases on the host (`STEP_PHASES`) with `perf_counter` stamps at the callbacks and forward
    hooks, and asks a CUDA event recorded at the previous step's end, without waiting, whether the GPU had caught up
    when the step's first forward began. No synchronisation: the host's time is where it waited."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._mark_s = time.perf_counter()
        self._phase = "data"
        self._phases_s = dict.fromkeys(STEP_PHASES, 0.0)
        self._caught_up: bool | None = None
        self._forward_seen = False
        self._step_end_event: Any = None

    @property
    def phase(self) -> str:
        """The phase the step is in now (`STEP_PHASES`)."""
        return self._phase

    def _enter(self, phase: str, now_s: float | None = None) -> None:
        now_s = time.perf_counter() if now_s is None else now_s
        self._phases_s[self._phase] += now_s - self._mark_s
        self._mark_s, self._phase = now_s, phase

    def step_begins(self) -> None:
        """The Trainer has the step's batches: what follows is the step's work. Under torch.compile the forward hooks
        cannot time (a clock read breaks the graph), so "forward" then holds the forward and the backward."""
        if self._phase == "data":
            self._enter("forward")

    def forward_begins(self) -> None:
        if not self._forward_seen and self._step_end_event is not None:
            self._caught_up = bool(self._step_end_event.query())
        self._forward_seen = True
        self._enter("forward")

    def forward_ends(self) -> None:
        self._enter("backward")

    def optimizer_begins(self) -> None:
        self._enter("optimizer")

    def loss_read(self) -> None:
        """The loop has read the loss to log it, after the step's end: the time since that end was the wait for the
        GPU (the next step's data wait begins now)."""
        if self._phase == "data":
            self._phase = "gpu wait"
            self._enter("data")

    def waits_for_gpu(self) -> None:
        """The probe synchronises with the GPU (the steady window's bounds): the time until the step's end is the
        GPU's."""
        self._enter("gpu wait")

    def step_ends(self, now_s: float) -> tuple[dict[str, float], bool | None]:
        """This step's phases, up to `now_s` (the probe's stamp of the step's end, so that they add up to its step
        time), and whether the GPU had caught up; the next step's data wait begins."""
        self._enter("data", now_s)
        phases, caught_up = self._phases_s, self._caught_up
        self._phases_s, self._caught_up, self._forward_seen = dict.fromkeys(STEP_PHASES, 0.0), None, False
        if self._cuda:
            # (torch.cuda.Event's __init__ is unannotated in torch)
            self._step_end_event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._step_end_event.record()
        return phases, caught_up
