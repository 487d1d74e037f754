"""RunConfig validation: values alone, and values against what a machine can do."""

from __future__ import annotations

import json

import pytest

from gpuanat.core.store.sweep import EXPERIMENTS
from gpuanat.core.vocabulary.config import (
    CPU_WORKLOAD,
    Capabilities,
    RunConfig,
    child_environment,
    expandable_segments_enabled,
    workload_for_device,
)
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.techniques import TECHNIQUES
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, model_is_path, validate_values

CPU_ONLY = Capabilities(torch_version="2.13.0+cpu", cuda_available=False, reason="CPU-only build")
HOPPER_WITH_BNB = Capabilities(
    torch_version="2.11.0",
    cuda_available=True,
    cuda_device_name="NVIDIA H100",
    cuda_compute_capability=(9, 0),
    bitsandbytes_version="0.50.2",
)
VOLTA_NO_BNB = Capabilities(
    torch_version="2.11.0",
    cuda_available=True,
    cuda_device_name="Tesla V100",
    cuda_compute_capability=(7, 0),
    bitsandbytes_error="ModuleNotFoundError",
)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"batch_size": 0}, "--batch-size"),
        ({"grad_accum": -1}, "--grad-accum"),
        ({"precision": "fp8"}, "--precision"),
        ({"optim": "nope"}, "--optim"),
        ({"attn": "flash"}, "--attn"),
        ({"workers": -2}, "--workers"),
        ({"seq_len": 513}, "--seq-len"),
        ({"seq_len": 0}, "--seq-len"),
        ({"samples": 0}, "--samples"),
        ({"epochs": 0}, "--epochs"),
        ({"max_steps": 0}, "--max-steps"),
        ({"preset": "llama"}, "--preset"),
        ({"batch_size": 65_537}, "--batch-size"),
        ({"grad_accum": 65_537}, "--grad-accum"),
        ({"workers": 513}, "--workers"),
        ({"preset": "tiny", "seq_len": 131_073}, "--seq-len"),
        ({"samples": 10_000_001, "seq_len": 1}, "--samples"),
        ({"samples": 2_097_153, "seq_len": 512}, "--samples"),  # 2^30 tokens and one sample more
        ({"epochs": 10_001}, "--epochs"),
        ({"max_steps": 10_000_001}, "--max-steps"),
        ({"model": "./no-such-dir"}, "--model"),
    ],
)
def test_bad_values_name_their_flag(changes, flag):
    with pytest.raises(ConfigError) as raised:
        validate_values(RunConfig(**changes))
    assert raised.value.flag == flag


def test_seq_len_limit_follows_the_preset_and_local_checkpoints(tmp_path):
    validate_values(RunConfig(preset="gpt2", seq_len=1024))
    with pytest.raises(ConfigError, match="≤ 1024"):
        validate_values(RunConfig(preset="gpt2", seq_len=1025))
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    with pytest.raises(ConfigError, match=f"≤ 128, the position embeddings of {tmp_path}"):
        validate_values(RunConfig(model=str(tmp_path), seq_len=256))


def test_the_largest_values_allowed_are_valid():
    validate_values(
        RunConfig(
            preset="tiny",
            batch_size=65_536,
            grad_accum=65_536,
            workers=512,
            seq_len=1,
            samples=10_000_000,
            epochs=10_000,
            max_steps=10_000_000,
        )
    )
    validate_values(RunConfig(samples=2_097_152, seq_len=512))  # 2^30 tokens


@pytest.mark.parametrize(
    ("model", "is_path"),
    [
        ("./my-bert", True),
        ("/models/bert", True),
        ("~/bert", True),
        ("models/org/bert", True),
        ("bert-base-uncased", False),
        ("google-bert/bert-base-uncased", False),
    ],
)
def test_a_model_is_a_path_when_it_looks_like_one(model, is_path):
    assert model_is_path(model) is is_path


def test_a_local_model_is_a_directory_with_config_json(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        validate_values(RunConfig(model=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        validate_values(RunConfig(model=str(tmp_path)))
    (tmp_path / "config.json").write_text("{}")
    validate_values(RunConfig(model=str(tmp_path)))


EVERY_FIELD = frozenset(technique.field for technique in TECHNIQUES)


@pytest.mark.parametrize(
    ("changes", "given", "expected"),
    [
        ({"device": "cpu"}, set(), CPU_WORKLOAD),  # nothing chosen: the CPU's workload
        ({"device": "cpu", "seq_len": 32}, {"seq_len"}, {**CPU_WORKLOAD, "seq_len": 32}),  # what was given stays
        ({"device": "cpu", "preset": "bert-base"}, {"preset"}, {"preset": "bert-base", "seq_len": 512, "samples": 512}),
        ({"device": "cpu", "model": "org/name"}, {"model"}, {"preset": "bert-large", "seq_len": 512, "samples": 512}),
        ({"device": "cuda"}, set(), {"preset": "bert-large", "seq_len": 512, "samples": 512}),  # a GPU trains the docs'
    ],
)
def test_the_workload_left_to_the_defaults_is_sized_for_the_device(changes, given, expected):
    config, note = workload_for_device(RunConfig(**changes), EVERY_FIELD - given)
    assert {field: getattr(config, field) for field in expected} == expected
    assert (note is not None) == (config != RunConfig(**changes))
    if note is not None:
        assert note == f"training the tiny preset, seq {config.seq_len}, {config.samples} samples"
    validate_values(config)


def test_defaults_are_valid_and_round_trip():
    config = RunConfig()
    validate_values(config)
    assert RunConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    assert RunConfig.from_json({**config.to_json(), "added_by_a_newer_version": 1}) == config


@pytest.mark.parametrize(
    ("changes", "capabilities", "flag", "words"),
    [
        ({"device": "cuda"}, CPU_ONLY, "--device", "use --device cpu"),
        ({"device": "cpu", "precision": "fp16"}, CPU_ONLY, "--precision", "fp16 needs a CUDA GPU"),
        ({"device": "cpu", "tf32": True}, CPU_ONLY, "--tf32", "tf32 needs a CUDA GPU"),
        ({"device": "cpu", "optim": "adamw_bnb_8bit"}, CPU_ONLY, "--optim", "needs a CUDA GPU"),
        ({"device": "cuda", "optim": "adamw_bnb_8bit"}, VOLTA_NO_BNB, "--optim", "needs bitsandbytes"),
        ({"device": "cuda", "precision": "bf16"}, VOLTA_NO_BNB, "--precision", "compute capability ≥ 8.0"),
        ({"device": "cuda", "tf32": True}, VOLTA_NO_BNB, "--tf32", "this GPU has 7.0"),
        ({"device": "cpu", "expandable_segments": True}, CPU_ONLY, "--expandable-segments", "CUDA allocator"),
    ],
)
def test_machine_limits(changes, capabilities, flag, words):
    unsupported = machine_unsupported_reason(RunConfig(**changes), capabilities)
    assert unsupported is not None
    assert unsupported[0] == flag
    assert words in unsupported[1]


def test_every_docs_experiment_runs_on_hopper_and_cpu_runs_the_portable_ones():
    on_gpu = [machine_unsupported_reason(e.config(RunConfig(device="cuda")), HOPPER_WITH_BNB) for e in EXPERIMENTS]
    assert on_gpu == [None] * len(EXPERIMENTS)
    runnable_on_cpu = [
        e.name for e in EXPERIMENTS if machine_unsupported_reason(e.config(RunConfig(device="cpu")), CPU_ONLY) is None
    ]
    assert runnable_on_cpu == ["vanilla", "grad accumulation", "+ grad checkpointing", "bf16", "adafactor"]


def test_sweep_keeps_the_docs_effective_batch():
    base = RunConfig(batch_size=4)
    by_name = {e.name: e.config(base) for e in EXPERIMENTS}
    assert (by_name["vanilla"].batch_size, by_name["vanilla"].grad_accum) == (4, 1)
    assert (by_name["grad accumulation"].batch_size, by_name["grad accumulation"].grad_accum) == (1, 4)
    combined = by_name["accum + gc + fp16 + 8-bit adam"]
    assert (
        combined.batch_size,
        combined.grad_accum,
        combined.grad_checkpointing,
        combined.precision,
        combined.optim,
    ) == (1, 4, True, "fp16", "adamw_bnb_8bit")
    assert {config.effective_batch_size for config in by_name.values()} == {4}


@pytest.mark.parametrize(
    ("user_conf", "expandable", "child_conf"),
    [
        (None, True, "expandable_segments:True"),
        (None, False, "expandable_segments:False"),
        ("expandable_segments:True", False, "expandable_segments:False"),
        ("max_split_size_mb:128, expandable_segments : False", True, "max_split_size_mb:128,expandable_segments:True"),
    ],
)
def test_the_child_allocator_conf_follows_the_technique_and_keeps_the_users_other_options(
    user_conf, expandable, child_conf
):
    base = {"PATH": "/usr/bin"} | ({"PYTORCH_CUDA_ALLOC_CONF": user_conf} if user_conf else {})
    environment = child_environment(RunConfig(expandable_segments=expandable), base)
    assert environment == {"PATH": "/usr/bin", "PYTORCH_CUDA_ALLOC_CONF": child_conf}
    assert base.get("PYTORCH_CUDA_ALLOC_CONF") == user_conf  # not changed in place


@pytest.mark.parametrize(
    ("user_conf", "enabled"),
    [
        (None, False),
        ("expandable_segments:True", True),
        ("max_split_size_mb:128, expandable_segments : true", True),
        ("expandable_segments:False", False),
        ("max_split_size_mb:128", False),
    ],
)
def test_the_users_allocator_conf_is_the_default_of_the_technique(user_conf, enabled):
    assert expandable_segments_enabled({"PYTORCH_CUDA_ALLOC_CONF": user_conf} if user_conf else {}) is enabled


def test_every_technique_the_machine_cannot_run_is_named_with_its_reason():
    """Issue #17: with fp16, tf32, expandable segments and 8-bit Adam on a CPU box without bitsandbytes, each of
    them is refused — not only the first — and 8-bit Adam names both things it lacks."""
    from gpuanat.core.vocabulary.validation import machine_unsupported_reasons

    config = RunConfig(device="cpu", precision="fp16", tf32=True, expandable_segments=True, optim="adamw_bnb_8bit")
    reasons = dict(machine_unsupported_reasons(config, CPU_ONLY))
    assert list(reasons) == ["--precision", "--tf32", "--expandable-segments", "--optim"]
    assert "a CUDA GPU and bitsandbytes" in reasons["--optim"]
