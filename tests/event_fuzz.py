"""Lines a broken, hostile or newer child could write on the events pipe, none of them a valid event.

Built from real encoded events, then broken one way each, in the classes a tester found to escape the
decoder: `type` not a string, `bands` not an object, numbers as strings, nesting thousands deep, lines far
longer than any event, bytes that are not UTF-8 or not JSON, cut-off lines, wrong versions, values out of
range. Seeded, so a failure names the line that caused it.
"""

from __future__ import annotations

import dataclasses
import json
import random

from gpuanat.core.vocabulary.protocol import (
    MAX_EVENT_LINE_BYTES,
    PROTOCOL_VERSION,
    Done,
    Error,
    Hello,
    KernelRow,
    ModelInfo,
    Operations,
    ProbeBands,
    Step,
    encode,
)

BANDS = ProbeBands(
    weights_bytes=8,
    gradients_bytes=8,
    optimizer_state_bytes=16,
    activations_bytes=4,
    activations_method="saved_tensors",
    batch_bytes=2,
    measured_at_step=1,
)
VALID_EVENTS = [
    Hello(pid=42, versions={"torch": "2.11"}, device="cpu", device_name=None, config={"batch_size": 4}),
    ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=8),
    Step(step=2, samples=8, tokens=256, step_time_s=0.1, elapsed_s=0.2, loss=0.7, bands=BANDS),
    Done(
        status="ok",
        steps=8,
        samples=32,
        train_runtime_s=1.0,
        samples_per_second=32.0,
        steady_samples_per_second=33.0,
        warmup_steps=2,
        bands=BANDS,
    ),
    Error(kind="exception", message="boom"),
    Operations(
        device="cpu",
        first_step=4,
        profiled_steps=2,
        wall_s=0.1,
        processing_s=0.2,
        kernels=[
            KernelRow(
                name="aten::mm",
                op="aten::mm",
                optimizer=False,
                group="contractions",
                calls=4,
                time_s=0.01,
                flops=1e6,
                bytes=4e5,
            )
        ],
    ),
]
WRONG_VALUES = ["3", [], {}, None, True, -1, 2**64, 1.5, "x" * 50]
"""Values that are wrong for every required integer field of an event."""


def _payload(rng: random.Random) -> dict:
    return json.loads(encode(rng.choice(VALID_EVENTS)))


def _dumps(payload: object) -> bytes:
    return json.dumps(payload).encode()


def _required_integer_fields(payload: dict) -> list[str]:
    return [
        key
        for key, value in payload.items()
        if key not in ("v", "type") and isinstance(value, int) and not isinstance(value, bool)
    ]


def _wrong_type(rng: random.Random) -> bytes:
    payload = _payload(rng)
    payload["type"] = rng.choice([["step"], {"step": 1}, 1, None, True, "step" * 3, ""])
    return _dumps(payload)


def _wrong_version(rng: random.Random) -> bytes:
    payload = _payload(rng)
    choice = rng.choice([PROTOCOL_VERSION + 1, str(PROTOCOL_VERSION), True, None, [1], "missing"])
    if choice == "missing":
        del payload["v"]
    else:
        payload["v"] = choice
    return _dumps(payload)


def _payload_with_integers(rng: random.Random) -> dict:
    return json.loads(encode(rng.choice(VALID_EVENTS[:4])))  # an Error event has no integer it must carry


def _nullable(event_type: str, field: str) -> bool:
    """Whether the protocol lets `field` of events of `event_type` be null (`ModelInfo.total_steps`: a loop that
    does not say how long it runs)."""
    cls = next(type(event) for event in VALID_EVENTS if event.type == event_type)
    return any(item.name == field and "None" in str(item.type) for item in dataclasses.fields(cls))


def _wrong_field(rng: random.Random) -> bytes:
    payload = _payload_with_integers(rng)
    field = rng.choice(_required_integer_fields(payload))
    payload[field] = rng.choice(
        [value for value in WRONG_VALUES if value is not None or not _nullable(payload["type"], field)]
    )
    return _dumps(payload)


def _missing_field(rng: random.Random) -> bytes:
    payload = _payload_with_integers(rng)
    del payload[rng.choice(_required_integer_fields(payload))]
    return _dumps(payload)


def _bands_not_an_object(rng: random.Random) -> bytes:
    payload = json.loads(encode(rng.choice([VALID_EVENTS[2], VALID_EVENTS[3]])))
    payload["bands"] = rng.choice([5, "bands", [1, 2], True])
    return _dumps(payload)


def _bad_band(rng: random.Random) -> bytes:
    payload = json.loads(encode(VALID_EVENTS[2]))
    payload["bands"][rng.choice(["weights_bytes", "gradients_bytes", "measured_at_step"])] = rng.choice(WRONG_VALUES)
    return _dumps(payload)


def _not_finite(rng: random.Random) -> bytes:
    # Python's json writes these literals, which JSON does not have; a float field must be finite.
    return (
        encode(VALID_EVENTS[2])
        .strip()
        .replace(b'"elapsed_s":0.2', b'"elapsed_s":' + rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e400"]))
    )


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([1_000, 5_000, 50_000])
    opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
    return b'{"v":1,"type":"step","bands":' + opener * depth + b"1" + closer * depth + b"}"


def _cut(rng: random.Random) -> bytes:
    line = encode(rng.choice(VALID_EVENTS)).strip()
    return line[: rng.randrange(1, len(line) - 1)]


def _not_utf8_or_json(rng: random.Random) -> bytes:
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))).replace(b"\n", b"")
    return b"\xff" + body


def _not_an_object(rng: random.Random) -> bytes:
    return rng.choice([b"[1, 2]", b"42", b'"step"', b"null", b"true"])


def _too_long(rng: random.Random) -> bytes:
    payload = _payload(rng)
    payload["padding"] = "x" * (MAX_EVENT_LINE_BYTES + rng.randrange(1, 4 * MAX_EVENT_LINE_BYTES))
    return _dumps(payload)


CLASSES = [
    _wrong_type,
    _wrong_version,
    _wrong_field,
    _missing_field,
    _bands_not_an_object,
    _bad_band,
    _not_finite,
    _deep,
    _cut,
    _not_utf8_or_json,
    _not_an_object,
]
"""Cheap classes: drawn for most lines. `_too_long` lines are added a few at a time (megabytes each)."""


def malformed_lines(count: int, *, seed: int = 0, too_long: int = 3) -> list[bytes]:
    """`count` lines (without their newline), every class represented, `too_long` of them over the cap."""
    rng = random.Random(seed)
    lines = [make(rng) for make in CLASSES]
    lines += [rng.choice(CLASSES)(rng) for _ in range(count - len(lines) - too_long)]
    lines += [_too_long(rng) for _ in range(too_long)]
    rng.shuffle(lines)
    assert all(b"\n" not in line for line in lines)
    return lines
