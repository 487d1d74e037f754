#!/usr/bin/env bash
# Issue #54 on one GPU: `gpuanat tune` on bert-large seq 512 (every technique it searches, each trial profiled), then
# its printed command rerun outside tune, alternating with the plain HF Trainer baseline at batch 64 (bf16, TF32:
# benchmarks/plain_trainer.py, no gpuanat in the process). Run from the repository root with gpuanat importable:
#   BUDGET=6 benchmarks/tune54/tune_check.sh
#   WORKLOAD="--preset llama-3.2-1b --seq-len 2048" NO_RERUN=1 BUDGET=6 benchmarks/tune54/tune_check.sh
# Writes $OUT/tune54/: tune.json, the progress log, the reruns (runs.jsonl: tune54/summarize.py; plain.jsonl) and the
# history of the search.
set -u
OUT=${OUT:-/tmp/gpuanat-out}/tune54
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/tune54-search.sqlite
started=$SECONDS
timeout "${TUNE_S:-420}" python3 -m gpuanat tune ${WORKLOAD:---preset bert-large --seq-len 512} --budget "${BUDGET:-6}" \
  --json > "$OUT/tune.json" 2> "$OUT/tune_log.txt"
echo "tune: exit $? after $((SECONDS - started)) s"
grep "^tune" "$OUT/tune_log.txt" | cut -c1-220
python3 - "$OUT/tune.json" > "$OUT/commands.txt" <<'PY'
import json, sys
best = json.load(open(sys.argv[1]))["best"]
print(best["command"])
print(best["trial_command"])
PY
cat "$OUT/commands.txt"
[ -n "${NO_RERUN:-}" ] && exit 0
timed=$(sed -n 2p "$OUT/commands.txt")
PLAIN='{"preset": "bert-large", "seq_len": 512, "precision": "bf16", "tf32": true, "batch_size": 64, "samples": 1280, "max_steps": 20}'
export GPUANAT_DB=/tmp/tune54-rerun.sqlite
for round in 1 2; do
  started=$SECONDS
  timeout 200 python3 -m gpuanat ${timed#gpuanat } --json > /tmp/rerun.json 2> /tmp/rerun.err
  rc=$?
  python3 benchmarks/tune54/summarize.py "winner-rerun-$round" "$rc" /tmp/rerun.json /tmp/rerun.err "$timed" >> "$OUT/runs.jsonl"
  echo "winner rerun $round: rc=$rc $((SECONDS - started)) s $(tail -1 "$OUT/runs.jsonl" | cut -c1-300)"
  started=$SECONDS
  timeout 200 python3 benchmarks/plain_trainer.py --config "$PLAIN" 2> /tmp/plain.err | grep '^{"' >> "$OUT/plain.jsonl"
  echo "plain Trainer b64 $round: rc=$? $((SECONDS - started)) s $(tail -1 "$OUT/plain.jsonl" | cut -c1-300)"
done
(cd /tmp && tar czf "$OUT/history.tar.gz" tune54-search.sqlite* tune54-rerun.sqlite*)
