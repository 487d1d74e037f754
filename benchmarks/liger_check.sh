#!/usr/bin/env bash
# Liger's layer kernels (--liger-layers) checked on a GPU, in one call of the device tool:
#   bash benchmarks/liger_check.sh
# 1. llm_matrix's liger-unseen set: plain HF Trainer with use_liger_kernel on config.json models whose Liger runs
#    were never measured (qwen3, gemma3, olmo2, smollm2), each against its run without Liger -> liger_unseen.json.
# 2. gpuanat run with --liger --liger-layers on llama-3.2-1b (full under autocast, and LoRA) with a memory snapshot,
#    whose peak is taken apart by peak_tensors.py -> peak_full.txt, peak_lora.txt; and on qwen3-0.6b's config.json
#    (Liger patched on the built model, q/k norms left as they are) -> runs.jsonl, summary.txt.
# 3. gpuanat fit of a config.json (issue #29 item 4) -> fit_qwen3.json.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/liger
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/liger-history.sqlite
python3 benchmarks/llm_matrix.py --set liger-unseen --out "$OUT/liger_unseen.json" --budget-s 260 2>&1 | tail -3
common=(--seq-len 1024 --batch-size 4 --max-steps 4 --samples 16 --json)
run() {  # NAME ARGS...: one run, its result a line of runs.jsonl, a line of summary.txt
  local name=$1; shift
  python3 -m gpuanat run "$@" "${common[@]}" > "/tmp/$name.out" 2> "/tmp/$name.err" || tail -3 "/tmp/$name.err"
  python3 benchmarks/run_line.py "/tmp/$name.out" "$name" "$OUT/runs.jsonl" | tee -a "$OUT/summary.txt"
}
run llama-full --preset llama-3.2-1b --precision bf16
run llama-full-liger --preset llama-3.2-1b --precision bf16 --liger --liger-layers --memory-snapshot /tmp/full.pickle
python3 benchmarks/peak_tensors.py /tmp/full.pickle > "$OUT/peak_full.txt" 2>&1
run llama-lora --preset llama-3.2-1b --precision bf16 --lora 16
run llama-lora-liger --preset llama-3.2-1b --precision bf16 --lora 16 --liger --liger-layers \
    --memory-snapshot /tmp/lora.pickle
python3 benchmarks/peak_tensors.py /tmp/lora.pickle > "$OUT/peak_lora.txt" 2>&1
run qwen3 --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16
run qwen3-liger-layers --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 --liger-layers
timeout 150 python3 -m gpuanat fit --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 \
    --seq-len 1024 --json > "$OUT/fit_qwen3.json" 2> /tmp/fit.err || tail -5 /tmp/fit.err
