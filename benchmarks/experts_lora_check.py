"""Mixtures of experts against plain-Trainer runs measured by `llm_matrix.py` (issue #50, experts with adapters): per
run, the trainable parameters PEFT made against `lora_shapes`, and the peak allocated and reserved memory and the
activations band against today's `gpuanat predict` (no torch, no GPU).

    python benchmarks/experts_lora_check.py benchmarks/results/h100/held_out50/*.json
    python benchmarks/experts_lora_check.py --all RESULTS.json     # the runs without LoRA too

Only runs whose config is a mixture of experts are read; where PEFT wraps the family's router and experts
(`shapes.PEFT_EXPERT_PARAMETERS`) the row says so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import llm_matrix  # noqa: E402

from gpuanat.core.memory.model_config import UnreadableModel, model_architecture  # noqa: E402
from gpuanat.core.memory.shapes import lora_expert_parameters, lora_shapes  # noqa: E402

GIB = 2**30


def _percent(predicted: float, measured: float | None) -> str:
    return f"{100 * (predicted - measured) / measured:+6.1f}%" if measured else "   n/a"


def main(paths: list[str], with_full: bool) -> int:
    errors: list[float] = []
    for path in paths:
        results = json.loads(Path(path).read_text())
        steps = results.get("steps_per_config", 3)
        for run in results["runs"]:
            case = llm_matrix.case_from_json(run["config"])
            config_json = llm_matrix.CONFIGS_DIR / case.preset / "config.json"
            if run.get("status") != "ok" or not config_json.exists() or not (case.lora or with_full):
                continue
            try:
                arch = model_architecture(str(config_json))
            except UnreadableModel:
                continue
            if not arch.experts:
                continue
            bands = ((run.get("probe") or {}).get("steps") or [{}])[0].get("bands") or {}
            predicted = llm_matrix.predict(case, steps, run["max_memory_allocated_bytes"], bands)
            if "error" in predicted:
                print(f"{run['key']:64s} {predicted['error'][:80]}")
                continue
            config, _ = llm_matrix.run_config_for(case, steps)
            trainable = lora_shapes(arch, config).params if case.lora else None
            wrapped = "wrapped" if lora_expert_parameters(arch, config) else "       "
            adapters = (
                f"adapters {'=' if trainable == run.get('params_trainable') else '≠'} "
                if trainable is not None
                else "            "
            )
            measured_activations = bands.get("activations_bytes")
            reserved = run.get("max_memory_reserved_bytes")
            errors.append(abs(predicted["error_pct"]))
            print(
                f"{run['key']:64s} {wrapped} {adapters}"
                f"allocated {predicted['peak_allocated_bytes'] / GIB:6.2f} vs "
                f"{run['max_memory_allocated_bytes'] / GIB:6.2f} GiB ({predicted['error_pct']:+6.1f}%)  "
                f"reserved {predicted.get('peak_reserved_bytes', 0) / GIB:6.2f} vs "
                f"{(reserved or 0) / GIB:6.2f} ({_percent(predicted.get('peak_reserved_bytes', 0), reserved)})  "
                f"activations {_percent(predicted['activations_bytes'], measured_activations)}"
            )
    if errors:
        within_5, within_10 = sum(error <= 5 for error in errors), sum(error <= 10 for error in errors)
        print(
            f"{len(errors)} runs: {within_5} within 5%, {within_10} within 10% of the measured peak allocated memory; "
            f"the largest error {max(errors):.1f}%"
        )
    return 0


if __name__ == "__main__":
    arguments = sys.argv[1:]
    raise SystemExit(main([a for a in arguments if a != "--all"], "--all" in arguments))
