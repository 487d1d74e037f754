"""QLoRA (--load-in-4bit) and Liger's fused linear cross-entropy (--liger): refused where they cannot run, predicted
from the shapes alone, chosen by key in the dashboard, and — where bitsandbytes, or liger-kernel and Triton, are
installed — built by the real worker on the CPU and measured against the prediction.

gpuanat runs both on CUDA only. Their CPU runs here go around the parent's machine checks on purpose: bitsandbytes'
CPU backend quantizes to NF4 exactly as its CUDA kernels do (same packed values, same scales), and Triton's
interpreter (TRITON_INTERPRET=1) runs Liger's kernels on the CPU, so the model the worker builds, its exact bands and
its logits can be checked without a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import time

import pytest
from conftest import REPO, cli_env, last_json, run_cli

from gpuanat.core.memory.bands.activations import liger_chunk_tokens, liger_kept_bytes
from gpuanat.core.memory.bands.weights import decoder_weight_casts_bytes, nf4_weight_bytes, qlora_head_copy_bytes
from gpuanat.core.memory.predict import estimate_memory, max_batch_size, prediction
from gpuanat.core.memory.shapes import lora_shapes, parameter_shapes
from gpuanat.core.run.runner import worker_command
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.core.vocabulary.protocol import Done, ModelInfo, decode
from gpuanat.core.vocabulary.techniques import changed_config
from gpuanat.core.vocabulary.validation import machine_unsupported_reasons, validate_values

GIB = 1024**3
CPU_ONLY = Capabilities(torch_version="2.13.0+cpu", cuda_available=False, reason="CPU-only build")
HOPPER_BARE = Capabilities(
    torch_version="2.11.0",
    cuda_available=True,
    cuda_compute_capability=(9, 0),
    peft_version="0.21.2",
    bitsandbytes_error="ModuleNotFoundError: No module named 'bitsandbytes'",
    liger_error="liger_kernel is not installed",
)
HOPPER_EQUIPPED = Capabilities(
    torch_version="2.11.0",
    cuda_available=True,
    cuda_compute_capability=(9, 0),
    peft_version="0.21.2",
    bitsandbytes_version="0.50.2",
    liger_version="0.8.5",
)
QLORA_8B = RunConfig(preset="llama-3.1-8b", lora=16, load_in_4bit=True, precision="bf16", seq_len=2048)
"""The issue's question: llama-3.1-8b, QLoRA rank 16, bf16, seq 2048."""


# --- refused where it cannot run, with the reason -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "flag", "words"),
    [
        ({"preset": "llama-tiny", "load_in_4bit": True}, "--load-in-4bit", "add --lora R"),
        (
            {"preset": "bert-large", "lora": 8, "load_in_4bit": True},
            "--load-in-4bit",
            "bert-large is a bert classifier",
        ),
        (
            {"preset": "llama-tiny", "lora": 8, "load_in_4bit": True, "gpus": "2", "distributed": "fsdp"},
            "--lora",
            "not with fsdp",
        ),
        ({"preset": "bert-large", "liger": True}, "--liger", "replaces a causal LM's loss"),
        ({"preset": "llama-tiny", "liger": True, "gpus": "2", "distributed": "zero3"}, "--liger", "zero3 shards"),
    ],
)
def test_values_that_cannot_train_are_refused_with_the_flag_to_fix(changes, flag, words):
    with pytest.raises(ConfigError) as refused:
        validate_values(RunConfig(**changes))
    assert refused.value.flag == flag and words in refused.value.message


def test_a_machine_without_cuda_or_the_libraries_refuses_each_with_its_reason():
    config = RunConfig(preset="llama-tiny", device="cpu", lora=8, load_in_4bit=True, liger=True)
    validate_values(config)  # the values are fine; the machine is not
    on_cpu = dict(machine_unsupported_reasons(config, CPU_ONLY))
    assert on_cpu["--load-in-4bit"] == (
        "QLoRA's 4-bit base (bitsandbytes NF4) needs a CUDA GPU and bitsandbytes (pip install 'gpuanat[bnb]')"
    )
    assert on_cpu["--liger"] == (
        "Liger's fused linear cross-entropy (Triton kernels) needs a CUDA GPU and "
        "liger-kernel (pip install 'gpuanat[llm]')"
    )
    on_bare_gpu = dict(machine_unsupported_reasons(config.replace(device="cuda"), HOPPER_BARE))
    assert on_bare_gpu["--load-in-4bit"].endswith(
        "needs bitsandbytes (pip install 'gpuanat[bnb]'; ModuleNotFoundError: No module named 'bitsandbytes')"
    )
    assert "needs liger-kernel" in on_bare_gpu["--liger"] and "CUDA" not in on_bare_gpu["--liger"].split("needs")[1]
    assert machine_unsupported_reasons(config.replace(device="cuda"), HOPPER_EQUIPPED) == []


def test_the_run_says_what_it_trains_and_the_history_keeps_it():
    config = RunConfig(preset="llama-3.1-8b", lora=16, load_in_4bit=True, liger=True, precision="bf16")
    assert config.techniques_summary() == "bs4 bf16 qlora16 liger"
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


def test_a_run_with_adapters_says_how_its_parameters_split(db_path):
    completed = run_cli(
        ["run", "--preset", "llama-tiny", "--device", "cpu", "--lora", "8", "--seq-len", "32", "--samples", "16"],
        db_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    adapters = lora_shapes(PRESETS["llama-tiny"], RunConfig(preset="llama-tiny", lora=8)).params
    base = parameter_shapes(PRESETS["llama-tiny"]).params
    assert f"Parameters: {adapters:,} trainable, {base:,} frozen (0.39%)" in completed.stdout.splitlines()


# --- predicted from the shapes --------------------------------------------------------------------------------------


def _nf4_bytes(values: int) -> int:
    """bitsandbytes' NF4 with double quantization, written out: the values two a byte, one 8-bit scale per 64, one
    fp32 scale per 256 of those, an fp32 offset, and the fp32 code tables (16 and 256 entries) each weight copies."""
    blocks = math.ceil(values / 64)
    return math.ceil(values / 2) + blocks + 4 * math.ceil(blocks / 256) + 4 + 16 * 4 + 256 * 4


def test_qlora_weights_of_llama_3_1_8b_are_nf4_matrices_and_an_fp32_rest():
    h, layers, intermediate, vocabulary, rank = 4096, 32, 14_336, 128_256, 16
    kv = 8 * 128  # 8 key/value heads of 128
    projections = [(h, h), (kv, h), (kv, h), (h, h), (intermediate, h), (intermediate, h), (h, intermediate)]
    quantized = layers * sum(_nf4_bytes(out * inp) for out, inp in projections)
    embeddings_and_head = 2 * vocabulary * h
    norms = (2 * layers + 1) * h
    rotary = 2 * 64 * 4  # inv_freq and original_inv_freq, fp32 buffers
    adapters = layers * sum(rank * (out + inp) for out, inp in projections)
    predicted = estimate_memory(QLORA_8B)
    assert predicted.weights_bytes == quantized + 4 * (embeddings_and_head + norms) + rotary + 4 * adapters
    assert predicted.gradients_bytes == 4 * adapters
    assert predicted.optimizer_state_bytes == 8 * adapters + 4 * 2 * layers * len(projections)  # fused AdamW's steps
    # half the bytes of LoRA's 16-bit base, and a little more than 4 bits a weight for the quantized ones
    assert 0.45 < predicted.weights_bytes / estimate_memory(QLORA_8B.replace(load_in_4bit=False)).weights_bytes < 0.55
    assert 0.5158 < nf4_weight_bytes(h * intermediate) / (h * intermediate) < 0.5159  # 0.5 + 1/64 + 4/(64·256)


def test_qlora_keeps_the_fp32_heads_16_bit_copy_for_backward_under_mixed_precision():
    with_amp, without = estimate_memory(QLORA_8B), estimate_memory(QLORA_8B.replace(precision="fp32"))
    head_copy = 2 * 128_256 * 4096
    lora = estimate_memory(QLORA_8B.replace(load_in_4bit=False))  # LoRA's 16-bit head needs no copy
    assert with_amp.activations_bytes - lora.activations_bytes >= head_copy
    assert without.weights_bytes == with_amp.weights_bytes  # the base is the same in any precision
    # Liger casts the head chunk by chunk inside its loss instead of saving a copy
    fused_config = QLORA_8B.replace(liger=True)
    preset = PRESETS[fused_config.preset]
    assert estimate_memory(fused_config).temporaries_bytes >= head_copy
    assert qlora_head_copy_bytes(fused_config, preset) == 0
    assert decoder_weight_casts_bytes(fused_config, preset, parameter_shapes(preset)) == 0
    assert decoder_weight_casts_bytes(QLORA_8B, preset, parameter_shapes(preset)) == head_copy


def test_liger_takes_the_logits_and_the_losss_copies_out_of_the_activations():
    base = RunConfig(
        preset="llama-3.1-8b", lora=16, precision="bf16", seq_len=2048, batch_size=2, grad_checkpointing=True
    )
    plain, fused = estimate_memory(base), estimate_memory(base.replace(liger=True))
    assert plain.logits_bytes == 2 * 2048 * 128_256 * 4 and fused.logits_bytes == 0
    # the logits and the loss's vocabulary-sized tensors are gone; the hidden states' gradient (16-bit on LoRA's
    # base) is kept for backward in their place
    hidden_gradient = 2 * 2048 * 4096 * 2
    assert liger_kept_bytes(base.replace(liger=True), PRESETS["llama-3.1-8b"]) == hidden_gradient
    assert plain.activations_bytes - fused.activations_bytes >= plain.logits_bytes - hidden_gradient
    assert fused.peak_allocated_bytes < plain.peak_allocated_bytes - 4 * GIB
    assert max_batch_size(base.replace(liger=True), 24 * GIB) > max_batch_size(base, 24 * GIB)
    # training the head too, Liger keeps its gradient (fp32, vocabulary × hidden) from the forward pass, and the
    # hidden states' in fp32 (an fp32 model's norms)
    full = RunConfig(preset="llama-3.2-1b", precision="bf16", seq_len=1024, batch_size=1, liger=True)
    assert liger_kept_bytes(full, PRESETS["llama-3.2-1b"]) == 4 * 128_256 * 2048 + 1024 * 2048 * 4
    # its chunks: 1024 tokens over ceil(128,256 / 2048) = 63 chunks, rounded up to a power of two
    assert liger_chunk_tokens(full, PRESETS["llama-3.2-1b"]) == 32


def test_what_no_measurement_has_checked_is_said():
    qlora = prediction(QLORA_8B.replace(liger=True))  # no checkpointing: the H100 measured QLoRA with it
    assert qlora.confidence == "unchecked"
    assert "QLoRA was measured with checkpointing only" in qlora.caveat and "Liger" in qlora.caveat
    assert prediction(QLORA_8B.replace(grad_checkpointing=True)).confidence == "checked"


def test_the_issues_question_answers_in_milliseconds_with_bands_peak_and_the_largest_batch(db_path):
    started_s = time.perf_counter()
    largest = max_batch_size(QLORA_8B.replace(grad_checkpointing=True), 24 * GIB)
    assert time.perf_counter() - started_s < 1.0 and largest >= 1
    command = [
        "predict",
        "--preset",
        "llama-3.1-8b",
        "--lora",
        "16",
        "--load-in-4bit",
        "--precision",
        "bf16",
        "--seq-len",
        "2048",
        "--gpu-memory",
        "24GiB",
    ]
    completed = run_cli(command, db_path, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0] == "Prediction for llama-3.1-8b bs4 bf16 qlora16, seq 2048:"
    for band in (
        "weights",
        "gradients",
        "optimizer state",
        "activations",
        "of which logits",
        "peak allocated",
        "peak device",
    ):
        assert any(line.strip().startswith(band) for line in lines), band
    assert any("largest batch that fits:" in line for line in lines)
    as_json = last_json(run_cli([*command, "--json"], db_path, timeout_s=60).stdout)
    assert as_json["weights_bytes"] == estimate_memory(QLORA_8B).weights_bytes
    assert as_json["max_batch_size"] == max_batch_size(QLORA_8B, 24 * GIB)
    assert as_json["max_batch_method"] == "model"  # no recorded run of full BERT training stands in for it


# --- the dashboard's keys -------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_keys_4_and_K_choose_qlora_and_liger_and_the_cpu_marks_them_unavailable(tmp_path):
    from test_keys_page import cpu_app, panel_text, until_probed

    from gpuanat.tui.screens.keys import key_rows
    from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

    app = cpu_app(tmp_path, RunConfig(device="cpu", preset="llama-tiny", seq_len=32, samples=32))
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        assert "Liger loss" in panel_text(app) and "4-bit base" not in panel_text(app)  # a causal LM: Liger applies
        await pilot.press("4")
        assert (app.dashboard.config.load_in_4bit, app.dashboard.config.lora) == (True, 16)  # QLoRA brings its adapters
        await pilot.press("K")
        assert app.dashboard.config.liger
        await pilot.pause()
        text = panel_text(app)
        assert "4-bit base" in text and "LoRA rank" in text and "+2 more" in text  # LoRA's PEFT is missing too
        tooltip = app.query_one(TechniquesPanel).tooltip
        assert "--load-in-4bit: QLoRA's 4-bit base (bitsandbytes NF4) needs a CUDA GPU" in tooltip
        assert "--liger: Liger's fused linear cross-entropy (Triton kernels) needs a CUDA GPU" in tooltip
        techniques = dict(key_rows(app)["Techniques of the next run"])
        assert techniques["4"].startswith("4-bit base (QLoRA) — QLoRA:") and techniques["K"].startswith("Liger loss")
        assert techniques["Y"].startswith("Liger layer kernels — Liger Kernel's RMSNorm, SwiGLU/GeGLU and RoPE")
        await pilot.press("Y")
        assert app.dashboard.config.liger_layers
        await pilot.pause()
        assert (
            "--liger-layers: Liger's layer kernels (Triton kernels) needs a CUDA GPU"
            in app.query_one(TechniquesPanel).tooltip
        )
        await pilot.press("Y")
        assert not app.dashboard.config.liger_layers
        await pilot.press("L", "L", "L")  # 16 → 32 → 64 → 0: without adapters the 4-bit base goes too
        assert (app.dashboard.config.lora, app.dashboard.config.load_in_4bit) == (0, False)
        await pilot.press("K")
        assert not app.dashboard.config.liger
        assert not any("--liger" in notification.message for notification in app.notices)
        await pilot.press("M")
        assert (
            app.dashboard.config.preset == "tiny"
        )  # a BERT classifier, which cannot take Liger: said at once, not at `r`
        await pilot.press("K")
        assert any(
            notification.message.startswith("--liger: Liger's fused linear cross-entropy replaces a causal LM's loss")
            for notification in app.notices
        )
    assert changed_config(RunConfig(lora=8), "load_in_4bit").lora == 8  # a rank chosen stays


def test_the_compile_key_cycles_eager_regions_whole_model():
    modes = [RunConfig()]
    for _ in range(3):
        modes.append(changed_config(modes[-1], "compile"))
    assert [(config.compile_regions, config.compile) for config in modes] == [
        (False, False),
        (True, False),
        (False, True),
        (False, False),
    ]


# --- built by the real worker on the CPU ----------------------------------------------------------------------------


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


def train_in_the_worker(config: RunConfig, tmp_path, extra_env: dict[str, str] | None = None) -> tuple[ModelInfo, Done]:
    """Train `config` with gpuanat's training child itself (`python -m gpuanat.worker`), without the parent's machine
    checks; returns its model and done events."""
    read_fd, write_fd = os.pipe()
    with open(tmp_path / "worker.log", "wb") as log:
        process = subprocess.Popen(
            worker_command(json.dumps(config.to_json()), write_fd),
            pass_fds=(write_fd,),
            env=cli_env(None, extra_env=extra_env),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            events = [decode(line) for line in pipe.read().splitlines()]
        assert process.wait(timeout=600) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    model = next(event for event in events if isinstance(event, ModelInfo))
    done = next(event for event in events if isinstance(event, Done))
    assert done.status == "ok"
    return model, done


LLAMA_TINY = RunConfig(preset="llama-tiny", device="cpu", seq_len=32, samples=16, batch_size=4)


@pytest.mark.skipif(not _installed("bitsandbytes", "peft"), reason="needs bitsandbytes (pip install 'gpuanat[bnb]')")
@pytest.mark.parametrize("grad_checkpointing", [True, False], ids=["checkpointing", "no-checkpointing"])
def test_the_worker_builds_qlora_as_predicted_to_the_byte(tmp_path, grad_checkpointing):
    config = LLAMA_TINY.replace(lora=8, load_in_4bit=True, precision="bf16", grad_checkpointing=grad_checkpointing)
    model, done = train_in_the_worker(config, tmp_path)
    predicted = estimate_memory(config)
    adapters = lora_shapes(PRESETS["llama-tiny"], config).params
    assert model.weights_bytes == done.bands.weights_bytes == predicted.weights_bytes  # NF4 + scales + fp32 rest
    assert done.bands.gradients_bytes == predicted.gradients_bytes == 4 * adapters
    assert done.bands.optimizer_state_bytes == predicted.optimizer_state_bytes
    assert (model.params, model.trainable_params) == (
        parameter_shapes(PRESETS["llama-tiny"]).params + adapters,
        adapters,
    )
    assert done.bands.logits_bytes == predicted.logits_bytes == 4 * 32 * 32_000 * 4


@pytest.mark.skipif(not _installed("liger_kernel", "triton"), reason="needs liger-kernel and triton")
def test_the_worker_trains_with_liger_and_returns_no_logits(tmp_path):
    interpreted = {"TRITON_INTERPRET": "1"}  # Liger's Triton kernels, run by Triton's interpreter on the CPU
    _, plain = train_in_the_worker(LLAMA_TINY, tmp_path, interpreted)
    model, fused = train_in_the_worker(LLAMA_TINY.replace(liger=True), tmp_path, interpreted)
    predicted = estimate_memory(LLAMA_TINY.replace(liger=True))
    assert plain.bands.logits_bytes == 4 * 32 * 32_000 * 4 and fused.bands.logits_bytes == predicted.logits_bytes == 0
    assert model.weights_bytes == predicted.weights_bytes and fused.bands.gradients_bytes == predicted.gradients_bytes
    # what the fused loss saves for backward (the hidden states' and the head's gradients, 8.2 MB) replaces the
    # logits and the loss's tensors (17.6 MB measured): the activations the CPU counts (saved tensors) shrink
    assert fused.bands.activations_bytes <= plain.bands.activations_bytes - plain.bands.logits_bytes + 4 * 32_000 * 64
    assert fused.bands.activations_bytes >= 4 * 32_000 * 64  # the head's gradient is among them
    assert plain.train_loss == pytest.approx(fused.train_loss, rel=1e-3)  # the same loss, computed in chunks


# --- Liger's layer kernels (--liger-layers) -------------------------------------------------------------------------

LIGER_RESULTS = REPO / "benchmarks" / "results" / "h100"


def test_liger_layer_kernels_keep_the_norms_input_alone_and_not_the_activation():
    """llama-3.2-1b under autocast (fp32 residual stream): each of a layer's two RMSNorms kept its fp32 input and the
    fp32 normalized value its weight multiplies; Liger's keeps the input alone (4 bytes a hidden element less each),
    and its SwiGLU keeps gate and up but not the activation's output (2 bytes an intermediate element less); the
    final norm saves 4 bytes a hidden element too. Its RoPE rotates in place: nothing changes there. On a frozen
    LoRA base the normalized value was not kept: Liger's norm keeps the bf16 input where HF's kept an fp32 copy."""
    h, intermediate, layers, tokens = 2048, 8192, 16, 4 * 1024
    plain = RunConfig(preset="llama-3.2-1b", seq_len=1024, batch_size=4, precision="bf16")
    liger = plain.replace(liger_layers=True)
    saved = estimate_memory(plain).activations_bytes - estimate_memory(liger).activations_bytes
    assert saved == (layers * (2 * 4 * h + 2 * intermediate) + 4 * h) * tokens
    lora = plain.replace(lora=16)
    saved = estimate_memory(lora).activations_bytes - estimate_memory(lora.replace(liger_layers=True)).activations_bytes
    assert saved == (layers * (2 * (4 - 2) * h + 2 * intermediate) + (4 - 2) * h) * tokens


def test_liger_kernels_against_plain_trainer_runs_on_the_h100():
    """benchmarks/llm_matrix.py's `liger` and `liger-unseen` sets (plain HF Trainer with use_liger_kernel, outside
    gpuanat; liger-kernel 0.8.5): llama-3.2-1b and qwen2.5-0.5b (the runs the model was derived on), and qwen3, gemma3,
    olmo2 and smollm2 read from their config.json, never measured with Liger before (the check): full fine-tuning
    under autocast, bf16 weights and LoRA, with the layer kernels alone and with all of Liger's kernels. Each peak
    within 5% (the largest misses: LoRA with the fused loss, 1-4% low); the layer kernels alone within 1.5%."""
    errors = {}
    for path in (LIGER_RESULTS / "llm" / "liger.json", LIGER_RESULTS / "liger" / "liger_unseen.json"):
        for record in json.loads(path.read_text())["runs"]:
            assert record["status"] == "ok"
            if not record["config"]["liger"]:
                continue
            config = RunConfig.from_json(record["predicted"]["run_config"])
            assert config.liger_layers and config.liger == record["config"].get("liger_loss", True)
            peak = record["max_memory_allocated_bytes"]
            errors[record["key"]] = (estimate_memory(config).peak_allocated_bytes - peak) / peak
    assert len(errors) == 16 + 24
    assert {key.split()[0] for key in errors} == {
        "llama-3.2-1b",
        "qwen2.5-0.5b",
        "qwen3-0.6b",
        "gemma-3-1b",
        "olmo-2-1b",
        "smollm2-360m",
    }
    assert [(key, f"{error:+.1%}") for key, error in errors.items() if abs(error) > 0.05] == []
    layers_only = {key: error for key, error in errors.items() if key.endswith("liger-layers")}
    assert len(layers_only) == 12
    assert [(key, f"{error:+.1%}") for key, error in layers_only.items() if abs(error) > 0.015] == []


def test_liger_layers_is_refused_on_a_classifier_and_needs_the_package():
    with pytest.raises(ConfigError, match="--liger-layers: Liger's layer kernels patch causal LMs"):
        validate_values(RunConfig(preset="bert-base", liger_layers=True))
    reasons = dict(machine_unsupported_reasons(RunConfig(preset="llama-3.2-1b", liger_layers=True), HOPPER_BARE))
    assert reasons["--liger-layers"].startswith("Liger's layer kernels (Triton kernels) needs liger-kernel")
