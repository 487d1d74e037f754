#!/usr/bin/env bash
# Issue #51 on a GPU: gpuanat's sampler (record_gpm.py, 0.25 s) and an independent GPM sampler (independent_gpm.py,
# 1 s) side by side during a GEMM-, an element-wise- and a launch-bound step (workloads.py) and gpuanat's bert-large
# bf16 batch-64 run; the windows in windows.jsonl.   OUT=dir benchmarks/gpm/gpm_check.sh
set -u
OUT=${OUT:-/tmp/gpm}
mkdir -p "$OUT"
python3 benchmarks/gpm/independent_gpm.py --out "$OUT/independent.jsonl" &
independent=$!
python3 benchmarks/gpm/record_gpm.py --out "$OUT/gpuanat_samples.jsonl" &
recorder=$!
sleep 3
for kind in gemm elementwise launch; do
  python3 benchmarks/gpm/workloads.py "$kind" --seconds 20 >> "$OUT/windows.jsonl"
  sleep 2
done
start=$(python3 -c "import time; print(time.time())")
python3 -m gpuanat run --preset bert-large --precision bf16 --batch-size 64 --max-steps 120 --samples 7680 \
  --db "$OUT/history.sqlite" --json --trace-out "$OUT/bert_trace.jsonl" > "$OUT/bert.json" 2> "$OUT/bert.err"
end=$(python3 -c "import time; print(time.time())")
echo "{\"kind\": \"bert-large bf16 b64\", \"start_wall_s\": $start, \"end_wall_s\": $end}" >> "$OUT/windows.jsonl"
sleep 2
kill "$independent" "$recorder"
wait
cat "$OUT/windows.jsonl"
