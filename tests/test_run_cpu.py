"""`gpuanat run` for real: the tiny BERT trains on the CPU in a real child process.

The runs start together (module fixture) so the suite pays the imports once in wall time. Byte
counts are checked against an independent count of the same model built in this process.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math

import pytest
from conftest import last_json, run_cli, start_cli
from result_golden import assert_as_recorded
from transformers import AutoModelForSequenceClassification, BertConfig

from gpuanat.core.measure.anatomy import stack_problems
from gpuanat.core.vocabulary.presets import PRESETS

pytestmark = pytest.mark.xdist_group("test_run_cpu")
"""Its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`)."""

BASE = ["--preset", "tiny", "--device", "cpu", "--seq-len", "64", "--samples", "64"]
RUNS = {
    "adamw_bs8": [*BASE, "--batch-size", "8"],
    "adamw_bs16": [*BASE, "--batch-size", "16"],
    "checkpointing_bs8": [*BASE, "--batch-size", "8", "--grad-checkpointing"],
    "sgd_accum": [*BASE, "--batch-size", "4", "--grad-accum", "2", "--optim", "sgd"],
    "adafactor_eager": [*BASE, "--batch-size", "8", "--optim", "adafactor", "--attn", "eager"],
    "compiled_bs8": [*BASE, "--batch-size", "8", "--compile"],
    "regions_bs8": [*BASE, "--batch-size", "8", "--compile-regions"],
}
ALLOCATOR_CONF = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.9,expandable_segments:True"}
"""The user's allocator options reach the child; the technique decides expandable_segments."""


@pytest.fixture(scope="module")
def history_db(tmp_path_factory):
    return tmp_path_factory.mktemp("runs") / "history.sqlite"


@pytest.fixture(scope="module")
def results(history_db):
    processes = {
        name: start_cli(["run", *args, "--json"], history_db, extra_env=ALLOCATOR_CONF) for name, args in RUNS.items()
    }
    outputs = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, f"{name}: {stderr[-3000:]}"
        outputs[name] = last_json(stdout)
    return outputs


def tiny_model_counts() -> dict[str, int]:
    """Parameters and buffers of the tiny preset, counted here with numel × element size."""
    preset = PRESETS["tiny"]
    model = AutoModelForSequenceClassification.from_config(
        BertConfig(
            vocab_size=preset.vocab_size,
            hidden_size=preset.hidden_size,
            num_hidden_layers=preset.num_layers,
            num_attention_heads=preset.num_heads,
            intermediate_size=preset.intermediate_size,
            max_position_embeddings=preset.max_positions,
        )
    )
    parameters = list(model.parameters())
    return {
        "params": sum(p.numel() for p in parameters),
        "parameter_tensors": len(parameters),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "matrices_elements": [tuple(p.shape) for p in parameters],
    }


def test_every_result_prints_as_gpuanat_printed_it_before_the_result_was_typed(results):
    for name, result in results.items():
        assert_as_recorded(name, result)


def test_json_contract(results):
    result = results["adamw_bs8"]
    for key in (
        "run_id",
        "status",
        "config",
        "params",
        "train_runtime_s",
        "samples_per_second",
        "steady_samples_per_second",
        "peak_allocated_bytes",
        "device_memory_used_bytes",
        "bands",
    ):
        assert key in result
    assert result["status"] == "ok"
    assert result["config"]["batch_size"] == 8 and result["config"]["optim"] == "adamw_torch_fused"
    assert set(result["config"]) >= {
        "grad_accum",
        "grad_checkpointing",
        "precision",
        "tf32",
        "optim",
        "workers",
        "pin_memory",
        "attn",
        "compile",
        "seq_len",
        "samples",
        "epochs",
        "max_steps",
    }
    assert result["train_runtime_s"] > 0 and result["samples_per_second"] > 0
    assert result["steady_samples_per_second"] > 0
    assert result["steps"] == 8 and result["samples"] == 64
    # On the CPU the GPU figures are null, each with a reason.
    assert result["peak_allocated_bytes"] is None and result["device_memory_used_bytes"] is None
    assert "CPU" in result["unavailable"]["device_memory_used_bytes"]
    assert "CPU" in result["unavailable"]["peak_allocated_bytes"]
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes"):
        assert isinstance(result["bands"][band], int)
    # The prediction made from the preset's shape is recorded with the run; on the CPU there is no
    # allocator peak to compare it with.
    assert result["predicted"]["weights_bytes"] == result["bands"]["weights_bytes"]
    assert result["predicted"]["gradients_bytes"] == result["gradients_after_backward_bytes"]
    assert result["predicted"]["optimizer_state_bytes"] == result["bands"]["optimizer_state_bytes"]
    assert result["prediction_error_percent"] is None


def test_exact_bytes_for_fp32_adamw(results):
    counts = tiny_model_counts()
    result = results["adamw_bs8"]
    bands = result["bands"]
    assert result["params"] == counts["params"]
    assert bands["weights_bytes"] == 4 * counts["params"] + counts["buffer_bytes"]
    assert result["gradients_after_backward_bytes"] == 4 * counts["params"]
    # AdamW keeps exp_avg and exp_avg_sq (fp32: 8 B/param) and one fp32 step counter per parameter tensor.
    assert bands["optimizer_state_bytes"] == 8 * counts["params"] + 4 * counts["parameter_tensors"]


def test_sgd_has_no_optimizer_state_and_adafactor_factors_its_state(results):
    counts = tiny_model_counts()
    assert results["sgd_accum"]["bands"]["optimizer_state_bytes"] == 0
    assert results["sgd_accum"]["gradients_after_backward_bytes"] == 4 * counts["params"]
    # Adafactor: a 2-D weight keeps a row and a column factor, a 1-D one its full second moment; plus a step.
    expected = 0
    for shape in counts["matrices_elements"]:
        expected += 4 * (shape[0] + shape[1]) if len(shape) == 2 else 4 * math.prod(shape)
    adafactor_state = results["adafactor_eager"]["bands"]["optimizer_state_bytes"]
    assert expected <= adafactor_state <= expected + 4 * counts["parameter_tensors"]
    assert adafactor_state < results["adamw_bs8"]["bands"]["optimizer_state_bytes"] / 10


def test_activations_scale_with_batch_and_shrink_with_checkpointing(results):
    bs8 = results["adamw_bs8"]["bands"]["activations_bytes"]
    bs16 = results["adamw_bs16"]["bands"]["activations_bytes"]
    checkpointed = results["checkpointing_bs8"]["bands"]["activations_bytes"]
    assert 1.9 < bs16 / bs8 < 2.1
    assert checkpointed < bs8 / 2
    # On the CPU, SDPA runs its math kernel, which saves the s×s attention probabilities as eager does: so
    # both hold at least 2 layers × 2 heads × 64² fp32 probabilities per sample.
    for name in ("adamw_bs8", "adafactor_eager"):
        assert results[name]["bands"]["activations_bytes"] >= 8 * 2 * 2 * 64 * 64 * 4


def test_accumulation_counts_micro_batches(results):
    result = results["sgd_accum"]
    assert result["steps"] == 8  # 64 samples / (4 × 2)
    assert result["samples"] == 64


def test_gradients_are_alive_at_the_end_of_forward_only_when_accumulating(results):
    counts = tiny_model_counts()
    # the bands are one moment's, the end of forward: the second micro-batch's forward ends with the first one's
    # gradients still held; without accumulation none are alive then, and their size after backward is beside
    assert results["sgd_accum"]["bands"]["gradients_bytes"] == 4 * counts["params"]
    assert results["adamw_bs8"]["bands"]["gradients_bytes"] == 0
    assert results["adamw_bs8"]["gradients_after_backward_bytes"] == 4 * counts["params"]
    assert "gradients_at_forward_end_bytes" not in results["adamw_bs8"]


def test_every_result_s_bands_are_one_moment_s(results):
    for name, result in results.items():
        assert stack_problems(result) == [], name
        for rank in result["ranks"]:
            assert (
                rank["bands"] == result["bands"]
                and rank["gradients_after_backward_bytes"] == result["gradients_after_backward_bytes"]
            )


def test_history_lists_every_run_in_each_format(results, history_db):
    listed = json.loads(run_cli(["history", "--json"], history_db).stdout)
    by_id = {run["id"]: run for run in listed}
    for result in results.values():
        run = by_id[result["run_id"]]
        assert run["status"] == "ok"
        assert run["result"]["steady_samples_per_second"] == result["steady_samples_per_second"]
        assert run["config"] == result["config"]
    rows = list(csv.DictReader(io.StringIO(run_cli(["history", "--format", "csv"], history_db).stdout)))
    assert sorted(int(row["id"]) for row in rows) == sorted(by_id)
    markdown = run_cli(["history", "--format", "md"], history_db).stdout.splitlines()
    assert markdown[0].startswith("| id |") and len(markdown) == 2 + len(results)
    table = run_cli(["history"], history_db).stdout
    assert "bs4 accum2 sgd" in table
    last_two = json.loads(run_cli(["history", "--json", "--limit", "2"], history_db).stdout)
    assert [run["id"] for run in last_two] == sorted(by_id)[-2:]


def test_the_probe_reports_its_own_time(results):
    result = results["adamw_bs8"]
    parts = result["probe_time_by_part_s"]
    assert set(parts) == {"setup", "measured steps", "other steps", "synchronize", "profiling"}
    assert parts["synchronize"] == 0.0  # no CUDA: nothing to wait for
    assert parts["profiling"] == 0.0  # not asked to profile
    assert parts["measured steps"] > 0 and parts["other steps"] > 0
    assert sum(parts.values()) == pytest.approx(result["probe_time_s"])
    assert 0 < result["probe_time_s"] < result["train_runtime_s"]
    in_steps_s = parts["measured steps"] + parts["other steps"]
    assert result["probe_cost_percent"] == pytest.approx(
        100 * in_steps_s / (result["train_runtime_s"] - result["probe_time_s"])
    )


def test_the_wall_time_is_broken_down_from_the_request_to_the_result(results):
    from gpuanat.core.measure.startup import FIRST_STEP_PARTS, WALL_PARTS

    result = results["adamw_bs8"]
    breakdown = result["wall_breakdown_s"]
    assert list(breakdown) == [part for part, _ in WALL_PARTS]  # every part reached, in order
    assert all(seconds >= 0 for seconds in breakdown.values())
    assert breakdown["imports"] > breakdown["child start"]  # torch and transformers: the bulk of a start
    assert result["time_to_first_step_s"] == pytest.approx(sum(breakdown[part] for part in FIRST_STEP_PARTS))
    # 8 steps: the first step's end to the last's is 7 of them, inside the Trainer's own runtime
    assert 0 < breakdown["training"] < result["train_runtime_s"]


def test_each_steady_step_is_timed_by_phase_on_the_host(results, history_db):
    from gpuanat.core.store.history import HistoryStore
    from gpuanat.core.vocabulary.protocol import STEP_PHASES

    result = results["adamw_bs8"]
    breakdown = result["step_time_breakdown"]
    assert breakdown["steps"] == result["steps"] - result["warmup_steps"]
    assert list(breakdown["share"]) == list(STEP_PHASES)
    assert sum(breakdown["share"].values()) == pytest.approx(1.0)
    # a CPU step is forward, backward and the optimizer (its share of a tiny model's step varies from machine to
    # machine: 0.49 of a loaded CI machine's); the batch is a slice of a tensor in memory and nothing waits for a GPU
    share = breakdown["share"]
    assert share["forward"] > 0 and share["backward"] > 0 and share["optimizer"] > 0
    assert share["forward"] + share["backward"] > 2 * (share["data"] + share["gpu wait"])
    assert share["data"] < 0.2
    assert breakdown["gpu_caught_up_share"] is None and breakdown["gpu_busy_percent"] is None  # no GPU
    with HistoryStore(history_db) as store:
        steps = store.steps(result["run_id"])
    # every step's phases add up to its wall time: one stamp ends both (to the phases' rounding to the microsecond)
    for step in steps[1:]:
        assert sum(step["phases_s"].values()) == pytest.approx(step["step_time_s"], rel=0, abs=5e-6)
    steady = steps[result["warmup_steps"] :]
    assert breakdown["step_s"] == pytest.approx(sum(step["step_time_s"] for step in steady) / len(steady), rel=0.05)
    assert result["diagnosis"] == []  # nothing to say of a CPU run that waits for nothing


def test_steps_are_recorded_with_the_run(results, history_db):
    from gpuanat.core.measure.nvml_source import probe_nvml
    from gpuanat.core.store.history import HistoryStore

    with HistoryStore(history_db) as store:
        steps = store.steps(results["adamw_bs8"]["run_id"])
        samples = store.samples(results["adamw_bs8"]["run_id"])
    assert [step["step"] for step in steps] == list(range(1, 9))
    assert steps[-1]["samples"] == 64
    measured = [step for step in steps if step["bands"] is not None]
    assert [step["step"] for step in measured] == [1, 2, 3]
    # The optimizer state is created by the first optimizer step, after step 1's forward pass.
    assert [step["bands"]["optimizer_state_at_forward_end_bytes"] for step in measured] == [
        0,
        *[measured[0]["bands"]["optimizer_state_bytes"]] * 2,
    ]
    assert all(step["nvml_device_used_bytes"] is None for step in steps)  # no GPU
    assert all(later["elapsed_s"] > earlier["elapsed_s"] for earlier, later in itertools.pairwise(steps))
    # The sampler recorded host metrics of the training process while it ran.
    # Without NVML no GPU is read; on a GPU box (this CPU run beside it) every sample reads its GPUs.
    gpus_read = {len(sample["gpus"]) for sample in samples}
    nvml = probe_nvml()
    assert samples and gpus_read == ({len(nvml.gpu_names)} if nvml.available else {0})
    # A sample taken as the child exits finds no process to read (rss None); the others read it.
    rss_readings = [sample["host"]["rss_bytes"] for sample in samples if sample["host"]["rss_bytes"] is not None]
    assert len(rss_readings) >= len(samples) - 1 and max(rss_readings) > 100 * 1024**2


def test_the_child_runs_with_the_allocator_options_of_its_technique(results, history_db):
    from gpuanat.core.store.history import HistoryStore

    with HistoryStore(history_db) as store:
        row = store.run(results["adamw_bs8"]["run_id"])
    assert row is not None
    environment = row.environment
    assert environment["allocator_conf"] == "garbage_collection_threshold:0.9,expandable_segments:False"


def test_human_summary_reads_like_the_docs(history_db):
    completed = run_cli(["run", *BASE, "--batch-size", "16", "--max-steps", "2"], history_db)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert any(line.startswith("Time: ") for line in lines)
    assert any(line.startswith("Samples/second: ") for line in lines)
    assert "GPU memory occupied: unknown (no GPU reading)." in lines  # not "— MiB" (issue #48, point 12)
    assert any(line.strip().startswith("weights") and "MiB" in line for line in lines)
    assert "Steady samples/second: — (too few steps" in completed.stdout
    assert any(line.startswith("gpuanat's probe: ") and "% of the training time" in line for line in lines)
    (startup,) = [line for line in lines if line.startswith("Start-up: ")]
    assert " s to the first step (gpuanat " in startup and "imports " in startup, startup


def test_model_flag_loads_local_weights_and_refuses_a_missing_model(tmp_path, db_path):
    from transformers import AutoModelForSequenceClassification, BertConfig

    checkpoint = tmp_path / "my-bert"
    config = BertConfig(
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(checkpoint)
    common = ["run", "--device", "cpu", "--seq-len", "32", "--samples", "16", "--batch-size", "4", "--json"]
    loading = start_cli([*common, "--model", str(checkpoint)], db_path)
    missing = start_cli([*common, "--model", str(tmp_path / "no-such-model")], db_path, offline_hub=True)
    stdout, stderr = loading.communicate(timeout=300)
    assert loading.returncode == 0, stderr[-3000:]
    result = last_json(stdout)
    assert result["params"] == sum(p.numel() for p in model.parameters())
    assert result["bands"]["weights_bytes"] == 4 * result["params"] + sum(b.nbytes for b in model.buffers())
    _, stderr = missing.communicate(timeout=300)
    assert missing.returncode == 2
    assert stderr.strip().splitlines() == [
        f"gpuanat: error: --model: no such directory: {tmp_path / 'no-such-model'} "
        "(a local model is a directory with config.json, as save_pretrained "
        "writes it)"
    ]
    too_long = run_cli([*common, "--model", str(checkpoint), "--seq-len", "256"], db_path)
    assert too_long.returncode == 2 and f"≤ 128, the position embeddings of {checkpoint}" in too_long.stderr


def test_a_compiled_run_is_one_graph_with_the_probe_outside_it(results):
    """The probe's forward hooks stay out of torch.compile's graph: traced, they broke it at their clock reads and
    recompiled it at every step (a guard on the probe's sample count); the classifier's problem type, set before
    the first forward, no longer fails a guard either. The hooks still run at every step, around the graph."""
    result = results["compiled_bs8"]
    assert result["status"] == "ok"
    assert result["compile_stats"] == {"graphs": 1, "graph_breaks": 0, "frames": 1}
    assert result["samples"] == 64 and result["steps"] == 8
    assert result["step_time_breakdown"]["share"]["forward"] > 0
    # No break or recompilation to report (whether it beat eager is a CPU timing of a tiny model: not asserted)
    assert not [
        finding
        for finding in result["diagnosis"]
        if finding["bottleneck"] == "compile" and "graph break" in finding["evidence"]
    ]


def test_compiled_regions_are_one_graph_a_kind_of_block_outside_attention(results):
    """--compile-regions compiles, in each BERT layer, the MLP (intermediate, output) and the attention's output
    projection, and the embeddings: four kinds of module, one graph each, whatever the number of layers; attention
    stays eager. The eager run of the same training (adamw_bs8) is the history's reference: no compile finding
    unless the compiled run is slower (not asserted: CPU timings of a tiny model)."""
    result = results["regions_bs8"]
    assert result["status"] == "ok" and result["samples"] == 64
    assert result["config"]["compile_regions"] is True and result["config"]["compile"] is False
    assert result["compile_stats"] == {"graphs": 4, "graph_breaks": 0, "frames": 4}
    assert not [
        finding
        for finding in result["diagnosis"]
        if finding["bottleneck"] == "compile" and "graph break" in finding["evidence"]
    ]
