"""Today's `gpuanat predict` against every plain-Trainer H100 run on record, written as the table `predict` quotes
to say how far to trust a prediction (gpuanat/data/measured_predictions.json, read by
gpuanat/core/memory/measured_nearby.py): per run its family, techniques and the errors of the predicted peak
allocated and peak reserved memory.

    python benchmarks/measured_predictions.py            # print the summary and rewrite the table
    python benchmarks/measured_predictions.py --check    # print only

Sources (benchmarks/results/h100/): unseen/unseen.json (issue #29's 15 published configs), llm/decoders.json and
llm/decoders_llama.json (the presets qwen2.5-0.5b and llama-3.2-1b), held_out50/held_out50.json (issue #50's 19
models; since its kept-aside models were checked, with GPUANAT_PREDICT_ASIDE=1). Runs gpuanat cannot express
(another objective, QLoRA, Liger) are left out.
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

from gpuanat.core.memory.measured_nearby import TABLE_PATH, technique_kind  # noqa: E402
from gpuanat.core.memory.model_config import UnreadableModel, architecture_of  # noqa: E402
from gpuanat.core.memory.predict import estimate_memory, peak_reserved_bytes  # noqa: E402

RESULTS = (
    "unseen/unseen.json",
    "llm/small.json",
    "llm/decoders.json",
    "llm/decoders_llama.json",
    "held_out50/held_out50.json",
)


def rows() -> list[dict[str, object]]:
    os.environ.setdefault("GPUANAT_PREDICT_HELD_OUT", "1")  # issue #29's held-out five were checked long ago
    table = []
    for name in RESULTS:
        results = json.loads((HERE / "results" / "h100" / name).read_text())
        for run in results["runs"]:
            if run.get("status") != "ok" or not run.get("max_memory_reserved_bytes"):
                continue
            case = llm_matrix.case_from_json(run["config"])
            if case.qlora or case.liger or case.lora_dropout:
                continue
            if case.preset in llm_matrix.HELD_OUT_50_ASIDE and not os.environ.get("GPUANAT_PREDICT_ASIDE"):
                continue
            config, caveats = llm_matrix.run_config_for(case, results.get("steps_per_config", 3))
            if caveats:  # a configuration gpuanat cannot express (e.g. GPT-2 as a causal LM)
                continue
            try:
                estimate = estimate_memory(config)
                family = architecture_of(config).family
            except UnreadableModel:
                continue
            allocated, reserved = run["max_memory_allocated_bytes"], run["max_memory_reserved_bytes"]
            table.append(
                {
                    "run": run["key"],
                    "source": f"benchmarks/results/h100/{name}",
                    "family": family,
                    "kind": technique_kind(config),
                    "allocated_error_percent": round(100 * (estimate.peak_allocated_bytes - allocated) / allocated, 2),
                    "reserved_error_percent": round(100 * (peak_reserved_bytes(estimate) - reserved) / reserved, 2),
                }
            )
    return table


def main(check: bool) -> int:
    table = rows()
    for label, key in (("allocated", "allocated_error_percent"), ("reserved", "reserved_error_percent")):
        errors = [abs(float(row[key])) for row in table]  # type: ignore[arg-type]
        print(
            f"peak {label}: {sum(error <= 5 for error in errors)} of {len(errors)} within 5%, "
            f"{sum(error <= 10 for error in errors)} within 10%, worst {max(errors):.1f}%"
        )
    if not check:
        TABLE_PATH.write_text(json.dumps(table, indent=0) + "\n")
        print(f"wrote {TABLE_PATH.relative_to(HERE.parent)} ({len(table)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main("--check" in sys.argv[1:]))
