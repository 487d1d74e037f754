#!/usr/bin/env bash
# The runner against a plain Trainer on one GPU (issue #18 items 1 and 2), in one call of the device tool:
#   WHAT="bs32 bs64" benchmarks/cost_check.sh
# bert-large, bf16, fused AdamW, 2048 samples: plain HF Trainer (benchmarks/plain_trainer.py) and `gpuanat run`
# alternating ABBA (benchmarks/overhead.py), one run of each first not counted (cold disk and kernel caches), each
# run's HF and steady samples/s, wall time and start-up breakdown; PROBE_ARM=1 adds the plain Trainer with gpuanat's
# probe as a third arm. Writes $OUT/cost/overhead_<case>.json and the log.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/cost
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 -m pip install -q --no-index --find-links .whl -e . > "$OUT/pip.txt" 2>&1 || { tail -20 "$OUT/pip.txt"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
for case in ${WHAT:-bs32 bs64}; do
  batch=${case#bs}
  timeout ${CASE_S:-400} python3 benchmarks/overhead.py --interleave as-is \
    --base "{\"precision\": \"bf16\", \"batch_size\": $batch, \"samples\": 2048}" \
    --repeats ${REPEATS:-4} --warmup-runs ${WARMUP_RUNS:-1} ${PROBE_ARM:+--probe-arm} --out "$OUT/overhead_${case}_bf16.json" 2>&1 \
    | tee -a "$OUT/log.txt"
done
