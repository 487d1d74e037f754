"""The prediction model against measurements committed from an H100, most of them held out of its fit.

benchmarks/results/h100/memory_matrix.json: bert-large, seq 512, trained a few steps per configuration
by benchmarks/memory_matrix.py (fp32/fp16/bf16 x checkpointing x batch 1-64, four optimizers besides
fused AdamW, eager attention, accumulation). benchmarks/fit_memory_model.py fits the model's measured
coefficients on 14 of those rows; the other 56 are held out here.
The largest batch: every real `gpuanat run` trial on record near the H100's memory limit, from checks at the
largest batch predicted by the model of the day and 8 more (predict/max_batch_check*.json, anatomy/recheck/,
anatomy/optimizers/), at chosen batches around the edge, repeated, with and without expandable segments
(anatomy/edge/), at the allocator replay's (allocator/replay_check/), and from `gpuanat fit` searches. Each says,
of this model's predicted largest batch and of 8 more, whether it trained; EXPECTED_VERDICTS lists them, which were
fitted and which fail.
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

from gpuanat.core.memory.predict import estimate_memory, max_batch_size
from gpuanat.core.vocabulary.config import RunConfig

RESULTS = Path(__file__).parent.parent / "benchmarks" / "results" / "h100"
MATRIX = RESULTS / "memory_matrix.json"
MAX_BATCH_CHECK = RESULTS / "predict" / "max_batch_check.json"
CHECKPOINTED_CHECK = RESULTS / "anatomy" / "recheck" / "max_batch_check_checkpointed.json"
MIXED_CHECKPOINTED_SEARCH = RESULTS / "anatomy" / "fit_bf16_checkpointed.json"
FP32_CHECKPOINTED_ADAFACTOR_SEARCH = RESULTS / "anatomy" / "fit_fp32_checkpointed_adafactor.json"
OPTIMIZERS_CHECK = RESULTS / "anatomy" / "optimizers" / "max_batch_check_optimizers.json"
EDGE = RESULTS / "anatomy" / "edge"
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
    completed = subprocess.run(
        [
            sys.executable,
            str(FIT_SCRIPT),
            str(MATRIX),
            "--mixed-checkpointed-search",
            str(MIXED_CHECKPOINTED_SEARCH),
            "--fp32-checkpointed-adafactor-search",
            str(FP32_CHECKPOINTED_ADAFACTOR_SEARCH),
            "--json",
            str(tmp_path / "fit.json"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    fitted = json.loads((tmp_path / "fit.json").read_text())
    assert len([row for row in fitted["evaluation"]["rows"] if row["held_out"]]) >= 50


def test_held_out_peaks_are_within_ten_percent():
    rows = [run for run in measured_rows() if not is_training_row(run)]
    assert len(rows) >= 50
    errors = {
        json.dumps(run["overrides"]): error_percent(
            estimate_memory(RunConfig.from_json(run["config"])).peak_allocated_bytes, run["peak_allocated_bytes"]
        )
        for run in rows
    }
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


REPLAY_CHECK = RESULTS / "allocator" / "replay_check"
REPLAY_FIT = RESULTS / "allocator" / "fit" / "fit_fp32_ckpt_sgd.json"
"""`gpuanat fit` of fp32 + checkpointing + SGD, starting from the replay's 818 (with the driver's page)."""
CHECK_FILES = (
    MAX_BATCH_CHECK,
    RESULTS / "predict" / "max_batch_check_mixed_checkpointed.json",
    CHECKPOINTED_CHECK,
    OPTIMIZERS_CHECK,
    *sorted(path for path in EDGE.glob("*.json") if not path.name.startswith("fit_")),
    *sorted(REPLAY_CHECK.glob("*.json")),
)
"""Real `gpuanat run` trials at the largest batch predicted by the model of the day and at 8 more, or (anatomy/edge/)
at chosen batches, some under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or (allocator/replay_check/) at the
largest batch the allocator replay predicts, where no trial had said."""
SEARCH_FILES = (
    RESULTS / "predict" / "fit_bf16.json",
    MIXED_CHECKPOINTED_SEARCH,
    FP32_CHECKPOINTED_ADAFACTOR_SEARCH,
    EDGE / "fit_bf16_checkpointed_expandable.json",
    REPLAY_FIT,
)
"""`gpuanat fit --json` searches."""
H100_MEMORY_BYTES = 85_520_809_984
TECHNIQUES = ("precision", "grad_checkpointing", "optim", "attn", "grad_accum", "expandable_segments")


def _techniques(config: RunConfig) -> tuple:
    return tuple(getattr(config, name) for name in TECHNIQUES)


def _config(overrides: dict) -> RunConfig:
    return RunConfig.from_json({"preset": "bert-large", "device": "cuda", "seq_len": 512, **overrides})


def h100_trials() -> dict[tuple, list[dict]]:
    """Every largest-batch trial on record, by technique set: batch size, whether it trained, its peak, and the file
    it is recorded in."""
    trials: dict[tuple, list[dict]] = {}

    def add(config: RunConfig, batch_size: int, trained: bool, peak_allocated_bytes: int | None, source: str) -> None:
        trials.setdefault(_techniques(config), []).append(
            {
                "batch_size": batch_size,
                "trained": trained,
                "peak_allocated_bytes": peak_allocated_bytes,
                "source": source,
            }
        )

    for path in CHECK_FILES:
        report = json.loads(path.read_text())
        assert report["gpu_memory_bytes"] == H100_MEMORY_BYTES
        # Trials made with the environment variable, before the technique existed.
        expandable = "expandable_segments:True" in (report.get("pytorch_cuda_alloc_conf") or "")
        for check in report["checks"]:
            config = _config(check["overrides"])
            config = config.replace(expandable_segments=True) if expandable else config
            for trial in check["trials"]:
                add(config, trial["batch_size"], trial["status"] == "ok", trial["peak_allocated_bytes"], path.name)
    for path in SEARCH_FILES:
        search = json.loads(path.read_text())
        for trial in search["trials"]:
            add(
                RunConfig.from_json(search["config"]),
                trial["batch_size"],
                trial["trained"],
                trial.get("peak_allocated_bytes"),
                path.name,
            )
    for search in json.loads(MATRIX.read_text())["max_batch"]["searches"]:
        for trial in search.get("trials", []):
            add(
                _config(search["overrides"]),
                trial["batch_size"],
                trial["status"] == "ok",
                trial["peak_allocated_bytes"],
                MATRIX.name,
            )
    return trials


def verdict(trials: list[dict], batch_size: int) -> str:
    """'trains' or 'oom' from the trials at `batch_size`; else inferred from the others, taking a larger batch
    that trained, or a smaller one that ran out of memory, to say the same ('trains?', 'oom?'); 'unknown' where
    nothing says; 'both' where trials disagree."""
    exact = {trial["trained"] for trial in trials if trial["batch_size"] == batch_size}
    if not exact:
        exact = {True for trial in trials if trial["trained"] and trial["batch_size"] > batch_size}
        exact |= {False for trial in trials if not trial["trained"] and trial["batch_size"] < batch_size}
        return {frozenset({True}): "trains?", frozenset({False}): "oom?", frozenset(): "unknown"}.get(
            frozenset(exact), "both"
        )
    return {frozenset({True}): "trains", frozenset({False}): "oom"}.get(frozenset(exact), "both")


EXPECTED_VERDICTS = {
    # (precision, checkpointing, optimizer, attention, accumulation, expandable segments):
    #     (verdict at the prediction, at 8 more)
    # Default allocator. Trained at the predicted batch and ran out of memory at 8 more, in these very trials.
    # Fragmentation was fitted on fp32's and fp32 + checkpointing's searches (AdamW); the others are held out.
    ("fp32", False, "adamw_torch_fused", "sdpa", 1, False): ("trains", "oom"),
    ("fp16", False, "adamw_torch_fused", "sdpa", 1, False): ("trains", "oom"),
    ("fp32", True, "adamw_torch_fused", "sdpa", 1, False): ("trains", "oom"),
    ("fp32", False, "adafactor", "sdpa", 1, False): ("trains", "oom"),
    ("fp32", False, "adamw_torch_fused", "eager", 1, False): ("trains", "oom"),
    ("bf16", False, "adamw_torch_fused", "sdpa", 4, False): ("trains", "oom"),
    ("bf16", False, "sgd", "sdpa", 1, False): ("trains", "oom"),
    ("bf16", False, "adamw_bnb_8bit", "sdpa", 1, False): ("trains", "oom"),
    ("bf16", True, "sgd", "sdpa", 1, False): ("trains", "oom"),
    ("bf16", True, "adamw_torch_fused", "sdpa", 4, False): ("trains", "oom"),
    ("fp32", True, "sgd", "sdpa", 1, False): ("trains", "oom"),
    ("fp16", True, "adamw_torch_fused", "sdpa", 1, False): ("trains", "oom"),
    # Fitted on its search: 945 trained (and twice more when repeated), 946 and 947 ran out of memory.
    ("bf16", True, "adamw_torch_fused", "sdpa", 1, False): ("trains", "oom?"),
    # Fitted on its search: 818 trained, 819, 820 and 822 ran out of memory. The trial at 817 was still running
    # when the device time ran out.
    ("fp32", True, "adafactor", "sdpa", 1, False): ("trains?", "oom?"),
    # 146 trained in the check and ran out of memory in the search: at the edge, runs differ.
    ("bf16", False, "adamw_torch_fused", "sdpa", 1, False): ("both", "oom"),
    # The model's failures. Predicted 805, too low: 807 and 813 trained.
    ("fp32", True, "adamw_bnb_8bit", "sdpa", 1, False): ("trains?", "trains"),
    # Predicted 978: 973 ran out of memory, 965 and 980 trained (the replay's island, allocator/replay_check/).
    ("bf16", True, "adafactor", "sdpa", 1, False): ("both", "oom?"),
    # Predicted 967, too high: 961 ran out of memory (and the two batches above); 953 and 959 trained.
    ("bf16", True, "adamw_bnb_8bit", "sdpa", 1, False): ("oom?", "oom?"),
    # Expandable segments: no fragmentation charged, nothing fitted. Tried at the prediction and 8 more (with the
    # environment variable, before the technique existed).
    ("fp32", False, "adamw_torch_fused", "sdpa", 1, True): ("trains", "oom"),
    ("bf16", False, "adamw_torch_fused", "sdpa", 1, True): ("trains", "oom"),
    ("fp32", True, "adamw_torch_fused", "sdpa", 1, True): ("trains", "oom"),
    ("fp32", True, "adafactor", "sdpa", 1, True): ("trains", "oom"),
    ("bf16", True, "adafactor", "sdpa", 1, True): ("trains", "oom"),
    ("bf16", True, "sgd", "sdpa", 1, True): ("trains", "oom"),
    # Held out: tried after, through --expandable-segments.
    ("fp32", True, "sgd", "sdpa", 1, True): ("trains", "oom"),
    ("fp32", True, "adamw_bnb_8bit", "sdpa", 1, True): ("trains", "oom"),
    ("fp32", True, "adamw_torch", "sdpa", 1, True): ("trains", "oom"),
    ("fp16", True, "adafactor", "sdpa", 1, True): ("trains", "oom"),
    ("fp32", False, "adamw_torch_fused", "eager", 1, True): ("trains", "oom"),
    ("bf16", False, "adamw_torch_fused", "sdpa", 4, True): ("trains", "oom"),
    # Mixed precision, checkpointing and AdamW or 8-bit Adam: one step too high. 971 ran out of memory 20 MB short
    # and `gpuanat fit` found 970; 985 and 947 trained; fp16 with AdamW was tried at 971 and 979 only.
    ("bf16", True, "adamw_torch_fused", "sdpa", 1, True): ("oom", "oom"),
    ("fp16", True, "adamw_torch_fused", "sdpa", 1, True): ("oom", "oom"),
    ("bf16", True, "adamw_bnb_8bit", "sdpa", 1, True): ("oom", "oom"),
    ("bf16", True, "adamw_torch_fused", "sdpa", 4, True): ("oom", "oom"),
}
"""What the trials on record say of this model's predicted largest batch and of 8 more, per technique set. A
change of the model or new trials changes these; each change is a claim to read."""


def test_every_largest_batch_verdict_is_the_one_on_record():
    verdicts = {}
    for techniques, trials in h100_trials().items():
        predicted = max_batch_size(_config(dict(zip(TECHNIQUES, techniques, strict=True))), H100_MEMORY_BYTES)
        verdicts[techniques] = (verdict(trials, predicted), verdict(trials, predicted + 8))
    assert verdicts == EXPECTED_VERDICTS


def test_every_trial_that_trained_peaked_where_the_model_says():
    """Within 10%, and within 1% from 100 samples up, near the memory limit where the largest batch is decided
    (the searches start at batch 8, where the cache the model does not count weighs most)."""
    checked = 0
    for techniques, trials in h100_trials().items():
        config = _config(dict(zip(TECHNIQUES, techniques, strict=True)))
        for trial in trials:
            if trial["trained"] and trial["peak_allocated_bytes"]:
                predicted = estimate_memory(config.replace(batch_size=trial["batch_size"])).peak_allocated_bytes
                error = abs(error_percent(predicted, trial["peak_allocated_bytes"]))
                assert error <= (1.0 if trial["batch_size"] >= 100 else TARGET_PERCENT), (techniques, trial)
                checked += 1
    assert checked >= 50


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


def test_non_fused_adamw_holds_a_square_root_of_the_second_moment_for_every_matrix_during_the_step():
    """The one configuration of the set whose peak is the optimizer step of torch's foreach AdamW."""
    row = next(run for run in _autocast_rows() if run["overrides"].get("optim") == "adamw_torch")
    estimate = estimate_memory(RunConfig.from_json(row["config"]))
    assert abs(error_percent(estimate.peak_allocated_bytes, row["peak_allocated_bytes"])) <= 0.5
    # Fused AdamW: the same state (but a 4-byte step per tensor), no step temporaries.
    fused = estimate_memory(RunConfig.from_json(row["config"]).replace(optim="adamw_torch_fused"))
    assert error_percent(fused.peak_allocated_bytes, row["peak_allocated_bytes"]) < -5.0


def _freed_before_forward_returns(run: dict) -> int:
    """The forward pass's peak above what is alive at its end (weights, gradients, optimizer state, activations
    and the batch, all as the probe measured them at the end of forward)."""
    bands = run["bands"]
    alive = (
        bands["weights_bytes"]
        + bands["gradients_at_forward_end_bytes"]
        + bands["optimizer_state_at_forward_end_bytes"]
        + bands["activations_bytes"]
        + bands["batch_bytes"]
    )
    return bands["forward_peak_allocated_bytes"] - alive


def test_autocast_keeps_the_weight_copies_until_the_forward_pass_returns():
    def by_batch(precision: str) -> dict[int, int]:
        return {
            run["overrides"]["batch_size"]: _freed_before_forward_returns(run)
            for run in _autocast_rows()
            if run["overrides"]
            == {
                "precision": precision,
                "grad_checkpointing": True,
                "grad_accum": 4,
                "batch_size": run["overrides"]["batch_size"],
            }
        }

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
