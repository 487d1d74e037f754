"""`gpuanat predict --model CONFIG.json` against the plain-Trainer H100 runs of `llm_matrix.py --set unseen`
(benchmarks/results/h100/unseen/unseen.json): per run, the predicted peak allocated memory's error and the activations
band predicted and measured (no torch, no GPU).

    python benchmarks/any_model_predictions.py                      # the development models
    python benchmarks/any_model_predictions.py phi-2 bloom-560m     # only these
    GPUANAT_PREDICT_HELD_OUT=1 python benchmarks/any_model_predictions.py   # the held-out ones too (checked once)

The held-out models (`llm_matrix.HELD_OUT`) were chosen before any prediction; their rows print only with
GPUANAT_PREDICT_HELD_OUT=1. Outputs committed: benchmarks/results/h100/unseen/predicted_{development,held_out}.txt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import llm_matrix  # noqa: E402

GIB = 2**30


def main(only: list[str]) -> int:
    results = json.loads((HERE / "results" / "h100" / "unseen" / "unseen.json").read_text())
    steps = results.get("steps_per_config", 3)
    errors = []
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
        print(f"{run['key']:70s} peak {predicted['error_pct']:+6.1f}%  activations {band}")
    if errors:
        print(
            f"{len(errors)} runs predicted: {sum(error <= 10 for error in errors)} within 10% of the measured peak "
            f"allocated memory, the largest error {max(errors):.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
