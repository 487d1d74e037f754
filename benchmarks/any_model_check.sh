#!/usr/bin/env bash
# Issue #29's techniques through gpuanat itself on a GPU, in one call of the device tool:
#   bash benchmarks/any_model_check.sh
# A model held in bf16 (--weights-dtype bf16) and LoRA dropout (--lora-dropout) on llama-3.2-1b, seq 1024, batch 4,
# against the same run's plain counterpart; and TFLOP/s/MFU of a --model config.json (qwen3-0.6b, gemma-3-1b:
# sliding windows; granite MoE). 20 steps each. Writes $OUT/any_model/results.jsonl (one `run --json` result a line,
# with its name) and summary.txt (a line each, benchmarks/run_line.py: peak and predicted, steady rate, TFLOP/s, MFU).
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/any_model
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB="$OUT/history.sqlite"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
common=(--seq-len 1024 --batch-size 4 --max-steps 20 --samples 80 --json)
run() {  # NAME ARGS...: one run, its result a line of results.jsonl, a line of summary.txt
  local name=$1; shift
  python3 -m gpuanat run "$@" "${common[@]}" > "$OUT/$name.out" 2> "$OUT/$name.err" || tail -3 "$OUT/$name.err"
  python3 benchmarks/run_line.py "$OUT/$name.out" "$name" "$OUT/results.jsonl" | tee -a "$OUT/summary.txt"
}
run llama-amp --preset llama-3.2-1b --precision bf16
run llama-bf16w --preset llama-3.2-1b --precision bf16 --weights-dtype bf16
run llama-lora --preset llama-3.2-1b --precision bf16 --lora 16
run llama-dropout --preset llama-3.2-1b --precision bf16 --lora 16 --lora-dropout 0.05
run qwen3-model --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16
run gemma3-model --model benchmarks/configs/gemma-3-1b/config.json --precision bf16
run granite-model --model benchmarks/configs/granite-3.1-1b-a400m/config.json --precision bf16 --weights-dtype bf16
rm -f "$OUT"/*.out "$OUT"/*.err "$OUT"/*.json "$OUT"/history.sqlite*
rm -rf "$OUT/logs"
