"""`gpuanat predict`'s answer to "which technique first makes it fit" (issue #34): the memory techniques added one by
one, cheapest first, until the predicted run fits; each step's flags, given to `predict` again, are that run."""

from __future__ import annotations

import json
import shlex

from conftest import run_cli

from gpuanat.cli.run import out_of_memory_hint
from gpuanat.core.memory.fit_ladder import fit_ladder
from gpuanat.core.memory.predict import estimate_memory, fits_in, peak_device_bytes
from gpuanat.core.vocabulary.config import RunConfig

GIB = 1024**3
LLAMA_8B = ["--preset", "llama-3.1-8b", "--precision", "bf16", "--batch-size", "1", "--seq-len", "1024"]


def predicted(db_path, flags: list[str]) -> dict:
    completed = run_cli(["predict", *flags, "--json"], db_path)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_each_step_is_the_run_its_flags_make_and_only_the_last_fits(db_path):
    """An 8B decoder on one 16 GiB GPU: its peak allocated is the model's state, which checkpointing leaves; what it
    lowers is the allocator's reserve above it (the logits' and activations' segments that the gradients and states
    split), so it comes first, then bf16 weights and LoRA shrink the state, and QLoRA's 4-bit base fits. Replaying
    the flags step by step through the command line gives each step's peak."""
    flags = [*LLAMA_8B, "--gpu-memory", "16GiB"]
    result = predicted(db_path, flags)
    # pure bf16 lowers the activations, not the state that peaks here; tried again after LoRA, which it cannot join
    (left_out,) = [step for step in result["fit_ladder"] if step["refused"] is not None]
    assert left_out["technique"].startswith("pure bf16") and "LoRA's frozen base" in left_out["refused"]
    ladder = [step for step in result["fit_ladder"] if step["refused"] is None]
    assert [step["technique"].split()[0] for step in ladder] == ["gradient", "bf16", "LoRA", "QLoRA"]
    assert [step["fits"] for step in ladder] == [False, False, False, True]
    peaks = [result["peak_device_bytes"], *(step["peak_device_bytes"] for step in ladder)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == len(peaks)
    checkpointed = predicted(db_path, [*flags, "--grad-checkpointing"])
    assert checkpointed["peak_allocated_bytes"] >= result["peak_allocated_bytes"]  # the state is the peak
    assert checkpointed["peak_reserved_bytes"] < result["peak_reserved_bytes"]  # the reserve is what falls
    applied = list(flags)
    assert ladder[2]["flags"] == "--lora 16 --weights-dtype fp32"  # LoRA's base is 16-bit already: bf16 weights go
    for step in ladder:
        applied += shlex.split(step["flags"])
        again = predicted(db_path, applied)
        assert again["peak_device_bytes"] == step["peak_device_bytes"], step
    assert again["fit_ladder"] == []  # the run the last step made fits as given


def test_several_gpus_shard_first_and_say_what_this_version_cannot_train(db_path):
    """On 2 GPUs DDP leaves each rank the whole 8B model's state; sharding the optimizer state (ZeRO-1) is the first
    step, not enough on 80 GiB (its step holds the gradients' partition in fp32 too: 89.81 GiB measured for ZeRO-2
    on 2 H200s); FSDP's is. Already fully sharded and too long a sequence: checkpointing is tried, then LoRA (FSDP
    shards its base); the steps ZeRO-3 refuses here are said, with why, instead of being skipped in silence."""
    ddp = predicted(db_path, [*LLAMA_8B, "--gpus", "2", "--distributed", "ddp", "--gpu-memory", "80GiB"])
    first = ddp["fit_ladder"][0]
    assert first["flags"] == "--distributed zero1" and not first["fits"]
    assert any(step["flags"] == "--distributed fsdp" and step["fits"] for step in ddp["fit_ladder"])
    fsdp = run_cli(
        [
            "predict",
            "--preset",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--batch-size",
            "4",
            "--seq-len",
            "8192",
            "--gpus",
            "2",
            "--distributed",
            "fsdp",
            "--gpu-memory",
            "80GiB",
        ],
        db_path,
    )
    assert fsdp.returncode == 0, fsdp.stderr
    text = fsdp.stdout
    assert "What makes it fit on 2 × 80.00 GiB" in text and "--grad-checkpointing" in text
    # FSDP2 trains fp32 masters of a bf16 model (accelerate upcasts them); LoRA's frozen 16-bit base shards too
    assert "bf16 weights" in text and "left out: lowers nothing here" in text
    assert "--lora 16" in text and "QLoRA" not in text
    zero3 = run_cli(
        [
            "predict",
            "--preset",
            "llama-3.1-8b",
            "--precision",
            "bf16",
            "--batch-size",
            "4",
            "--seq-len",
            "8192",
            "--gpus",
            "2",
            "--distributed",
            "zero3",
            "--gpu-memory",
            "80GiB",
        ],
        db_path,
    ).stdout
    assert "left out: LoRA trains on one GPU or with ddp or fsdp here; not with zero3" in zero3
    assert "None of these makes it fit: a smaller --batch-size or --seq-len" in zero3
    ddp_text = run_cli(
        ["predict", *LLAMA_8B, "--gpus", "2", "--distributed", "ddp", "--gpu-memory", "80GiB"], db_path
    ).stdout
    assert "--distributed zero1" in ddp_text and "None of these" not in ddp_text


def test_a_run_that_fits_has_no_ladder(db_path):
    config = RunConfig(preset="bert-large", batch_size=8)
    assert fits_in(estimate_memory(config), 80 * GIB) and fit_ladder(config, 80 * GIB) == []
    text = run_cli(["predict", "--batch-size", "8", "--gpu-memory", "80GiB"], db_path).stdout
    assert "batch 8 fits" in text and "What makes it fit" not in text
    assert predicted(db_path, ["--gpu-memory", "80GiB"])["fit_ladder"] == []
    without_size = predicted(db_path, [])  # no GPU memory to fit (no NVML here): no ladder either; on a GPU, NVML's
    assert without_size["fit_ladder"] == ([] if without_size["gpu_memory_bytes"] else None)


def test_the_ladder_agrees_with_the_estimate_it_is_built_on():
    """Each tried step's peak is the estimate of the config it made, its verdict `fits_in`'s (a classifier on a
    small GPU: checkpointing first)."""
    config = RunConfig(preset="bert-large", batch_size=64)
    (step,) = fit_ladder(config, 16 * GIB)
    checkpointed = config.replace(grad_checkpointing=True)
    assert step.flags == "--grad-checkpointing" and step.fits
    assert step.peak_device_bytes == peak_device_bytes(estimate_memory(checkpointed))
    assert not fits_in(estimate_memory(config), 16 * GIB) and fits_in(estimate_memory(checkpointed), 16 * GIB)


def test_a_technique_that_never_helped_is_said_after_the_one_that_fits(db_path):
    """bert-large at seq 128, batch 1, on a 4 GiB GPU: its state peaks and its activations are small, so checkpointing
    lowers nothing (its recompute adds a layer's worth), bf16 weights fit; the checkpointing step is listed last as
    left out, and the answer is still that it fits. (A decoder under autocast is another case: checkpointing frees
    autocast's weight copies together as the forward returns, which lowers the allocator's reserve.)"""
    small = ["--preset", "bert-large", "--precision", "fp32", "--batch-size", "1", "--seq-len", "128"]
    ladder = fit_ladder(RunConfig(preset="bert-large", precision="fp32", batch_size=1, seq_len=128), 4 * GIB)
    assert [(step.flags, step.fits, step.refused is None) for step in ladder] == [
        ("--precision bf16 --weights-dtype bf16", True, True),
        ("--grad-checkpointing", False, False),
    ]
    assert "lowers nothing here" in ladder[1].refused
    text = run_cli(["predict", *small, "--gpu-memory", "4GiB"], db_path).stdout
    assert "left out: lowers nothing here" in text and "None of these" not in text


def test_sharding_on_the_accelerate_loop_takes_trainer_and_says_so(db_path):
    """The docs' Accelerate loop trains with DDP only: the ladder's sharding step takes HF Trainer, and its flags say
    so, so that they replay to the same run."""
    flags = [*LLAMA_8B, "--gpus", "2", "--distributed", "ddp", "--engine", "accelerate", "--gpu-memory", "80GiB"]
    first = predicted(db_path, flags)["fit_ladder"][0]
    assert first["flags"] == "--distributed zero1 --engine trainer" and first["refused"] is None
    assert predicted(db_path, [*flags, *shlex.split(first["flags"])])["peak_device_bytes"] == first["peak_device_bytes"]


def test_running_out_of_memory_says_what_is_predicted_to_fit():
    """The OOM an H200 pair measured (llama-3.1-8b under FSDP, batch 8 at seq 8192, no checkpointing): the hint is
    the fit ladder's, up to the step predicted to fit; without a GPU's size, only what is not on yet."""
    oom = RunConfig(preset="llama-3.1-8b", gpus="2", distributed="fsdp", precision="bf16", batch_size=8, seq_len=8192)
    hint = out_of_memory_hint(oom, 150_754_820_096)
    flags = [step.flags for step in fit_ladder(oom, 150_754_820_096) if step.refused is None]
    assert hint == f"add {' '.join(flags)} (predicted to fit; `gpuanat predict` shows why)"
    assert flags[0] == "--grad-checkpointing"
    checkpointed = RunConfig(preset="bert-large", precision="bf16", grad_checkpointing=True)
    assert out_of_memory_hint(checkpointed, None) == "try a smaller --batch-size"


def test_a_run_that_fits_only_once_the_cache_is_given_back_says_so(db_path):
    """FSDP2's cache above the peak (fitted on 2 and 4 H200s) can take the peak device past the GPU; near the limit the
    allocator frees what it caches, so the run is said to fit, and why the two numbers disagree."""
    flags = [
        "predict",
        "--preset",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--distributed",
        "fsdp",
        "--precision",
        "bf16",
        "--seq-len",
        "2048",
        "--gpu-memory",
        "80GiB",
    ]
    text = run_cli(flags, db_path).stdout
    prediction = json.loads(run_cli([*flags, "--json"], db_path).stdout)
    assert prediction["peak_device_bytes"] > 80 * GIB and "batch 4 fits" in text
    assert "of allocator cache above the peak allocated: near the limit the allocator frees" in text
    # a ladder step alike: LoRA makes batch 8 at seq 4096 fit 2 × 80 GiB with a peak device above it
    ladder_flags = [
        "predict",
        "--preset",
        "llama-3.1-8b",
        "--gpus",
        "2",
        "--distributed",
        "fsdp",
        "--precision",
        "bf16",
        "--grad-checkpointing",
        "--seq-len",
        "4096",
        "--batch-size",
        "8",
        "--gpu-memory",
        "80GiB",
    ]
    ladder = json.loads(run_cli([*ladder_flags, "--json"], db_path).stdout)["fit_ladder"]
    lora = next(step for step in ladder if step["flags"].startswith("--lora"))
    assert lora["fits"] and lora["peak_device_bytes"] > 80 * GIB
    assert "fits (its allocator cache given back near the limit)" in run_cli(ladder_flags, db_path).stdout
