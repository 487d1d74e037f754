"""Fit the measured coefficients of `gpuanat predict` and report its error on held-out measurements.

Reads a memory matrix measured by benchmarks/memory_matrix.py. Only the *training* rows are used to fit:
the fp32 and bf16 rows at batch 8 and 32, with and without checkpointing, the eager-attention rows at
batch 16, and, for the allocator's fragmentation, the largest-batch searches of
fp32 with and without checkpointing. Every other row — batch 1, 2, 4, 16 and 64, fp16, the other
optimizers, eager attention at batch 4 or with checkpointing, gradient accumulation, and the other
searches — is held out. Coefficients are bytes per token-hidden element (s·h) per sample.

    python benchmarks/fit_memory_model.py MATRIX.json [--json OUT]   fit, and compare with predict.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpuanat.core.config import RunConfig
from gpuanat.core.predict import (
    COEFFICIENTS,
    CUDA_CONTEXT_BYTES,
    DRIVER_RESERVED_BYTES,
    estimate_memory,
    half_weight_copies_bytes,
    max_batch_size,
    parameter_shapes,
)
from gpuanat.core.presets import PRESETS

FIT_BATCHES = (8, 32)
EAGER_FIT_BATCH = 16
FIT_SEARCHES = ({"precision": "fp32"}, {"precision": "fp32", "grad_checkpointing": True})
DECIMALS = 2


def config_of(run: dict[str, Any]) -> RunConfig:
    return RunConfig.from_json(run["config"])


def is_training_row(run: dict[str, Any]) -> bool:
    overrides = run["overrides"]
    core = set(overrides) <= {"precision", "grad_checkpointing", "batch_size"}
    if core and overrides["precision"] in ("fp32", "bf16") and overrides["batch_size"] in FIT_BATCHES:
        return True
    return overrides.get("attn") == "eager" and overrides["batch_size"] == EAGER_FIT_BATCH


MIXED_CHECKPOINTED_SEARCH = {"precision": "bf16", "grad_checkpointing": True}
"""Fragmentation differs between fp32 and mixed precision under checkpointing (reserved / allocated 1.10 vs
1.03 near the limit): the mixed one is fitted on the trials of benchmarks/max_batch_check.py for this
configuration, when given."""


def fit(matrix: dict[str, Any], max_batch_check: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    preset = PRESETS["bert-large"]
    shapes = parameter_shapes(preset)
    layers, heads = preset.num_layers, preset.num_heads
    rows = [run for run in matrix["runs"] if run["status"] == "ok" and is_training_row(run)]
    fitted: dict[str, dict[str, float]] = {}
    for mixed in (False, True):
        for checkpointing in (False, True):
            precision = "bf16" if mixed else "fp32"
            pair = sorted((run for run in rows if run["overrides"].get("precision") == precision
                           and set(run["overrides"]) <= {"precision", "grad_checkpointing", "batch_size"}
                           and bool(run["overrides"].get("grad_checkpointing")) == checkpointing),
                          key=lambda run: run["overrides"]["batch_size"])
            (small, large) = pair
            config = config_of(small)
            s, h = config.seq_len, preset.hidden_size
            samples = large["overrides"]["batch_size"] - small["overrides"]["batch_size"]
            activations_slope = (large["bands"]["activations_bytes"] - small["bands"]["activations_bytes"]) / samples

            def above_forward_end(run: dict[str, Any]) -> int:
                bands = run["bands"]
                return run["peak_allocated_bytes"] - (bands["weights_bytes"] + bands["optimizer_state_bytes"]
                                                      + bands["activations_bytes"])

            # The peak's excess over what is alive at the end of forward, per sample, at the larger batch.
            temporaries = above_forward_end(large) / large["overrides"]["batch_size"] / (s * h)
            key = f"{'mixed' if mixed else 'fp32'}{' checkpointed' if checkpointing else ''}"
            entry = {"backward_temporaries": 0.0, "checkpointed": 0.0, "recompute_temporaries": 0.0}
            if checkpointing:
                entry["checkpointed"] = activations_slope / (s * h)
                entry["recompute_temporaries"] = temporaries
                eager = next(run for run in rows if run["overrides"].get("attn") == "eager"
                             and run["overrides"]["precision"] == precision and run["overrides"]["grad_checkpointing"])
                sdpa_peak = (large["peak_allocated_bytes"] - (large["overrides"]["batch_size"] - EAGER_FIT_BATCH)
                             * (activations_slope + temporaries * s * h))
                entry["eager_recompute_per_score"] = ((eager["peak_allocated_bytes"] - sdpa_peak)
                                                      / (EAGER_FIT_BATCH * heads * s * s))
            else:
                entry["activations_per_layer"] = activations_slope / (layers * s * h)
                entry["backward_temporaries"] = temporaries
                eager = next(run for run in rows if run["overrides"].get("attn") == "eager"
                             and run["overrides"]["precision"] == precision
                             and not run["overrides"]["grad_checkpointing"])
                sdpa_activations = (small["bands"]["activations_bytes"]
                                    + activations_slope * (EAGER_FIT_BATCH - small["overrides"]["batch_size"]))
                entry["eager_per_score"] = ((eager["bands"]["activations_bytes"] - sdpa_activations)
                                            / (EAGER_FIT_BATCH * layers * heads * s * s))
                entry["eager_recompute_per_score"] = 0.0
                entry["half_copies_check_bytes"] = (small["bands"]["activations_bytes"]
                                                    - activations_slope * small["overrides"]["batch_size"]
                                                    - half_weight_copies_bytes(config, shapes))
            fitted[key] = entry
    for name in ("fp32", "mixed"):
        fitted[f"{name} checkpointed"]["activations_per_layer"] = fitted[name]["activations_per_layer"]
        fitted[f"{name} checkpointed"]["eager_per_score"] = fitted[name]["eager_per_score"]
    workspaces = [run["steps"][-1]["allocated_bytes"] - run["bands"]["weights_bytes"]
                  - run["bands"]["optimizer_state_bytes"] for run in rows]
    fitted["constants"] = {"cublas_workspace_bytes": statistics.median(workspaces)}
    for search in matrix.get("max_batch", {}).get("searches", []):
        if search["overrides"] in FIT_SEARCHES and search.get("largest_batch_size"):
            best = next(trial for trial in search["trials"] if trial["batch_size"] == search["largest_batch_size"])
            key = "fp32 checkpointed" if search["overrides"].get("grad_checkpointing") else "fp32"
            fraction = best["peak_reserved_bytes"] / best["peak_allocated_bytes"] - 1
            for name in (key, key.replace("fp32", "mixed")):
                fitted[name]["cache_fraction"] = fraction
    for check in (max_batch_check or {}).get("checks", []):
        if check["overrides"] == MIXED_CHECKPOINTED_SEARCH:
            trained = [trial for trial in check["trials"] if trial["status"] == "ok"]
            largest = max(trained, key=lambda trial: trial["batch_size"])
            fitted["mixed checkpointed"]["cache_fraction"] = (largest["peak_reserved_bytes"]
                                                              / largest["peak_allocated_bytes"] - 1)
    return fitted


def coefficient_table() -> dict[str, dict[str, float]]:
    names = {(False, False): "fp32", (True, False): "mixed", (False, True): "fp32 checkpointed",
             (True, True): "mixed checkpointed"}
    return {names[key]: vars(value) for key, value in COEFFICIENTS.items()}


def percent(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def evaluate(matrix: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for run in matrix["runs"]:
        if run["status"] != "ok":
            continue
        estimate = estimate_memory(config_of(run))
        rows.append({
            "overrides": run["overrides"], "held_out": not is_training_row(run),
            "measured_peak_allocated_bytes": run["peak_allocated_bytes"],
            "predicted_peak_allocated_bytes": estimate.peak_allocated_bytes,
            "peak_error_percent": percent(estimate.peak_allocated_bytes, run["peak_allocated_bytes"]),
            "measured_activations_bytes": run["bands"]["activations_bytes"],
            "predicted_activations_bytes": estimate.activations_bytes,
            "measured_optimizer_state_bytes": run["bands"]["optimizer_state_bytes"],
            "predicted_optimizer_state_bytes": estimate.optimizer_state_bytes,
        })
    searches = []
    total = matrix["environment"]["total_memory_bytes"]
    for search in matrix.get("max_batch", {}).get("searches", []):
        if not search.get("largest_batch_size"):
            continue
        config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", "seq_len": 512, **search["overrides"]})
        predicted = max_batch_size(config, total)
        searches.append({"overrides": search["overrides"], "held_out": search["overrides"] not in FIT_SEARCHES,
                         "largest_batch_size": search["largest_batch_size"], "predicted": predicted,
                         "predicted_fits": predicted <= search["largest_batch_size"],
                         "plus_8_fails": predicted + 8 > search["largest_batch_size"]})
    return {"rows": rows, "max_batch": searches}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("matrix", type=Path)
    parser.add_argument("--json", type=Path, help="write the fit and the evaluation here")
    parser.add_argument("--max-batch-check", type=Path, help="max_batch_check.json, for the mixed-precision "
                        "checkpointed fragmentation")
    args = parser.parse_args()
    matrix = json.loads(args.matrix.read_text())
    fitted = fit(matrix, json.loads(args.max_batch_check.read_text()) if args.max_batch_check else None)
    in_code = coefficient_table()
    mismatches = []
    for name, entry in fitted.items():
        if name == "constants":
            continue
        print(f"{name:<20} " + "  ".join(f"{key} {value:.4f}" for key, value in sorted(entry.items())))
        for key, value in entry.items():
            if key in in_code[name] and round(value, DECIMALS if key != "cache_fraction" else 4) != round(
                    in_code[name][key], DECIMALS if key != "cache_fraction" else 4):
                mismatches.append(f"{name}.{key}: fitted {value:.4f}, predict.py has {in_code[name][key]}")
    print(f"constants: {fitted['constants']}  (predict.py: context {CUDA_CONTEXT_BYTES}, "
          f"driver reserved {DRIVER_RESERVED_BYTES})")
    evaluation = evaluate(matrix)
    for part in (False, True):
        errors = [abs(row["peak_error_percent"]) for row in evaluation["rows"] if row["held_out"] is part]
        print(f"{'held-out' if part else 'training'} rows: {len(errors)}, peak allocated |error| "
              f"max {max(errors):.1f}%, mean {statistics.mean(errors):.1f}%")
    for row in evaluation["rows"]:
        print(f"  {'H' if row['held_out'] else 'T'} {json.dumps(row['overrides']):<88} "
              f"{row['peak_error_percent']:+6.1f}%")
    for search in evaluation["max_batch"]:
        print(f"  max batch {'H' if search['held_out'] else 'T'} {json.dumps(search['overrides'])}: measured "
              f"{search['largest_batch_size']}, predicted {search['predicted']}, fits {search['predicted_fits']}, "
              f"+8 fails {search['plus_8_fails']}")
    if args.json:
        args.json.write_text(json.dumps({"fitted": fitted, "in_code": in_code, "evaluation": evaluation}, indent=1))
    if mismatches:
        print("predict.py differs from the fit:\n  " + "\n  ".join(mismatches), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
