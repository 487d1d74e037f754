"""The moment memory ran out, caught where it happens: CUDA's caching allocator calls its out-of-memory observers
just before it raises `OutOfMemoryError`, with the allocation it tried, and the allocator's lock released — the
tensors of the failing step are all still alive then, and Python's frames say which module and line asked. The
state is read there (`OutOfMemoryCapture.observed`, by whoever describes it now: the probe while training, else
this module's loading description) and kept until the error reaches the loop's handler (`take`).

On the CPU there is no observer: the error's traceback keeps the failing step's frames (and so its tensors) alive
until it is handled, so the same description is read there from the traceback's frames.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from gpuanat.core.measure.gpus import rank_file_path
from gpuanat.core.vocabulary.config import OOM_SNAPSHOT_EVENTS, OOM_SNAPSHOT_VARIABLE
from gpuanat.core.vocabulary.protocol import OutOfMemory, ProbeBands
from gpuanat.worker.probe.device_memory import NvmlReader, allocator_bytes
from gpuanat.worker.probe.sink import warn


@dataclass(frozen=True)
class Failure:
    """Where an allocation failed, as the observer or the traceback tells it."""

    frames: list[types.FrameType]
    """Python's frames then, innermost first."""
    lines: list[int]
    """The line each frame was at then (a traceback's frame has moved on since: its line is the traceback's)."""
    autograd_node: Any
    """The autograd node running (a backward's operation), when one was."""
    failed_allocation_bytes: int | None
    device_free_bytes: int | None
    device_total_bytes: int | None


Describer = Callable[[Failure], OutOfMemory]


class OutOfMemoryCapture:
    """The process's one out-of-memory observer (torch has no way to detach one: it is attached once, and asks
    `describe`, which the probe sets while training)."""

    def __init__(self) -> None:
        self._describe: weakref.WeakMethod[Describer] | None = None
        self.last: OutOfMemory | None = None
        self.snapshot_path: str | None = None
        self._attached = False

    @property
    def describe(self) -> Describer | None:
        """The running probe's `state_at_failure`, held weakly: the observer lives as long as the process, and must
        not keep a probe (its model, gradients and optimizer) alive after its training was dropped, ended or failed."""
        return self._describe() if self._describe is not None else None

    @describe.setter
    def describe(self, method: Describer | None) -> None:
        self._describe = weakref.WeakMethod(method) if method is not None else None

    def attach(self) -> None:
        """Observe CUDA's out-of-memory errors from now on (a no-op without CUDA); when `--keep-oom-snapshot` asked
        (`OOM_SNAPSHOT_VARIABLE`), the allocator's history is recorded (bounded) and written there (a rank's own
        file) when memory runs out."""
        if not torch.cuda.is_available():
            return
        snapshot_path = rank_file_path(os.environ.get(OOM_SNAPSHOT_VARIABLE), os.environ)
        if snapshot_path and snapshot_path != self.snapshot_path:
            torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=OOM_SNAPSHOT_EVENTS)
            self.snapshot_path = snapshot_path
        if not self._attached:
            torch._C._cuda_attach_out_of_memory_observer(self.observed)  # type: ignore[attr-defined]  # (CUDA builds)
            self._attached = True

    def observed(self, device: int, allocation_bytes: int, device_total_bytes: int, device_free_bytes: int) -> None:
        """The allocator's call, just before it raises. Never raises itself (it would replace the real error)."""
        try:
            # (on autograd's own thread, in a backward, there is no Python caller: no frame above this one)
            frames = python_frames(sys._getframe().f_back)
            failure = Failure(
                frames=frames,
                lines=[frame.f_lineno for frame in frames],
                autograd_node=current_autograd_node(),
                failed_allocation_bytes=allocation_bytes,
                device_free_bytes=device_free_bytes,
                device_total_bytes=device_total_bytes,
            )
            describe = self.describe or describe_loading(torch.device("cuda", device))
            state = describe(failure)
            if self.snapshot_path:
                state = _with_snapshot(state, self.snapshot_path)
            self.last = state
        except Exception as error:  # a failure to describe leaves the error undescribed, never replaced
            warn(f"the memory at this out-of-memory error could not be read: {type(error).__name__}: {error}")

    def take(self) -> OutOfMemory | None:
        """The state at the last failure observed, once."""
        state, self.last = self.last, None
        return state


CAPTURE = OutOfMemoryCapture()


def _with_snapshot(state: OutOfMemory, path: str) -> OutOfMemory:
    """`state` with the allocator's snapshot written to `path` (memory_viz's file), if it could be."""
    try:
        torch.cuda.memory._dump_snapshot(path)  # type: ignore[no-untyped-call]
    except Exception:
        return state
    return dataclasses.replace(state, snapshot_path=path)


def python_frames(frame: types.FrameType | None) -> list[types.FrameType]:
    """`frame` and its callers, innermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def traceback_frames(error: BaseException) -> tuple[list[types.FrameType], list[int]]:
    """The frames an exception passed through, innermost first, and the line each was at."""
    frames, lines = [], []
    traceback = error.__traceback__
    while traceback is not None:
        frames.append(traceback.tb_frame)
        lines.append(traceback.tb_lineno)
        traceback = traceback.tb_next
    return frames[::-1], lines[::-1]


def current_autograd_node() -> Any:
    """The autograd node the engine runs on this thread (a backward operation, e.g. `MmBackward0`), if any."""
    try:
        return torch._C._current_autograd_node()
    except Exception:
        return None


_TORCH_FOLDER = os.path.dirname(torch.__file__) + os.sep
_PROBE_FOLDER = os.path.dirname(__file__) + os.sep


def operation_line(failure: Failure) -> str | None:
    """The source line that asked for the memory: the innermost frame outside torch's own Python and the probe,
    as `code  (file:line)`; else the innermost frame's."""
    placed = [
        (frame, line)
        for frame, line in zip(failure.frames, failure.lines, strict=True)
        if not frame.f_code.co_filename.startswith(_PROBE_FOLDER)
    ]
    outside = [(frame, line) for frame, line in placed if not frame.f_code.co_filename.startswith(_TORCH_FOLDER)]
    if not (outside or placed):
        return None
    chosen, line = (outside or placed)[0]
    filename = chosen.f_code.co_filename
    code = linecache.getline(filename, line).strip() or chosen.f_code.co_name
    return f"{code}  ({short_path(filename)}:{line})"


def short_path(filename: str) -> str:
    """A source file's path from its package on (site-packages/transformers/models/… → transformers/models/…)."""
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.basename(filename)


def module_of_frames(frames: Iterable[types.FrameType], names: dict[int, str]) -> str | None:
    """The innermost module (by its path in `names`, keyed by id) whose `forward` is among `frames`."""
    for frame in frames:
        if frame.f_code.co_name != "forward":
            continue
        code = frame.f_code
        module = frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None  # its `self`, by any name
        if module is not None and id(module) in names:
            return names[id(module)]
    return None


def phase_of_frames(frames: Iterable[types.FrameType]) -> str | None:
    """ "optimizer" when the optimizer's code is running, "backward" in autograd's engine call; None otherwise."""
    files = [frame.f_code.co_filename for frame in frames]
    if any(f"{os.sep}optim{os.sep}" in name and name.startswith(_TORCH_FOLDER) for name in files):
        return "optimizer"
    if any(name.startswith(_TORCH_FOLDER) and name.endswith(f"autograd{os.sep}graph.py") for name in files):
        return "backward"
    return None


def describe_loading(device: torch.device) -> Describer:
    """Before training begins (the model moving to its device): everything allocated is the model's so far."""

    def describe(failure: Failure) -> OutOfMemory:
        allocated = reserved = None
        used = process = None
        if device.type == "cuda":
            allocated, _, reserved = allocator_bytes(device)
            reader = NvmlReader.open(device)
            if reader is not None:
                used, process = reader.read()
                reader.close()
        bands = (
            ProbeBands(
                weights_bytes=allocated,
                gradients_bytes=0,
                optimizer_state_bytes=0,
                activations_bytes=0,
                activations_method="allocator",
                batch_bytes=0,
                measured_at_step=0,
                optimizer_state_at_forward_end_bytes=0,
            )
            if allocated is not None
            else None
        )
        return OutOfMemory(
            phase="loading",
            failed_allocation_bytes=failure.failed_allocation_bytes,
            device_free_bytes=failure.device_free_bytes,
            device_total_bytes=failure.device_total_bytes,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            operation=operation_line(failure),
            bands=bands,
            nvml_device_used_bytes=used,
            nvml_process_used_bytes=process,
        )

    return describe


def cpu_failure(error: BaseException, failed_allocation_bytes: int | None) -> Failure:
    """A CPU run's failure, from its error's traceback."""
    frames, lines = traceback_frames(error)
    return Failure(
        frames=frames,
        lines=lines,
        autograd_node=None,
        failed_allocation_bytes=failed_allocation_bytes,
        device_free_bytes=None,
        device_total_bytes=None,
    )
