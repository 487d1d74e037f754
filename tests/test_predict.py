"""The pre-run estimate: parameter shapes against the real models, state sizes against the probe."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import run_cli
from transformers import AutoModelForSequenceClassification, BertConfig, GPT2Config

from gpuanat.core.measure.nvml_source import probe_nvml
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.bands.optimizer import step_counter_bytes
from gpuanat.core.memory.model_config import architecture_of
from gpuanat.core.memory.parallel import ddp_first_buckets_may_outlive
from gpuanat.core.memory.predict import (
    CUDA_CONTEXT_BYTES,
    DRIVER_RESERVED_BYTES,
    estimate_memory,
    fits_in,
    max_batch_size,
)
from gpuanat.core.memory.shapes import parameter_shapes
from gpuanat.core.memory.sizes import parse_size
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import PRESETS


def real_model(name: str):
    preset = PRESETS[name]
    if preset.family == "bert":
        config = BertConfig(
            vocab_size=preset.vocab_size,
            hidden_size=preset.hidden_size,
            num_hidden_layers=preset.num_layers,
            num_attention_heads=preset.num_heads,
            intermediate_size=preset.intermediate_size,
            max_position_embeddings=preset.max_positions,
        )
    else:
        config = GPT2Config(
            vocab_size=preset.vocab_size,
            n_embd=preset.hidden_size,
            n_layer=preset.num_layers,
            n_head=preset.num_heads,
            n_inner=preset.intermediate_size,
            n_positions=preset.max_positions,
            pad_token_id=preset.vocab_size - 1,
        )
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("name", ["tiny", "bert-base", "gpt2"])
def test_parameter_shapes_match_the_real_model(name):
    model = real_model(name)
    shapes = parameter_shapes(PRESETS[name])
    parameters = list(model.parameters())
    assert shapes.params == sum(p.numel() for p in parameters)
    assert shapes.tensors == len(parameters)
    assert sorted(shapes.vectors) == sorted(p.numel() for p in parameters if p.dim() == 1)
    assert shapes.buffer_bytes == sum(b.nbytes for b in model.buffers())


def test_tensor_band_estimates_for_bert_large():
    shapes = parameter_shapes(PRESETS["bert-large"])
    estimate = estimate_memory(RunConfig())
    assert shapes.params == 335_143_938  # bert-large-uncased with a 2-label head
    assert estimate.weights_bytes == 4 * shapes.params + 8192
    assert estimate.gradients_bytes == 4 * shapes.params
    assert estimate.optimizer_state_bytes == 8 * shapes.params + 4 * shapes.tensors
    assert estimate_memory(RunConfig(optim="sgd")).optimizer_state_bytes == 0


def test_techniques_move_the_estimate_the_right_way():
    vanilla = estimate_memory(RunConfig())
    per_four_samples = estimate_memory(RunConfig(batch_size=8)).activations_bytes - vanilla.activations_bytes
    assert per_four_samples > 0
    assert (
        abs(
            estimate_memory(RunConfig(batch_size=12)).activations_bytes
            - 2 * per_four_samples
            - vanilla.activations_bytes
        )
        <= 2
    )  # linear in the batch (integer rounding)
    assert estimate_memory(RunConfig(grad_checkpointing=True)).activations_bytes < vanilla.activations_bytes / 5
    assert estimate_memory(RunConfig(attn="eager")).activations_bytes > vanilla.activations_bytes
    assert estimate_memory(RunConfig(optim="adafactor")).peak_allocated_bytes < vanilla.peak_allocated_bytes
    accumulating = estimate_memory(RunConfig(batch_size=4, grad_accum=4))
    assert accumulating.peak_allocated_bytes == vanilla.peak_allocated_bytes + vanilla.gradients_bytes
    # batch 1 without accumulation peaks at the first optimizer step: weights, gradients, state, workspaces
    single = estimate_memory(RunConfig(batch_size=1))
    assert single.peak_allocated_bytes > (
        single.weights_bytes + single.optimizer_state_bytes + single.activations_bytes + single.temporaries_bytes
    )
    assert estimate_memory(RunConfig(precision="bf16")).activations_bytes < vanilla.activations_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 1024**3),
        ("80G", 80 * 1024**3),
        ("40GB", 40 * 1000**3),
        ("81559MiB", 81559 * 1024**2),
        ("1.5 GiB", int(1.5 * 1024**3)),
        ("64MiB", 64 * 1024**2),
        ("64TiB", 64 * 1024**4),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "0G", "-1GiB", "12 parsecs", ""])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError, match="not a memory size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("24", "give a unit: 24GiB, 24G, 24GB or 24576MiB"),  # 24 bytes was read before: "largest batch 0"
        ("4096", "give a unit"),
        ("63MiB", "not a GPU's memory"),
        ("24B", "not a GPU's memory"),
        ("65TiB", "not a GPU's memory"),
    ],
)
def test_parse_size_refuses_what_no_gpu_has(text, words):
    with pytest.raises(ValueError, match=words):
        parse_size(text)


@pytest.mark.parametrize(
    "config",
    [RunConfig(), RunConfig(precision="bf16", grad_checkpointing=True), RunConfig(optim="adafactor", attn="eager")],
)
def test_max_batch_size_is_the_boundary_of_what_fits(config):
    gpu_memory = 80 * 1024**3
    largest = max_batch_size(config, gpu_memory)
    assert largest > 1
    assert fits_in(estimate_memory(config.replace(batch_size=largest)), gpu_memory)
    assert not fits_in(estimate_memory(config.replace(batch_size=largest + 1)), gpu_memory)
    assert max_batch_size(config, 2 * 1024**3) == 0  # weights and optimizer state alone exceed 2 GiB


def test_predict_command(db_path):
    completed = run_cli(["predict", "--gpu-memory", "80GiB", "--precision", "bf16", "--json"], db_path)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    for key in (
        "weights_bytes",
        "gradients_bytes",
        "optimizer_state_bytes",
        "activations_bytes",
        "peak_allocated_bytes",
        "peak_device_bytes",
        "max_batch_size",
    ):
        assert isinstance(result[key], int)
    assert result["gpu_memory_bytes"] == 80 * 1024**3 and result["gpu_memory_source"] == "--gpu-memory"
    # bert-large at seq 512 in bf16 has a recorded template: the largest batch is the replay's, the model's beside it.
    assert result["max_batch_method"] == "replay"
    assert result["max_batch_size"] == largest_batch(RunConfig(precision="bf16"), 80 * 1024**3).batch_size
    assert result["max_batch_size_model"] == max_batch_size(RunConfig(precision="bf16"), 80 * 1024**3)
    unrecorded = json.loads(run_cli(["predict", "--gpu-memory", "80GiB", "--seq-len", "256", "--json"], db_path).stdout)
    assert unrecorded["max_batch_method"] == "model"
    assert unrecorded["max_batch_size"] == unrecorded["max_batch_size_model"] > result["max_batch_size"]
    without_size = json.loads(run_cli(["predict", "--json"], db_path).stdout)
    nvml = probe_nvml()
    if nvml.available and nvml.gpu_total_bytes:  # a GPU box: GPU 0's memory, read through NVML
        assert without_size["gpu_memory_bytes"] == nvml.gpu_total_bytes[0]
        assert without_size["gpu_memory_source"] == f"NVML: {nvml.gpu_names[0]}" and without_size["max_batch_size"]
    else:
        assert without_size["max_batch_size"] is None and "give --gpu-memory" in without_size["gpu_memory_source"]
    bad = run_cli(["predict", "--gpu-memory", "lots"], db_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--gpu-memory" in bad.stderr
    human = run_cli(["predict", "--gpu-memory", "16GiB", "--batch-size", "64"], db_path).stdout
    assert "does NOT fit" in human and "largest batch that fits:" in human and "caveat" not in human
    assert result["max_batch_caveat"] is None


def test_predict_says_where_its_largest_batch_was_refuted(db_path):
    """The bytes model's caveats, where it answers: at a sequence length no template was recorded at."""
    flags = ["predict", "--gpu-memory", "81559MiB", "--precision", "bf16", "--grad-checkpointing", "--seq-len", "384"]
    replayed = json.loads(
        run_cli(
            [
                "predict",
                "--gpu-memory",
                "81559MiB",
                "--precision",
                "bf16",
                "--grad-checkpointing",
                "--optim",
                "adafactor",
                "--json",
            ],
            db_path,
        ).stdout
    )
    assert replayed["max_batch_method"] == "replay" and replayed["max_batch_caveat"] is None
    refuted = run_cli([*flags, "--optim", "adafactor"], db_path).stdout
    assert "caveat:" in refuted and "gpuanat fit" in refuted
    assert "--expandable-segments" in refuted
    for optim in ("adamw_torch_fused", "sgd"):  # the mixed-precision checkpointed optimizers that held
        assert json.loads(run_cli([*flags, "--optim", optim, "--json"], db_path).stdout)["max_batch_caveat"] is None
    # With expandable segments it is the other way round: AdamW and 8-bit Adam ran out of memory at the prediction.
    expandable = [*flags, "--expandable-segments", "--json"]
    for optim in ("adamw_torch_fused", "adamw_bnb_8bit"):
        caveat = json.loads(run_cli([*expandable, "--optim", optim], db_path).stdout)["max_batch_caveat"]
        assert "expandable segments" in caveat and "gpuanat fit" in caveat
    for optim in ("adafactor", "sgd"):
        assert json.loads(run_cli([*expandable, "--optim", optim], db_path).stdout)["max_batch_caveat"] is None


def test_expandable_segments_charge_no_fragmentation():
    """With expandable segments the peak allocated memory alone decides whether a batch fits."""
    gpu_memory_bytes = 85_520_809_984
    allocatable = gpu_memory_bytes - DRIVER_RESERVED_BYTES - CUDA_CONTEXT_BYTES
    default = RunConfig(preset="bert-large", precision="fp32", grad_checkpointing=True)
    expandable = default.replace(expandable_segments=True)
    largest = max_batch_size(expandable, gpu_memory_bytes)
    assert estimate_memory(expandable.replace(batch_size=largest)).peak_allocated_bytes <= allocatable
    assert estimate_memory(expandable.replace(batch_size=largest + 1)).peak_allocated_bytes > allocatable
    # Default allocator: fragmentation charged (fp32 + checkpointing + AdamW: 754 on the H100, 837 without).
    assert max_batch_size(default, gpu_memory_bytes) < largest
    assert estimate_memory(expandable).peak_allocated_bytes == estimate_memory(default).peak_allocated_bytes


def test_the_users_expandable_segments_setting_is_the_default_on_cuda(db_path):
    """A user who exports PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True trains with it unless a flag says no."""
    exported = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    def config(*flags: str) -> dict:
        size = [] if "cpu" in flags else ["--gpu-memory", "80GiB"]  # on the CPU no GPU's size (refused: test_host_oom)
        completed = run_cli(["predict", *size, "--json", *flags], db_path, extra_env=exported)
        return json.loads(completed.stdout)["config"]

    assert config()["expandable_segments"] is True
    assert config("--no-expandable-segments")["expandable_segments"] is False
    assert config("--device", "cpu")["expandable_segments"] is False  # an option of the CUDA allocator only


MULTI_GPU_RESULTS = {
    gpus: Path(__file__).resolve().parent.parent / "benchmarks" / "results" / f"h200x{gpus}" / "multi" / "results.jsonl"
    for gpus in (2, 4)
}
ZERO_GRADIENTS_RESULTS = MULTI_GPU_RESULTS[2].parent.parent / "zero_gradients" / "results.jsonl"


def test_each_rank_holds_what_its_distributed_technique_leaves_it():
    one = estimate_memory(RunConfig(precision="bf16", batch_size=16))
    ranks = {
        technique: estimate_memory(RunConfig(precision="bf16", batch_size=16, gpus="4", distributed=technique))
        for technique in ("ddp", "fsdp", "zero1", "zero2", "zero3")
    }
    ddp, fsdp, zero1, zero2, zero3 = (ranks[name] for name in ("ddp", "fsdp", "zero1", "zero2", "zero3"))
    assert (ddp.weights_bytes, ddp.gradients_bytes, ddp.optimizer_state_bytes) == (
        one.weights_bytes,
        one.gradients_bytes,
        one.optimizer_state_bytes,
    )
    assert ddp.communication_buffers_bytes == one.gradients_bytes  # DDP's buckets: a copy of every gradient
    # FSDP2 shards the parameters and their moments; buffers and fused AdamW's step counters stay whole on each rank
    shapes = parameter_shapes(architecture_of(RunConfig()))
    buffers, counters = shapes.buffer_bytes, step_counter_bytes(RunConfig(precision="bf16"), shapes)
    assert buffers > 0 and counters == 4 * shapes.tensors
    assert fsdp.weights_bytes == -(-(one.weights_bytes - buffers) // 4) + buffers
    assert fsdp.optimizer_state_bytes == -(-(one.optimizer_state_bytes - counters) // 4) + counters
    # DeepSpeed trains a 16-bit model; its fp32 master weights join the optimizer state, 12 B/param with Adam, sharded.
    assert zero1.weights_bytes == zero2.weights_bytes == 4 * zero3.weights_bytes
    assert zero1.optimizer_state_bytes == zero3.optimizer_state_bytes < one.optimizer_state_bytes
    assert zero1.gradients_bytes == zero2.gradients_bytes == zero3.gradients_bytes  # 16-bit partitions
    assert ddp.peak_allocated_bytes > one.peak_allocated_bytes > fsdp.peak_allocated_bytes


@pytest.mark.parametrize("gpus", [2, 4])
def test_per_rank_predictions_against_the_h200_measurements(gpus):
    """Measured by benchmarks/multi_gpu_check.sh on 2 and on 4 H200s: bert-large bf16 batch 16, seq 512
    (docs/several-gpus.md). The DeepSpeed buckets and the 16-bit compute of FSDP and ZeRO were derived from DeepSpeed's
    source and autocast's rules and checked against both machines' runs; nothing here was fitted to them."""
    lines = MULTI_GPU_RESULTS[gpus].read_text().splitlines()
    results = {
        json.loads(line)["technique"]: json.loads(line)
        for line in lines
        if json.loads(line).get("gpus_asked", "2") == str(gpus) and json.loads(line)["status"] == "ok"
    }
    techniques = [name for name in ("default", "ddp", "fsdp", "zero1", "zero2", "zero3") if name in results]
    assert len(techniques) >= 4
    for technique in techniques:
        result = results[technique]
        config = RunConfig.from_json(result["config"])
        predicted = estimate_memory(config)
        for rank in result["ranks"]:
            bands = rank["bands"]
            # What the technique shards is exact, to the tolerance of buffers the model does not list (< 0.2%).
            assert bands["weights_bytes"] == pytest.approx(predicted.weights_bytes, rel=2e-3), technique
            assert bands["optimizer_state_bytes"] == pytest.approx(predicted.optimizer_state_bytes, rel=2e-3), technique
            assert rank["gradients_at_forward_end_bytes"] == pytest.approx(
                predicted.gradients_at_peak_bytes, rel=2e-3, abs=1 << 20
            ), technique
            assert bands["activations_bytes"] == pytest.approx(predicted.activations_bytes, rel=0.02), technique
            assert rank["peak_allocated_bytes"] == pytest.approx(predicted.peak_allocated_bytes, rel=0.01), technique


ACCELERATE_RANKS = MULTI_GPU_RESULTS[2].parent.parent / "accelerate_ranks"


def _accelerate_rank_peaks() -> list[tuple[str, RunConfig, int]]:
    """(run, config, a rank's peak allocated) for every rank of the Accelerate loop measured on H200s: 2 GPUs in
    accelerate_ranks/ (3 runs as is, 3 with TORCH_NCCL_AVOID_RECORD_STREAMS=0, 7 of gpuanat's trees since #15), 4 in
    h200x4/accelerate_ranks/ (2 runs), and the 4- and 2-GPU runs of #15 (multi/results.jsonl)."""
    rows = []
    for path in sorted(ACCELERATE_RANKS.glob("run-accelerate*.json")):
        result = json.loads(path.read_text().strip().splitlines()[-1])
        rows += [
            (path.name, RunConfig.from_json(result["config"]), rank["peak_allocated_bytes"]) for rank in result["ranks"]
        ]
    bisect = [json.loads(line) for line in (ACCELERATE_RANKS / "bisect.jsonl").read_text().splitlines()]
    config = RunConfig.from_json(
        json.loads((ACCELERATE_RANKS / "run-accelerate-1.json").read_text().strip().splitlines()[-1])["config"]
    )
    rows += [
        (line["tree"], dataclasses.replace(config, max_steps=30), round(peak * 2**30))
        for line in bisect
        for peak in line["peak_allocated_gib"]
    ]
    for path in sorted((ACCELERATE_RANKS.parents[1] / "h200x4" / "accelerate_ranks").glob("run-accelerate*.json")):
        result = json.loads(path.read_text().strip().splitlines()[-1])
        rows += [
            (f"h200x4 {path.name}", RunConfig.from_json(result["config"]), rank["peak_allocated_bytes"])
            for rank in result["ranks"]
        ]
    for line in MULTI_GPU_RESULTS[4].read_text().splitlines():
        result = json.loads(line)
        if result["technique"] == "accelerate":
            rows += [
                (
                    f"h200x4 {result['gpus_asked']} GPUs",
                    RunConfig.from_json(result["config"]),
                    rank["peak_allocated_bytes"],
                )
                for rank in result["ranks"]
            ]
    return rows


def test_ddp_first_buckets_outlive_their_rebuild_on_some_ranks():
    """The Accelerate loop's DDP rebuilds its buckets as step 2 begins; on some ranks, at random, the first ones are
    still allocated as that step's forward pass ends: each rank peaks either at the bands or one bucket set above
    them, and the prediction is the higher, which the GPU must hold (benchmarks/accelerate_ranks_check.sh)."""
    rows = _accelerate_rank_peaks()
    assert len(rows) == 40
    above = 0
    for run, config, peak in rows:
        assert ddp_first_buckets_may_outlive(config), run
        predicted = estimate_memory(config)
        buckets = predicted.first_buckets_bytes
        assert buckets == predicted.gradients_bytes  # every gradient's bucket (bert-large: 1.25 GiB)
        without = predicted.peak_allocated_bytes - buckets
        if peak == pytest.approx(predicted.peak_allocated_bytes, rel=3e-3):
            above += 1
        else:
            assert peak == pytest.approx(without, rel=1e-3), run
    assert above == 20  # both happen
    # Recorded with torch's allocator history (`--memory-snapshot`, which slows the host), no rank held them
    recorded = sorted(ACCELERATE_RANKS.glob("snapshot*-run-accelerate*.json"))
    assert len(recorded) == 3
    for path in recorded:
        result = json.loads(path.read_text().strip().splitlines()[-1])
        predicted = estimate_memory(RunConfig.from_json(result["config"]))
        for rank in result["ranks"]:
            assert rank["peak_allocated_bytes"] == pytest.approx(
                predicted.peak_allocated_bytes - predicted.first_buckets_bytes, rel=1e-3
            ), path.name
    # When rank 0 held them, it was at step 2 (its history's peak a step), the rebuild's step
    for line in (ACCELERATE_RANKS / "bisect.jsonl").read_text().splitlines():
        steps = json.loads(line)["rank0_step_peak_allocated_gib"]
        assert steps[2:] == [min(steps[1:])] * len(steps[2:]) and max(steps) == steps[1]


def test_predict_says_where_the_first_ddp_buckets_are_in_the_peak(db_path):
    flags = [
        "predict",
        "--preset",
        "bert-large",
        "--precision",
        "bf16",
        "--batch-size",
        "16",
        "--seq-len",
        "512",
        "--gpus",
        "2",
        "--distributed",
        "ddp",
        "--gpu-memory",
        "141GiB",
    ]
    accelerate = run_cli([*flags, "--engine", "accelerate"], db_path)
    trainer = run_cli(flags, db_path)
    assert accelerate.returncode == 0 and trainer.returncode == 0, accelerate.stderr + trainer.stderr
    assert "of which 1.25 GiB are DDP's first buckets" in accelerate.stdout
    assert "first buckets" not in trainer.stdout
    printed = json.loads(run_cli([*flags, "--engine", "accelerate", "--json"], db_path).stdout)
    assert printed["ddp_first_buckets_bytes"] == 1340575752  # bert-large's fp32 gradients


def test_trainer_keeps_no_first_ddp_buckets():
    """HF Trainer asks DDP for find_unused_parameters where the model does not checkpoint, which keeps the first
    buckets; with checkpointing they are rebuilt, yet 2 H200s held 6.68 GiB on every rank of 3 runs, not the 7.57 of
    the first buckets alive as step 2's forward pass ends: the prediction leaves them out, and is 1.5% high."""
    ddp = RunConfig(preset="bert-large", precision="bf16", batch_size=16, seq_len=512, gpus="2", distributed="ddp")
    assert not ddp_first_buckets_may_outlive(ddp) and estimate_memory(ddp).first_buckets_bytes == 0
    for path in sorted(ACCELERATE_RANKS.glob("run-trainer-ckpt-*.json")):
        result = json.loads(path.read_text().strip().splitlines()[-1])
        config = RunConfig.from_json(result["config"])
        assert config.engine == "trainer" and config.grad_checkpointing
        predicted = estimate_memory(config)
        assert predicted.first_buckets_bytes == 0
        for rank in result["ranks"]:
            assert rank["peak_allocated_bytes"] == pytest.approx(predicted.peak_allocated_bytes, rel=0.02)
            assert rank["peak_allocated_bytes"] < predicted.peak_allocated_bytes + predicted.gradients_bytes // 2


@pytest.mark.parametrize("name", [name for name, preset in PRESETS.items() if preset.objective == "causal-lm"])
def test_decoder_parameter_shapes_match_the_real_model(name):
    """Every decoder preset, built by the worker's own code on the meta device (no memory: llama-3.1-8b too)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gpuanat.worker.model import preset_model_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(preset_model_config(PRESETS[name]))
    shapes = parameter_shapes(PRESETS[name])
    parameters = list(model.parameters())
    assert shapes.params == sum(p.numel() for p in parameters)
    assert shapes.tensors == len(parameters)
    assert sorted(shapes.vectors) == sorted(p.numel() for p in parameters if p.dim() == 1)
    assert shapes.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())


LLM_MATRIX = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h100" / "llm"


NO_LORA_DROPOUT_THEN = "RunConfig has no LoRA dropout: predicted without it"
"""The caveat benchmarks/llm_matrix.py wrote before RunConfig had `lora_dropout`."""
NO_WEIGHTS_DTYPE_THEN = "RunConfig has no weights dtype: predicted with fp32 weights, not bf16"
"""The caveat it wrote before RunConfig had `weights_dtype`."""


def test_lora_dropout_adds_its_masks_a_byte_an_adapted_input_element():
    """llama-3.2-1b, seq 1024, batch 4, all-linear: q, k, v and gate, up read the hidden size (2048), o the heads'
    width (2048), down the MLP's (8192): 20,480 bytes a token and layer, 16 layers, 4,096 tokens (1,280 MiB; the H100
    measured 1,256 more with dropout 0.05 than without). Only the adapted layers' inputs count."""
    plain = RunConfig(preset="llama-3.2-1b", seq_len=1024, batch_size=4, precision="bf16", lora=16)
    dropped = plain.replace(lora_dropout=0.05)
    added = estimate_memory(dropped).activations_bytes - estimate_memory(plain).activations_bytes
    assert added == (3 * 2048 + 2048 + 2 * 2048 + 8192) * 16 * 4096
    q_only = dropped.replace(lora_targets="q_proj,v_proj")
    assert (
        estimate_memory(q_only).activations_bytes - estimate_memory(q_only.replace(lora_dropout=0.0)).activations_bytes
    ) == 2 * 2048 * 16 * 4096


def test_peaks_against_the_h100_matrix_of_plain_trainer_runs():
    """benchmarks/llm_matrix.py on the H100 (plain HF Trainer, outside gpuanat): bert-base, the gpt2 classifier,
    llama-3.2-1b and qwen2.5-0.5b full, with 8-bit Adam, checkpointing and LoRA at seq 512-2048, and llama-3.1-8b
    QLoRA. The decoder and GPT-2 formulas were derived from what autograd saved (benchmarks/saved_tensors.py) and
    checked on these runs, so this is their record, not a held-out test. Left out: configurations gpuanat cannot
    express (a paged optimizer, GPT-2 as a language model) and the Liger set, which applied all of
    Liger's kernels where `--liger` applies its fused loss alone. LoRA dropout and a model held in bf16
    (--lora-dropout and --weights-dtype since issue #29; the records were predicted before they existed and say so)
    are in, as the runs used them."""
    errors = []
    for path in sorted(LLM_MATRIX.glob("*.json")):
        if path.name in ("saved_tensors.json", "liger.json"):
            continue
        for record in json.loads(path.read_text())["runs"]:
            predicted = record.get("predicted") or {}
            run_config, caveats = predicted.get("run_config"), predicted.get("caveats") or []
            if caveats == [NO_LORA_DROPOUT_THEN]:
                run_config, caveats = {**run_config, "lora_dropout": record["config"]["lora_dropout"]}, []
            if caveats == [NO_WEIGHTS_DTYPE_THEN]:
                run_config, caveats = {**run_config, "weights_dtype": record["config"]["weights"]}, []
            if record["status"] != "ok" or caveats or record["config"].get("liger"):
                continue
            config = RunConfig.from_json(run_config)
            peak = record["max_memory_allocated_bytes"]
            errors.append((record["key"], (estimate_memory(config).peak_allocated_bytes - peak) / peak))
    assert len(errors) >= 91
    assert sum("dropout" in key for key, _ in errors) == 2 and sum("weights-bf16" in key for key, _ in errors) == 4
    assert {key.split()[0] for key, _ in errors} == {
        "bert-base",
        "gpt2",
        "llama-3.2-1b",
        "qwen2.5-0.5b",
        "llama-3.1-8b",
    }
    assert [(key, f"{error:+.1%}") for key, error in errors if abs(error) > 0.10] == []


def test_zero_gradient_partitions_are_read_before_deepspeeds_step_frees_them():
    """On 2 H200s, once the probe read the ZeRO optimizer's gradients as its `step` begins (DeepSpeed steps inside
    accelerate's backward, before Trainer's on_pre_optimizer_step): ZeRO-1 and ZeRO-2 held their 16-bit partition,
    ZeRO-3 its flat buffer — each rank half of bert-large's 0.62 GiB, as predicted (the first runs read 0), within
    DeepSpeed's alignment padding of the partitions (rank 0's was 1.7% larger)."""
    for line in ZERO_GRADIENTS_RESULTS.read_text().splitlines():
        result = json.loads(line)
        predicted = estimate_memory(RunConfig.from_json(result["config"]))
        assert len(result["ranks"]) == 2
        for rank in result["ranks"]:
            assert rank["bands"]["gradients_bytes"] == pytest.approx(predicted.gradients_bytes, rel=0.02), result[
                "technique"
            ]
