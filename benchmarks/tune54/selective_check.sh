#!/usr/bin/env bash
# Selective activation checkpointing (--grad-checkpointing --selective-checkpointing) on bert-large, pure bf16,
# compiled regions, the Accelerate loop, against the same run without checkpointing in the same call; one line of
# JSON a run in $OUT/selective.jsonl (benchmarks/tune54/summarize.py). Run from the repository root:
#   benchmarks/tune54/selective_check.sh
set -u
OUT=${OUT:-/tmp/gpuanat-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/selective-history.sqlite
BEST="--preset bert-large --seq-len 512 --precision bf16 --tf32 --weights-dtype bf16 --no-autocast --engine accelerate"
run() {
  local name=$1; shift
  local started=$SECONDS
  timeout "${LIMIT:-80}" python3 -m gpuanat run $BEST "$@" --max-steps 20 --json > /tmp/run.json 2> /tmp/run.err
  local rc=$?
  python3 benchmarks/tune54/summarize.py "$name" "$rc" /tmp/run.json /tmp/run.err "$BEST $*" >> "$OUT/selective.jsonl"
  echo "$name rc=$rc $((SECONDS - started)) s: $(tail -1 "$OUT/selective.jsonl" | cut -c1-200)"
}
run sac-b128-regions --batch-size 128 --compile-regions --grad-checkpointing --selective-checkpointing
if ! grep -q '"name": "sac-b128-regions", "rc": 0' "$OUT/selective.jsonl"; then
  tail -5 /tmp/run.err
  run sac-b128 --batch-size 128 --grad-checkpointing --selective-checkpointing
fi
run none-b128-regions --batch-size 128 --compile-regions
run sac-b256-regions --batch-size 256 --compile-regions --grad-checkpointing --selective-checkpointing
