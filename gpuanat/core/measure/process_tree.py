"""The tracked processes on the host: a walk of the process tree under the tracked pids, and their CPU and RSS.

`HostProcessMeter` keeps psutil's `Process` objects between reads (psutil needs two readings to know a CPU rate)
and re-walks the tree only now and then, because a walk reads /proc of every process on the machine. Every live
source measures the host through it; `HostOnlySource` is that alone, for machines where NVML is unavailable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import ClassVar

import psutil

from gpuanat.core.measure.samples import HostProcess, HostSample, Sample


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this PID exists (one we may not signal counts).

    psutil checks that the id names a process, not one of its threads: `kill(tid, 0)` accepts a live thread's id,
    so a recorder PID reused as a thread id would read as alive."""
    return pid is not None and pid > 0 and psutil.pid_exists(pid)


DEFAULT_DESCENDANTS_REFRESH_S = 1.0
"""How often the process tree under the tracked pids is re-walked. Walking it reads /proc/*/stat for
every process on the machine (1.9 ms of CPU at 190 processes on the H100 machine), too much to do at 4 Hz;
DataLoader workers and other descendants are picked up within this delay, or within
`DESCENDANTS_REFRESH_MAX_S` once the tree has stayed the same."""

DESCENDANTS_REFRESH_MAX_S = 4.0
"""The longest wait between walks: each walk that finds the tree unchanged doubles the wait up to this, and a
change (a process new or gone, other tracked pids) brings it back to the refresh interval."""


class HostProcessMeter:
    """CPU and RSS of the tracked pids and their descendants, through cached psutil processes.

    psutil's `cpu_percent` is the CPU time since the previous call on the same `Process` object,
    so the objects are kept between reads; a process met for the first time reads 0.0.
    """

    def __init__(
        self, descendants_refresh_s: float, per_process: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._descendants_refresh_s = descendants_refresh_s
        self._per_process = per_process
        self._clock = clock
        self._processes: dict[int, psutil.Process] = {}
        self._roots: frozenset[int] = frozenset()
        self._tree_walked_at_s = -math.inf
        self._walk_wait_s = descendants_refresh_s

    def measure(self, pids: Iterable[int]) -> HostSample:
        roots = frozenset(pids)
        now_s = self._clock()
        if roots != self._roots or now_s - self._tree_walked_at_s >= self._walk_wait_s:
            walked = self._walk_tree(roots)
            unchanged = roots == self._roots and walked.keys() == self._processes.keys()
            self._walk_wait_s = (
                min(2 * self._walk_wait_s, max(DESCENDANTS_REFRESH_MAX_S, self._descendants_refresh_s))
                if unchanged
                else self._descendants_refresh_s
            )
            self._processes = walked
            self._roots = roots
            self._tree_walked_at_s = now_s
        cpu_percent = 0.0
        rss_bytes = 0
        measured = 0
        details: list[HostProcess] = []
        for pid, process in list(self._processes.items()):
            try:
                with process.oneshot():
                    process_cpu_percent = process.cpu_percent(interval=None)
                    process_rss_bytes = process.memory_info().rss
                    if self._per_process:
                        details.append(
                            HostProcess(
                                pid=pid,
                                parent_pid=process.ppid(),
                                name=process.name(),
                                cpu_percent=process_cpu_percent,
                                rss_bytes=process_rss_bytes,
                            )
                        )
            except psutil.NoSuchProcess:
                del self._processes[pid]
                continue
            except psutil.AccessDenied:
                continue
            cpu_percent += process_cpu_percent
            rss_bytes += process_rss_bytes
            measured += 1
        if not measured:
            return HostSample(cpu_percent=None, rss_bytes=None)
        return HostSample(cpu_percent=cpu_percent, rss_bytes=rss_bytes, processes=tuple(details))

    def _walk_tree(self, roots: frozenset[int]) -> dict[int, psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in roots:
            root = self._processes.get(pid)
            try:
                if root is None or not root.is_running():
                    root = psutil.Process(pid)
                found[pid] = root
                descendants = root.children(recursive=True)
            except psutil.Error:
                continue
            for child in descendants:
                cached = self._processes.get(child.pid)
                # psutil compares pid and creation time, so a reused pid is a new process.
                found[child.pid] = cached if cached == child else child
        return found

    def clear(self) -> None:
        self._processes = {}
        self._roots = frozenset()
        self._tree_walked_at_s = -math.inf
        self._walk_wait_s = self._descendants_refresh_s


class HostOnlySource:
    """Host metrics of the tracked processes when NVML is unavailable: `gpus` is always empty.

    With `per_process=True` each sample also lists every process of the tree (`HostSample.processes`)."""

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(
        self, *, descendants_refresh_s: float = DEFAULT_DESCENDANTS_REFRESH_S, per_process: bool = False
    ) -> None:
        self._host = HostProcessMeter(descendants_refresh_s, per_process)

    def read(self, pids: Iterable[int]) -> Sample:
        return Sample(t_s=time.monotonic(), gpus=(), host=self._host.measure(pids))

    def close(self) -> None:
        self._host.clear()
