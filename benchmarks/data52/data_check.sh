#!/usr/bin/env bash
# Issue #52 on a GPU: a decoder trained on a local dataset (Python's standard-library docstrings, a BPE tokenizer
# trained on them: make_corpus.py) with each padding — longest, max, pack — through `gpuanat run` (real tokens/s,
# padding share, memory, loss); `history --compare` of the three; the dashboard's loss pane mid-run (SVG).
#   OUT=dir bash benchmarks/data52/data_check.sh
set -u
OUT=${OUT:-/tmp/data52}
mkdir -p "$OUT"
export TQDM_DISABLE=1
python3 benchmarks/data52/make_corpus.py --out "$OUT/corpus" --rows 20000 | tee "$OUT/corpus.json"
common=(--preset "${PRESET:-qwen2.5-0.5b}" --data "$OUT/corpus/docstrings.jsonl" --tokenizer "$OUT/corpus/tokenizer"
  --precision bf16 --batch-size 16 --seq-len 1024 --samples 20000 --max-steps "${STEPS:-150}" --db "$OUT/history.sqlite")
for padding in longest max pack; do
  python3 -m gpuanat run "${common[@]}" --padding "$padding" --name "pad $padding" --json \
    > "$OUT/run_$padding.json" 2> "$OUT/run_$padding.err"
  echo "$padding rc $?"
done
python3 -m gpuanat history --db "$OUT/history.sqlite" --compare 1 2 3 > "$OUT/compare.txt" 2>&1
python3 -m gpuanat history --db "$OUT/history.sqlite" --format md > "$OUT/history.md" 2>&1
for padding in longest max pack; do
  python3 - "$OUT/run_$padding.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
keys = ("status", "steps", "steady_samples_per_second", "steady_tokens_per_second", "steady_real_tokens_per_second",
        "padding_percent", "peak_allocated_bytes", "peak_reserved_bytes", "device_memory_used_bytes", "final_loss",
        "min_loss", "train_loss", "mfu", "tensor_active_percent", "joules_per_sample")
print(sys.argv[1].rsplit("/", 1)[-1], {k: r.get(k) for k in keys})
print("  histogram", r.get("length_histogram"), "curve points", len(r.get("loss_curve") or []), r.get("error"))
PY
done
cat "$OUT/compare.txt"
python3 benchmarks/data52/loss_screenshot.py --data "$OUT/corpus/docstrings.jsonl" --tokenizer "$OUT/corpus/tokenizer" \
  --out-dir "$OUT/shots" --mid-run-s "${MID_RUN_S:-45}" > "$OUT/shots.log" 2>&1
echo "screenshot rc $?"; ls "$OUT/shots"
