#!/usr/bin/env bash
# torch.compile through HF Trainer against eager, one GPU (issue #19's compile rule), one call of the device tool:
#   benchmarks/archive/compile_check.sh    (from the repository root; archived: benchmarks/README.md)
# bert-large bf16 batch 32, 1024 samples: eager, then compiled, in one history (so the compiled run's diagnosis
# finds the eager one). Writes $OUT/compile/runs.jsonl and the log.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/compile
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=$OUT/history.sqlite
python3 -m pip install -q --no-index --find-links ${WHEELS:-.whl} -e . > "$OUT/pip.txt" 2>&1 || { tail -20 "$OUT/pip.txt"; exit 1; }
for flags in "" "--compile"; do
  timeout ${RUN_S:-240} gpuanat run --precision bf16 --batch-size 32 --samples ${SAMPLES:-1024} $flags --json \
    2>> "$OUT/log.txt" | tail -1 >> "$OUT/runs.jsonl"
  echo "compile flags '$flags': exit ${PIPESTATUS[0]}" | tee -a "$OUT/log.txt"
done
