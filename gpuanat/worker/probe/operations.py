"""The operations anatomy's profiler, inside the training process: a few steps after warm-up under torch.profiler
(Kineto), read into one row a kernel (`KernelRow`) — which kernel, launched by which operator, in or out of the
optimizer's step, how often, how long, its FLOPs and bytes from the operator's shapes — classified by
`core.operations.classify`, and sent as one `Operations` event. The probe's core calls `step_begins` and
`step_ends`; this module knows nothing else of the loop.

The profiler starts one step early (its warm-up: CUPTI's start-up costs land there) and stops after the profiled
steps; the steps around it run without it. Asked by `GPUANAT_PROFILE_OPS` (steps to profile) and
`GPUANAT_PROFILE_OPS_TRACE` (where to write the Chrome/Perfetto trace) in the environment, or by the probe's
`profile_ops` argument.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from gpuanat.core.measure.gpus import rank_file_path
from gpuanat.core.operations.classify import PROFILER_MARKERS, group_of, group_of_op
from gpuanat.core.operations.counts import contraction_flops, estimated_flops, moved_bytes
from gpuanat.core.vocabulary.config import PROFILE_OPS_TRACE_VARIABLE, PROFILE_OPS_VARIABLE
from gpuanat.core.vocabulary.protocol import Event, KernelRow, Operations
from gpuanat.worker.probe.sink import warn

MAX_ROWS = 200
"""Kernel rows an event carries, the longest first; the rest are summed into one row a group."""
MAX_NAME_CHARS = 300
"""A kernel's name is cut to this many characters (C++ template names run to thousands)."""
OPTIMIZER_RANGES = ("Optimizer.step#", "Optimizer.zero_grad#")
DEVICE_RANGES = (*PROFILER_MARKERS, "Optimizer.")
"""Ranges torch draws on the device's timeline too (the profiler's steps, the optimizer's step): not work. (A
compiled region's Triton kernel has a CPU range of its own name: its device event is work.)"""
ANNOTATION_ACTIVITY_TYPES = (1, 2)
"""Kineto's USER_ANNOTATION and GPU_USER_ANNOTATION: ranges drawn on the GPU's timeline, not work."""


def requested_steps(environment: Mapping[str, str] | None = None) -> tuple[int, str | None]:
    """(steps to profile, trace path) asked through the environment; (0, None) when not asked or unreadable."""
    environment = os.environ if environment is None else environment
    text = environment.get(PROFILE_OPS_VARIABLE, "").strip()
    steps = int(text) if text.isdigit() else 0
    return steps, rank_file_path(environment.get(PROFILE_OPS_TRACE_VARIABLE) or None, environment)


class OperationsProfiler:
    """Profiles `steps` optimizer steps from `first_step` (the step before warms the profiler up) and emits their
    `Operations` through `emit`."""

    def __init__(
        self, steps: int, first_step: int, *, cuda: bool, trace_path: str | None, emit: Callable[[Event], None]
    ) -> None:
        self.steps = steps
        self.first_step = max(2, first_step)
        self.last_step = self.first_step + steps - 1
        self._cuda = cuda
        self._trace_path = trace_path
        self._emit = emit
        self._profile: Any = None
        self._started_s: float | None = None
        self.done = False

    def step_begins(self, step: int) -> None:
        if self.done or self._profile is not None or step != self.first_step - 1:
            return
        try:
            self._start()
        except Exception as error:  # a profiler that cannot start costs the run its operations, nothing else
            self._fail(error)

    def _start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile = torch.profiler.profile(
            activities=activities,
            record_shapes=True,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=self.steps, repeat=1),
            on_trace_ready=self._read,
        )
        self._profile.__enter__()

    def step_ends(self, step: int) -> None:
        """Called at every step's end, before the probe reads its clock."""
        if self._profile is None or self.done:
            return
        try:
            self._step_ends(step)
        except Exception as error:  # reading the profile failed: the run goes on, measured as without it
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        warn(f"profiling the operations failed (training goes on, without them): {type(error).__name__}: {error}")
        with contextlib.suppress(Exception):
            self.stop()
        self.done = True

    def _step_ends(self, step: int) -> None:
        if step == self.first_step - 1:
            self._synchronize()
            self._started_s = time.perf_counter()
        elif step == self.last_step:
            self._synchronize()
            self._wall_s = time.perf_counter() - (self._started_s or time.perf_counter())
        self._profile.step()  # after the last profiled step: `_read`
        if step >= self.last_step:
            self._profile.__exit__(None, None, None)
            self._profile = None
            self.done = True

    def stop(self) -> None:
        """Training ended before the profiled steps did: the profiler stops, nothing is sent."""
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            self._profile = None
        self.done = True

    def _synchronize(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    def _read(self, profile: Any) -> None:
        started_s = time.perf_counter()
        trace_error = None
        if self._trace_path is not None:
            try:
                profile.export_chrome_trace(self._trace_path)
            except (OSError, RuntimeError) as error:
                trace_error = f"{type(error).__name__}: {error}"
        rows = kernel_rows(profile.events(), cuda=self._cuda)
        self._emit(
            Operations(
                device="cuda" if self._cuda else "cpu",
                first_step=self.first_step,
                profiled_steps=self.steps,
                wall_s=getattr(self, "_wall_s", 0.0),
                processing_s=time.perf_counter() - started_s,
                kernels=rows,
                trace_path=self._trace_path if trace_error is None and self._trace_path else None,
                trace_error=trace_error,
            )
        )


def _is_cpu(event: Any) -> bool:
    return bool(event.device_type == torch.profiler.DeviceType.CPU)


def _in_optimizer(event: Any, cache: dict[int, bool]) -> bool:
    """Whether `event` runs inside the optimizer's step or zero_grad (a record_function range torch's optimizers
    open)."""
    chain = []
    node, found = event, False
    while node is not None:
        key = id(node)
        if key in cache:
            found = cache[key]
            break
        chain.append(key)
        if node.name.startswith(OPTIMIZER_RANGES):
            found = True
            break
        node = node.cpu_parent
    for key in chain:
        cache[key] = found
    return found


def _context(event: Any, cache: dict[int, Any]) -> Any:
    """The operator a launch serves: the innermost ATen operator around (or at) `event` whose name says its kind
    (`group_of_op`: autocast's cast inside `aten::linear` is a cast, the zeros inside `aten::embedding_backward` are
    the embedding's), else `event` itself."""
    key = id(event)
    if key not in cache:
        node = event
        while node is not None and group_of_op(node.name) is None:
            node = node.cpu_parent
        cache[key] = node if node is not None else event
    return cache[key]


def _flop_source(event: Any) -> Any:
    """The outermost operator around (or at) `event` whose FLOPs its shapes give: the one the FLOPs are counted at."""
    source, node = None, event
    while node is not None:
        if node.name.startswith("aten::") and contraction_flops(node.name, node.input_shapes or []) is not None:
            source = node
        node = node.cpu_parent
    return source


def _counts(event: Any, group: str, counted: set[int]) -> tuple[float | None, float | None]:
    """(FLOPs, bytes) to put on the first row `event` (an operator) launched: at its flop source, once."""
    source = _flop_source(event)
    if source is not None:
        if id(source) in counted:
            return 0.0, 0.0
        counted.add(id(source))
        shapes = source.input_shapes or []
        return (
            float(contraction_flops(source.name, shapes) or 0),
            _float(moved_bytes(source.name, shapes, getattr(source, "input_dtypes", None) or [])),
        )
    shapes = event.input_shapes or []
    return (
        _float(estimated_flops(group, shapes, event.name)),
        _float(moved_bytes(event.name, shapes, getattr(event, "input_dtypes", None) or [])),
    )


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


def kernel_rows(events: Iterable[Any], *, cuda: bool) -> list[KernelRow]:
    """The profiled events as rows: on a GPU run every kernel and memory copy, on a CPU run every operator's own
    time, each with the operator it serves, group, launches, time, FLOPs and bytes.

    On a GPU the profiler hands each operator the kernels it launched (`FunctionEvent.kernels`, what its
    `key_averages` counts); a device event no operator claims (a compiled region's Triton kernel) is counted from the
    device's own events, with no operator."""
    events = list(events)
    optimizer_cache: dict[int, bool] = {}
    context_cache: dict[int, Any] = {}
    counted: set[int] = set()
    totals: dict[tuple[str, str | None, bool], list[Any]] = defaultdict(lambda: [0, 0.0, None, None, ""])
    device = "cuda" if cuda else "cpu"

    launches: dict[int, tuple[Any, list[tuple[str, str | None, bool]]]] = {}

    def add(name: str, op_event: Any, time_s: float, calls: int = 1) -> None:
        op = _context(op_event, context_cache).name if op_event is not None else None
        optimizer = op_event is not None and _in_optimizer(op_event, optimizer_cache)
        key = (name[:MAX_NAME_CHARS], op, optimizer)
        entry = totals[key]
        entry[0] += calls
        entry[1] += time_s
        entry[4] = group_of(name, op, optimizer=optimizer, device=device)
        if op_event is not None:
            launches.setdefault(id(op_event), (op_event, []))[1].append(key)

    def count_flops_and_bytes() -> None:
        """Each operator's FLOPs and bytes, once, on the longest of its kernels that is no memory copy (a GEMM's
        workspace memset is not where its FLOPs are)."""
        for op_event, keys in launches.values():
            computing = [key for key in keys if totals[key][4] != "memory_copies"] or keys
            key = max(computing, key=lambda key: totals[key][1])
            flops, moved = _counts(op_event, totals[key][4], counted)
            if flops is not None:
                totals[key][2] = (totals[key][2] or 0.0) + flops
            if moved is not None:
                totals[key][3] = (totals[key][3] or 0.0) + moved

    cpu_events = [
        event
        for event in events
        if _is_cpu(event) and not event.is_async and not event.name.startswith(PROFILER_MARKERS)
    ]
    if not cuda:
        for event in cpu_events:
            if event.self_cpu_time_total > 0:
                add(event.name, event, event.self_cpu_time_total / 1e6)
        count_flops_and_bytes()
        return _rows(totals)
    device_events: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    annotations: set[str] = set()
    for event in events:
        if _is_cpu(event):
            continue
        if (
            getattr(event, "is_user_annotation", False)
            or event.name.startswith(DEVICE_RANGES)
            or getattr(event, "activity_type", None) in ANNOTATION_ACTIVITY_TYPES
        ):
            annotations.add(event.name)
            continue
        device_events[event.name][0] += 1
        device_events[event.name][1] += event.time_range.elapsed_us() / 1e6
    claimed: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in cpu_events:
        for kernel in event.kernels:
            if kernel.name in annotations or kernel.name not in device_events:
                continue
            add(kernel.name, event, kernel.duration / 1e6)
            claimed[kernel.name][0] += 1
            claimed[kernel.name][1] += kernel.duration / 1e6
    for name, (calls, time_s) in device_events.items():
        unclaimed_calls, unclaimed_s = calls - claimed[name][0], time_s - claimed[name][1]
        if unclaimed_calls > 0 and unclaimed_s > 0:
            add(name, None, unclaimed_s, int(unclaimed_calls))
    count_flops_and_bytes()
    return _rows(totals)


def _rows(totals: dict[tuple[str, str | None, bool], list[Any]]) -> list[KernelRow]:
    rows = [
        KernelRow(
            name=name, op=op, optimizer=optimizer, group=group, calls=calls, time_s=time_s, flops=flops, bytes=moved
        )
        for (name, op, optimizer), (calls, time_s, flops, moved, group) in totals.items()
    ]
    rows.sort(key=lambda row: row.time_s, reverse=True)
    return rows[:MAX_ROWS] + _summed_by_group(rows[MAX_ROWS:])


def _summed_by_group(rows: list[KernelRow]) -> list[KernelRow]:
    """Rows beyond `MAX_ROWS`, summed into one a group, named by how many they are."""
    by_group: dict[str, list[KernelRow]] = defaultdict(list)
    for row in rows:
        by_group[row.group].append(row)
    return [
        KernelRow(
            name=f"({len(group_rows)} more kernels)",
            op=None,
            optimizer=group == "optimizer",
            group=group,
            calls=sum(row.calls for row in group_rows),
            time_s=sum(row.time_s for row in group_rows),
            flops=_sum_known(row.flops for row in group_rows),
            bytes=_sum_known(row.bytes for row in group_rows),
        )
        for group, group_rows in by_group.items()
    ]


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None
