#!/usr/bin/env bash
# Issue #51: runs' steady medians and energy per sample against an independent GPM sampler cut over the very same
# steps (benchmarks/gpm/same_steps.py): a GEMM-, an element-wise- and a launch-bound loop through the probe
# (benchmarks/gpm/step_loop.py, `gpuanat run --script`) and bert-large bf16 batch 64 through Trainer, on GPU 0; then,
# where the machine has two GPUs, a DDP run's NVML trace with GPM on both (for the lanes' replay in CI).
#   OUT=dir bash benchmarks/gpm/same_steps_check.sh
set -u
OUT=${OUT:-/tmp/same_steps}
mkdir -p "$OUT"
python3 benchmarks/gpm/independent_gpm.py --out "$OUT/independent.jsonl" --gpu 0 &
independent=$!
python3 -c 'import json, time; print(json.dumps({"wall_s": time.time(), "monotonic_s": time.monotonic()}))' > "$OUT/clock.json"
sleep 2
for spec in gemm:${GEMM_STEPS:-800} elementwise:${ELEMENTWISE_STEPS:-2500} launch:${LAUNCH_STEPS:-4000}; do
  kind=${spec%%:*}
  python3 -m gpuanat run --script benchmarks/gpm/step_loop.py --name "step $kind" --db "$OUT/history.sqlite" --json \
    -- "$kind" --steps "${spec##*:}" > "$OUT/run_$kind.json" 2> "$OUT/run_$kind.err"
  echo "$kind rc $?"
  sleep 2
done
python3 -m gpuanat run --preset bert-large --precision bf16 --batch-size 64 --max-steps 120 --samples 100000 \
  --name "bert-large bf16 b64" --db "$OUT/history.sqlite" --json > "$OUT/run_bert.json" 2> "$OUT/run_bert.err"
echo "bert rc $?"
kill "$independent"; wait "$independent" 2> /dev/null
python3 benchmarks/gpm/same_steps.py --history "$OUT/history.sqlite" --independent "$OUT/independent.jsonl" \
  --clock "$OUT/clock.json" | tee "$OUT/same_steps.jsonl"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  python3 -m gpuanat run --gpus 2 --distributed ddp --precision bf16 --batch-size 16 --samples 6144 --name ddp-gpm \
    --trace-out "$OUT/ddp_trace.jsonl" --db "$OUT/history.sqlite" --json > "$OUT/run_ddp.json" 2> "$OUT/run_ddp.err"
  echo "ddp rc $?"
fi
for f in "$OUT"/run_*.json; do
  python3 - "$f" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
keys = ("status", "steps", "steady_samples_per_second", "sm_active_percent", "tensor_active_percent",
        "dram_bandwidth_percent", "average_power_w", "joules_per_sample", "sm_clock_mhz", "throttled_percent",
        "throttle_reasons")
print(sys.argv[1].rsplit("/", 1)[-1], {k: r.get(k) for k in keys})
print("  diagnosis:", [d["bottleneck"] + ": " + d["evidence"] for d in r.get("diagnosis") or []])
PY
done
