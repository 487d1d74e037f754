"""What a watch has learned about the run it watches, from the probe events its processes publish.

`ObservedRun.observe_event` takes each event of the watched tree and hands it to the `Publisher` of the process that
published it: with torchrun, one rank, whose `RankEvents` (`run_state`, the same reduction as a launched run's) keeps
its hello, model, steps, bands, done and error. Rank 0 (without ranks, the first process that publishes) speaks for
the run: its state is the run's, and its new steps are kept for the history. The run's peaks are kept here too:
reserved memory from its events; GPU memory, RSS and CPU, which the watch's records raise as samples arrive, and the
main GPU's readings (its activity, power and energy for the result).

Plain Python: no torch, no UI; nothing here reads a sample or writes the history.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpuanat.core.measure.run_state import RankEvents
from gpuanat.core.measure.samples import GpuSample
from gpuanat.core.vocabulary.protocol import Event, Malformed, ProbeBands, Ranked, Step

THROUGHPUT_WINDOW_S = 5.0
"""Samples/s in a record is the rate over the published steps of about this many seconds of training."""
KEPT_STEPS = 20_000
KEPT_GPU_READINGS = 14_400
"""The main GPU's readings a watch keeps for the result's activity and energy (`measure.activity`): an hour at the
watch's 4 Hz; a longer run's steady medians are over its last hour."""


@dataclass
class Publisher:
    """One publishing process of the tree: with torchrun, one rank."""

    pid: int
    rank: int | None = None
    """From the process's RANK (torchrun, accelerate launch); None when unreadable or not set."""
    state: RankEvents = field(default_factory=RankEvents)
    """What it has published."""

    @property
    def probe_bands(self) -> ProbeBands | None:
        return self.state.probe_bands

    @property
    def reserved_bytes(self) -> int | None:
        """torch's reserved memory at its latest step."""
        return self.state.last_step.reserved_bytes if self.state.last_step else None

    @property
    def step(self) -> int | None:
        return self.state.last_step.step if self.state.last_step else None


def _rank_of(pid: int) -> int | None:
    with contextlib.suppress(psutil.Error, ValueError):
        rank = psutil.Process(pid).environ().get("RANK")
        return int(rank) if rank is not None else None
    return None


@dataclass
class ObservedRun:
    """What the watch has learned about the run: the probe events of its publishing processes, and peaks."""

    malformed: int = 0
    """Lines of the publications that were no event, every process's."""
    publisher_pid: int | None = None
    """The process that speaks for the run: rank 0, else the first that published."""
    peak_gpu_memory_bytes: int | None = None
    """The tree's GPU memory (NVML per-process, all GPUs) at its highest."""
    peak_device_used_bytes: int | None = None
    device_total_bytes: int | None = None
    gpu_name: str | None = None
    peak_rss_bytes: int | None = None
    peak_cpu_percent: float | None = None
    steps: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=KEPT_STEPS))
    """The run's new steps as records, for the history."""
    gpu_readings: collections.deque[tuple[float, GpuSample]] = field(
        default_factory=lambda: collections.deque(maxlen=KEPT_GPU_READINGS)
    )
    """(sampler time, the tree's main GPU without its process lists), the latest `KEPT_GPU_READINGS` samples."""
    publishers: dict[int, Publisher] = field(default_factory=dict)
    """Every publishing process, by PID, in the order they first published: each rank of a distributed job."""

    def observe_event(self, pid: int, event: Event | Ranked | Malformed) -> Step | None:
        """Take one event; returns the step when it is a new one of the run (for the history). A process publishes
        its own events: a `Ranked` envelope (what only gpuanat's rank launcher sends its parent) counts as malformed."""
        if isinstance(event, (Malformed, Ranked)):
            self.malformed += 1
            return None
        if pid not in self.publishers:
            self.publishers[pid] = Publisher(pid, rank=_rank_of(pid))
        new_step = self.publishers[pid].state.observe(event)
        if self.publisher_pid is None or (
            self.publishers[pid].rank == 0 and self.publishers[self.publisher_pid].rank != 0
        ):
            self.publisher_pid = pid  # rank 0 speaks for the run; without ranks, the first publisher
        if pid != self.publisher_pid or new_step is None:
            return None
        self.steps.append(dataclasses.asdict(new_step))
        return new_step

    @property
    def run(self) -> RankEvents:
        """The state of the process that speaks for the run (an empty one before any publishes): its hello, model,
        steps, bands, done, error and reserved peak."""
        return self.publishers[self.publisher_pid].state if self.publisher_pid is not None else _NOTHING_PUBLISHED


_NOTHING_PUBLISHED = RankEvents()
"""Read, never written: what a run that published nothing has said."""
