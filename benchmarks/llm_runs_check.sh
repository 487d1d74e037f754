#!/usr/bin/env bash
# Decoder LLMs through gpuanat itself (issue #16), on one GPU, in one call of the device tool:
#   benchmarks/llm_runs_check.sh
# Real `gpuanat run --json`s: llama-3.2-1b full and LoRA, qwen2.5-0.5b, gpt2 (the classifier), llama-3.1-8b QLoRA
# (--load-in-4bit) and llama-3.2-1b with Liger's fused linear cross-entropy; then the dashboard during a
# llama-3.2-1b run (the logits row). Writes $OUT/llm_runs/: results.jsonl (each result, "case" added), the
# screenshot, and the runs' stderr in logs.tar.gz. Wheels missing there travel in .whl_llm (bitsandbytes, liger-kernel,
# datasets and its deps, textual and its deps).
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/llm_runs
mkdir -p "$OUT" /tmp/llm_runs
export PYTHONUNBUFFERED=1 GPUANAT_DB=/tmp/llm_runs/gpu.sqlite TQDM_DISABLE=1
python3 -m pip install -q --no-index --find-links .whl_llm -e . bitsandbytes liger-kernel peft \
  > /tmp/llm_runs/pip.txt 2>&1 || { tail -20 /tmp/llm_runs/pip.txt; exit 1; }
COMMON=(--precision bf16 --max-steps ${STEPS:-8} --samples 64)
run_case() {
  local name=$1; shift
  local started=$(date +%s)
  timeout ${CASE_S:-150} gpuanat run "${COMMON[@]}" "$@" --json > /tmp/llm_runs/$name.json 2> /tmp/llm_runs/$name.err
  local code=$?
  python3 - "$name" "$code" "$(( $(date +%s) - started ))" <<'PY' >> "$OUT/results.jsonl"
import json, sys
name, code, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    result = json.loads(open(f"/tmp/llm_runs/{name}.json").read().strip().splitlines()[-1])
except Exception as error:
    result = {"status": "no result", "why": str(error)}
print(json.dumps({"case": name, "exit_code": code, "wall_s": wall, **result}))
PY
  echo "$name: exit $code, $(( $(date +%s) - started )) s"
}
run_case llama-1b-full --preset llama-3.2-1b --seq-len 1024 --batch-size 2
run_case llama-1b-lora --preset llama-3.2-1b --seq-len 1024 --batch-size 2 --lora 16
run_case qwen-0.5b-full --preset qwen2.5-0.5b --seq-len 2048 --batch-size 2
run_case llama-8b-qlora --preset llama-3.1-8b --seq-len 1024 --batch-size 2 --lora 16 --load-in-4bit --grad-checkpointing
run_case llama-1b-liger --preset llama-3.2-1b --seq-len 1024 --batch-size 2 --liger
run_case gpt2-cls --preset gpt2 --seq-len 512 --batch-size 16
python3 - "$OUT/results.jsonl" <<'PY'
import json, sys
G = 2**30
for line in open(sys.argv[1]):
    r = json.loads(line)
    bands = r.get("bands") or {}
    total = sum(v for k, v in bands.items() if k.endswith("_bytes") and k not in ("free_bytes",) and v is not None)
    predicted = (r.get("predicted") or {}).get("peak_allocated_bytes")
    peak = r.get("peak_allocated_bytes")
    error = f"{100 * (predicted - peak) / peak:+.1f}%" if predicted and peak else "-"
    print(f"{r['case']:16s} {r.get('status')}: peak {peak and peak / G:.2f} GiB predicted {predicted and predicted / G:.2f}"
          f" ({error}); NVML used {(r.get('device_memory_used_bytes') or 0) / G:.2f}, bands sum {total / G:.2f};"
          f" logits {(r.get('logits_bytes') or 0) / G:.2f} GiB; tokens/s {r.get('steady_tokens_per_second')};"
          f" trainable {r.get('trainable_params')}; error {r.get('error')}")
PY
timeout 150 python3 scripts/take_screenshots.py --out-dir "$OUT" --gpus 1 --distributed none --preset llama-3.2-1b \
  --precision bf16 --batch-size 2 --seq-len 1024 --samples 4096 --max-steps 400 --mid-run-s 15 \
  --filename dashboard_llama.svg > /tmp/llm_runs/shot.log 2>&1; echo "screenshot: exit $?"
tar czf "$OUT/logs.tar.gz" -C /tmp/llm_runs --exclude gpu.sqlite . 2>/dev/null
