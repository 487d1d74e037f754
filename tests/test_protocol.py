"""The child->parent protocol: round trips, tolerance of garbage and of newer children."""

from __future__ import annotations

import json

import pytest

from gpuanat.core.protocol import (
    PROTOCOL_VERSION,
    Done,
    Error,
    Hello,
    Malformed,
    ModelInfo,
    ProbeBands,
    Step,
    decode,
    encode,
)

BANDS = ProbeBands(weights_bytes=10, gradients_bytes=20, optimizer_state_bytes=30, activations_bytes=None,
                   activations_method="unavailable", batch_bytes=5, measured_at_step=3)
EVENTS = [
    Hello(pid=1, versions={"torch": "2.11"}, device="cuda", device_name="H100", config={"batch_size": 4}),
    ModelInfo(params=335_000_000, trainable_params=335_000_000, weights_bytes=1_340_000_000, dtype="float32",
              total_steps=128),
    Step(step=3, samples=12, tokens=6144, step_time_s=0.02, elapsed_s=0.5, loss=0.69, allocated_bytes=1,
         peak_allocated_bytes=2, reserved_bytes=3, bands=BANDS),
    Done(status="ok", steps=128, samples=512, train_runtime_s=9.5, samples_per_second=53.9,
         steady_samples_per_second=60.1, warmup_steps=13, bands=BANDS),
    Error(kind="oom", message="CUDA out of memory", step=4, peak_allocated_bytes=80),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda event: event.type)
def test_round_trip(event):
    line = encode(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == event


def test_newer_fields_are_ignored():
    payload = json.loads(encode(EVENTS[2]))
    payload["gpu_temperature_c"] = 61
    payload["bands"]["something_new_bytes"] = 1
    assert decode(json.dumps(payload)) == EVENTS[2]


@pytest.mark.parametrize(("line", "reason"), [
    (b"Epoch 1: 100%|#####|\n", "not JSON"),
    (b"[1, 2]\n", "not a JSON object"),
    (json.dumps({"v": PROTOCOL_VERSION + 1, "type": "step"}), "protocol version"),
    (json.dumps({"v": PROTOCOL_VERSION, "type": "teleport"}), "unknown event type"),
    (json.dumps({"v": PROTOCOL_VERSION, "type": "step", "step": 1}), "bad fields for Step"),
    (b"\xff\xfe garbage", "not JSON"),
])
def test_garbage_becomes_malformed_not_an_exception(line, reason):
    decoded = decode(line)
    assert isinstance(decoded, Malformed)
    assert reason in decoded.reason


def test_non_finite_numbers_travel_as_null():
    # An fp16 run can log a NaN or infinite loss; JSON cannot carry either.
    step = Step(step=1, samples=1, tokens=1, step_time_s=0.1, elapsed_s=1.0, loss=float("nan"))
    decoded = decode(encode(step))
    assert isinstance(decoded, Step) and decoded.loss is None
    assert decode(encode(Done(status="ok", steps=1, samples=1, train_runtime_s=1.0, samples_per_second=float("inf"),
                              steady_samples_per_second=None, warmup_steps=2))).samples_per_second is None
