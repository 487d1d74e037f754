"""What a watch has learned about the run it watches, from the probe events its processes publish.

`ObservedRun.observe_event` takes each event of the watched tree. Rank 0 (without ranks, the first process that
publishes) speaks for the run: its hello, model, steps, done and error, the steps kept for the history and the
recent ones that give the current samples/s. Every publishing process, each rank of a distributed job, also keeps
its own `Publisher`: its bands, reserved memory and step. The run's peaks are kept here too: reserved memory from
its events; GPU memory, RSS and CPU, which the watch's records raise as samples arrive.

Plain Python: no torch, no UI; nothing here reads a sample or writes the history.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpuanat.core.run.protocol import Done, Error, Event, Hello, Malformed, ModelInfo, ProbeBands, Step

THROUGHPUT_WINDOW_S = 5.0
"""Samples/s in a record is the rate over the published steps of about this many seconds of training."""
KEPT_STEPS = 20_000


@dataclass
class Publisher:
    """What one publishing process of the tree has said: with torchrun, one rank."""

    pid: int
    rank: int | None = None
    """From the process's RANK (torchrun, accelerate launch); None when unreadable or not set."""
    probe_bands: ProbeBands | None = None
    reserved_bytes: int | None = None
    step: int | None = None

    def observe(self, event: Event) -> None:
        if isinstance(event, (Step, Done)) and event.bands is not None and (
                self.probe_bands is None or event.bands.measured_at_step >= self.probe_bands.measured_at_step):
            self.probe_bands = event.bands
        if isinstance(event, Step):
            self.step = event.step if self.step is None else max(self.step, event.step)
            if event.reserved_bytes is not None:
                self.reserved_bytes = event.reserved_bytes


def _rank_of(pid: int) -> int | None:
    with contextlib.suppress(psutil.Error, ValueError):
        rank = psutil.Process(pid).environ().get("RANK")
        return int(rank) if rank is not None else None
    return None


@dataclass
class ObservedRun:
    """What the watch has learned about the run: probe events of the publishing process, and peaks."""

    hello: Hello | None = None
    model: ModelInfo | None = None
    last_step: Step | None = None
    probe_bands: ProbeBands | None = None
    done: Done | None = None
    error: Error | None = None
    malformed: int = 0
    publisher_pid: int | None = None
    peak_reserved_bytes: int | None = None
    peak_gpu_memory_bytes: int | None = None
    """The tree's GPU memory (NVML per-process, all GPUs) at its highest."""
    peak_device_used_bytes: int | None = None
    device_total_bytes: int | None = None
    gpu_name: str | None = None
    peak_rss_bytes: int | None = None
    peak_cpu_percent: float | None = None
    recent_steps: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=256))
    """(elapsed s, samples) of the latest published steps, for the current samples/s."""
    steps: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=KEPT_STEPS))
    publishers: dict[int, Publisher] = field(default_factory=dict)
    """Every publishing process, by PID, in the order they first published: each rank of a distributed job."""

    def observe_event(self, pid: int, event: Event | Malformed) -> Step | None:
        """Take one event; returns the step when it is a new one (for the history)."""
        if isinstance(event, Malformed):
            self.malformed += 1
            return None
        if pid not in self.publishers:
            self.publishers[pid] = Publisher(pid, rank=_rank_of(pid))
        self.publishers[pid].observe(event)
        if self.publisher_pid is None or (self.publishers[pid].rank == 0
                                          and self.publishers[self.publisher_pid].rank != 0):
            self.publisher_pid = pid  # rank 0 speaks for the run; without ranks, the first publisher
        if pid != self.publisher_pid:
            return None
        if isinstance(event, Hello):
            self.hello = event
        elif isinstance(event, ModelInfo):
            # A rewritten publication file starts over with the same ModelInfo; a new model means a new run.
            if event != self.model or self.done is not None:
                self.model, self.done, self.last_step = event, None, None
                self.recent_steps.clear()
        elif isinstance(event, Step):
            if event.bands is not None and (self.probe_bands is None
                                            or event.bands.measured_at_step >= self.probe_bands.measured_at_step):
                self.probe_bands = event.bands
            if event.reserved_bytes is not None:
                self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, event.reserved_bytes)
            if self.last_step is not None and event.step <= self.last_step.step:
                return None
            self.last_step = event
            self.recent_steps.append((event.elapsed_s, event.samples))
            record = dataclasses.asdict(event)
            self.steps.append(record)
            return event
        elif isinstance(event, Done):
            self.done = event
            if event.bands is not None:
                self.probe_bands = event.bands
            if event.peak_reserved_bytes is not None:
                self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, event.peak_reserved_bytes)
        elif isinstance(event, Error):
            self.error = event
        return None

    def samples_per_second(self) -> float | None:
        """Samples/s over the last `THROUGHPUT_WINDOW_S` seconds of published steps."""
        if len(self.recent_steps) < 2:
            return None
        last_elapsed_s, last_samples = self.recent_steps[-1]
        first_elapsed_s, first_samples = self.recent_steps[-2]
        for elapsed_s, samples in reversed(self.recent_steps):
            if last_elapsed_s - elapsed_s > THROUGHPUT_WINDOW_S:
                break
            first_elapsed_s, first_samples = elapsed_s, samples
        if last_elapsed_s <= first_elapsed_s:
            return None
        return (last_samples - first_samples) / (last_elapsed_s - first_elapsed_s)
