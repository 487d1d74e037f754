"""A tied embedding's gradient as the backward pass ends (issue #50): the LM head's gradient of the shared weight waits
in autograd's input buffer until the embedding's arrives and is added to it. Measured on the CPU with the profiler's
allocator events around the real engine (the same autograd code as on CUDA): one more vocabulary-sized tensor under
autocast with fp32 weights, two where the head's matmul ran in the weight's own dtype, none untied — what
`tied_embedding_gradient_bytes` says, and what lifted command-r7b-4l's batch-1 peaks on the H100 by 3.91 GiB."""

from __future__ import annotations

import json
import warnings

import pytest

from gpuanat.core.memory.bands.weights import tied_embedding_gradient_bytes
from gpuanat.core.memory.model_config import read_architecture
from gpuanat.core.vocabulary.config import RunConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
profiler = pytest.importorskip("torch.profiler")

VOCAB, HIDDEN, TOKENS = 32768, 64, 8
"""A vocabulary large beside the rest of the model, and few tokens: the embedding's gradient is the largest tensor of
the backward's end (the logits, 8 × 32,768 fp32, are gone by then)."""


def _peak_at_the_embedding_backward_above_the_step_end(model, autocast: bool, trace_path) -> int:
    tokens = torch.randint(0, VOCAB, (1, TOKENS))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()

    step()
    model.zero_grad(set_to_none=True)  # the Trainer's next step: no gradient until backward makes it
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        step()
    profile.export_chrome_trace(str(trace_path))
    events = json.loads(trace_path.read_text())["traceEvents"]
    memory = sorted((event for event in events if event.get("name") == "[memory]"), key=lambda event: event["ts"])
    embedding_backward_start = min(
        event["ts"] for event in events if event.get("ph") == "X" and "EmbeddingBackward" in event.get("name", "")
    )
    step_end = memory[-1]["args"]["Total Allocated"]  # every gradient, nothing else of the step
    peak = max(event["args"]["Total Allocated"] for event in memory if event["ts"] >= embedding_backward_start)
    return peak - step_end


@pytest.mark.parametrize(
    ("precision", "weights_dtype", "tied", "copies"),
    [
        ("bf16", "fp32", True, 1),
        ("bf16", "bf16", True, 2),
        ("fp32", "fp32", True, 2),
        ("bf16", "fp32", False, 0),
        ("bf16", "bf16", False, 0),
    ],
    ids=["amp-tied", "bf16-weights-tied", "fp32-tied", "amp-untied", "bf16-weights-untied"],
)
def test_the_tied_embedding_gradient_at_the_end_of_backward_is_what_the_model_says(
    precision, weights_dtype, tied, copies, tmp_path
):
    keys = {
        "hidden_size": HIDDEN,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": VOCAB,
        "tie_word_embeddings": tied,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_config = transformers.AutoConfig.for_model("llama", **keys)
        model = transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
    if weights_dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    torch.manual_seed(0)
    measured = _peak_at_the_embedding_backward_above_the_step_end(model, precision == "bf16", tmp_path / "trace.json")
    architecture = read_architecture(model_config.to_dict(), "tied-llama")
    config = RunConfig(preset="llama-tiny", precision=precision, weights_dtype=weights_dtype, seq_len=TOKENS)
    derived = tied_embedding_gradient_bytes(config, architecture)
    vocabulary_tensor = VOCAB * HIDDEN * (2 if weights_dtype == "bf16" else 4)
    assert derived == copies * vocabulary_tensor
    # what else the embedding's backward allocates (its index bookkeeping) is a few KiB beside 4-8 MiB
    assert derived <= measured < derived + vocabulary_tensor // 100
    assert tied_embedding_gradient_bytes(config.replace(lora=16), architecture) == 0  # frozen embeddings
