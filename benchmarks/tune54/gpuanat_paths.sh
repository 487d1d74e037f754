#!/usr/bin/env bash
# Issue #54 on one GPU, through `gpuanat run`: pure bf16 (--weights-dtype bf16 --no-autocast) on bert-large seq 512
# with each engine and compiled regions, profiled once; llama-3.2-1b seq 2048 pure bf16 compiled. One line of JSON a
# run in $OUT/runs.jsonl (benchmarks/tune54/summarize.py). Run from the repository root with gpuanat importable:
#   WHAT="bert llama" benchmarks/tune54/gpuanat_paths.sh
set -u
OUT=${OUT:-/tmp/gpuanat-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/tune54-history.sqlite
python3 -c "import liger_kernel, sys; print('liger', liger_kernel.__version__ if hasattr(liger_kernel, '__version__') else 'present')" > "$OUT/liger.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.txt"
run() {
  local name=$1; shift
  local started=$SECONDS
  timeout "${LIMIT:-240}" python3 -m gpuanat run "$@" --json > /tmp/run.json 2> /tmp/run.err
  local rc=$?
  python3 benchmarks/tune54/summarize.py "$name" "$rc" /tmp/run.json /tmp/run.err "$*" >> "$OUT/runs.jsonl"
  echo "$name rc=$rc $((SECONDS - started)) s: $(tail -1 "$OUT/runs.jsonl" | cut -c1-400)"
}
BERT="--preset bert-large --seq-len 512 --precision bf16 --tf32 --weights-dtype bf16"
LLAMA="--preset llama-3.2-1b --seq-len 2048 --precision bf16 --tf32 --weights-dtype bf16"
for what in ${WHAT:-bert llama}; do
  case $what in
    bert)
      run bert-pure-b64 $BERT --no-autocast --batch-size 64 --max-steps 30
      run bert-pure-b64-accelerate $BERT --no-autocast --batch-size 64 --max-steps 30 --engine accelerate
      run bert-pure-b128-accelerate-regions $BERT --no-autocast --batch-size 128 --max-steps 30 --engine accelerate \
        --compile-regions --profile-ops 3
      run bert-pure-b64-accelerate-regions $BERT --no-autocast --batch-size 64 --max-steps 40 --engine accelerate \
        --compile-regions
      ;;
    llama)
      run llama-pure-b4-compile $LLAMA --no-autocast --batch-size 4 --max-steps 20 --engine accelerate --compile \
        --profile-ops 2
      run llama-pure-b8-compile $LLAMA --no-autocast --batch-size 8 --max-steps 16 --engine accelerate --compile
      ;;
  esac
done
