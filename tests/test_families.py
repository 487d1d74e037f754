"""Families outside the Llama-like table (issue #50), read from transformers' modeling code: for a tiny config of each
(every Falcon variant, GPT-BigCode, GPT-J, CodeGen, MPT, Persimmon, Nemotron, Cohere, Cohere-2, GLM-4, OLMo-3, OpenAI
GPT, GPT-Neo) the parameters, buffers and PEFT's adapters equal the model transformers builds, and one layer's saved
tensors equal the derivation to the byte on the CPU (fp32, eager attention; Falcon's multi-query SDPA too). A
model_type in no table is read for what its config's keys say, or refused with the reason (`predict --model`: exit 2,
one line)."""

from __future__ import annotations

import json
import warnings

import pytest
from conftest import run_cli
from saved_tensors import TINY, saved_bytes_per_token_of_one_layer

from gpuanat.core.memory.bands.decoder_layers import eager_scores_bytes, layer_bytes_per_token
from gpuanat.core.memory.model_config import UnreadableModel, read_architecture
from gpuanat.core.memory.predict import prediction_caveat
from gpuanat.core.memory.shapes import lora_shapes, parameter_shapes
from gpuanat.core.vocabulary.config import RunConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FALCON = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "vocab_size": 512,
    "ffn_hidden_size": 128,
}
FAMILY_CONFIGS = {
    "falcon-rw-alibi-bias-sequential": {
        "model_type": "falcon",
        "alibi": True,
        "bias": True,
        "parallel_attn": False,
        "multi_query": False,
        "new_decoder_architecture": False,
        **FALCON,
    },
    "falcon-7b-multi-query-parallel": {
        "model_type": "falcon",
        "alibi": False,
        "bias": False,
        "parallel_attn": True,
        "multi_query": True,
        "new_decoder_architecture": False,
        **FALCON,
    },
    "falcon-40b-new-architecture": {
        "model_type": "falcon",
        "alibi": False,
        "bias": False,
        "parallel_attn": True,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        **FALCON,
    },
    "gpt-bigcode-multi-query-dropout": {
        "model_type": "gpt_bigcode",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "n_inner": 128,
        "vocab_size": 512,
        "n_positions": 256,
        "multi_query": True,
    },
    "gptj-parallel-partial-rotary": {
        "model_type": "gptj",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "n_inner": 128,
        "vocab_size": 512,
        "n_positions": 256,
        "rotary_dim": 8,
    },
    "codegen-fused-interleaved": {
        "model_type": "codegen",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "n_inner": 128,
        "vocab_size": 512,
        "n_positions": 256,
        "rotary_dim": 8,
    },
    "mpt-alibi-no-bias": {
        "model_type": "mpt",
        "d_model": 64,
        "n_layers": 3,
        "n_heads": 4,
        "vocab_size": 512,
        "max_seq_len": 256,
        "no_bias": True,
    },
    "persimmon-relu2-qk-layernorm": {
        "model_type": "persimmon",
        "hidden_act": "relu2",
        "qk_layernorm": True,
        "partial_rotary_factor": 0.5,
        **TINY,
    },
    "nemotron-relu2-layernorm1p": {
        "model_type": "nemotron",
        "num_key_value_heads": 2,
        "hidden_act": "relu2",
        "partial_rotary_factor": 0.5,
        **TINY,
    },
    "cohere-parallel-python-layernorm": {"model_type": "cohere", "num_key_value_heads": 2, **TINY},
    "cohere2-sliding": {
        "model_type": "cohere2",
        "num_key_value_heads": 2,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        **TINY,
    },
    "glm4-sandwich-fused-gate-up": {
        "model_type": "glm4",
        "num_key_value_heads": 2,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "pad_token_id": None,
        **TINY,
    },
    "olmo3-sliding": {
        "model_type": "olmo3",
        "num_key_value_heads": 2,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        **TINY,
    },
    "openai-gpt-post-norm": {
        "model_type": "openai-gpt",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 4,
        "vocab_size": 512,
        "n_positions": 256,
    },
    "gpt-neo-local-global": {
        "model_type": "gpt_neo",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "attention_types": [[["global", "local"], 1]],
        "window_size": 16,
    },
}
BATCH, SEQ = 2, 32
CPU_DROPOUT_MASK_EXTRA_BYTES = 3
"""torch's CPU dropout keeps a mask in the input's dtype (fp32: 4 bytes); CUDA's fused dropout a bool (1 byte), which
the model counts (GPT-BigCode's default dropouts are 0.1: after attention, the MLP and on the probabilities)."""


def _config(name: str):
    data = dict(FAMILY_CONFIGS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoConfig.for_model(data.pop("model_type"), **data)


def _build(name: str, device: str = "meta", attn: str | None = None):
    model_config = _config(name)
    architecture = read_architecture(model_config.to_dict(), name)
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(
            model_config, **({"attn_implementation": attn} if attn else {})
        )
    return model, architecture


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_every_parameter_buffer_and_adapter_is_read_from_the_family_code(name):
    model, architecture = _build(name, device="cpu")
    assert architecture.assumed == ()
    shapes = parameter_shapes(architecture)
    assert shapes.params == sum(parameter.numel() for parameter in model.parameters())
    assert shapes.tensors == len(list(model.parameters()))
    assert shapes.buffer_bytes == sum(buffer.numel() * buffer.element_size() for buffer in model.buffers())
    peft = pytest.importorskip("peft")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear"))
    trainable = sum(parameter.numel() for parameter in adapted.parameters() if parameter.requires_grad)
    assert lora_shapes(architecture, RunConfig(preset="llama-tiny", lora=4)).params == trainable


def _per_forward_bytes(name: str, architecture) -> int:
    """What a layer saves once a forward pass, not per token (at a real size a few KiB): GPT-J's and CodeGen's
    sin and cos gathered from their table for q and for k (4 × seq × rotary width, fp32), GLM-4's cos and sin repeated
    to the rotary width, OLMo-3's global cos and sin (first read by this full-attention layer), Nemotron's two
    (1 + weight) vectors, the two int64 indices ([-2] and [-1]) with which Falcon's multi-query and new-architecture
    layers pick the key and the value out of the fused output."""
    if name.startswith(("gptj", "codegen")):
        return 4 * SEQ * architecture.rotary_dim * 4
    if name.startswith("nemotron"):
        return 2 * architecture.hidden_size * 4
    if name.startswith("glm4"):
        return 2 * SEQ * architecture.rotary_dim * 4
    if name.startswith("olmo3"):
        return 2 * SEQ * architecture.head_dim * 4
    if architecture.family == "falcon" and (architecture.kv_heads == 1 or architecture.kv_expanded):
        return 2 * 8
    return 0


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_one_layer_of_each_family_keeps_for_backward_what_the_derivation_says(name, lora):
    """fp32 on the CPU with eager attention: the derivation's rules, to the byte, with the CPU's dropout masks and
    what a layer saves once a forward pass (`_per_forward_bytes`) added."""
    model, architecture = _build(name, device="cpu", attn="eager")
    if lora:
        peft = pytest.importorskip("peft")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = peft.get_peft_model(model, peft.LoraConfig(r=lora, target_modules="all-linear"))
    model.train()
    torch.manual_seed(0)
    measured = saved_bytes_per_token_of_one_layer(model, torch.randint(0, 512, (BATCH, SEQ)))
    config = RunConfig(
        preset="llama-tiny", precision="fp32", attn="eager", lora=lora, seq_len=SEQ, batch_size=BATCH, device="cpu"
    )
    derived = layer_bytes_per_token(config, architecture) + architecture.num_heads * SEQ * eager_scores_bytes(
        config, architecture
    )
    masks = architecture.residual_dropout_sites if architecture.residual_dropout else 0
    derived += masks * architecture.hidden_size * CPU_DROPOUT_MASK_EXTRA_BYTES
    if architecture.attention_dropout:
        derived += architecture.num_heads * SEQ * CPU_DROPOUT_MASK_EXTRA_BYTES
    derived += _per_forward_bytes(name, architecture) / (BATCH * SEQ)
    assert measured == derived


@pytest.mark.parametrize("batch", [1, BATCH])
def test_falcon_multi_query_under_sdpa_is_torch_math_attention_as_derived(batch):
    """Falcon-7B's one key/value head reaches SDPA without enable_gqa, which no fused kernel takes: torch's math
    attention keeps the query, the key and value expanded to every head and every score's probability — the same code
    on the CPU as on CUDA, where it also upcasts 16-bit inputs to fp32 (allowFP16BF16ReductionMathSDP is off). matmul
    broadcasts the one key/value head to every head: a view of it for one sequence, copies for several."""
    name = "falcon-7b-multi-query-parallel"
    model, architecture = _build(name, device="cpu", attn="sdpa")
    assert architecture.kv_heads == 1 and architecture.kv_broadcast_to_heads
    model.train()
    torch.manual_seed(0)
    measured = saved_bytes_per_token_of_one_layer(model, torch.randint(0, 512, (batch, SEQ)))
    config = RunConfig(preset="llama-tiny", precision="fp32", seq_len=SEQ, batch_size=batch, device="cpu")
    probabilities = architecture.num_heads * SEQ * eager_scores_bytes(config, architecture)
    assert probabilities == architecture.num_heads * SEQ * 4
    derived = layer_bytes_per_token(config, architecture) + probabilities
    assert measured == derived + _per_forward_bytes(name, architecture) / (batch * SEQ)
    mixed = RunConfig(preset="llama-tiny", precision="bf16", seq_len=SEQ, batch_size=BATCH)
    assert eager_scores_bytes(mixed, architecture) == 4  # fp32 probabilities under bf16 autocast too


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_falcon_alibi_mask_is_cast_by_every_layer_under_autocast_and_each_copy_kept(autocast):
    """Falcon-RW's ALiBi mask (batch × heads × seq², built in the embeddings' fp32) reaches SDPA in every layer: in
    fp32 the kernel keeps the one mask; under autocast SDPA's cast makes a 16-bit copy in each layer (no cache for a
    tensor that needs no gradient) and each layer's kernel keeps its own — on the H100 falcon-rw-1b's AMP runs
    measured 24 of them (-16.3% before at batch 4). The CPU's autocast and SDPA kernel do the same."""
    from gpuanat.core.memory.bands.activations import falcon_mask_bytes_per_score

    model, architecture = _build("falcon-rw-alibi-bias-sequential", device="cpu", attn="sdpa")
    assert architecture.materialized_mask_heads == architecture.num_heads
    model.train()
    masks: dict[int, int] = {}

    def pack(tensor):
        if tensor.dim() == 4 and tuple(tensor.shape[-3:]) == (architecture.num_heads, SEQ, SEQ):
            masks[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    tokens = torch.randint(0, 512, (BATCH, SEQ))
    with (
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
    ):
        model(input_ids=tokens, labels=tokens)
    config = RunConfig(preset="llama-tiny", precision="bf16" if autocast else "fp32", seq_len=SEQ, batch_size=BATCH)
    assert len(masks) == (architecture.num_layers if autocast else 1)
    derived = (
        BATCH * SEQ * SEQ * architecture.materialized_mask_heads * falcon_mask_bytes_per_score(config, architecture)
    )
    assert sum(masks.values()) == derived


@pytest.mark.parametrize(("autocast", "lora"), [(False, 0), (True, 0), (True, 4)], ids=["fp32", "amp", "amp-lora"])
def test_falcon_multi_query_checkpointed_backward_peaks_at_the_softmax_gradient_as_derived(autocast, lora, tmp_path):
    """With checkpointing, backward recomputes each multi-query layer and runs torch's math attention backward: the
    recomputed layer, its fp32 probabilities and the softmax's two fp32 gradients at once (the peak, in
    `_softmax_backward_data`), every gradient already allocated (`zero_grad(set_to_none=False)`) — measured by the
    profiler's allocator events on the CPU, whose math attention upcasts 16-bit inputs as CUDA's does."""
    from gpuanat.core.memory.bands.activations import checkpointed_math_attention_bytes

    profiler = pytest.importorskip("torch.profiler")
    keys = {**FALCON, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 8, "ffn_hidden_size": 64}
    model_config = transformers.AutoConfig.for_model(
        "falcon", **keys, multi_query=True, parallel_attn=True, alibi=False, bias=False
    )
    architecture = read_architecture(model_config.to_dict(), "falcon-multi-query-tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
        if lora:
            peft = pytest.importorskip("peft")
            model = peft.get_peft_model(model, peft.LoraConfig(r=lora, target_modules="all-linear"))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        model.enable_input_require_grads()
    model.train()
    torch.manual_seed(0)
    batch, seq = 2, 256  # the scores (8 heads × 256² × 4 bytes) far above the rest of the layer
    tokens = torch.randint(0, 512, (batch, seq))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()

    step()
    model.zero_grad(set_to_none=False)
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        step()
    trace = tmp_path / "trace.json"
    profile.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    memory = sorted((event for event in events if event.get("name") == "[memory]"), key=lambda event: event["ts"])
    start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]  # weights and gradients
    backward = min(event["ts"] for event in events if event.get("ph") == "X" and "Backward" in event.get("name", ""))
    peak = max(event["args"]["Total Allocated"] for event in memory if event["ts"] >= backward) - start
    config = RunConfig(
        preset="llama-tiny",
        precision="bf16" if autocast else "fp32",
        seq_len=seq,
        batch_size=batch,
        grad_checkpointing=True,
        lora=lora,
    )
    derived = checkpointed_math_attention_bytes(config, architecture)
    scores = batch * architecture.num_heads * seq * seq * 4
    assert derived > 3 * scores
    assert abs(peak - derived) < 0.03 * derived
    # what the H100 held beyond this derivation the prediction says
    path = tmp_path / "config.json"
    path.write_text(model_config.to_json_string())
    caveat = prediction_caveat(config.replace(model=str(path))) or ""
    assert "multi-query math attention held about 0.2 GiB a sequence more" in caveat
    assert "multi-query" not in (prediction_caveat(config.replace(model=str(path), grad_checkpointing=False)) or "")


UNKNOWN = {
    "model_type": "my_decoder",
    "architectures": ["MyDecoderForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def test_an_unknown_family_is_read_for_what_its_keys_say():
    falcon_like = read_architecture(
        {
            **UNKNOWN,
            "multi_query": True,
            "parallel_attn": True,
            "alibi": True,
            "layer_norm_epsilon": 1e-5,
            "bias": True,
            "hidden_act": "gelu",
            "gated_mlp": False,
            "intermediate_size": 256,
        },
        "falcon-like",
    )
    assert (falcon_like.kv_heads, falcon_like.parallel_residual, falcon_like.pre_norms) == (1, True, 1)
    assert (falcon_like.positions, falcon_like.norm, falcon_like.gated_mlp) == ("alibi", "layer", False)
    assert falcon_like.attention_bias and falcon_like.output_bias and falcon_like.mlp_bias
    assert falcon_like.assumed[0] == "my_decoder is no family gpuanat knows: its layer read from its config's keys"
    assert any("one norm read by attention and the MLP" in note for note in falcon_like.assumed)
    neox_like = read_architecture(
        {
            **UNKNOWN,
            "num_key_value_heads": 2,
            "use_parallel_residual": True,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        },
        "neox-like",
    )
    assert (neox_like.kv_heads, neox_like.pre_norms, neox_like.positions, neox_like.norm) == (2, 2, "rotary", "rms")
    assert neox_like.gated_mlp and not neox_like.attention_bias
    assert any("as every silu decoder in transformers" in note for note in neox_like.assumed)
    squared = read_architecture(
        {**UNKNOWN, "hidden_act": "relu2", "mlp_gated": False, "layer_norm_eps": 1e-5, "no_bias": True}, "relu2"
    )
    assert (squared.activation, squared.gated_mlp, squared.norm) == ("squared_relu", False, "layer_weight_only")
    assert any("neither rotary nor ALiBi" in note and "cannot be told" in note for note in squared.assumed)


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        ({"multi_query": True, "num_kv_heads": 4, "hidden_act": "silu"}, "multi_query says one key/value head"),
        (
            {"parallel_attn": True, "use_parallel_residual": False, "hidden_act": "silu"},
            "parallel-residual keys disagree",
        ),
        ({"hidden_act": "gelu"}, "its MLP's kind: hidden_act 'gelu' and no key saying gated"),
    ],
)
def test_an_unknown_family_whose_keys_leave_the_memory_open_is_refused(keys, reason):
    with pytest.raises(UnreadableModel, match="my_decoder is no family gpuanat knows") as refused:
        read_architecture({**UNKNOWN, **keys}, "config.json")
    assert reason in str(refused.value)


def test_predict_refuses_a_contradictory_unknown_family_in_one_line(tmp_path, db_path):
    """The Falcon-7B config as another model_type: multi_query and num_kv_heads 71 say different things, and the
    family's code that settles it is unknown — one line, exit 2, never a number."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**UNKNOWN, "multi_query": True, "num_kv_heads": 4, "hidden_act": "silu"}))
    completed = run_cli(
        ["predict", "--model", str(path), "--seq-len", "128", "--gpu-memory", "80GiB"], db_path, timeout_s=60
    )
    assert completed.returncode == 2 and completed.stdout == ""
    assert completed.stderr.count("\n") == 1
    assert completed.stderr.startswith(f"gpuanat: error: --model: {path}: my_decoder is no family gpuanat knows")
    assert "multi_query says one key/value head and num_kv_heads 4 says otherwise" in completed.stderr


def test_predict_reads_a_new_family_and_says_what_no_measurement_checked(tmp_path, db_path):
    """A family read from its code is predicted with the caveat that no run of it was measured (Cohere's first
    version: its second was measured on the H100); one transformers gives no SDPA attention says that it trains with
    eager attention only."""
    for name, family, note in (
        ("cohere-parallel-python-layernorm", "cohere", "no cohere model was measured"),
        ("mpt-alibi-no-bias", "mpt", "transformers gives mpt no SDPA attention: it trains with --attn eager only"),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(_config(name).to_json_string())
        completed = run_cli(
            ["predict", "--model", str(path), "--seq-len", "128", "--gpu-memory", "24GiB", "--json"],
            db_path,
            timeout_s=60,
        )
        assert completed.returncode == 0, completed.stderr
        predicted = json.loads(completed.stdout)
        architecture = read_architecture(json.loads(path.read_text()), name)
        assert architecture.family == family
        assert (
            predicted["weights_bytes"]
            == 4 * parameter_shapes(architecture).params + parameter_shapes(architecture).buffer_bytes
        )
        assert note in predicted["caveat"] and predicted["confidence"] != "checked"
