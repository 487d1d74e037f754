"""Memory by module and the anatomy at an out-of-memory failure (#49), from the real probe in real training loops on
the CPU, and a failure recorded on an H200 replayed through the parent's reading of it.

The CPU's allocator raises "can't allocate memory" for a request no machine can grant (2**45 bytes here), so a real
out-of-memory error happens in the step, the phase and the module a test chooses; its anatomy is read from the
error's traceback, as on a CPU run. On a GPU the same description is read inside the failing allocation (torch's OOM
observer): benchmarks/oom/oom_check.py checks those on the H200 against torch's own snapshot at the failure
(docs/out-of-memory.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from gpuanat.core.measure.anatomy import assemble_bands, stack_total_bytes
from gpuanat.core.measure.failure import Readings, bands_readings, modules_json, out_of_memory_json
from gpuanat.core.measure.run_state import RankEvents
from gpuanat.core.vocabulary.protocol import MODULES_REST, NO_MODULE, Done, Error, ProbeBands, Step, decode
from gpuanat.worker.probe.module_memory import ModuleFollower
from gpuanat.worker.probe.plain_loop import LoopProbe

IMPOSSIBLE_ELEMENTS = 1 << 43
"""An allocation of 2**45 bytes (fp32): more than any machine's memory, refused at once by the CPU's allocator."""
RECORDED = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h200" / "oom"


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    config._attn_implementation = "eager"
    return BertForSequenceClassification(config)


def train(
    model: torch.nn.Module, steps: int, fail: Callable[[int, torch.Tensor], torch.Tensor] | None = None
) -> tuple[list, BaseException | None]:
    """`steps` steps of a plain loop under the probe (every event kept); `fail(step)` may raise in a step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    events: list = []
    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(1))
    raised = None
    try:
        with LoopProbe(model, optimizer, total_steps=steps, emit=events.append, publish=False) as probe:
            for step in range(1, steps + 1):
                loss = model(input_ids=ids, labels=ids[:, 0] % 2).loss
                if fail is not None:
                    loss = fail(step, loss)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                probe.step(loss=loss)
    except RuntimeError as error:
        raised = error
    return events, raised


def measured_bands(events: list) -> list[ProbeBands]:
    return [event.bands for event in events if isinstance(event, Step) and event.bands is not None]


def test_each_column_of_a_measured_steps_modules_sums_to_its_band_and_the_attention_holds_the_most():
    events, raised = train(tiny_bert(), 3)
    assert raised is None
    bands = measured_bands(events)
    assert [b.measured_at_step for b in bands] == [1, 2, 3]
    for band in bands:
        rows = band.modules
        assert rows is not None and len(rows) <= 12 + 2
        named = [row for row in rows if row.module not in (MODULES_REST, NO_MODULE)]
        # on the CPU the activations band is what autograd saved: every byte of it is some module's
        assert sum(row.activations_bytes for row in rows) == band.activations_bytes > 0
        assert all(row.module != NO_MODULE or row.activations_bytes == 0 for row in rows)
        assert sum(row.parameters_bytes for row in rows) == band.weights_bytes
        assert sum(row.gradients_bytes for row in rows) == band.gradients_bytes > 0
        assert sum(row.optimizer_state_bytes for row in rows) == band.optimizer_state_bytes > 0
        totals = [r.activations_bytes + r.parameters_bytes + r.gradients_bytes + r.optimizer_state_bytes for r in named]
        assert totals == sorted(totals, reverse=True)  # the top modules, largest first
    named = [row for row in bands[-1].modules if row.module not in (MODULES_REST, NO_MODULE)]
    largest = max(named, key=lambda row: row.activations_bytes)
    # eager attention keeps its scores and probabilities: batch x heads x seq x seq, in the layer's self-attention
    assert largest.module.startswith("bert.encoder.layer.") and largest.module.endswith(".attention.self")
    embeddings = next(row for row in bands[-1].modules if row.module == "bert.embeddings.word_embeddings")
    assert embeddings.parameters_bytes == 512 * 64 * 4 and embeddings.optimizer_state_bytes >= 2 * 512 * 64 * 4


def test_a_forward_that_runs_out_of_memory_says_its_module_its_line_and_the_allocation():
    model = tiny_bert()
    layer = model.bert.encoder.layer[1].intermediate
    forward = layer.forward

    def too_large(hidden_states):  # the layer's forward, asking for too much once its own work is done
        output = forward(hidden_states)
        if model.fail_now:
            torch.empty(IMPOSSIBLE_ELEMENTS)
        return output

    model.fail_now = False
    layer.forward = too_large

    def at_step_2(step, loss):
        model.fail_now = step == 1  # the next forward, step 2's, fails
        return loss

    events, raised = train(model, 3, at_step_2)
    assert raised is not None and "can't allocate memory" in str(raised)
    (error,) = [event for event in events if isinstance(event, Error)]
    failure = error.out_of_memory
    assert error.kind == "oom" and failure is not None
    assert (failure.phase, failure.step) == ("forward", 2)
    assert failure.failed_allocation_bytes == IMPOSSIBLE_ELEMENTS * 4
    assert failure.module == "bert.encoder.layer.1.intermediate"
    assert failure.operation.startswith("torch.empty(IMPOSSIBLE_ELEMENTS)  (test_module_memory.py:")
    bands = failure.bands
    assert bands.activations_method == "saved_tensors" and bands.measured_at_step == 2
    # the layers before it had saved their tensors; the failing one and those after it had not
    saved_in = {row.module for row in bands.modules if row.activations_bytes}
    assert any(module.startswith("bert.encoder.layer.0.") for module in saved_in)
    assert not any(module.startswith("bert.encoder.layer.1.output") for module in saved_in)
    assert bands.optimizer_state_bytes > 0 and bands.gradients_bytes == 0  # step 1's state; step 2's gradients: none
    assert failure.largest_tensors and failure.largest_tensors == sorted(
        failure.largest_tensors, key=lambda tensor: -tensor.bytes
    )
    assert {tensor.band for tensor in failure.largest_tensors} <= {"weights", "optimizer state", "activations"}


def test_a_backward_that_runs_out_of_memory_is_said_to_be_in_the_backward():
    class Greedy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            torch.empty(IMPOSSIBLE_ELEMENTS)  # the backward's own allocation
            return grad

    events, raised = train(tiny_bert(), 2, lambda step, loss: Greedy.apply(loss))
    assert raised is not None
    (error,) = [event for event in events if isinstance(event, Error)]
    failure = error.out_of_memory
    assert (failure.phase, failure.step) == ("backward", 1)
    assert failure.operation.startswith("torch.empty(IMPOSSIBLE_ELEMENTS)  # the backward's own allocation")
    # every saved tensor was still held when it failed: the activations are the forward's, whole
    assert failure.bands.activations_bytes > 0


def test_the_backwards_module_is_found_by_walking_down_from_each_modules_output():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.tanh(self.inner(x)) * 2  # tanh and the product: the block's own code

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), Block())
    follower = ModuleFollower(model, torch.device("cpu"))
    x = torch.randn(3, 4)
    follower.forward_begins([x])
    output = model(x)
    follower.forward_ends()
    product = output.grad_fn  # MulBackward0: made in Block.forward itself
    tanh = product.next_functions[0][0]
    inner = tanh.next_functions[0][0]  # AddmmBackward0 of the inner Linear
    first = inner.next_functions[1][0]  # the first Linear's output, reached through the inner one's input
    assert [follower.current_module(node) for node in (product, tanh, inner, first)] == ["1", "1", "1.inner", "0"]
    assert follower.current_module(None) is None


def test_under_compile_no_module_is_followed_and_the_bands_say_so():
    model = tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters())
    events: list = []
    probe = LoopProbe(model, optimizer, total_steps=2, emit=events.append, publish=False)
    probe.begin(
        model,
        optimizer,
        total_steps=2,
        compiled=True,  # as when the model is torch.compile'd: hooks would enter its graph
        training_config=lambda device: {},
        framework_versions={},
        steps_begin_at_forward=True,
    )
    ids = torch.randint(0, 512, (2, 16))
    for step in (1, 2):
        model(input_ids=ids, labels=ids[:, 0] % 2).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        probe.step_ends(step, 2)
    probe.end(2)
    assert all(band.modules is None for band in measured_bands(events))


@pytest.fixture(scope="module")
def recorded_optimizer_failure() -> list:
    """The probe's event lines of a plain loop that ran out of memory in its optimizer's first step, on an H200
    (benchmarks/oom/optimizer_step.py --events)."""
    return [decode(line) for line in (RECORDED / "optimizer_events.jsonl").read_bytes().splitlines()]


def test_a_recorded_gpu_failure_replayed_gives_bands_that_add_up_to_nvml_at_the_failure(recorded_optimizer_failure):
    state = RankEvents()
    for event in recorded_optimizer_failure:
        state.observe(event)
    assert isinstance(state.error, Error) and state.error.kind == "oom"
    failure = state.error.out_of_memory
    assert state.probe_bands == failure.bands  # the bands shown are the failing allocation's
    assert failure.phase == "optimizer" and failure.operation.startswith("optimizer.step()")
    readings = bands_readings(Readings(None, None, None, None), state.error)
    bands = assemble_bands(
        state.probe_bands,
        reserved_bytes=readings.reserved_bytes,
        device_used_bytes=readings.device_used_bytes,
        device_total_bytes=readings.device_total_bytes,
        process_used_bytes=readings.process_used_bytes,
    )
    assert not bands.unavailable
    assert stack_total_bytes(bands.values()) == failure.nvml_device_used_bytes
    assert bands.free_bytes == failure.device_total_bytes - failure.nvml_device_used_bytes
    # the failing allocation was one of Adam's second moments: its first ones were all made
    assert bands.optimizer_state_bytes > bands.weights_bytes == failure.bands.weights_bytes
    entry = out_of_memory_json(state.error, 0)
    assert entry["rank"] == 0 and "bands" not in entry
    assert json.dumps(entry)  # plain JSON
    rows = modules_json(state.probe_bands)
    assert sum(row["optimizer_state_bytes"] for row in rows) == failure.bands.optimizer_state_bytes


def test_a_done_after_the_error_keeps_the_failures_bands(recorded_optimizer_failure):
    """A loop's probe says done after its error (its `with` block ends), with the bands of its last measured step:
    the bands shown stay the failure's, which are of a later moment."""
    state = RankEvents()
    for event in recorded_optimizer_failure:
        state.observe(event)
    failure_bands = state.probe_bands
    earlier = dataclasses.replace(failure_bands, measured_at_step=failure_bands.measured_at_step - 1, modules=None)
    state.observe(
        Done(
            status="stopped",
            steps=0,
            samples=0,
            train_runtime_s=None,
            samples_per_second=None,
            steady_samples_per_second=None,
            warmup_steps=2,
            bands=earlier,
        )
    )
    assert state.probe_bands is failure_bands
