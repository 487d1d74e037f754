#!/usr/bin/env bash
# Issue #50's out-of-memory edge: for each configuration, the largest batch `gpuanat predict` says fits this GPU
# (read through NVML), then `gpuanat run` at that batch and at one more (3 optimizer steps each). The prediction
# holds where the first trains and the second runs out of memory.
#   OUT=dir benchmarks/oom/edge_check.sh                       # the configurations below
#   OUT=dir benchmarks/oom/edge_check.sh "CONFIG" "CONFIG@B1,B2"   # these; @: only these batch sizes
set -u
OUT=${OUT:-/tmp/edge}
mkdir -p "$OUT"
DB="$OUT/history.sqlite"
CONFIGS=(
  "--preset qwen2.5-0.5b --precision bf16 --seq-len 2048"
  "--preset llama-3.2-1b --precision bf16 --seq-len 2048"
  "--model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 --seq-len 1024"
  "--model benchmarks/configs/gemma-3-1b/config.json --precision bf16 --seq-len 1024 --lora 16"
  "--preset llama-3.2-1b --precision bf16 --seq-len 1024 --grad-checkpointing"
)
if [ $# -gt 0 ]; then CONFIGS=("$@"); fi
for item in "${CONFIGS[@]}"; do
  config=${item%@*}
  # shellcheck disable=SC2086
  largest=$(python3 -m gpuanat predict $config --json | python3 -c "import json,sys; print(json.load(sys.stdin)['max_batch_size'])")
  batches="$largest $((largest + 1))"
  if [ "$item" != "$config" ]; then batches=${item#*@}; batches=${batches//,/ }; fi
  for batch in $batches; do
    # shellcheck disable=SC2086
    python3 -m gpuanat run $config --batch-size "$batch" --max-steps 3 --samples $((batch * 3)) --db "$DB" --json \
      > "$OUT/run.json" 2> "$OUT/run.err"
    rc=$?
    python3 - "$config" "$largest" "$batch" "$rc" "$OUT/run.json" >> "$OUT/edge.jsonl" <<'PY'
import json, sys
config, largest, batch, rc, path = sys.argv[1:]
try:
    lines = [line for line in open(path).read().splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
except Exception as error:
    result = {"unreadable": str(error)}
print(json.dumps({
    "config": config, "predicted_largest": int(largest), "batch": int(batch), "exit": int(rc),
    "status": result.get("status"), "steps": result.get("steps"),
    "peak_allocated_bytes": result.get("peak_allocated_bytes"),
    "peak_reserved_bytes": result.get("peak_reserved_bytes"),
    "device_memory_total_bytes": result.get("device_memory_total_bytes"),
    "out_of_memory": result.get("out_of_memory"),
    "predicted_peak_allocated_bytes": (result.get("predicted") or {}).get("peak_allocated_bytes"),
    "predicted_peak_reserved_bytes": (result.get("predicted") or {}).get("peak_reserved_bytes"),
}))
PY
    tail -1 "$OUT/edge.jsonl" | cut -c1-220
  done
done
