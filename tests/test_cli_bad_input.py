"""Bad input is refused before anything starts: exit 2, one line on stderr naming the flag, no traceback.

And a newcomer's first runs on this machine, which has no CUDA GPU: the defaults train a workload sized for the
CPU, and what needs a GPU says so.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import last_json, run_cli

from gpuanat.core.store.history import HistoryStore

TINY = ["--preset", "tiny", "--device", "cpu"]
REFUSED_WITHIN_S = 2.0
"""A value that needs no torch is refused before the capability probe imports it. Measured here (2 cores): 0.1 s
idle, up to 0.6 s with other tests running, for a bad --model path; 0.2 s idle, up to 1.0 s loaded, for an uncached
name offline (huggingface_hub's import). The probe alone takes 1.25 s idle; the refusals took 5.6 s and 28 s when
the training child judged them. The tests also prove the order without a clock (a torch that ends the process)."""


def history_json(db_path) -> list:
    completed = run_cli(["history", "--json"], db_path, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def assert_refused(completed, flag: str, words: str, db_path) -> None:
    """One line on stderr naming the flag and the reason, exit 2, nothing on stdout, no run in the history."""
    assert completed.returncode == 2, completed.stderr
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith(f"gpuanat: error: {flag}"), line
    assert words in line, line
    assert completed.stdout == ""
    assert history_json(db_path) == []


@pytest.mark.parametrize(
    ("args", "flag", "allowed"),
    [
        (["run", "--batch-size", "0"], "--batch-size", "≥ 1"),
        (["run", "--grad-accum", "-1"], "--grad-accum", "≥ 1"),
        (["run", "--precision", "fp8"], "--precision", "'fp32', 'fp16', 'bf16'"),
        (["run", "--optim", "nope"], "--optim", "adamw_torch"),
        (["run", "--attn", "flash"], "--attn", "sdpa"),
        (["run", "--batch-size", "four"], "--batch-size", "int"),
        (["run", "--seq-len", "1024"], "--seq-len", "≤ 512"),
        (["run", "--samples", "0"], "--samples", "≥ 1"),
        (["run", "--workers", "-1"], "--workers", "≥ 0"),
        (["run", "--epochs", "0"], "--epochs", "≥ 1"),
        (["run", "--max-steps", "0"], "--max-steps", "≥ 1"),
        (["run", "--compile", "--compile-regions"], "--compile-regions", "--compile already compiles the whole model"),
        (["run", "--precision", "fp16"], "--precision", "needs a CUDA GPU"),
        (["run", "--tf32"], "--tf32", "needs a CUDA GPU"),
        (["run", "--optim", "adamw_bnb_8bit"], "--optim", "needs a CUDA GPU"),
        (["sweep", "--precision", "bf16"], "--precision", "the sweep sets it per experiment"),
        (["sweep", "--only", "warp drive"], "--only", "vanilla"),
        (["run", "--memory-snapshot", "run.pickle"], "--memory-snapshot", "only on CUDA, and this run is on cpu"),
        (["history", "--limit", "0"], "--limit", "≥ 1"),
        (["history", "--format", "xml"], "--format", "table"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(args, flag, allowed, db_path):
    extra = TINY if args[0] in ("run", "sweep") and "--device" not in args else []
    completed = run_cli([*args, *extra], db_path, timeout_s=60)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert flag in lines[0]
    assert allowed in lines[0]
    assert "Traceback" not in completed.stderr
    assert completed.stdout == ""
    if db_path.exists():
        with HistoryStore(db_path) as store:
            assert store.runs() == []


def test_cuda_requested_on_a_machine_without_it(db_path):
    completed = run_cli(["run", "--preset", "tiny", "--device", "cuda"], db_path, timeout_s=60)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("gpuanat: error: --device: cuda is not available here")
    assert "--device cpu" in completed.stderr


def test_help_explains_every_flag():
    completed = run_cli(["run", "--help"], None, timeout_s=60)
    assert completed.returncode == 0
    for flag in (
        "--preset",
        "--grad-checkpointing",
        "--precision",
        "--optim",
        "--tf32",
        "--pin-memory",
        "--attn",
        "--compile",
        "--seq-len",
        "--samples",
        "--max-steps",
        "--db",
        "--json",
        "--memory-snapshot",
    ):
        assert flag in completed.stdout


@pytest.mark.parametrize(
    ("args", "flag", "bound"),
    [
        (["run", "--batch-size", "10000000000"], "--batch-size", "must be ≤ 65,536"),
        (["run", "--batch-size", "65537"], "--batch-size", "must be ≤ 65,536"),
        (["run", "--grad-accum", "65537"], "--grad-accum", "must be ≤ 65,536"),
        (["run", "--samples", "10000001", "--seq-len", "1"], "--samples", "must be ≤ 10,000,000"),
        (["run", "--samples", "3000000", "--seq-len", "512"], "--samples", "must be ≤ 1,073,741,824 tokens"),
        (["run", "--seq-len", "200000"], "--seq-len", "must be ≤ 131,072"),
        (["run", "--epochs", "10001"], "--epochs", "must be ≤ 10,000"),
        (["run", "--workers", "513"], "--workers", "must be ≤ 512"),
        (["run", "--max-steps", "10000001"], "--max-steps", "must be ≤ 10,000,000"),
        (["sweep", "--batch-size", "65537"], "--batch-size", "must be ≤ 65,536"),
        (["fit", "--max-batch", "65537"], "--max-batch", "≤ 65,536"),
        (["fit", "--batch-size", "65537"], "--batch-size", "must be ≤ 65,536"),
        (["predict", "--batch-size", "65537"], "--batch-size", "must be ≤ 65,536"),
    ],
)
def test_a_value_past_its_bound_is_refused_with_the_bound(args, flag, bound, db_path):
    extra = ["--preset", "tiny"] if args[0] != "predict" else []
    assert_refused(run_cli([*args, *extra], db_path, timeout_s=60), flag, bound, db_path)


@pytest.mark.parametrize(
    ("command", "size", "words"),
    [
        ("predict", "24", "give a unit: 24GiB, 24G, 24GB or 24576MiB"),
        ("fit", "24", "give a unit: 24GiB, 24G, 24GB or 24576MiB"),
        ("predict", "24MiB", "not a GPU's memory"),
        ("predict", "100TiB", "not a GPU's memory"),
    ],
)
def test_a_gpu_memory_without_a_unit_or_no_gpus_size_is_refused(command, size, words, db_path):
    assert_refused(run_cli([command, "--gpu-memory", size], db_path, timeout_s=60), "--gpu-memory", words, db_path)


def test_predict_with_a_gpu_size_still_answers(db_path):
    completed = run_cli(["predict", "--gpu-memory", "80GiB", "--json"], db_path, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["gpu_memory_bytes"] == 80 * 1024**3 and result["max_batch_size"] > 0
    human = run_cli(["predict", "--gpu-memory", "80GiB", "--batch-size", "65536"], db_path, timeout_s=60).stdout
    peak_device = next(line for line in human.splitlines() if line.strip().startswith("peak device"))
    assert peak_device.endswith("TiB"), peak_device  # not thousands of GiB


@pytest.mark.parametrize(
    ("model", "offline", "words"),
    [
        ("./no-such-dir", False, "no such directory: ./no-such-dir"),
        ("tests", False, "tests has no config.json"),  # a directory, but not a saved model
        ("some-org/not-cached", True, "not in the local Hugging Face cache"),
    ],
)
def test_a_model_that_cannot_be_had_is_refused_before_torch(model, offline, words, db_path, tmp_path):
    # A torch whose import ends the process: had anything imported it first (the capability probe, the training
    # child), the answer would be "cannot start the training environment", or a failed run.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("import os\nos._exit(97)\n")
    env = {"PYTHONPATH": str(tmp_path)} | ({"HF_HUB_OFFLINE": "1"} if offline else {})
    started = time.monotonic()
    completed = run_cli(["run", "--model", model], db_path, timeout_s=60, extra_env=env)
    elapsed_s = time.monotonic() - started
    assert_refused(completed, "--model", words, db_path)
    assert elapsed_s < REFUSED_WITHIN_S


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        (["--precision", "fp16"], "--precision", "fp16 needs a CUDA GPU"),
        (["--tf32"], "--tf32", "tf32 needs a CUDA GPU"),
        (["--expandable-segments"], "--expandable-segments", "an option of the CUDA allocator"),
        (["--optim", "adamw_bnb_8bit"], "--optim", "needs a CUDA GPU"),
    ],
)
def test_a_cuda_technique_on_device_cpu_is_refused_before_torch(args, flag, words, db_path, tmp_path):
    # --device cpu says all the machine needs to know: no capability probe (which imports torch), cached or not
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("import os\nos._exit(97)\n")
    env = {"PYTHONPATH": str(tmp_path), "GPUANAT_NO_CAPABILITIES_CACHE": "1"}
    completed = run_cli(["run", "--preset", "tiny", "--device", "cpu", *args], db_path, timeout_s=60, extra_env=env)
    assert_refused(completed, flag, words, db_path)


def test_a_hub_name_not_cached_online_says_it_will_download(db_path):
    # --device cuda stops it at the capability probe here (no CUDA): it gets as far as saying what it would fetch.
    completed = run_cli(["run", "--model", "some-org/not-cached", "--device", "cuda"], db_path, timeout_s=60)
    assert completed.returncode == 2
    first, refusal = completed.stderr.strip().splitlines()
    assert first == (
        "gpuanat: --model some-org/not-cached is not in the local Hugging Face cache; the run will "
        "download it from the Hub"
    )
    assert refusal.startswith("gpuanat: error: --device: cuda is not available here")


@pytest.mark.parametrize("args", [["fit"], ["fit", "--device", "cpu"], ["fit", "--preset", "tiny"]])
def test_fit_on_the_cpu_is_refused_and_says_what_to_use(args, db_path):
    completed = run_cli(args, db_path, timeout_s=60)
    assert_refused(completed, "fit needs a CUDA GPU", "gpuanat predict --gpu-memory", db_path)
    assert "largest batch that fits GPU memory" in completed.stderr


def test_run_without_a_preset_trains_the_cpu_workload_and_says_so(db_path):
    # 6-7 s on an idle 2-core CPU (CPU_WORKLOAD's docstring); bert-large, the GPU default, would take about 85 minutes
    completed = run_cli(["run", "--json"], db_path, timeout_s=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok"
    config = result["config"]
    assert (config["preset"], config["seq_len"], config["samples"], config["device"]) == ("tiny", 64, 64, "cpu")
    (line,) = [line for line in completed.stderr.splitlines() if line.startswith("gpuanat:")]
    assert line.startswith("gpuanat: no CUDA GPU here (")
    assert line.endswith("training the tiny preset, seq 64, 64 samples — give --preset to choose")


def test_a_preset_given_on_the_cpu_is_kept(db_path):
    completed = run_cli(
        ["run", "--preset", "bert-base", "--max-steps", "1", "--samples", "4", "--seq-len", "32", "--json"],
        db_path,
        timeout_s=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    config = last_json(completed.stdout)["config"]
    assert (config["preset"], config["seq_len"], config["samples"]) == ("bert-base", 32, 4)
    assert "no CUDA GPU here" not in completed.stderr


def test_sweep_on_the_cpu_trains_the_cpu_workload_in_every_experiment(db_path):
    completed = run_cli(["sweep", "--only", "vanilla", "--only", "tf32", "--json"], db_path, timeout_s=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    vanilla, tf32 = json.loads(completed.stdout.strip().splitlines()[-1])
    assert (vanilla["status"], tf32["status"]) == ("ok", "skipped")
    for row in (vanilla, tf32):
        assert (row["config"]["preset"], row["config"]["seq_len"], row["config"]["samples"]) == ("tiny", 64, 64)
    assert sum("training the tiny preset" in line for line in completed.stderr.splitlines()) == 1
