"""The prediction model against measurements committed from an H100, most of them held out of its fit.

benchmarks/results/h100/memory_matrix.json: bert-large, seq 512, trained a few steps per configuration
by benchmarks/memory_matrix.py (fp32/fp16/bf16 x checkpointing x batch 1-64, four optimizers besides
fused AdamW, eager attention, accumulation). benchmarks/fit_memory_model.py fits the model's measured
coefficients on 12 of those rows; the other 58 are held out here.
benchmarks/results/h100/predict/max_batch_check.json: real `gpuanat run` trials at the predicted largest
batch and 8 more, for ten configurations, none of them used in the fit. Its checkpointed ones belong to an
earlier model; checkpointing was refitted (temporaries as a line through batch 32 and 64, mixed precision's
fragmentation from a `gpuanat fit` search, anatomy/fit_bf16_checkpointed.json) and rechecked on other
checkpointed configurations in anatomy/recheck/max_batch_check_checkpointed.json.
benchmarks/results/h100/anatomy/memory_matrix_autocast_cache.json: configurations measured after the fact
that AMP with checkpointing keeps autocast's weight copies until the forward pass returns was found in the
docs' table, and used for nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuanat.core.config import RunConfig
from gpuanat.core.predict import estimate_memory, max_batch_size

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results" / "h100"
MATRIX = RESULTS / "memory_matrix.json"
MAX_BATCH_CHECK = RESULTS / "predict" / "max_batch_check.json"
CHECKPOINTED_CHECK = RESULTS / "anatomy" / "recheck" / "max_batch_check_checkpointed.json"
MIXED_CHECKPOINTED_SEARCH = RESULTS / "anatomy" / "fit_bf16_checkpointed.json"
AUTOCAST_CACHE_SET = RESULTS / "anatomy" / "memory_matrix_autocast_cache.json"
DOCS_TABLE_SWEEP = RESULTS / "anatomy" / "probe_cost" / "sweep_128.json"
FIT_SCRIPT = Path(__file__).parent.parent / "benchmarks" / "fit_memory_model.py"
TARGET_PERCENT = 10.0

sys.path.insert(0, str(FIT_SCRIPT.parent))
from fit_memory_model import is_training_row  # noqa: E402


def measured_rows() -> list[dict]:
    return [run for run in json.loads(MATRIX.read_text())["runs"] if run["status"] == "ok"]


def error_percent(predicted: int, measured: int) -> float:
    return 100.0 * (predicted - measured) / measured


def test_the_coefficients_are_the_fit_of_the_training_rows(tmp_path):
    completed = subprocess.run([sys.executable, str(FIT_SCRIPT), str(MATRIX), "--mixed-checkpointed-search",
                                str(MIXED_CHECKPOINTED_SEARCH), "--json", str(tmp_path / "fit.json")],
                               capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    fitted = json.loads((tmp_path / "fit.json").read_text())
    assert len([row for row in fitted["evaluation"]["rows"] if row["held_out"]]) >= 50


def test_held_out_peaks_are_within_ten_percent():
    rows = [run for run in measured_rows() if not is_training_row(run)]
    assert len(rows) >= 50
    errors = {json.dumps(run["overrides"]): error_percent(estimate_memory(RunConfig.from_json(run["config"]))
                                                          .peak_allocated_bytes, run["peak_allocated_bytes"])
              for run in rows}
    worst = max(errors, key=lambda key: abs(errors[key]))
    assert abs(errors[worst]) <= TARGET_PERCENT, f"{worst}: {errors[worst]:+.1f}%"
    # every technique class is represented among the held-out rows
    covered = {key for run in rows for key in run["overrides"]}
    assert {"precision", "grad_checkpointing", "optim", "attn", "grad_accum"} <= covered
    assert {1, 64} <= {run["overrides"]["batch_size"] for run in rows}


@pytest.mark.parametrize("band", ["weights_bytes", "optimizer_state_bytes"])
def test_exact_bands_match_the_probe_to_the_byte(band):
    for run in measured_rows():
        estimate = estimate_memory(RunConfig.from_json(run["config"]))
        assert getattr(estimate, band) == run["bands"][band], run["overrides"]


def test_gradients_alive_at_the_end_of_forward_only_when_accumulating():
    for run in measured_rows():
        estimate = estimate_memory(RunConfig.from_json(run["config"]))
        assert estimate.gradients_at_peak_bytes == run["bands"]["gradients_at_forward_end_bytes"], run["overrides"]


def _checks(path: Path, *, checkpointing: bool) -> list[dict]:
    return [check for check in json.loads(path.read_text())["checks"]
            if bool(check["overrides"].get("grad_checkpointing")) == checkpointing]


@pytest.mark.parametrize("path, checkpointing", [(MAX_BATCH_CHECK, False), (CHECKPOINTED_CHECK, True)],
                         ids=["first", "checkpointed-recheck"])
def test_the_max_batch_checks_were_of_this_model_and_their_peaks_hold(path, checkpointing):
    gpu_memory_bytes = json.loads(path.read_text())["gpu_memory_bytes"]
    checks = _checks(path, checkpointing=checkpointing)
    assert len(checks) >= 4
    for check in checks:
        config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", **check["overrides"]})
        assert max_batch_size(config, gpu_memory_bytes) == check["predicted_max_batch_size"]
        for trial in check["trials"]:
            if trial["status"] != "ok":
                continue
            predicted = estimate_memory(config.replace(batch_size=trial["batch_size"])).peak_allocated_bytes
            assert abs(error_percent(predicted, trial["peak_allocated_bytes"])) <= TARGET_PERCENT, check["overrides"]


CHECKPOINTED_PLUS_8_TRAINED = {"precision": "fp32", "grad_checkpointing": True, "optim": "adafactor"}
"""Held out: predicted 782 trains, and so does 790. `gpuanat fit` found 818 (anatomy/fit_fp32_checkpointed_adafactor
.json): the allocator reserves 1.058 times what it allocates there, while the model takes fp32 checkpointing's
1.104 from its AdamW search; the prediction is 36 samples short, safe but not within 8."""


@pytest.mark.parametrize("check", [
    pytest.param(check, id=json.dumps(check["overrides"]),
                 marks=[pytest.mark.xfail(strict=True, reason="790 trained on the H100; the largest is 818")]
                 if check["overrides"] == CHECKPOINTED_PLUS_8_TRAINED else [])
    for path, checkpointing in ((MAX_BATCH_CHECK, False), (CHECKPOINTED_CHECK, True))
    for check in _checks(path, checkpointing=checkpointing)])
def test_the_predicted_largest_batch_trains_and_8_more_runs_out_of_memory(check):
    statuses = {trial["batch_size"]: trial["status"] for trial in check["trials"]}
    predicted = check["predicted_max_batch_size"]
    assert statuses[predicted] == "ok"
    assert statuses[predicted + 8] == "oom"


def test_the_mixed_checkpointed_search_is_the_fragmentation_fit_and_its_peaks_hold():
    search = json.loads(MIXED_CHECKPOINTED_SEARCH.read_text())
    config = RunConfig.from_json(search["config"])
    # The fragmentation is fitted on this search, so the prediction equals its answer by construction; the held-out
    # tests of it are the other mixed-precision checkpointed checks above.
    assert max_batch_size(config, search["gpu_memory_bytes"]) == search["largest_batch_size"] == 945
    for trial in search["trials"]:
        if trial["trained"]:
            predicted = estimate_memory(config.replace(batch_size=trial["batch_size"])).peak_allocated_bytes
            assert abs(error_percent(predicted, trial["peak_allocated_bytes"])) <= 0.5


def test_the_docs_table_peaks_are_within_ten_percent():
    runs = json.loads(DOCS_TABLE_SWEEP.read_text())
    assert len(runs) == 11 and all(run["status"] == "ok" for run in runs)
    for run in runs:
        predicted = estimate_memory(RunConfig.from_json(run["config"])).peak_allocated_bytes
        assert abs(error_percent(predicted, run["peak_allocated_bytes"])) <= TARGET_PERCENT, run["name"]


def _autocast_rows() -> list[dict]:
    return [run for run in json.loads(AUTOCAST_CACHE_SET.read_text())["runs"] if run["status"] == "ok"]


def test_autocast_cache_configurations_are_within_ten_percent():
    rows = _autocast_rows()
    assert len(rows) >= 20
    for run in rows:
        predicted = estimate_memory(RunConfig.from_json(run["config"])).peak_allocated_bytes
        assert abs(error_percent(predicted, run["peak_allocated_bytes"])) <= TARGET_PERCENT, run["overrides"]


def _freed_before_forward_returns(run: dict) -> int:
    """The forward pass's peak above what is alive at its end (weights, gradients, optimizer state, activations
    and the batch, all as the probe measured them at the end of forward)."""
    bands = run["bands"]
    alive = (bands["weights_bytes"] + bands["gradients_at_forward_end_bytes"]
             + bands["optimizer_state_at_forward_end_bytes"] + bands["activations_bytes"] + bands["batch_bytes"])
    return bands["forward_peak_allocated_bytes"] - alive


def test_autocast_keeps_the_weight_copies_until_the_forward_pass_returns():
    def by_batch(precision: str) -> dict[int, int]:
        return {run["overrides"]["batch_size"]: _freed_before_forward_returns(run) for run in _autocast_rows()
                if run["overrides"] == {"precision": precision, "grad_checkpointing": True, "grad_accum": 4,
                                        "batch_size": run["overrides"]["batch_size"]}}

    for precision in ("bf16", "fp16"):
        freed = by_batch(precision)
        # What the forward pass frees before returning, extrapolated to no samples: the weight copies alone.
        intercept = freed[1] - (freed[2] - freed[1])
        config = RunConfig.from_json({"preset": "bert-large", "precision": precision, "grad_checkpointing": True})
        assert abs(error_percent(estimate_memory(config).autocast_cache_bytes, intercept)) <= 2.0
    # Without AMP there are no copies: only the last layer's transients, growing with the batch.
    fp32 = by_batch("fp32")
    mixed = RunConfig.from_json({"preset": "bert-large", "precision": "bf16", "grad_checkpointing": True})
    assert fp32[2] - (fp32[8] - fp32[2]) / 3 < 0.01 * estimate_memory(mixed).autocast_cache_bytes
