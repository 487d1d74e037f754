"""Events the training child sends to its parent: one JSON object per line on a dedicated pipe.

stdout and stderr stay the human log (tqdm and all); events travel on their own file descriptor.
Every event carries the protocol version `v` and its `type`. Decoding is tolerant: unknown keys are
ignored (a newer child may add fields), and a line that is not a valid event becomes `Malformed`,
which the parent reports and skips — never fatal.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class ProbeBands:
    """Memory the probe measured inside the training process, in bytes.

    Weights, gradients and optimizer state are exact sums of unique tensor storages.
    """

    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int | None
    activations_method: str
    """"allocator": CUDA allocated at the end of forward minus the live set and the batch;
    "saved_tensors": unique storages autograd saved for backward (CPU); "unavailable"."""
    batch_bytes: int
    measured_at_step: int
    gradients_at_forward_end_bytes: int = 0
    """Gradients alive when the forward pass ended (the memory peak): 0 unless accumulating, since the
    Trainer frees them after each optimizer step. Gradients and activations do not peak together."""
    optimizer_state_at_forward_end_bytes: int | None = None
    """Optimizer state alive when the forward pass ended: 0 in the first step (the state is created by the
    first optimizer step), else all of it. None from a probe that did not measure it."""
    forward_peak_allocated_bytes: int | None = None
    """Highest torch allocated memory during the forward pass. Above the end of forward it holds what the
    forward pass frees before it returns: with AMP and checkpointing, autocast's cache of half-precision
    weight copies, emptied when autocast exits."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeBands:
        """From a decoded event or a stored step record; keys it does not know are ignored."""
        return _build(cls, data)


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
    total_steps: int
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
    type: str = "step"


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
    type: str = "done"


@dataclass(frozen=True)
class Error:
    kind: str
    """"oom", "exception" or "config"."""
    message: str
    traceback: str | None = None
    step: int | None = None
    peak_allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    flag: str | None = None
    """For kind "config": the CLI flag at fault."""
    type: str = "error"


@dataclass(frozen=True)
class Malformed:
    """A line that could not be decoded; kept so the parent can report it."""

    line: str
    reason: str
    type: str = "malformed"


Event = Hello | ModelInfo | Step | Done | Error
EVENT_TYPES: dict[str, type] = {cls.type: cls for cls in (Hello, ModelInfo, Step, Done, Error)}  # type: ignore[attr-defined]


def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN or infinity (an fp16 loss can be either): they travel as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def encode(event: Event) -> bytes:
    payload = _finite_or_none({"v": PROTOCOL_VERSION, **dataclasses.asdict(event)})
    return (json.dumps(payload, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    values = {key: value for key, value in data.items() if key in known}
    if "bands" in values:
        values["bands"] = ProbeBands.from_json(values["bands"]) if values["bands"] is not None else None
    return cls(**values)


def decode(line: bytes | str) -> Event | Malformed:
    text = line.decode(errors="replace") if isinstance(line, bytes) else line
    text = text.strip()
    try:
        data = json.loads(text)
    except ValueError as error:
        return Malformed(text, f"not JSON: {error}")
    if not isinstance(data, dict):
        return Malformed(text, "not a JSON object")
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        return Malformed(text, f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    cls = EVENT_TYPES.get(data.get("type", ""))
    if cls is None:
        return Malformed(text, f"unknown event type {data.get('type')!r}")
    try:
        return _build(cls, {key: value for key, value in data.items() if key not in ("v", "type")})
    except TypeError as error:
        return Malformed(text, f"bad fields for {cls.__name__}: {error}")
