"""Does the predicted largest batch fit, and does 8 more not? Checked with real `gpuanat run` trials.

For each configuration: `gpuanat predict`'s max_batch_size for this GPU, then a real 2-step run at that
batch (it must train) and at 8 more (it must run out of memory). Each trial is a fresh process, exactly
what `gpuanat run` does. When the predicted batch does not train, it also tries 8 fewer.

    python benchmarks/max_batch_check.py --out max_batch_check.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuanat.core.config import RunConfig
from gpuanat.core.predict import max_batch_size
from gpuanat.core.sampler import probe_nvml

CONFIGS: tuple[dict[str, Any], ...] = (
    {"precision": "fp32"},
    {"precision": "bf16"},
    {"precision": "fp16"},
    {"precision": "fp32", "grad_checkpointing": True},
    {"precision": "bf16", "grad_checkpointing": True},
    {"precision": "fp32", "optim": "adafactor"},
    {"precision": "fp32", "attn": "eager"},
    {"precision": "bf16", "grad_accum": 4},
    {"precision": "bf16", "optim": "sgd"},
    {"precision": "bf16", "optim": "adamw_bnb_8bit"},
)
TRIAL_STEPS = 2


def flags(overrides: dict[str, Any], batch_size: int) -> list[str]:
    config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", **overrides})
    arguments = ["--preset", "bert-large", "--precision", config.precision, "--optim", config.optim,
                 "--attn", config.attn, "--grad-accum", str(config.grad_accum), "--batch-size", str(batch_size),
                 "--max-steps", str(TRIAL_STEPS), "--samples", str(TRIAL_STEPS * batch_size * config.grad_accum)]
    return [*arguments, "--grad-checkpointing"] if config.grad_checkpointing else arguments


def trial(overrides: dict[str, Any], batch_size: int) -> dict[str, Any]:
    started_s = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "gpuanat", "run", *flags(overrides, batch_size), "--json"],
                               capture_output=True, text=True, check=False)
    lines = completed.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    record = {"batch_size": batch_size, "status": result.get("status", f"exit {completed.returncode}"),
              "run_id": result.get("run_id"), "peak_allocated_bytes": result.get("peak_allocated_bytes"),
              "peak_reserved_bytes": result.get("peak_reserved_bytes"),
              "device_memory_used_bytes": result.get("device_memory_used_bytes"),
              "predicted_peak_allocated_bytes": (result.get("predicted") or {}).get("peak_allocated_bytes"),
              "seconds": time.perf_counter() - started_s}
    if not lines:
        record["stderr_tail"] = completed.stderr[-2000:]
    print(f"{json.dumps(overrides)} batch {batch_size}: {record['status']} ({record['seconds']:.0f} s)", flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", type=json.loads, action="append", metavar="JSON",
                        help="check only these configurations (RunConfig overrides), e.g. '{\"precision\": \"bf16\"}'")
    args = parser.parse_args()
    nvml = probe_nvml()
    if not (nvml.available and nvml.gpu_total_bytes):
        sys.exit(f"no GPU: {nvml.reason}")
    total_bytes = nvml.gpu_total_bytes[0]
    report: dict[str, Any] = {"gpu": nvml.gpu_names[0], "gpu_memory_bytes": total_bytes, "checks": []}
    for overrides in args.only or CONFIGS:
        config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", **overrides})
        predicted = max_batch_size(config, total_bytes)
        trials = [trial(overrides, predicted), trial(overrides, predicted + 8)]
        if trials[0]["status"] != "ok":
            trials.append(trial(overrides, max(1, predicted - 8)))
        report["checks"].append({
            "overrides": overrides, "predicted_max_batch_size": predicted, "trials": trials,
            "predicted_fits": trials[0]["status"] == "ok", "plus_8_out_of_memory": trials[1]["status"] == "oom",
        })
        args.out.write_text(json.dumps(report, indent=1))
    passed = sum(check["predicted_fits"] and check["plus_8_out_of_memory"] for check in report["checks"])
    print(f"{passed} of {len(report['checks'])}: the predicted batch trains and 8 more runs out of memory")


if __name__ == "__main__":
    main()
