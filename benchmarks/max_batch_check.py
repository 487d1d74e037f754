"""Does the predicted largest batch fit, and does 8 more not? Checked with real `gpuanat run` trials.

For each configuration: `gpuanat predict`'s max_batch_size for this GPU, then a real 2-step run at that
batch (it must train) and at 8 more (it must run out of memory). Each trial is a fresh process, exactly
what `gpuanat run` does. When the predicted batch does not train, it also tries 8 fewer.

    python benchmarks/max_batch_check.py --out max_batch_check.json

`--batches` tries given batches instead (each `--repeats` times), `--descend` steps down by 8 from the last of
them until one trains, and `--alloc-conf` runs every trial under that PYTORCH_CUDA_ALLOC_CONF (for instance
`expandable_segments:True`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuanat.core.measure.nvml_source import probe_nvml
from gpuanat.core.memory.predict import max_batch_size
from gpuanat.core.vocabulary.config import ALLOCATOR_CONF_VARIABLE, RunConfig

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
    arguments = [
        "--preset",
        "bert-large",
        "--precision",
        config.precision,
        "--optim",
        config.optim,
        "--attn",
        config.attn,
        "--grad-accum",
        str(config.grad_accum),
        "--batch-size",
        str(batch_size),
        "--max-steps",
        str(TRIAL_STEPS),
        "--samples",
        str(TRIAL_STEPS * batch_size * config.grad_accum),
    ]
    return (
        arguments
        + ["--grad-checkpointing"] * config.grad_checkpointing
        + ["--expandable-segments"] * config.expandable_segments
    )


def trial(overrides: dict[str, Any], batch_size: int, alloc_conf: str | None = None) -> dict[str, Any]:
    started_s = time.perf_counter()
    env = {**os.environ, ALLOCATOR_CONF_VARIABLE: alloc_conf} if alloc_conf else None
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "run", *flags(overrides, batch_size), "--json"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    lines = completed.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {}
    record = {
        "batch_size": batch_size,
        "status": result.get("status", f"exit {completed.returncode}"),
        "run_id": result.get("run_id"),
        "peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "peak_reserved_bytes": result.get("peak_reserved_bytes"),
        "device_memory_used_bytes": result.get("device_memory_used_bytes"),
        "predicted_peak_allocated_bytes": (result.get("predicted") or {}).get("peak_allocated_bytes"),
        "seconds": time.perf_counter() - started_s,
    }
    if result.get("error"):
        record["error_step"] = result["error"].get("step")
        record["error_message"] = result["error"].get("message")
    if not lines:
        record["stderr_tail"] = completed.stderr[-2000:]
    print(f"{json.dumps(overrides)} batch {batch_size}: {record['status']} ({record['seconds']:.0f} s)", flush=True)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only",
        type=json.loads,
        action="append",
        metavar="JSON",
        help='check only these configurations (RunConfig overrides), e.g. \'{"precision": "bf16"}\'',
    )
    parser.add_argument(
        "--batches",
        type=lambda text: [int(part) for part in text.split(",")],
        metavar="N,N,...",
        help="try these batches (instead of the prediction and 8 more)",
    )
    parser.add_argument("--repeats", type=int, default=1, metavar="K", help="try each of --batches K times (1)")
    parser.add_argument(
        "--descend",
        type=int,
        default=0,
        metavar="K",
        help="then step down by 8 from the last of --batches, at most K times, until one trains",
    )
    parser.add_argument("--alloc-conf", metavar="CONF", help="PYTORCH_CUDA_ALLOC_CONF for every trial")
    args = parser.parse_args()
    nvml = probe_nvml()
    if not (nvml.available and nvml.gpu_total_bytes):
        sys.exit(f"no GPU: {nvml.reason}")
    total_bytes = nvml.gpu_total_bytes[0]
    report: dict[str, Any] = {
        "gpu": nvml.gpu_names[0],
        "gpu_memory_bytes": total_bytes,
        "pytorch_cuda_alloc_conf": args.alloc_conf,
        "checks": [],
    }
    for overrides in args.only or CONFIGS:
        config = RunConfig.from_json({"preset": "bert-large", "device": "cuda", **overrides})
        predicted = max_batch_size(config, total_bytes)
        if args.batches:
            trials = [trial(overrides, batch, args.alloc_conf) for batch in args.batches for _ in range(args.repeats)]
            batch = args.batches[-1]
            for _ in range(args.descend):
                if trials[-1]["status"] == "ok":
                    break
                batch -= 8
                trials.append(trial(overrides, batch, args.alloc_conf))
            report["checks"].append({"overrides": overrides, "predicted_max_batch_size": predicted, "trials": trials})
            args.out.write_text(json.dumps(report, indent=1))
            continue
        trials = [trial(overrides, predicted, args.alloc_conf), trial(overrides, predicted + 8, args.alloc_conf)]
        if trials[0]["status"] != "ok":
            trials.append(trial(overrides, max(1, predicted - 8), args.alloc_conf))
        report["checks"].append(
            {
                "overrides": overrides,
                "predicted_max_batch_size": predicted,
                "trials": trials,
                "predicted_fits": trials[0]["status"] == "ok",
                "plus_8_out_of_memory": trials[1]["status"] == "oom",
            }
        )
        args.out.write_text(json.dumps(report, indent=1))
    judged = [check for check in report["checks"] if "predicted_fits" in check]
    passed = sum(check["predicted_fits"] and check["plus_8_out_of_memory"] for check in judged)
    print(f"{passed} of {len(judged)}: the predicted batch trains and 8 more runs out of memory")


if __name__ == "__main__":
    main()
