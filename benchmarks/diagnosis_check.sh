#!/usr/bin/env bash
# The docs' 11 experiments on one GPU with the step-time breakdown and the diagnosis (issue #19), in one call of the
# device tool (carry .whl_llm: bitsandbytes for the 8-bit Adam rows):
#   benchmarks/diagnosis_check.sh
# `gpuanat sweep --json` at SAMPLES samples (256: half the docs' 512, to fit one call), then the same bf16 run at
# batch 32 (GPU-bound) and at batch 32 with torch.compile (the compile rule). Writes $OUT/diagnosis/: sweep.json,
# extra.jsonl, the history (history.sqlite: steps and NVML samples) and the log.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/diagnosis
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=$OUT/history.sqlite
python3 -m pip install -q --no-index --find-links ${WHEELS:-.whl_llm} -e . bitsandbytes > "$OUT/pip.txt" 2>&1 \
  || { tail -20 "$OUT/pip.txt"; exit 1; }
timeout ${SWEEP_S:-420} gpuanat sweep --samples ${SAMPLES:-256} --json > "$OUT/sweep.json" 2> "$OUT/log.txt"
echo "sweep: exit $?" | tee -a "$OUT/log.txt"
for extra in "--precision bf16 --batch-size 32" "--precision bf16 --batch-size 32 --compile"; do
  timeout ${EXTRA_S:-150} gpuanat run $extra --samples 1024 --json 2>> "$OUT/log.txt" | tail -1 >> "$OUT/extra.jsonl"
  echo "$extra: exit $?" | tee -a "$OUT/log.txt"
done
