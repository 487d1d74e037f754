#!/usr/bin/env bash
# Issue #30 on a GPU, in one call of the device tool: do the bands of every result and published record add up to
# NVML, for the docs' default run, --model runs and a user's own loops with their probes?
#   bash benchmarks/loop_probes_check.sh
# 1. `gpuanat run --json`: the docs' default run (bert-large, fp32, batch 4); qwen3-0.6b from its config.json with
#    --model, under bf16 autocast and with bf16 weights.
# 2. The three loops of benchmarks/loops with their probes — a plain PyTorch loop (gpuanat.probe.track), a Lightning
#    fit (LightningAnatomyCallback), a TRL SFTTrainer fine-tune (AnatomyCallback in one line) — each under
#    `gpuanat run --script`, and each started on its own and watched by PID (`gpuanat watch PID --json`).
# 3. benchmarks/bands_check.py --results on every result and record: every band >= 0, each stack within 1% of the
#    device reading beside it -> bands_results.json. Results: results.jsonl, records_<loop>.jsonl, summary.txt.
# 4. With COST_ROUNDS=N: benchmarks/loop_probe_cost.py, each loop without and with its probe, ABBA -> loop_probe_cost.json.
# SKIP_DOCS=1 and SKIP_WATCH=1 leave out the docs' run and the watches.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/loops
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/loops-history.sqlite
export XDG_RUNTIME_DIR=/tmp/loops-runtime && mkdir -p -m 700 "$XDG_RUNTIME_DIR"
STEPS=${STEPS:-60}
run() {  # NAME ARGS...: `gpuanat run ARGS --json`
  local name=$1; shift
  timeout 300 python3 -m gpuanat run --json "$@" > "/tmp/$name.out" 2> "/tmp/$name.err" || tail -3 "/tmp/$name.err"
  python3 benchmarks/run_line.py "/tmp/$name.out" "$name" "$OUT/results.jsonl" | tee -a "$OUT/summary.txt"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl, lightning; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'lightning', lightning.__version__)" | tee "$OUT/versions.txt"
[ -z "${SKIP_DOCS:-}" ] && run docs-default
run qwen3-autocast --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 --seq-len 1024 --batch-size 4 --samples 160
run qwen3-bf16-weights --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 --weights-dtype bf16 --seq-len 1024 \
  --batch-size 4 --samples 160
for loop in plain_loop lightning_fit trl_sft; do
  run "script-$loop" --script "benchmarks/loops/$loop.py" -- --probe --steps "$STEPS"
  [ -n "${SKIP_WATCH:-}" ] && continue
  # the same script started on its own, watched by PID from its start to its end
  python3 "benchmarks/loops/$loop.py" --probe --steps "$STEPS" --hold-s 2 > "/tmp/own-$loop.out" 2>&1 &
  pid=$!
  timeout 300 python3 -m gpuanat watch "$pid" --json > "$OUT/records_$loop.jsonl" 2> "/tmp/watch-$loop.err" \
    || tail -3 "/tmp/watch-$loop.err"
  wait "$pid"
  python3 - "$OUT/records_$loop.jsonl" "$loop" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
from gpuanat.core.measure.anatomy import stack_problems, stack_sum_error_percent
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
published = [r for r in records if r.get("published") and r.get("bands_measured_at_step")]
errors = [e for e in (stack_sum_error_percent(r) for r in published) if e is not None]
problems = [p for r in published for p in stack_problems(r)]
print(f"watch {sys.argv[2]:<18} {len(records)} records, {len(published)} with bands, max |sum - NVML| "
      f"{max(map(abs, errors)) if errors else None}%, {len(problems)} problems {problems[:3]}; final "
      f"{records[-1] if records else None}")
PY
done
python3 benchmarks/bands_check.py --results "$OUT/results.jsonl" $(ls "$OUT"/records_*.jsonl 2>/dev/null) \
  --out "$OUT/bands_results.json" | head -20 | tee -a "$OUT/summary.txt"
# 4. each probe's cost: its loop without and with it, alternated in one process (COST_ROUNDS ABBA rounds)
[ -n "${COST_ROUNDS:-}" ] && timeout 420 python3 benchmarks/loop_probe_cost.py --out "$OUT/loop_probe_cost.json" \
  --rounds "$COST_ROUNDS" --steps "${COST_STEPS:-50}" 2>&1 | grep -v '^{' | tee -a "$OUT/summary.txt"
