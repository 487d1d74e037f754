"""The child->parent protocol: round trips, tolerance of garbage and of newer children."""

from __future__ import annotations

import json

import pytest
from event_fuzz import malformed_lines

from gpuanat.core.vocabulary.protocol import (
    MAX_EVENT_LINE_BYTES,
    PROTOCOL_VERSION,
    Done,
    Error,
    EventLines,
    Hello,
    KernelRow,
    Malformed,
    ModelInfo,
    Operations,
    ProbeBands,
    Ranked,
    Step,
    decode,
    encode,
)

BANDS = ProbeBands(
    weights_bytes=10,
    gradients_bytes=20,
    optimizer_state_bytes=30,
    activations_bytes=None,
    activations_method="unavailable",
    batch_bytes=5,
    measured_at_step=3,
)
EVENTS = [
    Hello(pid=1, versions={"torch": "2.11"}, device="cuda", device_name="H100", config={"batch_size": 4}),
    ModelInfo(
        params=335_000_000, trainable_params=335_000_000, weights_bytes=1_340_000_000, dtype="float32", total_steps=128
    ),
    Step(
        step=3,
        samples=12,
        tokens=6144,
        step_time_s=0.02,
        elapsed_s=0.5,
        loss=0.69,
        allocated_bytes=1,
        peak_allocated_bytes=2,
        reserved_bytes=3,
        bands=BANDS,
    ),
    Done(
        status="ok",
        steps=128,
        samples=512,
        train_runtime_s=9.5,
        samples_per_second=53.9,
        steady_samples_per_second=60.1,
        warmup_steps=13,
        bands=BANDS,
    ),
    Error(kind="oom", message="CUDA out of memory", step=4, peak_allocated_bytes=80),
    Operations(
        device="cuda",
        first_step=15,
        profiled_steps=3,
        wall_s=0.43,
        processing_s=4.8,
        kernels=[
            KernelRow(
                name="nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT",
                op="aten::mm",
                optimizer=False,
                group="contractions",
                calls=360,
                time_s=0.0123,
                flops=1.2e12,
                bytes=None,
            ),
            KernelRow(name="Memset (Device)", op=None, optimizer=False, group="memory_copies", calls=3, time_s=1e-6),
        ],
        trace_path="/tmp/trace.json",
    ),
]


@pytest.mark.parametrize(
    "kernels, words",
    [
        ("not a list", "must be a list"),
        ([{"name": "k", "op": None, "optimizer": False, "group": "other", "calls": "3", "time_s": 0.1}], "integer"),
        ([["k", None, False, "other", 3, 0.1]], "must be an object"),
        ([{"name": "k", "optimizer": False, "group": "other", "calls": 3, "time_s": 0.1}], "op"),
    ],
)
def test_an_operations_event_with_bad_kernel_rows_is_malformed(kernels, words):
    payload = json.loads(encode(EVENTS[-1]))
    payload["kernels"] = kernels
    event = decode(json.dumps(payload))
    assert isinstance(event, Malformed) and words in event.reason


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


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"Epoch 1: 100%|#####|\n", "not JSON"),
        (b"[1, 2]\n", "not a JSON object"),
        (json.dumps({"v": PROTOCOL_VERSION + 1, "type": "step"}), "protocol version"),
        (json.dumps({"v": PROTOCOL_VERSION, "type": "teleport"}), "unknown event type"),
        (json.dumps({"v": PROTOCOL_VERSION, "type": "step", "step": 1}), "bad fields for Step"),
        (b"\xff\xfe garbage", "not JSON"),
    ],
)
def test_garbage_becomes_malformed_not_an_exception(line, reason):
    decoded = decode(line)
    assert isinstance(decoded, Malformed)
    assert reason in decoded.reason


def test_non_finite_numbers_travel_as_null():
    # An fp16 run can log a NaN or infinite loss; JSON cannot carry either.
    step = Step(step=1, samples=1, tokens=1, step_time_s=0.1, elapsed_s=1.0, loss=float("nan"))
    decoded = decode(encode(step))
    assert isinstance(decoded, Step) and decoded.loss is None
    assert (
        decode(
            encode(
                Done(
                    status="ok",
                    steps=1,
                    samples=1,
                    train_runtime_s=1.0,
                    samples_per_second=float("inf"),
                    steady_samples_per_second=None,
                    warmup_steps=2,
                )
            )
        ).samples_per_second
        is None
    )


def test_no_generated_garbage_line_escapes_the_decoder():
    # 100,000 lines of the classes that used to raise (a list for `type`, `bands` not an object, 1000+ deep
    # nesting), and every other way a line can be wrong: each is Malformed, none raises.
    lines = malformed_lines(100_000, seed=13, too_long=5)
    decoded = [decode(line) for line in lines]
    escaped = [
        (line[:120], event) for line, event in zip(lines, decoded, strict=True) if not isinstance(event, Malformed)
    ]
    assert escaped == []
    expected = [
        "not JSON",
        "not JSON: nested too deep",
        "not a JSON object",
        "protocol version",
        "unknown event type",
        f"line longer than {MAX_EVENT_LINE_BYTES} bytes",
        "bad fields for Step",
        "bad fields for Done",
        "bad fields for Hello",
        "bad fields for ModelInfo",
    ]
    assert [prefix for prefix in expected if not any(event.reason.startswith(prefix) for event in decoded)] == []


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("step", "3", "step must be an integer, not str"),
        ("samples", 3.0, "samples must be an integer, not float"),
        ("tokens", True, "tokens must be an integer, not bool"),
        ("step", -1, "between 0 and 2**63-1"),
        ("step", 2**63, "between 0 and 2**63-1"),
        ("elapsed_s", "0.5", "elapsed_s must be a number, not str"),
        ("loss", [0.5], "loss must be a number, not list"),
        ("bands", 5, "bands must be an object, not int"),
    ],
)
def test_a_step_with_fields_of_the_wrong_type_is_malformed(field, value, words):
    payload = json.loads(encode(EVENTS[2]))
    payload[field] = value
    decoded = decode(json.dumps(payload))
    assert isinstance(decoded, Malformed)
    assert words in decoded.reason


def test_integral_numbers_where_a_float_is_declared_become_floats():
    payload = json.loads(encode(EVENTS[2]))
    payload["elapsed_s"] = 2
    decoded = decode(json.dumps(payload))
    assert isinstance(decoded, Step) and decoded.elapsed_s == 2.0 and isinstance(decoded.elapsed_s, float)


def test_lines_are_cut_from_a_stream_in_any_chunking():
    lines = [encode(event) for event in EVENTS]
    stream = b"".join(lines[:2]) + b"\n\n" + b"".join(lines[2:])
    for chunk_bytes in (1, 7, 64, len(stream)):
        reader = EventLines()
        events = []
        for start in range(0, len(stream), chunk_bytes):
            events += reader.feed(stream[start : start + chunk_bytes])
        assert events + reader.finish() == EVENTS


def test_an_endless_line_is_reported_once_and_never_held_whole():
    reader = EventLines(max_line_bytes=1000)
    events = reader.feed(b"A" * 600)
    events += reader.feed(b"B" * 600)  # past the cap: reported here, then skipped up to its newline
    assert len(events) == 1 and isinstance(events[0], Malformed)
    assert events[0].reason == "line longer than 1000 bytes" and events[0].line.startswith("A")
    for _ in range(100):  # 10 MB more of the same line: nothing kept, nothing reported again
        assert reader.feed(b"C" * 100_000) == []
        assert len(reader._partial) == 0
    events = reader.feed(b"tail\n" + encode(EVENTS[0]))
    assert events == [EVENTS[0]]


def test_an_unterminated_last_line_is_decoded_at_the_end_of_the_stream():
    reader = EventLines()
    assert reader.feed(encode(EVENTS[1]).strip()) == []
    assert reader.finish() == [EVENTS[1]]
    reader.feed(b'{"v": 1, "type": "st')  # a child killed in the middle of a write
    (cut,) = reader.finish()
    assert isinstance(cut, Malformed) and "not JSON" in cut.reason


def test_a_ranks_events_travel_in_an_envelope_that_decodes_whole():
    step = Step(step=3, samples=48, tokens=24_576, step_time_s=0.05, elapsed_s=2.0, loss=0.7)
    decoded = decode(encode(Ranked(1, step)))
    assert decoded == Ranked(1, step)
    garbled = decode(encode(Ranked(2, Malformed("{not json", "not JSON: Expecting property name"))))
    assert isinstance(garbled, Ranked) and garbled.rank == 2 and isinstance(garbled.event, Malformed)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b'{"v":1,"type":"rank","rank":-1,"event":{"type":"done"}}', "rank must be an integer"),
        (b'{"v":1,"type":"rank","rank":true,"event":{}}', "rank must be an integer"),
        (b'{"v":1,"type":"rank","rank":1,"event":[1]}', "event must be an object"),
    ],
)
def test_a_bad_envelope_is_malformed(line, words):
    decoded = decode(line)
    assert isinstance(decoded, Malformed) and words in decoded.reason


def test_an_envelope_holds_no_envelope():
    inner = json.loads(encode(Ranked(1, Step(step=1, samples=1, tokens=1, step_time_s=0.1, elapsed_s=0.1))))
    nested = json.dumps({"v": 1, "type": "rank", "rank": 0, "event": inner}).encode()
    decoded = decode(nested)
    assert isinstance(decoded, Ranked) and isinstance(decoded.event, Malformed)
    assert "unknown event type 'rank'" in decoded.event.reason
