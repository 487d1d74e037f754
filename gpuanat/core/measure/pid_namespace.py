"""NVML's PIDs against ours: detect when they come from another PID namespace, and map them where /proc can.

NVML reports the PIDs of the host's PID namespace. Inside a container gpuanat sees the container's PIDs, so
the PIDs NVML lists do not exist here (or, by coincidence, are other processes). `PidNamespaceResolver`
notices that and maps what /proc makes possible:
1. a PID that exists here and, when its open files can be read, holds a `/dev/nvidia*` device: the same process;
2. a PID that appears as an outer level of a process's `NSpid:` line in /proc/<pid>/status (we see both levels);
3. the one PID NVML lists that is not visible here, when exactly one process of the watched tree holds a
   `/dev/nvidia*` device open and no other NVML PID is already that process.
Anything else stays unmapped, and `PidMapping.note` says so in a sentence for the user.

Plain Python; `proc_root` is injectable so tests can build the /proc of a container.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
FD_RESCAN_S = 2.0
"""How long what a process holds open is remembered before it is read again."""


@dataclass(frozen=True)
class PidMapping:
    """How the PIDs NVML listed relate to the PIDs visible here."""

    local_by_nvml: dict[int, int] = field(default_factory=dict)
    """NVML PID -> the PID of the same process here, for every PID that could be placed."""
    foreign: tuple[int, ...] = ()
    """NVML PIDs that are not processes visible here (another PID namespace) and could not be mapped."""
    other_namespace: bool = False
    """True when NVML's PIDs evidently come from another PID namespace than ours."""
    note: str | None = None
    """What to tell the user about it; None when NVML's PIDs are ours."""

    def nvml_pids_of(self, local_pids: Iterable[int]) -> set[int]:
        """The NVML PIDs that are these local processes."""
        wanted = set(local_pids)
        return {nvml_pid for nvml_pid, local_pid in self.local_by_nvml.items() if local_pid in wanted}


class PidNamespaceResolver:
    """Maps NVML PIDs onto local ones (see the module docstring), remembering what it read for a while."""

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        *,
        clock: Callable[[], float] = time.monotonic,
        fd_rescan_s: float = FD_RESCAN_S,
        check_visible_pids: bool = True,
    ) -> None:
        """`check_visible_pids=False` takes an NVML PID that exists here for the same process without looking
        at its open files: for NVML data replayed onto a live process that never opened a GPU."""
        self._proc_root = proc_root
        self._check_visible_pids = check_visible_pids
        self._clock = clock
        self._fd_rescan_s = fd_rescan_s
        self._holds_gpu: dict[int, tuple[float, bool | None]] = {}

    def _exists(self, pid: int) -> bool:
        return (self._proc_root / str(pid)).is_dir()

    def holds_gpu_device(self, pid: int) -> bool | None:
        """Whether `pid` has a /dev/nvidia* device open; None when its open files cannot be read."""
        now_s = self._clock()
        cached = self._holds_gpu.get(pid)
        if cached is not None and now_s - cached[0] < self._fd_rescan_s:
            return cached[1]
        answer: bool | None
        fd_dir = self._proc_root / str(pid) / "fd"
        try:
            entries = os.listdir(fd_dir)
        except OSError:
            answer = None
        else:
            answer = False
            for entry in entries:
                try:
                    target = os.readlink(fd_dir / entry)
                except OSError:
                    continue
                if target.startswith(NVIDIA_DEVICE_PREFIX):
                    answer = True
                    break
        self._holds_gpu[pid] = (now_s, answer)
        return answer

    def _nspid_levels(self, pid: int) -> list[int]:
        """The process's PID in each namespace from ours inwards (the NSpid line); [] when unreadable."""
        try:
            status = (self._proc_root / str(pid) / "status").read_text()
        except OSError:
            return []
        for line in status.splitlines():
            if line.startswith("NSpid:"):
                return [int(value) for value in line.split()[1:] if value.isdigit()]
        return []

    def resolve(self, nvml_pids: Iterable[int], tree_pids: Iterable[int]) -> PidMapping:
        """Place each NVML PID; `tree_pids` are the local processes being watched."""
        nvml = sorted(set(nvml_pids))
        tree = sorted(set(tree_pids))
        if not nvml:
            return PidMapping()
        mapped: dict[int, int] = {}
        unplaced: list[int] = []
        coincidences = 0
        for pid in nvml:
            if self._exists(pid):
                if self._check_visible_pids and self.holds_gpu_device(pid) is False:
                    coincidences += 1  # a process of ours with that number, but not on a GPU: another one
                    unplaced.append(pid)
                else:
                    mapped[pid] = pid
            else:
                unplaced.append(pid)
        if not unplaced:
            return PidMapping(local_by_nvml=mapped)

        not_here = len(unplaced)
        how: list[str] = []
        outer_levels = {level: pid for pid in tree for level in self._nspid_levels(pid)[1:]}
        for nvml_pid in list(unplaced):
            if nvml_pid in outer_levels:
                mapped[nvml_pid] = outer_levels[nvml_pid]
                unplaced.remove(nvml_pid)
                how.append(f"{nvml_pid}→{outer_levels[nvml_pid]} through NSpid")
        if len(unplaced) == 1:
            on_gpu = [pid for pid in tree if pid not in mapped.values() and self.holds_gpu_device(pid)]
            if len(on_gpu) == 1:
                mapped[unplaced[0]] = on_gpu[0]
                how.append(
                    f"{unplaced[0]}→{on_gpu[0]}, the only process of the watched tree with a /dev/nvidia* device open"
                )
                unplaced = []
        note = (
            f"NVML lists PIDs from another PID namespace (a container?): {not_here} of {len(nvml)} are "
            "not processes here"
        )
        if coincidences:
            note += f" ({coincidences} number{'s' if coincidences > 1 else ''} taken here by a process without a GPU)"
        if how:
            note += "; mapped " + ", ".join(how)
        if unplaced:
            note += f"; unmapped: {', '.join(str(pid) for pid in unplaced)}"
        return PidMapping(local_by_nvml=mapped, foreign=tuple(unplaced), other_namespace=True, note=note)
