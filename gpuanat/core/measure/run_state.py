"""What one training process has said about its run through its probe events: one rank's events, reduced.

A run's probe events reach gpuanat two ways: on the pipe of a child it launched (the recorded run of
`core/run/session.py`, and the dashboard's `LiveRun`), or in the publication file of a process it watches
(`core/watch/`, through `ObservedRun`). All three reduce them here, one `RankEvents` per training process, so a
launched and a watched run agree on what their latest step, their bands, their end and their error are.

The rules hold for events in any order a publication can give them: the bands kept are the latest measured (a step
carries bands measured at an earlier step); a step that is not past the last one is not a new step (a publication
file read again); a different `ModelInfo`, or one after `Done`, starts a new run of the same process (a script that
trains twice). What the samples say beside the events (peaks, the GPU's name, its busy share) belongs to the
owner, which reads the samples its own way.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field

from gpuanat.core.measure.loss_curve import LossCurve
from gpuanat.core.vocabulary.protocol import (
    Done,
    Error,
    Event,
    Hello,
    Malformed,
    Milestone,
    ModelInfo,
    Operations,
    ProbeBands,
    Step,
)

RECENT_STEPS_KEPT = 256
"""Steps kept for the current samples/s: more than any throughput window holds at a step every few ms."""


def _merged(first: Error, later: Error) -> Error:
    """One error told twice — by the probe, with its step and memory, then by gpuanat's script runner, with the
    traceback — as one: the first's figures, and what only the later one has."""
    return dataclasses.replace(
        first,
        **{
            item.name: getattr(later, item.name)
            for item in dataclasses.fields(first)
            if getattr(first, item.name) is None
        },
    )


@dataclass
class RankEvents:
    """What one training process (one rank of a distributed run) has said so far."""

    hello: Hello | None = None
    model: ModelInfo | None = None
    last_step: Step | None = None
    """The furthest step so far."""
    probe_bands: ProbeBands | None = None
    """The latest measured bands: of the step that measured last, or of `Done`; after an out-of-memory error, those
    at the failing allocation."""
    done: Done | None = None
    error: Error | None = None
    operations: Operations | None = None
    """The profiled steps' operations, when the probe was asked to profile them."""
    malformed: list[str] = field(default_factory=list)
    """Why each line that was no event was refused."""
    peak_reserved_bytes: int | None = None
    """torch's reserved memory at its highest, from the steps and `Done`."""
    step_ends_s: dict[int, float] = field(default_factory=dict)
    """Step number → time.monotonic() when it ended: where the steady window lies on the sampler's clock."""
    milestones: dict[str, float] = field(default_factory=dict)
    """Milestone name → time.monotonic() when the training process reached it; "first step" and "last step" from
    the steps' own times."""
    recent_steps: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_STEPS_KEPT)
    )
    """(elapsed s, samples) of the latest steps, for the current samples/s."""
    loss: LossCurve = field(default_factory=LossCurve)
    """What the loop logged: the loss curve, the latest loss, learning rate and gradients' norm."""

    def observe(self, event: Event | Malformed) -> Step | None:
        """Keep what `event` says; returns the step when it is a new one (past the last)."""
        if isinstance(event, Malformed):
            self.malformed.append(event.reason)
        elif isinstance(event, Hello):
            self.hello = event
        elif isinstance(event, ModelInfo):
            if event != self.model or self.done is not None:  # a new model, or the same again after the end
                self.model, self.done, self.last_step, self.operations = event, None, None, None
                self.loss = LossCurve()
                self.recent_steps.clear()
        elif isinstance(event, Step):
            return self._observe_step(event)
        elif isinstance(event, Milestone):
            self.milestones.setdefault(event.name, event.monotonic_s)
        elif isinstance(event, Done):
            self.done = event
            self.loss.observe(event)
            if event.bands is not None and (  # not over the bands of a failure that came before it
                self.probe_bands is None or event.bands.measured_at_step >= self.probe_bands.measured_at_step
            ):
                self.probe_bands = event.bands
            if event.peak_reserved_bytes is not None:
                self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, event.peak_reserved_bytes)
        elif isinstance(event, Error):
            self.error = event if self.error is None else _merged(self.error, event)
            failure = event.out_of_memory
            if failure is not None and failure.bands is not None:  # the bands at the failing allocation
                self.probe_bands = failure.bands
        elif isinstance(event, Operations):
            self.operations = event
        return None

    def _observe_step(self, step: Step) -> Step | None:
        self.loss.observe(step)
        if step.bands is not None and (
            self.probe_bands is None or step.bands.measured_at_step >= self.probe_bands.measured_at_step
        ):
            self.probe_bands = step.bands
        if step.reserved_bytes is not None:
            self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, step.reserved_bytes)
        if self.last_step is not None and step.step <= self.last_step.step:
            return None
        self.last_step = step
        self.recent_steps.append((step.elapsed_s, step.samples))
        if step.monotonic_s is not None:
            self.step_ends_s[step.step] = step.monotonic_s
            self.milestones.setdefault("first step", step.monotonic_s)
            self.milestones["last step"] = step.monotonic_s
        return step

    @property
    def failure_shown(self) -> Error | None:
        """The out-of-memory error whose failing allocation `probe_bands` holds (the allocator's and NVML's readings
        of that moment go with them: `failure.bands_readings`); None while the bands are a measured step's."""
        error = self.error
        failure = error.out_of_memory if error is not None else None
        if failure is None or failure.bands is None or failure.bands is not self.probe_bands:
            return None
        return error

    def samples_per_second(self, window_s: float) -> float | None:
        """Samples/s over the steps of about the last `window_s` seconds of training; None before two steps."""
        if len(self.recent_steps) < 2:
            return None
        last_elapsed_s, last_samples = self.recent_steps[-1]
        first_elapsed_s, first_samples = self.recent_steps[-2]
        for elapsed_s, samples in reversed(self.recent_steps):
            if last_elapsed_s - elapsed_s > window_s:
                break
            first_elapsed_s, first_samples = elapsed_s, samples
        if last_elapsed_s <= first_elapsed_s:
            return None
        return (last_samples - first_samples) / (last_elapsed_s - first_elapsed_s)


def rank_status(state: RankEvents, stopped_by_user: bool = False) -> str:
    """How one rank ended, from its own events; one that said neither done nor error was stopped when the user stopped
    the run (`stopped_by_user`), else it failed. In a run the user stopped, a rank's error other than running out of
    memory is the stop's doing (its collective lost a peer that stopped a step earlier): stopped, its error kept."""
    if state.error is not None:
        if state.error.kind == "oom":
            return "oom"
        return "stopped" if stopped_by_user else "failed"
    if state.done is not None:
        return "ok" if state.done.status == "ok" else "stopped"
    return "stopped" if stopped_by_user else "failed"
