#!/usr/bin/env bash
# The warm worker (issue #32) on a GPU, in one call of the device tool:
#   bash benchmarks/warm_worker_check.sh
# warm_worker.py (execute_run cold/warm pairs, a prepared worker's GPU footprint, the allocator's options handed over,
# the dashboard driven with Pilot) -> results.json, summary.txt; then the docs' sweep (3 experiments) with warm starts
# on and off -> sweep-warm.json, sweep-cold.json: each run's start and steady samples/s.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/warm_worker
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$OUT/gpu.txt"
nproc > "$OUT/cores.txt"
timeout 420 python3 benchmarks/warm_worker.py "$OUT" --steps ${STEPS:-20} 2>&1 | tail -40
sweep=(sweep --only vanilla --only bf16 --only tf32 --max-steps ${SWEEP_STEPS:-60} --samples 4096 --json)
GPUANAT_DB=/tmp/sweep-warm.sqlite GPUANAT_WARM_WORKER=1 timeout 240 python3 -m gpuanat "${sweep[@]}" \
    > "$OUT/sweep-warm.json" 2> /tmp/sweep-warm.err || tail -5 /tmp/sweep-warm.err
GPUANAT_DB=/tmp/sweep-cold.sqlite GPUANAT_WARM_WORKER=0 timeout 240 python3 -m gpuanat "${sweep[@]}" \
    > "$OUT/sweep-cold.json" 2> /tmp/sweep-cold.err || tail -5 /tmp/sweep-cold.err
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for kind in ("warm", "cold"):
    try:
        rows = json.load(open(f"{out}/sweep-{kind}.json"))
    except (OSError, ValueError) as error:
        print(kind, "no result:", error); continue
    for row in rows:
        start = row.get("start") or {}
        print(f"sweep {kind} {row['name']:>8}: {row['status']} warm={start.get('warm')} "
              f"to first step {row.get('time_to_first_step_s') or 0:.2f} s, steady {row.get('steady_samples_per_second')}"
              f" samples/s; cold reason: {start.get('cold_reason')}")
PY
