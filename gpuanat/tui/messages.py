"""What the dashboards' threads tell the event loop: one small message per thing that happened.

A run's thread, a search's (fit, tune), the capability probe and the watch's save work off the event loop; they
never touch a widget. Each posts one of these to the dashboard screen, whose handler paints what it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from gpuanat.core.run.tune.search import Progress
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult


@dataclass
class RunStarted(Message):
    """A run's training process started (a search starts one per trial)."""

    run_id: int
    pid: int
    log_path: Path
    gpu_indices: tuple[int, ...] = ()
    """NVML index of each rank's GPU (rank 0 first); empty on the CPU or without NVML."""
    start_note: str | None = None
    """How its process started: warm (prepared ahead) or cold and why (`WarmStart.describe`)."""


@dataclass
class RunFinished(Message):
    """A run ended: its recorded result, or None with why it could not be recorded."""

    result: RunResult | None
    failure: str | None = None


@dataclass
class FitStarting(Message):
    """The fit's first trial batch: the predicted largest batch (`method`: `replay`, `model`; `eager` for the whole
    model compiled, which is not predicted), or the current batch without one (None)."""

    batch_size: int
    method: str | None


@dataclass
class FitTrialDone(Message):
    """One trial of the fit ended with `status` ("ok", "oom", ...)."""

    batch_size: int
    status: str


@dataclass
class FitFinished(Message):
    """The fit ended: the largest batch that trains, or why it stopped."""

    largest_batch_size: int | None
    failure: str | None


@dataclass
class TuneTrialDone(Message):
    """One trial of the tune ended; `progress` says where the search stands (the time left, or "estimating…")."""

    name: str
    status: str
    samples_per_second: float | None
    progress: Progress


@dataclass
class TuneRoundOrdered(Message):
    """A round of the tune begins from trial `center` (its index), its moves ordered as `reason` says: what the
    center's operations anatomy and bottleneck found (`core.run.tune.moves`)."""

    center: int
    reason: str


@dataclass
class TuneFinished(Message):
    """The tune ended: its best set with a summary of the search, or why none trained."""

    best: RunConfig | None
    summary: str | None
    failure: str | None


@dataclass
class CapabilitiesFound(Message):
    """The capability probe answered: what this machine can train, or why it could not tell."""

    capabilities: Capabilities | None
    failure: str | None


@dataclass
class WatchSaved(Message):
    """The watch began recording into the history as run `run_id`, or could not (`failure`)."""

    run_id: int | None
    failure: str | None


@dataclass
class DataLengthRead(Message):
    """--data's rows were read for the configured run's prediction (`data_lengths.DataLengths`): the panel repaints at
    the data's length."""
