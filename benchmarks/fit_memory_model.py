"""Fit the measured coefficients of `gpuanat predict` and report its error on held-out measurements.

Reads a memory matrix measured by benchmarks/memory_matrix.py. Only the *training* rows are used to fit:
the fp32 and bf16 rows at batch 8 and 32, with and without checkpointing, and at batch 64 with it (the
recompute peak binds from batch 32 up, and its temporaries are the line through 32 and 64), the
eager-attention rows at batch 16, and, for the allocator's fragmentation, the largest-batch searches of
fp32 with and without checkpointing, of fp32 with checkpointing and Adafactor, and of bf16 with
checkpointing (`gpuanat fit`). Every other row —
batch 1, 2, 4, 16, and 64 without checkpointing, fp16, the other optimizers, eager attention at batch 4
or with checkpointing, gradient accumulation, and the other searches — is held out. Coefficients are
bytes per token-hidden element (s·h) per sample.

    python benchmarks/fit_memory_model.py MATRIX.json [--mixed-checkpointed-search FIT.json]
        [--fp32-checkpointed-adafactor-search FIT.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from gpuanat.core.memory.bands.optimizer import large_moment_bytes
from gpuanat.core.memory.bands.precision import COEFFICIENTS
from gpuanat.core.memory.bands.weights import half_weight_copies_bytes
from gpuanat.core.memory.predict import CUDA_CONTEXT_BYTES, DRIVER_RESERVED_BYTES, estimate_memory, max_batch_size
from gpuanat.core.memory.shapes import parameter_shapes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import PRESETS

FIT_BATCHES = (8, 32)
CHECKPOINTED_TEMPORARIES_BATCHES = (32, 64)
EAGER_FIT_BATCH = 16
FIT_SEARCHES = ({"precision": "fp32"}, {"precision": "fp32", "grad_checkpointing": True})
DECIMALS = 2


def config_of(run: dict[str, Any]) -> RunConfig:
    return RunConfig.from_json(run["config"])


def is_training_row(run: dict[str, Any]) -> bool:
    overrides = run["overrides"]
    core = set(overrides) <= {"precision", "grad_checkpointing", "batch_size"}
    if core and overrides["precision"] in ("fp32", "bf16"):
        batches = FIT_BATCHES + (CHECKPOINTED_TEMPORARIES_BATCHES if overrides.get("grad_checkpointing") else ())
        return overrides["batch_size"] in batches
    return overrides.get("attn") == "eager" and overrides["batch_size"] == EAGER_FIT_BATCH


def fit(
    matrix: dict[str, Any],
    mixed_checkpointed_search: dict[str, Any] | None = None,
    fp32_checkpointed_adafactor_search: dict[str, Any] | None = None,
) -> dict[str, dict[str, float]]:
    """Fragmentation differs between fp32 and mixed precision under checkpointing (reserved / allocated 1.10 vs
    1.03 at the largest batch): the mixed one comes from `mixed_checkpointed_search`, a `gpuanat fit --json`
    of bf16 with checkpointing, when given. With fp32 and checkpointing it also differs by optimizer (1.058 with
    Adafactor): given `fp32_checkpointed_adafactor_search`, that is the class's fraction, and the AdamW search's
    excess over it, per byte of AdamW's large moments, is `moment_fragmentation`."""
    preset = PRESETS["bert-large"]
    shapes = parameter_shapes(preset)
    layers, heads = preset.num_layers, preset.num_heads
    rows = [run for run in matrix["runs"] if run["status"] == "ok" and is_training_row(run)]
    fitted: dict[str, dict[str, float]] = {}
    for mixed in (False, True):
        for checkpointing in (False, True):
            precision = "bf16" if mixed else "fp32"
            by_batch = {
                run["overrides"]["batch_size"]: run
                for run in rows
                if run["overrides"].get("precision") == precision
                and set(run["overrides"]) <= {"precision", "grad_checkpointing", "batch_size"}
                and bool(run["overrides"].get("grad_checkpointing")) == checkpointing
            }
            small, large = (by_batch[batch] for batch in FIT_BATCHES)
            config = config_of(small)
            s, h = config.seq_len, preset.hidden_size
            samples = large["overrides"]["batch_size"] - small["overrides"]["batch_size"]
            activations_slope = (large["bands"]["activations_bytes"] - small["bands"]["activations_bytes"]) / samples

            def above_forward_end(run: dict[str, Any]) -> int:
                bands = run["bands"]
                return run["peak_allocated_bytes"] - (
                    bands["weights_bytes"] + bands["optimizer_state_bytes"] + bands["activations_bytes"]
                )

            # The peak's excess over what is alive at the end of forward, per sample: with checkpointing a line
            # through the two largest rows, where the recompute peak binds; else through zero at the larger batch.
            if checkpointing:
                low, high = (by_batch[batch] for batch in CHECKPOINTED_TEMPORARIES_BATCHES)
                temporaries = (
                    (above_forward_end(high) - above_forward_end(low))
                    / (high["overrides"]["batch_size"] - low["overrides"]["batch_size"])
                    / (s * h)
                )
                temporaries_constant = above_forward_end(low) - temporaries * s * h * low["overrides"]["batch_size"]
            else:
                temporaries = above_forward_end(large) / large["overrides"]["batch_size"] / (s * h)
                temporaries_constant = 0.0
            key = f"{'mixed' if mixed else 'fp32'}{' checkpointed' if checkpointing else ''}"
            entry = {
                "backward_temporaries": 0.0,
                "checkpointed": 0.0,
                "recompute_temporaries": 0.0,
                "recompute_constant_bytes": temporaries_constant,
                "moment_fragmentation": 0.0,
            }
            if checkpointing:
                entry["checkpointed"] = activations_slope / (s * h)
                entry["recompute_temporaries"] = temporaries
                eager = next(
                    run
                    for run in rows
                    if run["overrides"].get("attn") == "eager"
                    and run["overrides"]["precision"] == precision
                    and run["overrides"]["grad_checkpointing"]
                )
                sdpa_peak = large["peak_allocated_bytes"] - (large["overrides"]["batch_size"] - EAGER_FIT_BATCH) * (
                    activations_slope + temporaries * s * h
                )
                entry["eager_recompute_per_score"] = (eager["peak_allocated_bytes"] - sdpa_peak) / (
                    EAGER_FIT_BATCH * heads * s * s
                )
            else:
                entry["activations_per_layer"] = activations_slope / (layers * s * h)
                entry["backward_temporaries"] = temporaries
                eager = next(
                    run
                    for run in rows
                    if run["overrides"].get("attn") == "eager"
                    and run["overrides"]["precision"] == precision
                    and not run["overrides"]["grad_checkpointing"]
                )
                sdpa_activations = small["bands"]["activations_bytes"] + activations_slope * (
                    EAGER_FIT_BATCH - small["overrides"]["batch_size"]
                )
                entry["eager_per_score"] = (eager["bands"]["activations_bytes"] - sdpa_activations) / (
                    EAGER_FIT_BATCH * layers * heads * s * s
                )
                entry["eager_recompute_per_score"] = 0.0
                entry["half_copies_check_bytes"] = (
                    small["bands"]["activations_bytes"]
                    - activations_slope * small["overrides"]["batch_size"]
                    - half_weight_copies_bytes(config, shapes)
                )
            fitted[key] = entry
    for name in ("fp32", "mixed"):
        fitted[f"{name} checkpointed"]["activations_per_layer"] = fitted[name]["activations_per_layer"]
        fitted[f"{name} checkpointed"]["eager_per_score"] = fitted[name]["eager_per_score"]
    workspaces = [
        run["steps"][-1]["allocated_bytes"] - run["bands"]["weights_bytes"] - run["bands"]["optimizer_state_bytes"]
        for run in rows
    ]
    fitted["constants"] = {"cublas_workspace_bytes": statistics.median(workspaces)}
    fp32_checkpointed_adamw: dict[str, Any] | None = None
    for search in matrix.get("max_batch", {}).get("searches", []):
        if search["overrides"] in FIT_SEARCHES and search.get("largest_batch_size"):
            best = largest_trained(search["trials"], search["largest_batch_size"])
            key = "fp32 checkpointed" if search["overrides"].get("grad_checkpointing") else "fp32"
            fraction = best["peak_reserved_bytes"] / best["peak_allocated_bytes"] - 1
            for name in (key, key.replace("fp32", "mixed")):
                fitted[name]["cache_fraction"] = fraction
            if search["overrides"].get("grad_checkpointing"):
                fp32_checkpointed_adamw = best
    if mixed_checkpointed_search is not None:
        largest = largest_trained(mixed_checkpointed_search["trials"], mixed_checkpointed_search["largest_batch_size"])
        fitted["mixed checkpointed"]["cache_fraction"] = (
            largest["peak_reserved_bytes"] / largest["peak_allocated_bytes"] - 1
        )
    if fp32_checkpointed_adafactor_search is not None and fp32_checkpointed_adamw is not None:
        largest = largest_trained(
            fp32_checkpointed_adafactor_search["trials"], fp32_checkpointed_adafactor_search["largest_batch_size"]
        )
        fraction = largest["peak_reserved_bytes"] / largest["peak_allocated_bytes"] - 1
        adamw = fp32_checkpointed_adamw
        adamw_config = RunConfig.from_json(
            {"preset": "bert-large", "device": "cuda", "precision": "fp32", "grad_checkpointing": True}
        )
        fitted["fp32 checkpointed"]["cache_fraction"] = fraction
        fitted["fp32 checkpointed"]["moment_fragmentation"] = (
            adamw["peak_reserved_bytes"] - adamw["peak_allocated_bytes"] * (1 + fraction)
        ) / large_moment_bytes(adamw_config, shapes)
    return fitted


def largest_trained(trials: list[dict[str, Any]], largest_batch_size: int) -> dict[str, Any]:
    return next(trial for trial in trials if trial["batch_size"] == largest_batch_size)


def coefficient_table() -> dict[str, dict[str, float]]:
    names = {
        (False, False): "fp32",
        (True, False): "mixed",
        (False, True): "fp32 checkpointed",
        (True, True): "mixed checkpointed",
    }
    return {names[key]: vars(value) for key, value in COEFFICIENTS.items()}


def percent(predicted: float, measured: float) -> float:
    return 100.0 * (predicted - measured) / measured


def evaluate(matrix: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for run in matrix["runs"]:
        if run["status"] != "ok":
            continue
        estimate = estimate_memory(config_of(run))
        rows.append(
            {
                "overrides": run["overrides"],
                "held_out": not is_training_row(run),
                "measured_peak_allocated_bytes": run["peak_allocated_bytes"],
                "predicted_peak_allocated_bytes": estimate.peak_allocated_bytes,
                "peak_error_percent": percent(estimate.peak_allocated_bytes, run["peak_allocated_bytes"]),
                "measured_activations_bytes": run["bands"]["activations_bytes"],
                "predicted_activations_bytes": estimate.activations_bytes,
                "measured_optimizer_state_bytes": run["bands"]["optimizer_state_bytes"],
                "predicted_optimizer_state_bytes": estimate.optimizer_state_bytes,
            }
        )
    searches = []
    total = matrix["environment"]["total_memory_bytes"]
    for search in matrix.get("max_batch", {}).get("searches", []):
        if not search.get("largest_batch_size"):
            continue
        config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", "seq_len": 512, **search["overrides"]})
        predicted = max_batch_size(config, total)
        searches.append(
            {
                "overrides": search["overrides"],
                "held_out": search["overrides"] not in FIT_SEARCHES,
                "largest_batch_size": search["largest_batch_size"],
                "predicted": predicted,
                "predicted_fits": predicted <= search["largest_batch_size"],
                "plus_8_fails": predicted + 8 > search["largest_batch_size"],
            }
        )
    return {"rows": rows, "max_batch": searches}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("matrix", type=Path)
    parser.add_argument("--json", type=Path, help="write the fit and the evaluation here")
    parser.add_argument(
        "--mixed-checkpointed-search",
        type=Path,
        help="`gpuanat fit --json` of bf16 with checkpointing, for that class's fragmentation",
    )
    parser.add_argument(
        "--fp32-checkpointed-adafactor-search",
        type=Path,
        help="`gpuanat fit --json` of fp32 with checkpointing and Adafactor, for fragmentation without AdamW's moments",
    )
    args = parser.parse_args()
    matrix = json.loads(args.matrix.read_text())
    searches = [
        json.loads(path.read_text()) if path else None
        for path in (args.mixed_checkpointed_search, args.fp32_checkpointed_adafactor_search)
    ]
    fitted = fit(matrix, *searches)
    in_code = coefficient_table()
    mismatches = []
    for name, entry in fitted.items():
        if name == "constants":
            continue
        print(f"{name:<20} " + "  ".join(f"{key} {value:.4f}" for key, value in sorted(entry.items())))
        for key, value in entry.items():
            decimals = {"cache_fraction": 4, "moment_fragmentation": 3, "recompute_constant_bytes": -3}.get(
                key, DECIMALS
            )
            if key in in_code[name] and round(value, decimals) != round(in_code[name][key], decimals):
                mismatches.append(f"{name}.{key}: fitted {value:.4f}, precision.py has {in_code[name][key]}")
    print(
        f"constants: {fitted['constants']}  (predict.py: context {CUDA_CONTEXT_BYTES}, "
        f"driver reserved {DRIVER_RESERVED_BYTES})"
    )
    evaluation = evaluate(matrix)
    for part in (False, True):
        errors = [abs(row["peak_error_percent"]) for row in evaluation["rows"] if row["held_out"] is part]
        print(
            f"{'held-out' if part else 'training'} rows: {len(errors)}, peak allocated |error| "
            f"max {max(errors):.1f}%, mean {statistics.mean(errors):.1f}%"
        )
    for row in evaluation["rows"]:
        print(
            f"  {'H' if row['held_out'] else 'T'} {json.dumps(row['overrides']):<88} {row['peak_error_percent']:+6.1f}%"
        )
    for search in evaluation["max_batch"]:
        print(
            f"  max batch {'H' if search['held_out'] else 'T'} {json.dumps(search['overrides'])}: measured "
            f"{search['largest_batch_size']}, predicted {search['predicted']}, fits {search['predicted_fits']}, "
            f"+8 fails {search['plus_8_fails']}"
        )
    if args.json:
        args.json.write_text(json.dumps({"fitted": fitted, "in_code": in_code, "evaluation": evaluation}, indent=1))
    if mismatches:
        print("precision.py differs from the fit:\n  " + "\n  ".join(mismatches), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
