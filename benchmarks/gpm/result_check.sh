#!/usr/bin/env bash
# Issue #51: a `gpuanat run`'s steady activity and energy against an independent GPM sampler beside it, and a short
# `gpuanat tune --objective energy`.   OUT=dir benchmarks/gpm/result_check.sh
set -u
OUT=${OUT:-/tmp/gpm_result}
mkdir -p "$OUT"
python3 benchmarks/gpm/independent_gpm.py --out "$OUT/independent.jsonl" &
independent=$!
python3 -c 'import json, time; print(json.dumps({"wall_s": time.time(), "monotonic_s": time.monotonic()}))' > "$OUT/clock.json"
sleep 2
for config in "--preset bert-large --precision bf16 --batch-size 64" "--preset llama-3.2-1b --precision bf16 --batch-size 4 --seq-len 1024 --lora 16"; do
  name=$(echo "$config" | tr -c 'a-z0-9\n' '_' | cut -c1-40)
  python3 -m gpuanat run $config --max-steps 100 --samples 100000 --db "$OUT/history.sqlite" --json \
    --trace-out "$OUT/trace_$name.jsonl" > "$OUT/run_$name.json" 2> "$OUT/run_$name.err"
  sleep 2
done
python3 -m gpuanat tune --preset bert-large --seq-len 128 --objective energy --budget 3 --search batch,precision \
  --db "$OUT/history.sqlite" --json > "$OUT/tune.json" 2> "$OUT/tune.err"
kill "$independent"; wait
ls "$OUT"
