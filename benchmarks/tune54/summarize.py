"""One line of JSON for a `gpuanat run --json` of benchmarks/tune54/*.sh: its name, exit, steady samples/s, MFU, peak
memory, predicted peak, and, where it was profiled, the operations anatomy's group shares and the profiler's FLOPs a
sample against gpuanat's count (the issue's check of the MFU).

    python3 benchmarks/tune54/summarize.py NAME RC RESULT.json STDERR.txt "FLAGS" >> runs.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GROUPS = ("contractions", "elementwise", "normalizations", "optimizer", "memory_copies", "other")


def summary(name: str, rc: int, result_path: Path, stderr_path: Path, flags: str) -> dict:
    line: dict = {"name": name, "rc": rc, "flags": flags}
    lines = [text for text in result_path.read_text(errors="replace").splitlines() if text.startswith("{")]
    if not lines:
        line["stderr_tail"] = stderr_path.read_text(errors="replace")[-1500:]
        return line
    result = json.loads(lines[-1])
    predicted = result.get("predicted") or {}
    line.update(
        {
            "status": result.get("status"),
            "error": (result.get("error_message") or "")[:300] or None,
            "steady_samples_per_second": result.get("steady_samples_per_second"),
            "samples_per_second": result.get("samples_per_second"),
            "mfu": result.get("mfu"),
            "achieved_tflops": result.get("achieved_tflops"),
            "flops_per_sample": result.get("flops_per_sample"),
            "peak_allocated_bytes": result.get("peak_allocated_bytes"),
            "peak_reserved_bytes": result.get("peak_reserved_bytes"),
            "predicted_peak_allocated_bytes": predicted.get("peak_allocated_bytes"),
            "predicted_peak_reserved_bytes": predicted.get("peak_reserved_bytes"),
            "prediction_error_percent": result.get("prediction_error_percent"),
            "tensor_active_percent": result.get("tensor_active_percent"),
            "wall_s": sum((result.get("wall_breakdown_s") or {}).values()),
            "final_loss": result.get("final_loss"),
            "gpu": result.get("gpu_name"),
            "versions": result.get("versions"),
        }
    )
    anatomy = result.get("operations_anatomy")
    if anatomy:
        line["anatomy_shares"] = {group: (anatomy.get(group) or {}).get("time_share") for group in GROUPS}
        line["anatomy_busy_share"] = anatomy.get("busy_share")
        profiled_samples = (anatomy.get("profiled_steps") or 0) * (result.get("config") or {}).get("batch_size", 0)
        if profiled_samples and anatomy.get("flops"):
            line["profiler_flops_per_sample"] = anatomy["flops"] / profiled_samples
            contractions = (anatomy.get("contractions") or {}).get("flops", 0)
            line["contraction_flops_per_sample"] = contractions / profiled_samples
    return line


if __name__ == "__main__":
    name, rc, result_path, stderr_path, flags = sys.argv[1:6]
    print(json.dumps(summary(name, int(rc), Path(result_path), Path(stderr_path), flags)))
