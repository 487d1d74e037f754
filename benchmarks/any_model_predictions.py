"""`gpuanat predict --model CONFIG.json` against the plain-Trainer H100 runs of `llm_matrix.py --set unseen`
(benchmarks/results/h100/unseen/unseen.json): per run, the predicted peak allocated memory's error and the activations
band predicted and measured (no torch, no GPU).

    python benchmarks/any_model_predictions.py                      # the development models
    python benchmarks/any_model_predictions.py phi-2 bloom-560m     # only these
    GPUANAT_RESULTS=held_out50 python benchmarks/any_model_predictions.py   # issue #50's set (its aside models only
                                                                            # with GPUANAT_PREDICT_ASIDE=1)
    GPUANAT_PREDICT_HELD_OUT=1 python benchmarks/any_model_predictions.py   # the held-out ones too (checked once)

The held-out models (`llm_matrix.HELD_OUT`) were chosen before any prediction; their rows print only with
GPUANAT_PREDICT_HELD_OUT=1. Outputs committed: benchmarks/results/h100/unseen/predicted_{development,held_out}.txt.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import llm_matrix  # noqa: E402

GIB = 2**30


def main(only: list[str]) -> int:
    name = os.environ.get("GPUANAT_RESULTS", "unseen")
    results = json.loads((HERE / "results" / "h100" / name / f"{name}.json").read_text())
    steps = results.get("steps_per_config", 3)
    errors: list[float] = []
    reserved_errors: list[float] = []
    for run in results["runs"]:
        if run.get("status") != "ok" or (only and run["config"]["preset"] not in only):
            continue
        case = llm_matrix.case_from_json(run["config"])
        bands = ((run.get("probe") or {}).get("steps") or [{}])[0].get("bands") or {}
        predicted = llm_matrix.predict(case, steps, run["max_memory_allocated_bytes"], bands)
        if "error" in predicted:
            print(f"{run['key']:70s} {predicted['error'][:70]}")
            continue
        measured_activations = bands.get("activations_bytes")
        activations = predicted["activations_bytes"]
        band = (
            f"{activations / GIB:6.2f} vs {measured_activations / GIB:6.2f} GiB "
            f"({100 * (activations - measured_activations) / measured_activations:+6.1f}%)"
            if measured_activations
            else "not measured"
        )
        errors.append(abs(predicted["error_pct"]))
        measured_reserved = run.get("max_memory_reserved_bytes")
        reserved = predicted.get("peak_reserved_bytes")
        reserved_error = (
            100 * (reserved - measured_reserved) / measured_reserved if reserved and measured_reserved else None
        )
        if reserved_error is not None:
            reserved_errors.append(abs(reserved_error))
        reserved_text = f"{reserved_error:+6.1f}%" if reserved_error is not None else "   —   "
        print(f"{run['key']:70s} peak {predicted['error_pct']:+6.1f}%  reserved {reserved_text}  activations {band}")
    if errors:
        print(
            f"{len(errors)} runs predicted: {sum(error <= 10 for error in errors)} within 10% of the measured peak "
            f"allocated memory, the largest error {max(errors):.1f}%"
        )
    if reserved_errors:
        print(
            f"peak reserved: {sum(error <= 5 for error in reserved_errors)} of {len(reserved_errors)} within 5%, "
            f"{sum(error <= 10 for error in reserved_errors)} within 10%, the largest error {max(reserved_errors):.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
