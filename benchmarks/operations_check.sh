#!/usr/bin/env bash
# The operations anatomy (issue #31) measured on a GPU, in one call of the device tool:
#   bash benchmarks/operations_check.sh
# bert-large at seq 512 (the docs' workload, batch 4), fp32 and bf16, eager and --compile-regions, eager attention in
# bf16, and a decoder (llama-3.2-1b shape, bf16, seq 1024; and with Liger's kernels), each with `--profile-ops 3 --profile-ops-trace`, checked
# against its own trace by operations_check.py -> results.jsonl, summary.txt; the fp32 run once more without
# profiling (the plain baseline: the steady rate a profiled run reports must match it).
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/operations
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/operations-history.sqlite
nvidia-smi --query-gpu=name,memory.used,utilization.gpu,clocks.sm,temperature.gpu --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    > "$OUT/versions.txt" 2>&1
python3 benchmarks/operations_smoke.py > "$OUT/smoke.txt" 2>&1; head -30 "$OUT/smoke.txt"
bert=(--preset bert-large --seq-len 512 --batch-size 4 --max-steps ${STEPS:-40} --samples 4096 --json)
profiled() {  # NAME ARGS...: one profiled run, checked against its trace
  local name=$1; shift
  timeout ${RUN_TIMEOUT:-150} python3 -m gpuanat run "$@" --profile-ops 3 --profile-ops-trace "/tmp/$name.trace.json" \
      > "/tmp/$name.out" 2> "/tmp/$name.err" || tail -5 "/tmp/$name.err"
  python3 benchmarks/operations_check.py "/tmp/$name.out" "/tmp/$name.trace.json" "$name" "$OUT/results.jsonl" \
      | tee -a "$OUT/summary.txt"
  rm -f "/tmp/$name.trace.json"
}
timeout 120 python3 -m gpuanat run "${bert[@]}" > /tmp/baseline.out 2> /tmp/baseline.err || tail -5 /tmp/baseline.err
python3 benchmarks/operations_check.py /tmp/baseline.out /nonexistent bert-fp32-unprofiled "$OUT/results.jsonl" \
    | head -1 | tee -a "$OUT/summary.txt"
profiled bert-fp32 "${bert[@]}"
profiled bert-bf16 "${bert[@]}" --precision bf16
profiled bert-fp32-compile-regions "${bert[@]}" --compile-regions
profiled bert-bf16-compile-regions "${bert[@]}" --precision bf16 --compile-regions
profiled bert-bf16-eager-attention "${bert[@]}" --precision bf16 --attn eager
llama=(--preset llama-3.2-1b --precision bf16 --seq-len 1024 --batch-size 4 --max-steps 30 --samples 4096 --json)
profiled llama-3.2-1b-bf16 "${llama[@]}"
profiled llama-3.2-1b-bf16-liger "${llama[@]}" --liger --liger-layers
