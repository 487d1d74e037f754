"""Replaying recorded traces: the real sampling code fed with data recorded on a real GPU.

- `ReplaySource`: plays back a JSON-lines trace that a `Sampler` recorded (`trace_path`), so tests run the real
  sampling code on data recorded on a real GPU;
- `ReplayGpuSource`: the GPUs of a recorded trace with live host metrics, so tests watch a real process through
  recorded NVML data.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import ClassVar

from gpuanat.core.measure.process_tree import DEFAULT_DESCENDANTS_REFRESH_S, HostProcessMeter
from gpuanat.core.measure.samples import Sample


class ReplaySource:
    """Plays back a trace recorded by `Sampler(trace_path=...)`: one `Sample.to_json` per line.

    Each `read` returns the next recorded sample with its recorded `t_s` and host metrics (the
    `pids` argument is ignored), and raises `StopIteration` after the last one. The whole trace is
    parsed up front, so a malformed line fails the constructor with its line number.
    """

    keeps_recorded_time: ClassVar[bool] = True

    def __init__(self, path: Path | str, *, remap_pids: dict[int, int] | None = None) -> None:
        """`remap_pids` maps recorded GPU process PIDs onto others, e.g. the recorded training
        PID onto a live one, so code that looks up its own PID finds the recorded usage."""
        self.path = Path(path)
        self._remap_pids = dict(remap_pids or {})
        self._samples = self._load()
        self._next: Iterator[Sample] = iter(self._samples)

    def _load(self) -> list[Sample]:
        samples = []
        with self.path.open(encoding="utf-8") as trace:
            for line_number, line in enumerate(trace, start=1):
                if not line.strip():
                    continue
                try:
                    sample = Sample.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError) as error:
                    raise ValueError(f"{self.path}:{line_number}: not a recorded sample: {error}") from error
                samples.append(self._remapped(sample))
        return samples

    def _remapped(self, sample: Sample) -> Sample:
        if not self._remap_pids:
            return sample
        gpus = tuple(
            dataclasses.replace(
                gpu,
                processes=tuple(
                    dataclasses.replace(process, pid=self._remap_pids.get(process.pid, process.pid))
                    for process in gpu.processes
                ),
                process_utilization=None
                if gpu.process_utilization is None
                else tuple(
                    dataclasses.replace(entry, pid=self._remap_pids.get(entry.pid, entry.pid))
                    for entry in gpu.process_utilization
                ),
            )
            for gpu in sample.gpus
        )
        return dataclasses.replace(sample, gpus=gpus)

    def __len__(self) -> int:
        return len(self._samples)

    def read(self, pids: Iterable[int]) -> Sample:
        return next(self._next)

    def close(self) -> None:
        self._next = iter(())


class ReplayGpuSource:
    """The GPUs of a recorded trace, one sample per read, with live host metrics of the tracked processes.

    Tests watch a real process through real NVML data this way. Samples are stamped live; `read` raises
    `StopIteration` after the last recorded one.
    """

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(
        self,
        replay: ReplaySource,
        *,
        per_process: bool = True,
        descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S,
    ) -> None:
        self._replay = replay
        self._host = HostProcessMeter(descendants_refresh_s, per_process)

    def read(self, pids: Iterable[int]) -> Sample:
        pids = frozenset(pids)
        recorded = self._replay.read(pids)
        return Sample(t_s=time.monotonic(), gpus=recorded.gpus, host=self._host.measure(pids))

    def close(self) -> None:
        self._replay.close()
        self._host.clear()
