"""Decoder LLMs on the CPU: the llama-tiny preset trained as a causal LM by the real worker, full and with LoRA
(PEFT), a model from a bare config.json, and what predict says of each.

The exact bands — weights, gradients, optimizer state — are counted by the probe from the real tensors and must
equal what `gpuanat predict` computes from the shapes alone; the logits are batch × seq × vocabulary.
"""

from __future__ import annotations

import html
import io
import json

import pytest
from conftest import last_json, run_cli, state_bytes
from rich.console import Console

from gpuanat.core.memory.predict import estimate_memory, prediction
from gpuanat.core.memory.shapes import lora_shapes, parameter_shapes
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, validate_values

LLAMA_TINY = ["--preset", "llama-tiny", "--device", "cpu", "--seq-len", "32", "--samples", "32", "--batch-size", "4"]


def _config(result: dict) -> RunConfig:
    return RunConfig.from_json(result["config"])


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--lora", "8"],
        ["--lora", "4", "--lora-targets", "q_proj,v_proj", "--precision", "bf16"],
        ["--weights-dtype", "bf16", "--precision", "bf16"],
    ],
    ids=["full", "lora", "lora-qv-bf16", "bf16-weights"],
)
def test_a_causal_lm_trains_and_its_exact_bands_are_what_predict_says(db_path, extra):
    completed = run_cli(["run", *LLAMA_TINY, *extra, "--json"], db_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["steps"] == 8
    config = _config(result)
    predicted = estimate_memory(config)
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert state_bytes(result)[band] == getattr(predicted, band), band
    # the bands are the end of forward's: the gradients alive then, as predicted at the peak
    assert result["bands"]["gradients_bytes"] == predicted.gradients_at_peak_bytes
    shapes = parameter_shapes(PRESETS["llama-tiny"])
    adapters = lora_shapes(PRESETS["llama-tiny"], config).params if config.lora else 0
    assert result["params"] == shapes.params + adapters
    assert result["trainable_params"] == (adapters or shapes.params)
    # the logits: batch 4 × seq 32 × a 32,000-token vocabulary, fp32 also under bf16 (accelerate converts the
    # outputs of a mixed-precision model to fp32)
    assert result["logits_bytes"] == predicted.logits_bytes == 4 * 32 * 32_000 * 4
    assert result["tokens_per_second"] == pytest.approx(result["samples_per_second"] * 32)
    # decoders were measured in bf16 (docs/llm.md): an fp32 run says so
    if config.precision == "fp32":
        assert result["predicted"]["confidence"] == "unchecked"
        assert "measured in bf16 only" in result["predicted"]["caveat"]
    else:
        assert result["predicted"]["confidence"] == "checked" and result["predicted"]["caveat"] is None


def test_a_bare_config_json_trains_with_random_weights_and_the_head_its_architecture_needs(tmp_path, db_path):
    from gpuanat.worker.model import preset_model_config

    llama = tmp_path / "llama" / "config.json"
    llama.parent.mkdir()
    preset_model_config(PRESETS["llama-tiny"]).to_json_file(llama)
    completed = run_cli(
        ["run", "--model", str(llama), "--device", "cpu", "--seq-len", "16", "--samples", "8", "--json"], db_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok"
    assert result["params"] == parameter_shapes(PRESETS["llama-tiny"]).params  # no classification head added
    assert result["logits_bytes"] == 4 * 16 * 32_000 * 4  # a causal LM's logits


def test_a_config_json_that_is_not_one_is_refused_before_torch(tmp_path, db_path):
    broken = tmp_path / "config.json"
    broken.write_text(json.dumps({"hidden_size": 64}))
    completed = run_cli(["run", "--model", str(broken), "--device", "cpu"], db_path, timeout_s=60)
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        f"gpuanat: error: --model: {broken} has no model_type: a config.json as transformers writes it is needed"
    )


def test_lora_needs_peft_and_one_gpu_ddp_or_fsdp():
    without_peft = Capabilities(
        torch_version="2.11.0", cuda_available=True, cuda_compute_capability=(9, 0), peft_error="peft is not installed"
    )
    flag, reason = machine_unsupported_reason(RunConfig(preset="llama-tiny", lora=8), without_peft)
    assert flag == "--lora" and "gpuanat[llm]" in reason and "not installed" in reason
    validate_values(RunConfig(preset="llama-tiny", lora=8, gpus="2", distributed="fsdp"))
    with pytest.raises(ConfigError, match="LoRA trains on one GPU or with ddp or fsdp here; not with zero3"):
        validate_values(RunConfig(preset="llama-tiny", lora=8, gpus="2", distributed="zero3"))
    with pytest.raises(ConfigError, match="module names"):
        validate_values(RunConfig(preset="llama-tiny", lora=8, lora_targets="q_proj,,v_proj"))


def test_predict_says_what_no_measurement_has_checked():
    assert prediction(RunConfig()).confidence == "checked"  # bert-large: the H100's held-out runs
    assert prediction(RunConfig(preset="gpt2")).confidence == "checked"  # the H100 matrix (docs/llm.md)
    assert "decoders only" in prediction(RunConfig(preset="gpt2", lora=8)).caveat
    mistral = prediction(RunConfig(preset="mistral-7b", lora=16, precision="bf16"))
    assert mistral.confidence == "unchecked" and "no mistral decoder was measured" in mistral.caveat
    # mistral-7b under FSDP2 on 2 and 4 H200s (docs/several-gpus.md)
    sharded = prediction(
        RunConfig(preset="mistral-7b", lora=16, precision="bf16", grad_checkpointing=True, gpus="2", distributed="fsdp")
    )
    assert sharded.confidence == "checked"
    decoder = prediction(
        RunConfig(preset="llama-3.1-8b", lora=16, precision="bf16", seq_len=2048, batch_size=1, grad_checkpointing=True)
    )
    assert decoder.confidence == "checked"
    # exact: a 16-bit base of 8.03B parameters and 42M fp32 adapters with their gradients and AdamW's moments
    adapters = lora_shapes(PRESETS["llama-3.1-8b"], RunConfig(preset="llama-3.1-8b", lora=16)).params
    assert adapters == 41_943_040
    assert decoder.gradients_bytes == 4 * adapters
    assert decoder.weights_bytes == 2 * parameter_shapes(PRESETS["llama-3.1-8b"]).params + 4 * adapters + 256
    assert decoder.logits_bytes == 1 * 2048 * 128_256 * 4


@pytest.mark.asyncio
async def test_the_dashboard_chooses_a_decoder_and_lora_by_key_and_trains_it(db_path):
    """M steps through the presets, L through the LoRA ranks; the run the dashboard starts trains what it shows."""
    from test_tui import make_app, run_to_completion, wait_for

    from gpuanat.core.vocabulary.presets import PRESETS as presets
    from gpuanat.tui.widgets.memory_bar import MemoryBar
    from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

    app = make_app(db_path, RunConfig(preset="tiny", device="cpu", seq_len=32, samples=32, batch_size=4))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        names = list(presets)
        await pilot.press(*["M"] * ((names.index("llama-tiny") - names.index("tiny")) % len(names)))
        assert app.dashboard.config.preset == "llama-tiny"
        await pilot.press("L")
        assert app.dashboard.config.lora == 8
        console = Console(width=80, record=True, file=io.StringIO())
        console.print(app.query_one(TechniquesPanel).render())
        shown = console.export_text()
        assert "LoRA rank" in shown and "llama-tiny on cpu" in shown
        result = await run_to_completion(app, pilot)
        await pilot.pause()
        # the causal LM's logits under the activations, measured and predicted: 4 × 32 × 32,000 × 4 bytes
        assert app.query_one(MemoryBar).logits == (result.logits_bytes, result.logits_bytes, 16_384_000)
        assert "of which logits" in html.unescape(app.export_screenshot()).replace("\xa0", " ")
    assert result.status == "ok", result.error
    assert (result.config["preset"], result.config["lora"]) == ("llama-tiny", 8)
    assert result.trainable_params == lora_shapes(PRESETS["llama-tiny"], RunConfig(preset="llama-tiny", lora=8)).params


def test_the_gpt2_preset_trains_the_docs_classifier_not_a_language_model(db_path):
    """GPT-2's config is a decoder's, but the preset is the HF docs' 2-label classifier: the H100 showed the worker
    training a causal LM for it (1.53 GiB of logits) while predict counted a classifier."""
    completed = run_cli(
        [
            "run",
            "--preset",
            "gpt2",
            "--device",
            "cpu",
            "--seq-len",
            "16",
            "--samples",
            "6",
            "--batch-size",
            "2",
            "--max-steps",
            "3",
            "--json",
        ],
        db_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok"
    assert result["logits_bytes"] == 2 * 2 * 4  # batch × 2 labels, fp32
    predicted = estimate_memory(_config(result))
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert state_bytes(result)[band] == getattr(predicted, band), band
    # the bands are the end of forward's: the gradients alive then, as predicted at the peak
    assert result["bands"]["gradients_bytes"] == predicted.gradients_at_peak_bytes


def test_lora_dropout_trains_and_adds_what_predict_says_to_the_activations(db_path):
    """`--lora-dropout` reaches PEFT: the probe's activations grow by the dropout's saved tensors. In fp32 (the CPU)
    each adapted projection keeps a mask (1 byte) and a dropped copy of its input (4) an input element: llama-tiny
    adapts 3 × 64 + 64 + 2 × 64 + 128 = 512 inputs a layer, 2 layers, 128 tokens: 655,360 bytes predicted; the probe
    measured 688,128 (+5%, a key/value-wide fp32 tensor a layer more, not explained)."""
    runs = {}
    for dropout in ("0", "0.1"):
        completed = run_cli(["run", *LLAMA_TINY, "--lora", "8", "--lora-dropout", dropout, "--json"], db_path)
        assert completed.returncode == 0, completed.stderr[-3000:]
        runs[dropout] = last_json(completed.stdout)
    assert runs["0.1"]["config"]["lora_dropout"] == 0.1 and "dropout0.1" in _config(runs["0.1"]).techniques_summary()
    measured = runs["0.1"]["bands"]["activations_bytes"] - runs["0"]["bands"]["activations_bytes"]
    predicted = (
        estimate_memory(_config(runs["0.1"])).activations_bytes - estimate_memory(_config(runs["0"])).activations_bytes
    )
    assert predicted == 512 * 5 * 128 * 2
    assert measured == pytest.approx(predicted, rel=0.10)


def test_lora_dropout_is_a_probability_on_lora_adapters():
    for dropout, words in ((1.0, "a probability in [0, 1)"), (-0.1, "a probability in [0, 1)")):
        with pytest.raises(ConfigError, match=r"--lora-dropout") as raised:
            validate_values(RunConfig(preset="llama-tiny", lora=8, lora_dropout=dropout))
        assert words in str(raised.value)
    with pytest.raises(ConfigError, match="add --lora R"):
        validate_values(RunConfig(preset="llama-tiny", lora_dropout=0.05))


def test_a_classifier_held_in_bf16_has_the_bands_predict_says(db_path):
    """--weights-dtype bf16 on the BERT-shaped tiny preset: weights, gradients and AdamW's moments at 2 bytes a
    parameter, counted by the probe from the real tensors, equal to predict's."""
    completed = run_cli(
        [
            "run",
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--seq-len",
            "32",
            "--samples",
            "32",
            "--batch-size",
            "4",
            "--weights-dtype",
            "bf16",
            "--precision",
            "bf16",
            "--json",
        ],
        db_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    predicted = estimate_memory(_config(result))
    assert result["status"] == "ok" and result["config"]["weights_dtype"] == "bf16"
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert state_bytes(result)[band] == getattr(predicted, band), band
    # the bands are the end of forward's: the gradients alive then, as predicted at the peak
    assert result["bands"]["gradients_bytes"] == predicted.gradients_at_peak_bytes
    fp32 = estimate_memory(_config(result).replace(weights_dtype="fp32"))
    assert predicted.gradients_bytes * 2 == fp32.gradients_bytes


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"weights_dtype": "bf16"}, "give --precision bf16 too"),
        ({"weights_dtype": "bf16", "precision": "bf16", "lora": 8}, "held in 16 bits already"),
        ({"weights_dtype": "fp16", "precision": "bf16"}, "use bf16"),
    ],
)
def test_a_weights_dtype_that_cannot_train_is_refused_with_its_reason(changes, words):
    with pytest.raises(ConfigError, match="--weights-dtype") as raised:
        validate_values(RunConfig(preset="llama-tiny", **changes))
    assert words in str(raised.value)
