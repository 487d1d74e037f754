"""Events the training child sends to its parent: one JSON object per line on a dedicated pipe.

stdout and stderr stay the human log (tqdm and all); events travel on their own file descriptor.
Every event carries the protocol version `v` and its `type`. Decoding is tolerant of a newer child
(unknown keys are ignored) and total over bytes: whatever a line holds — not JSON, a list for `type`,
strings for numbers, nesting thousands deep, megabytes without a newline — it becomes an event whose
every field has its declared type, or `Malformed`, which the parent counts and skips. Nothing a child
writes can raise in the parent. `EventLines` cuts a byte stream into lines of bounded size, so an
unterminated or enormous line costs the reader at most `MAX_EVENT_LINE_BYTES` of memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass
from typing import Any

from gpuanat.core.vocabulary.probe_memory import MODULES_REST as MODULES_REST  # the protocol's, re-exported
from gpuanat.core.vocabulary.probe_memory import NO_MODULE as NO_MODULE
from gpuanat.core.vocabulary.probe_memory import LiveTensor as LiveTensor
from gpuanat.core.vocabulary.probe_memory import ModuleMemory as ModuleMemory
from gpuanat.core.vocabulary.probe_memory import OutOfMemory as OutOfMemory
from gpuanat.core.vocabulary.probe_memory import ProbeBands as ProbeBands

PROTOCOL_VERSION = 1
MAX_EVENT_LINE_BYTES = 1 << 20
"""The longest line that is decoded (1 MiB). The largest real event, a `done` with bands and a hello with a
full config, is a few KiB; a longer line is reported as malformed and skipped up to its newline."""
MALFORMED_EXCERPT_BYTES = 200
"""How much of a malformed line is kept for the report."""
MAX_INT = (1 << 63) - 1
"""Integers an event may carry: SQLite stores 64-bit signed integers, and no count or size is negative."""


@dataclass(frozen=True)
class Hello:
    pid: int
    versions: dict[str, str]
    device: str
    device_name: str | None
    config: dict[str, Any]
    allocator_conf: str | None = None
    """`PYTORCH_CUDA_ALLOC_CONF` as the training process saw it (None: unset)."""
    type: str = "hello"


@dataclass(frozen=True)
class ModelInfo:
    params: int
    trainable_params: int
    weights_bytes: int
    """Unique parameter and buffer storages, as loaded (before any training step)."""
    dtype: str
    total_steps: int | None
    """Optimizer steps the run will take; None when its loop does not say (a plain loop's `track` without
    `total_steps`)."""
    matmul_flops_per_token: int | None = None
    """Model FLOPs of the matmul weights a token costs in training: 6 a trained weight, 4 a frozen one (forward and
    the input's gradient), counted from the model's linear layers (a mixture of experts' expert weights scaled by
    the experts a token visits); the embeddings' lookups and a classifier's one-token head left out."""
    attention_width: int | None = None
    """Σ over the layers attending to every earlier position of heads × head_dim: QKᵀ and AV cost
    3 × 2 × 2 × width FLOPs a token and position in training."""
    windowed_attention_width: dict[str, int] | None = None
    """The same for sliding-window layers, by window length (as text, a JSON key): they attend to at most that many
    positions."""
    type: str = "model"


@dataclass(frozen=True)
class Step:
    step: int
    samples: int
    """Samples trained so far, counted from the batches the model saw."""
    tokens: int
    step_time_s: float
    """Wall time since the previous step ended (the first step includes warm-up)."""
    elapsed_s: float
    """Seconds since training began."""
    loss: float | None = None
    allocated_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    """Highest torch allocated memory during this step."""
    reserved_bytes: int | None = None
    bands: ProbeBands | None = None
    """Present on the steps where the probe measured tensors exactly."""
    monotonic_s: float | None = None
    """time.monotonic() when the step ended. Linux shares this clock between processes, so it lines the
    record up with the sampler's `t_s` in the parent."""
    nvml_device_used_bytes: int | None = None
    """NVML device memory used (v2), read by the training process right after `reserved_bytes`, with no
    allocation in between: on the steps the probe measures exactly and whenever reserved memory changed,
    when NVML is readable."""
    nvml_process_used_bytes: int | None = None
    """NVML's memory of this process on that device, read with `nvml_device_used_bytes`; None when NVML
    does not list the process under its own PID (another PID namespace)."""
    phases_s: dict[str, float] | None = None
    """This step's wall time on the training loop's thread, by phase (`STEP_PHASES`), timed on the host with no
    synchronisation: where the host spent it, which is where it waited when the GPU was behind."""
    gpu_caught_up: bool | None = None
    """Whether the GPU had finished the previous step's work when this step's first forward began (a CUDA event
    queried, never waited for): True means the GPU stood idle waiting for the host; None on the CPU."""
    loss_step: int | None = None
    """The step whose log gave `loss`, `learning_rate` and `grad_norm`: the loop's latest log so far (they stay until
    the next one; a loop logs after its step's end, so often an earlier step's); None before the first log."""
    learning_rate: float | None = None
    """As the loop logged it (Trainer's `learning_rate`, the optimizer's first group's in Lightning, or `track`'s
    `learning_rate=`); None when not logged, and like `loss` a NaN or infinity travels as null."""
    grad_norm: float | None = None
    """The gradients' total norm as the loop logged it (Trainer's `grad_norm` when it clips); None when not logged."""
    type: str = "step"


STEP_PHASES = ("data", "forward", "backward", "optimizer", "gpu wait")
"""A step's phases on the host: waiting for the next batch (the DataLoader and the copy to the device, from the last
step's end to the first forward); the forward passes; the backward passes (and gradient clipping); the optimizer step
(and zero_grad); and the wait for the GPU when the Trainer reads the loss to log it (every 10 steps)."""


@dataclass(frozen=True)
class Done:
    status: str
    """"ok", or "stopped" when interrupted."""
    steps: int
    samples: int
    train_runtime_s: float | None
    samples_per_second: float | None
    """As HF Trainer reports it (train_samples_per_second): warm-up included."""
    steady_samples_per_second: float | None
    warmup_steps: int
    steady_reason: str | None = None
    """Why steady_samples_per_second is None, when it is."""
    train_loss: float | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    bands: ProbeBands | None = None
    probe_time_s: float | None = None
    """Wall time spent inside the probe's callbacks and hooks, on the training loop's thread."""
    probe_time_by_part_s: dict[str, float] | None = None
    """That time split into "setup" (once per run), "measured steps", "other steps" and "synchronize" (the
    waits of the two CUDA synchronisations bracketing the steady-state window: queued GPU work finishing)."""
    steady_phases_s: dict[str, float] | None = None
    """The steady steps' `Step.phases_s`, summed (the same steps as the steady samples/s)."""
    steady_steps: int | None = None
    """How many steps those are."""
    steady_gpu_caught_up_steps: int | None = None
    """Of those, the steps whose `gpu_caught_up` was True (None on the CPU)."""
    compile_stats: dict[str, int] | None = None
    """With torch.compile (--compile or --compile-regions): TorchDynamo's counters at the end, "graphs" (unique
    graphs compiled) and "graph_breaks", and the "frames" gpuanat compiled (the model: 1; regions: one a kind of
    module)."""
    loss: float | None = None
    """The last logged loss, with its `loss_step`, `learning_rate` and `grad_norm` as `Step` has them: a loop logs
    after its step's end, so the last step's log reaches no `Step`."""
    loss_step: int | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    trained_tokens: int | None = None
    """A --data run's: the token positions of every batch trained, padding included; None on random data."""
    real_tokens: int | None = None
    """Of those, the data's own (the attention mask's ones; all of them when packed)."""
    batch_samples: int | None = None
    """The rows (packed: the blocks) those batches held."""
    length_histogram: dict[str, int] | None = None
    """A --data run's rows by token length (`dataset.load.length_histogram`)."""
    type: str = "done"


@dataclass(frozen=True)
class Error:
    kind: str
    """"oom", "exception", "config", or "exited": a rank of a distributed run ended without saying why (killed, or
    crashed in native code), reported by the rank launcher."""
    message: str
    traceback: str | None = None
    step: int | None = None
    peak_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    flag: str | None = None
    """For kind "config": the CLI flag at fault."""
    out_of_memory: OutOfMemory | None = None
    """For kind "oom": the memory at the failing allocation."""
    type: str = "error"


@dataclass(frozen=True)
class Milestone:
    """The training process reached a point of its start-up or end (`MILESTONES`), at `monotonic_s`
    (time.monotonic(): Linux shares this clock between processes, so the parent lines it up with its own)."""

    name: str
    monotonic_s: float
    type: str = "milestone"


MILESTONES = ("started", "imported", "cuda ready", "model built", "dataset built", "trainer ready", "trained")
"""What a training process reports, in order: its first line ran; torch and transformers imported; its GPU chosen and
CUDA initialised (on a GPU); the model built; the dataset built; the Trainer (or Accelerate loop) constructed;
training returned. The first step's end is the first `Step`'s `monotonic_s`."""


@dataclass(frozen=True)
class KernelRow:
    """What the profiled steps spent in one kernel (launched by one operator, in or out of the optimizer's step),
    summed over its launches; on a CPU run, one operator's own (self) time."""

    name: str
    """The GPU kernel's name (or memory copy's, "Memcpy HtoD …"); on the CPU the operator's."""
    op: str | None
    """The operator it serves: the outermost ATen operator around its launch whose name says its kind
    ("aten::linear", "aten::embedding_dense_backward"), else the one that launched it; None when the profile links
    it to none (a compiled region's Triton kernel)."""
    optimizer: bool
    """Launched inside the optimizer's step or zero_grad."""
    group: str
    """Its kind of operation (`core/operations/classify.GROUPS`), as the probe classified it."""
    calls: int
    time_s: float
    flops: float | None = None
    """Floating-point operations, from the operator's shapes (None: not known, as for a fused Triton kernel)."""
    bytes: float | None = None
    """Bytes its operator reads and writes, estimated from its tensors' shapes (None: not known)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelRow:
        """From a decoded event or a stored result; keys it does not know are ignored, a wrong type raises
        ValueError."""
        return _build(cls, data)


@dataclass(frozen=True)
class Operations:
    """The operations anatomy of a few profiled steps (torch.profiler): every kernel's time, launches, FLOPs and
    bytes (`kernels`, the longest first; what did not fit summed into one row a group, named "(N more kernels)")."""

    device: str
    """"cuda": the rows are GPU kernels and memory copies; "cpu": the rows are CPU operators' own time."""
    first_step: int
    """The first profiled step (the profiler warmed up during the step before)."""
    profiled_steps: int
    wall_s: float
    """Wall time of the profiled steps, profiler on."""
    processing_s: float
    """Time spent after them reading the profile (and writing the trace): the run's pause for it."""
    kernels: list[KernelRow]
    trace_path: str | None = None
    """Where the profiler's Chrome/Perfetto trace of those steps was written (None: not asked, or not written)."""
    trace_error: str | None = None
    type: str = "operations"


@dataclass(frozen=True)
class Malformed:
    """A line that could not be decoded; kept so the parent can report it."""

    line: str
    reason: str
    type: str = "malformed"


@dataclass(frozen=True)
class Ranked:
    """An event of one rank of a distributed run, as the rank launcher (gpuanat.worker.launch) forwards it:
    `event` is that rank's event (or `Malformed`, for a line of the rank's that did not decode)."""

    rank: int
    event: Event | Malformed
    type: str = "rank"


Event = Hello | ModelInfo | Step | Done | Error | Milestone | Operations
EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        Hello,
        ModelInfo,
        Step,
        Done,
        Error,
        Milestone,
        Operations,
    )
}


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity (an fp16 loss can be either): they travel as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def encode(event: Event | Ranked) -> bytes:
    payload = _finite_or_none({"v": PROTOCOL_VERSION, **dataclasses.asdict(event)})
    return (json.dumps(payload, separators=(",", ":"), allow_nan=False) + "\n").encode()


class _FieldTypeError(ValueError):
    """A field's value does not have the field's declared type."""


def _check(value: Any, annotation: Any, name: str) -> Any:
    """`value` if it has the type `annotation` (int, float, str, bool, X | None, dict[str, V], list[V], Any,
    ProbeBands, KernelRow), converted where JSON cannot say it (an integral float is no int; an int is a float)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, _UNION_TYPE):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        (inner,) = [option for option in options if option is not type(None)]
        return _check(value, inner, name)
    if annotation in _FIELD_TYPES:  # an object of the protocol's own (ProbeBands, KernelRow)
        if not isinstance(value, dict):
            raise _FieldTypeError(f"{name} must be an object, not {type(value).__name__}")
        return _build(annotation, value)
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise _FieldTypeError(f"{name} must be a list, not {type(value).__name__}")
        return [_check(item, item_type, f"{name}[{index}]") for index, item in enumerate(value)]
    if origin is dict:
        key_type, value_type = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise _FieldTypeError(f"{name} must be an object, not {type(value).__name__}")
        return {
            _check(key, key_type, name): _check(item, value_type, f"{name}[{key!r}]") for key, item in value.items()
        }
    if annotation is bool:
        if not isinstance(value, bool):
            raise _FieldTypeError(f"{name} must be true or false, not {type(value).__name__}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldTypeError(f"{name} must be an integer, not {type(value).__name__}")
        if not 0 <= value <= MAX_INT:
            raise _FieldTypeError(f"{name} must be between 0 and 2**63-1")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _FieldTypeError(f"{name} must be a number, not {type(value).__name__}")
        if not math.isfinite(value):
            raise _FieldTypeError(f"{name} must be finite")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise _FieldTypeError(f"{name} must be a string, not {type(value).__name__}")
        return value
    raise TypeError(f"the protocol cannot check fields of type {annotation!r}")  # a programming error


_UNION_TYPE = type(int | None)
_Built = typing.TypeVar("_Built")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls) if field.name != "type"}


def _build(cls: type[_Built], data: dict[str, Any]) -> _Built:
    """`cls` from `data`: every field it knows checked against its declared type; unknown keys ignored;
    _FieldTypeError (a ValueError) for a wrong type, TypeError for a missing field."""
    types = _FIELD_TYPES[cls]
    values = {key: _check(value, types[key], key) for key, value in data.items() if key in types}
    return cls(**values)


def probe_bands_from_json(data: dict[str, Any]) -> ProbeBands:
    """`ProbeBands` from a decoded event or a stored step record, checked as an event's; keys it does not know are
    ignored."""
    return _build(ProbeBands, data)


def _excerpt(line: bytes) -> str:
    return line[:MALFORMED_EXCERPT_BYTES].decode(errors="replace").strip()


def decode(line: bytes | str) -> Event | Ranked | Malformed:
    """The event a line holds (another rank's in its `Ranked` envelope), or Malformed saying why not. Never raises."""
    data_bytes = line.encode(errors="replace") if isinstance(line, str) else bytes(line)
    if len(data_bytes) > MAX_EVENT_LINE_BYTES:
        return Malformed(_excerpt(data_bytes), f"line longer than {MAX_EVENT_LINE_BYTES} bytes")
    text = data_bytes.decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except RecursionError:
        return Malformed(_excerpt(data_bytes), "not JSON: nested too deep")
    except ValueError as error:
        return Malformed(_excerpt(data_bytes), f"not JSON: {error}")
    if not isinstance(data, dict):
        return Malformed(_excerpt(data_bytes), "not a JSON object")
    version = data.get("v")
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        return Malformed(
            _excerpt(data_bytes), f"protocol version {_excerpt(repr(version).encode())}, expected {PROTOCOL_VERSION}"
        )
    if data.get("type") == "rank":
        return _decode_ranked(data, data_bytes)
    return _decode_fields(data, data_bytes)


def _decode_fields(data: dict[str, Any], data_bytes: bytes) -> Event | Malformed:
    event_type = data.get("type")
    cls = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if cls is None:
        return Malformed(_excerpt(data_bytes), f"unknown event type {_excerpt(repr(event_type).encode())}")
    try:
        return _build(cls, {key: value for key, value in data.items() if key not in ("v", "type")})
    except (TypeError, ValueError, RecursionError) as error:
        return Malformed(_excerpt(data_bytes), f"bad fields for {cls.__name__}: {error}")


def _decode_ranked(data: dict[str, Any], data_bytes: bytes) -> Ranked | Malformed:
    """A `Ranked` envelope: the rank, and the rank's own event inside (one level: an envelope holds no envelope)."""
    rank, inner = data.get("rank"), data.get("event")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_INT:
        return Malformed(_excerpt(data_bytes), "bad fields for Ranked: rank must be an integer ≥ 0")
    if not isinstance(inner, dict):
        return Malformed(_excerpt(data_bytes), "bad fields for Ranked: event must be an object")
    if inner.get("type") == "malformed":
        line, reason = inner.get("line"), inner.get("reason")
        return Ranked(
            rank, Malformed(line if isinstance(line, str) else "", reason if isinstance(reason, str) else "malformed")
        )
    event = _decode_fields(inner, data_bytes)
    return Ranked(rank, event)


class EventLines:
    """Cuts a byte stream into lines, holding at most `max_line_bytes` of an unfinished line.

    A line longer than that is not kept: it comes out once, as `Malformed`, and the stream resumes after
    its newline. Used by the parent's reader of the events pipe and by the reader of publication files.
    """

    def __init__(self, max_line_bytes: int = MAX_EVENT_LINE_BYTES) -> None:
        self._max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self._skipping = False
        """In the middle of an over-long line that was reported: drop bytes until its newline."""

    def feed(self, data: bytes) -> list[Event | Ranked | Malformed]:
        """The events (and malformed lines) completed by `data`."""
        events: list[Event | Ranked | Malformed] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            if self._skipping:
                if newline >= 0:
                    self._skipping = False
                start = end + 1
                continue
            if len(self._partial) + (end - start) > self._max_line_bytes:
                head = bytes(self._partial[:MALFORMED_EXCERPT_BYTES]) or data[start : start + MALFORMED_EXCERPT_BYTES]
                events.append(Malformed(_excerpt(head), f"line longer than {self._max_line_bytes} bytes"))
                self._partial.clear()
                self._skipping = newline < 0
                start = end + 1
                continue
            self._partial += data[start:end]
            if newline < 0:
                break
            if self._partial.strip():
                events.append(decode(bytes(self._partial)))
            self._partial.clear()
            start = newline + 1
        return events

    def finish(self) -> list[Event | Ranked | Malformed]:
        """At the end of the stream: an unterminated last line, decoded (a child killed mid-write)."""
        rest, self._partial, self._skipping = bytes(self._partial), bytearray(), False
        return [decode(rest)] if rest.strip() else []


_FIELD_TYPES: dict[type, dict[str, Any]] = {}
_FIELD_TYPES.update(
    {
        cls: _field_types(cls)
        for cls in (ProbeBands, KernelRow, ModuleMemory, LiveTensor, OutOfMemory, *EVENT_TYPES.values())
    }
)
