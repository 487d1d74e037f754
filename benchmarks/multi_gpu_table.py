"""The table of benchmarks/multi_gpu_check.sh: per technique and rank, the bands, their sum against NVML's device
reading of that rank's GPU, throughput, and the peak allocated memory predicted when the run was made and by
today's `gpuanat predict` (which may have learnt since from these very runs: say which when quoting it).

    python benchmarks/multi_gpu_table.py benchmarks/results/h200x2/multi/results.jsonl [--markdown]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuanat.core.memory.predict import estimate_memory
from gpuanat.core.vocabulary.config import RunConfig

BANDS = (
    "other_processes_bytes",
    "cuda_context_bytes",
    "weights_bytes",
    "gradients_bytes",
    "optimizer_state_bytes",
    "activations_bytes",
    "temporaries_and_cache_bytes",
)
GIB = 1 << 30


def gib(value: int | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def rows(results: list[dict]) -> list[list[str]]:
    table = []
    for result in results:
        for rank in result.get("ranks") or [{}]:
            bands = rank.get("bands") or {}
            used = rank.get("device_memory_used_bytes")
            # At the peak (the end of forward) only the gradients alive then count (anatomy.py).
            at_peak = {**bands, "gradients_bytes": rank.get("gradients_at_forward_end_bytes")}
            total = sum(at_peak[name] for name in BANDS if at_peak.get(name) is not None)
            missing = [name for name in BANDS if at_peak.get(name) is None]
            predicted = result.get("predicted") or {}
            predicted_now = (
                estimate_memory(RunConfig.from_json(result["config"])).peak_allocated_bytes
                if result.get("config")
                else None
            )
            gap = f"{100 * (total - used) / used:+.2f}%" if used and not missing else "—"
            negative = [name for name in BANDS if (bands.get(name) or 0) < 0]
            table.append(
                [
                    result["technique"],
                    result.get("status", "?"),
                    str(rank.get("rank", "—")),
                    str(rank.get("gpu_index")),
                    *(gib(bands.get(name)) for name in BANDS),
                    gib(used),
                    gap,
                    ",".join(negative) or "none",
                    f"{result.get('samples_per_second') or 0:.1f}",
                    f"{result.get('steady_samples_per_second') or 0:.1f}",
                    gib(rank.get("peak_allocated_bytes")),
                    gib(predicted.get("peak_allocated_bytes")),
                    _error(predicted.get("peak_allocated_bytes"), rank.get("peak_allocated_bytes")),
                    gib(predicted.get("peak_device_bytes")),
                    _error(predicted.get("peak_device_bytes"), used),
                    gib(predicted_now),
                    _error(predicted_now, rank.get("peak_allocated_bytes")),
                ]
            )
    return table


def _error(predicted: int | None, measured: int | None) -> str:
    return "—" if not predicted or not measured else f"{100 * (predicted - measured) / measured:+.1f}%"


HEADER = [
    "technique",
    "status",
    "rank",
    "GPU",
    "other",
    "context",
    "weights",
    "grads",
    "optim",
    "activ",
    "temp+cache",
    "NVML used",
    "bands−NVML",
    "negative",
    "samples/s (HF)",
    "steady samples/s",
    "peak alloc",
    "predicted peak alloc",
    "error",
    "predicted device",
    "error",
    "predicted now",
    "error now",
]


def main() -> None:
    results = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    table = rows(results)
    if "--markdown" in sys.argv:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for row in table:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(cell)) for cell in column) for column in zip(HEADER, *table, strict=False)]
    for row in (HEADER, *table):
        print("  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=False)))
    for result in results:
        if result.get("status") != "ok":
            print(f"{result['technique']}: {result.get('status')} {json.dumps(result.get('error'))[:600]}")


if __name__ == "__main__":
    main()
