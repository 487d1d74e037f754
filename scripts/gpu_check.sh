#!/usr/bin/env bash
# GPU verification on the lent GPU machine (see ../shared/GPU.md and the README, "GPU checks").
#
# The whole check outlasts one 10-minute device call, so it runs as a background job in its own
# session that later calls collect from (named: with no argument it only prints this):
#   scripts/gpu_check.sh start [WAIT_S]    start the job, wait up to WAIT_S s, copy what exists to $OUT
#   scripts/gpu_check.sh collect [WAIT_S]  wait up to WAIT_S s for the job, copy what exists to $OUT
#   scripts/gpu_check.sh start-tui [WAIT_S]  the same for the TUI job
#   scripts/gpu_check.sh start-watch [WAIT_S]  the same for the watch job (issue #5)
#   scripts/gpu_check.sh start-fragmentation [WAIT_S]  largest-batch checks of the checkpointed optimizers (issue
#     #4: fragmentation by optimizer state), then `gpuanat fit` of fp32 + checkpointing + 8-bit Adam
#   scripts/gpu_check.sh start-edge-expandable [WAIT_S]  largest-batch edges with expandable segments (issue #4)
#   scripts/gpu_check.sh start-edge-default [WAIT_S]  largest-batch edges with the default allocator (issue #4)
#   scripts/gpu_check.sh start-expandable [WAIT_S]  --expandable-segments through fit and run, held out (issue #4)
#   scripts/gpu_check.sh start-replay-check [WAIT_S]  trials at the largest batches the allocator replay predicts
#     where no trial said yet (issue #4)
#   scripts/gpu_check.sh start-allocation-traces [WAIT_S]  the allocator's history of every largest-batch technique
#     set at batch 8, 12 and 16 (benchmarks/allocation_trace.py), for the allocator replay (issue #4)
#   scripts/gpu_check.sh start-anatomy [WAIT_S]  the same for the anatomy job (issue #4): the docs' table with
#     the bands checked against NVML at every step record and the probe's own time, the autocast-cache
#     configurations, and the largest bf16 + checkpointing batch found by `gpuanat fit`
# The job: `gpuanat sweep` (bert-large, the docs' table) -> plain-Trainer baselines of every row
# (benchmarks/overhead.py) -> a short run that records an NVML trace -> a real OOM -> GPU tests.
# The TUI job: README screenshots with the real app -> the TUI cost benchmark -> interleaved
# repeats of plain Trainer vs gpuanat on two configs.
# The watch job: a bert-large HF Trainer script started outside gpuanat (scripts/bert_large_external.py,
# with the one-line AnatomyCallback) -> `gpuanat watch PID --json --save` records it and an NVML trace while a
# second watcher takes the watch dashboard's screenshot -> a run without the callback, watched for 20 s ->
# the publishing cost paired on bert-large -> the GPU watch tests.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}
JOB=/tmp/gpuanat-job
mkdir -p "$OUT"

setup() {
  if compgen -G ".whl/*.whl" >/dev/null && [ ! -d /tmp/site ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GPUANAT_DB=$JOB/gpu.sqlite
}

# A job's start: the environment, its folder, and which GPU and driver it ran on.
begin_job() {
  setup
  mkdir -p "$JOB"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$JOB/env.txt"
}

# The docs' table at 128 samples, then every step record's bands against NVML.
sweep_and_bands() {
  python3 -m gpuanat sweep --samples 128 --json > "$JOB/sweep_128.json" 2> "$JOB/sweep_128.log"
  python3 benchmarks/bands_check.py "$GPUANAT_DB" --out "$JOB/bands_check.json" > "$JOB/bands_check.log" 2>&1
}

job() {
  setup
  mkdir -p "$JOB"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, transformers, datasets, bitsandbytes; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'datasets', datasets.__version__, \
'bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -1
  } > "$JOB/env.txt"
  echo "$(date +%T) sweep" >> "$JOB/progress.txt"
  python3 -m gpuanat sweep --json > "$JOB/sweep.json" 2> "$JOB/sweep.log"
  echo "$(date +%T) sweep exit $?; plain baselines" >> "$JOB/progress.txt"
  python3 -m gpuanat history --format md > "$JOB/history.md"
  python3 benchmarks/overhead.py --sweep-json "$JOB/sweep.json" --out "$JOB/overhead.json" > "$JOB/overhead.log" 2>&1
  echo "$(date +%T) trace" >> "$JOB/progress.txt"
  python3 -m gpuanat run --precision bf16 --batch-size 8 --max-steps 60 --trace-out "$JOB/nvml_trace_h100.jsonl" \
    --json > "$JOB/trace_run.json" 2>/dev/null
  echo "$(date +%T) oom" >> "$JOB/progress.txt"
  python3 -m gpuanat run --batch-size 512 --max-steps 3 --json > "$JOB/oom.json" 2> "$JOB/oom.log"
  echo "oom exit $?" >> "$JOB/oom.log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$JOB/oom.log"
  echo "$(date +%T) gpu tests" >> "$JOB/progress.txt"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests > "$JOB/gpu_tests.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_tui() {
  setup
  mkdir -p "$JOB"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$JOB/env.txt"
  echo "$(date +%T) screenshots" >> "$JOB/progress.txt"
  python3 scripts/take_screenshots.py --out-dir "$JOB/screenshots" > "$JOB/screenshots.log" 2>&1
  echo "$(date +%T) tui cost" >> "$JOB/progress.txt"
  python3 benchmarks/tui_cost.py --out "$JOB/tui_cost_h100.json" --stream-s 15 -- --samples 2048 \
    > "$JOB/tui_cost.log" 2>&1
  echo "$(date +%T) interleaved overhead" >> "$JOB/progress.txt"
  python3 benchmarks/overhead.py --interleave vanilla --interleave bf16 --repeats 3 \
    --out "$JOB/overhead_interleaved.json" > "$JOB/overhead_interleaved.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_watch() {
  setup
  mkdir -p "$JOB"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$JOB/env.txt"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    >> "$JOB/env.txt" 2>&1
  echo "$(date +%T) external bert-large with the callback" >> "$JOB/progress.txt"
  setsid python3 scripts/bert_large_external.py --max-steps 900 --ready-file "$JOB/ready" \
    > "$JOB/external.log" 2>&1 < /dev/null &
  local waited=0
  while [ ! -s "$JOB/ready" ] && [ "$waited" -lt 300 ]; do sleep 1; waited=$((waited + 1)); done
  local pid; pid=$(cat "$JOB/ready")
  echo "$(date +%T) watching PID $pid" >> "$JOB/progress.txt"
  ls -la "${XDG_RUNTIME_DIR:-/tmp/gpuanat-$(id -u)}"/ /tmp/gpuanat-"$(id -u)"/ > "$JOB/publication_ls.txt" 2>&1
  python3 -m gpuanat watch "$pid" --json --save "bert-large external" --trace-out "$JOB/nvml_trace_watch.jsonl" \
    > "$JOB/watch.jsonl" 2> "$JOB/watch.log" &
  local watcher=$!
  python3 scripts/take_screenshots.py --out-dir "$JOB/screenshots" --watch-pid "$pid" --mid-run-s 25 \
    > "$JOB/screenshots.log" 2>&1
  wait "$watcher"; echo "watch exit $?" >> "$JOB/watch.log"
  echo "$(date +%T) without the callback, 20 s" >> "$JOB/progress.txt"
  rm -f "$JOB/ready"
  setsid python3 scripts/bert_large_external.py --no-callback --max-steps 400 --ready-file "$JOB/ready" \
    > "$JOB/external_no_callback.log" 2>&1 < /dev/null &
  waited=0
  while [ ! -s "$JOB/ready" ] && [ "$waited" -lt 300 ]; do sleep 1; waited=$((waited + 1)); done
  python3 -m gpuanat watch "$(cat "$JOB/ready")" --json --duration 20 --save "bert-large external, no callback" \
    > "$JOB/watch_no_callback.jsonl" 2> "$JOB/watch_no_callback.log"
  wait
  python3 -m gpuanat history --json > "$JOB/history.json"
  python3 -m gpuanat history --format md > "$JOB/history.md"
  echo "$(date +%T) publishing cost on bert-large" >> "$JOB/progress.txt"
  python3 benchmarks/publish_cost.py --out "$JOB/publish_cost_h100.json" --rounds 3 --steps 40 \
    --config '{"device": "cuda", "batch_size": 4, "samples": 512}' > "$JOB/publish_cost.log" 2>&1
  echo "$(date +%T) gpu watch tests" >> "$JOB/progress.txt"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_watch_gpu.py -s > "$JOB/gpu_watch_tests.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_predict() {
  setup
  mkdir -p "$JOB"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$JOB/env.txt"
  echo "$(date +%T) sweep, 128 samples (bands against NVML at every step record)" >> "$JOB/progress.txt"
  python3 -m gpuanat sweep --samples 128 --json > "$JOB/sweep_128.json" 2> "$JOB/sweep_128.log"
  python3 benchmarks/bands_check.py "$GPUANAT_DB" --out "$JOB/bands_check.json" > "$JOB/bands_check.log" 2>&1
  echo "$(date +%T) max batch check" >> "$JOB/progress.txt"
  python3 benchmarks/max_batch_check.py --out "$JOB/max_batch_check.json" > "$JOB/max_batch_check.log" 2>&1
  echo "$(date +%T) fit" >> "$JOB/progress.txt"
  python3 -m gpuanat fit --precision bf16 --trial-steps 2 --json > "$JOB/fit_bf16.json" 2> "$JOB/fit_bf16.log"
  echo "$(date +%T) probe cost across the table" >> "$JOB/progress.txt"
  python3 - "$JOB" <<'PY' > "$JOB/probe_cost_table.log" 2>&1
import json, subprocess, sys
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.store.sweep import EXPERIMENTS
job = sys.argv[1]
for index, experiment in enumerate(EXPERIMENTS):
    config = experiment.config(RunConfig(device="cuda"))
    subprocess.run([sys.executable, "benchmarks/probe_cost.py", "--out", f"{job}/probe_cost_{index:02d}.json",
                    "--blocks", "4", "--steps", "25", "--config", json.dumps(config.to_json())], check=False)
PY
  python3 -c "import glob, json; print(json.dumps([json.load(open(f)) for f in sorted(glob.glob('$JOB/probe_cost_*.json'))]))" \
    > "$JOB/probe_cost_table.json"
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_anatomy() {
  begin_job
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    2>&1 | tail -1 >> "$JOB/env.txt"
  echo "$(date +%T) sweep, 128 samples (NVML read in the training process; probe time)" >> "$JOB/progress.txt"
  sweep_and_bands
  echo "$(date +%T) autocast-cache set" >> "$JOB/progress.txt"
  python3 benchmarks/memory_matrix.py --set autocast-cache --out "$JOB/memory_matrix_autocast_cache.json" \
    > "$JOB/memory_matrix_autocast_cache.log" 2>&1
  echo "$(date +%T) fit bf16 + checkpointing" >> "$JOB/progress.txt"
  python3 -m gpuanat fit --precision bf16 --grad-checkpointing --trial-steps 2 --json > "$JOB/fit_bf16_gc.json" \
    2> "$JOB/fit_bf16_gc.log"
  echo "$(date +%T) gpu tests" >> "$JOB/progress.txt"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py > "$JOB/gpu_tests.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_anatomy_recheck() {
  begin_job
  echo "$(date +%T) max batch, checkpointing (held out, and fp32 refitted)" >> "$JOB/progress.txt"
  python3 benchmarks/max_batch_check.py --out "$JOB/max_batch_check_checkpointed.json" \
    --only '{"precision": "bf16", "grad_checkpointing": true, "optim": "sgd"}' \
    --only '{"precision": "bf16", "grad_checkpointing": true, "grad_accum": 4}' \
    --only '{"precision": "fp32", "grad_checkpointing": true}' \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "adafactor"}' \
    > "$JOB/max_batch_check_checkpointed.log" 2>&1
  echo "$(date +%T) sweep, 128 samples" >> "$JOB/progress.txt"
  sweep_and_bands
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_probe_cost() {
  begin_job
  echo "$(date +%T) sweep, 128 samples (the probe's time after one allocator read per step)" >> "$JOB/progress.txt"
  sweep_and_bands
  echo "$(date +%T) gpu tests" >> "$JOB/progress.txt"
  python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py > "$JOB/gpu_tests.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_fit_fp32_checkpointed_adafactor() {
  begin_job
  echo "$(date +%T) fit fp32 + checkpointing + adafactor (its +8 trained)" >> "$JOB/progress.txt"
  python3 -m gpuanat fit --precision fp32 --grad-checkpointing --optim adafactor --trial-steps 2 --json \
    > "$JOB/fit_fp32_checkpointed_adafactor.json" 2> "$JOB/fit_fp32_checkpointed_adafactor.log"
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

job_fragmentation() {
  begin_job
  echo "$(date +%T) max batch, checkpointing, per optimizer (fragmentation by optimizer state)" >> "$JOB/progress.txt"
  python3 benchmarks/max_batch_check.py --out "$JOB/max_batch_check_optimizers.json" \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "sgd"}' \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' \
    --only '{"precision": "bf16", "grad_checkpointing": true, "optim": "adafactor"}' \
    --only '{"precision": "bf16", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "adafactor"}' \
    --only '{"precision": "bf16", "grad_checkpointing": true, "optim": "sgd"}' \
    > "$JOB/max_batch_check_optimizers.log" 2>&1
  echo "$(date +%T) fit fp32 + checkpointing + 8-bit Adam" >> "$JOB/progress.txt"
  python3 -m gpuanat fit --precision fp32 --grad-checkpointing --optim adamw_bnb_8bit --trial-steps 2 --json \
    > "$JOB/fit_fp32_checkpointed_8bit.json" 2> "$JOB/fit_fp32_checkpointed_8bit.log"
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

# One configuration's trials at given batches: check_at NAME CONFIG_JSON BATCHES [max_batch_check.py options].
check_at() {
  local name=$1 config=$2 batches=$3; shift 3
  echo "$(date +%T) $name: $config at $batches $*" >> "$JOB/progress.txt"
  python3 benchmarks/max_batch_check.py --out "$JOB/$name.json" --only "$config" --batches "$batches" "$@" \
    >> "$JOB/edge.log" 2>&1
}

# Issue #4: is the largest batch's edge sharp, and predictable from bytes alone, with expandable segments?
# The batches tried are the model's largest batch with no fragmentation charged (peak allocated + context +
# driver reserve <= total), and 8 more.
job_edge_expandable() {
  begin_job
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 -c "import torch; x = torch.ones(1 << 20, device='cuda'); \
print('expandable segments in effect:', [s.get('is_expandable') for s in torch.cuda.memory_snapshot()])" \
    >> "$JOB/env.txt" 2>&1
  local es=(--alloc-conf expandable_segments:True --descend 2)
  check_at es_bf16_ckpt_adafactor '{"precision": "bf16", "grad_checkpointing": true, "optim": "adafactor"}' 1004,1012 "${es[@]}"
  check_at es_bf16_ckpt '{"precision": "bf16", "grad_checkpointing": true}' 971,979 "${es[@]}"
  check_at es_bf16_ckpt_8bit '{"precision": "bf16", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' 993,1001 "${es[@]}"
  check_at es_fp32_ckpt '{"precision": "fp32", "grad_checkpointing": true}' 837,845 "${es[@]}"
  check_at es_fp32 '{"precision": "fp32"}' 94,102 "${es[@]}"
  check_at es_bf16 '{"precision": "bf16"}' 146,154 "${es[@]}"
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

# Issue #4, default allocator: the untried predictions, where the failing ones' edges lie, and one edge repeated.
job_edge_default() {
  begin_job
  check_at fp16_ckpt '{"precision": "fp16", "grad_checkpointing": true}' 945,953
  check_at fp32_ckpt_8bit '{"precision": "fp32", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' 813
  check_at bf16_ckpt_adafactor '{"precision": "bf16", "grad_checkpointing": true, "optim": "adafactor"}' 965 --descend 3
  check_at bf16_ckpt_8bit '{"precision": "bf16", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' 953 --descend 3
  check_at bf16_ckpt_repeat '{"precision": "bf16", "grad_checkpointing": true}' 945 --repeats 2
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

# Issue #4: the --expandable-segments technique through `gpuanat fit` and `gpuanat run`, on technique sets
# whose prediction with expandable segments was not tried before (held out).
job_expandable() {
  begin_job
  echo "$(date +%T) fit bf16 + checkpointing, expandable segments" >> "$JOB/progress.txt"
  python3 -m gpuanat fit --precision bf16 --grad-checkpointing --expandable-segments --trial-steps 2 --json \
    > "$JOB/fit_bf16_checkpointed_expandable.json" 2> "$JOB/fit_bf16_checkpointed_expandable.log"
  echo "$(date +%T) max batch, expandable segments, held out" >> "$JOB/progress.txt"
  python3 benchmarks/max_batch_check.py --out "$JOB/max_batch_check_expandable.json" \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "sgd", "expandable_segments": true}' \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "adamw_bnb_8bit", "expandable_segments": true}' \
    --only '{"precision": "fp32", "grad_checkpointing": true, "optim": "adamw_torch", "expandable_segments": true}' \
    --only '{"precision": "fp16", "grad_checkpointing": true, "optim": "adafactor", "expandable_segments": true}' \
    --only '{"precision": "bf16", "grad_checkpointing": true, "grad_accum": 4, "expandable_segments": true}' \
    --only '{"precision": "fp32", "attn": "eager", "expandable_segments": true}' \
    --only '{"precision": "bf16", "grad_accum": 4, "expandable_segments": true}' \
    > "$JOB/max_batch_check_expandable.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

# Issue #4: allocator histories of small batches, from which the replay predicts the largest batch.
job_allocation_traces() {
  begin_job
  echo "$(date +%T) allocation traces" >> "$JOB/progress.txt"
  python3 benchmarks/allocation_trace.py --out-dir "$JOB/traces" --parallel 3 > "$JOB/allocation_trace.log" 2>&1
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

# Issue #4: the replayed largest batches (gpuanat.core.memory.allocation_templates) that no trial on record judged yet.
job_replay_check() {
  begin_job
  check_at replay_fp32_ckpt_8bit '{"precision": "fp32", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' 816
  check_at replay_fp32_ckpt_sgd '{"precision": "fp32", "grad_checkpointing": true, "optim": "sgd"}' 819
  check_at replay_bf16_ckpt_8bit '{"precision": "bf16", "grad_checkpointing": true, "optim": "adamw_bnb_8bit"}' 959
  check_at replay_bf16_ckpt_adafactor '{"precision": "bf16", "grad_checkpointing": true, "optim": "adafactor"}' 980
  check_at replay_bf16_ckpt_sgd '{"precision": "bf16", "grad_checkpointing": true, "optim": "sgd"}' 980
  check_at replay_bf16_ckpt_accum4 '{"precision": "bf16", "grad_checkpointing": true, "grad_accum": 4}' 934
  check_at replay_bf16_8bit '{"precision": "bf16", "optim": "adamw_bnb_8bit"}' 156
  check_at replay_bf16_accum4 '{"precision": "bf16", "grad_accum": 4}' 150
  check_at replay_fp16 '{"precision": "fp16"}' 153
  check_at replay_es_fp16_ckpt '{"precision": "fp16", "grad_checkpointing": true, "expandable_segments": true}' 970
  check_at replay_es_bf16_ckpt_8bit '{"precision": "bf16", "grad_checkpointing": true, "optim": "adamw_bnb_8bit", "expandable_segments": true}' 992
  check_at replay_es_bf16_ckpt_accum4 '{"precision": "bf16", "grad_checkpointing": true, "grad_accum": 4, "expandable_segments": true}' 953
  check_at replay_es_fp32_ckpt_sgd '{"precision": "fp32", "grad_checkpointing": true, "optim": "sgd", "expandable_segments": true}' 866
  check_at replay_es_fp32_ckpt_adafactor '{"precision": "fp32", "grad_checkpointing": true, "optim": "adafactor", "expandable_segments": true}' 866
  echo "$(date +%T) done" >> "$JOB/progress.txt"
  touch "$JOB/DONE"
}

collect() {
  local wait_s=${1:-540} waited=0
  while [ ! -f "$JOB/DONE" ] && [ "$waited" -lt "$wait_s" ]; do sleep 5; waited=$((waited + 5)); done
  cat "$JOB/progress.txt" 2>/dev/null
  tail -3 "$JOB/sweep.log" 2>/dev/null
  # at most 8 files come back: bundle the small ones
  tar -C "$JOB" -czf "$OUT/results.tgz" --exclude gpu.sqlite --exclude 'gpu.sqlite-*' . 2>/dev/null
  [ -f "$JOB/gpu.sqlite" ] && python3 -c "import sqlite3; sqlite3.connect('$JOB/gpu.sqlite').execute('PRAGMA wal_checkpoint(FULL)')" \
    && cp "$JOB/gpu.sqlite" "$OUT/"
  [ -f "$JOB/DONE" ] && echo "JOB DONE" || echo "JOB STILL RUNNING"
}

start_in_background() {
  setup
  # Later calls re-send the working tree; the job runs from a snapshot so it measures one version.
  rm -rf /tmp/gpuanat-src "$JOB" && mkdir -p /tmp/gpuanat-src
  cp -r gpuanat benchmarks scripts tests pyproject.toml /tmp/gpuanat-src/
  (cd /tmp/gpuanat-src && setsid nohup bash scripts/gpu_check.sh "$1" > /tmp/gpuanat-job.log 2>&1 < /dev/null &)
}

case "${1:-}" in
  start) start_in_background job; collect "${2:-540}" ;;
  start-tui) start_in_background job_tui; collect "${2:-540}" ;;
  start-watch) start_in_background job_watch; collect "${2:-540}" ;;
  start-predict) start_in_background job_predict; collect "${2:-540}" ;;
  start-anatomy) start_in_background job_anatomy; collect "${2:-540}" ;;
  start-anatomy-recheck) start_in_background job_anatomy_recheck; collect "${2:-540}" ;;
  start-probe-cost) start_in_background job_probe_cost; collect "${2:-540}" ;;
  start-fit-adafactor) start_in_background job_fit_fp32_checkpointed_adafactor; collect "${2:-540}" ;;
  start-fragmentation) start_in_background job_fragmentation; collect "${2:-540}" ;;
  start-edge-expandable) start_in_background job_edge_expandable; collect "${2:-540}" ;;
  start-edge-default) start_in_background job_edge_default; collect "${2:-540}" ;;
  start-expandable) start_in_background job_expandable; collect "${2:-540}" ;;
  start-allocation-traces) start_in_background job_allocation_traces; collect "${2:-540}" ;;
  start-replay-check) start_in_background job_replay_check; collect "${2:-540}" ;;
  collect) collect "${2:-540}" ;;
  job) job ;;
  job_tui) job_tui ;;
  job_watch) job_watch ;;
  job_predict) job_predict ;;
  job_anatomy) job_anatomy ;;
  job_anatomy_recheck) job_anatomy_recheck ;;
  job_probe_cost) job_probe_cost ;;
  job_fit_fp32_checkpointed_adafactor) job_fit_fp32_checkpointed_adafactor ;;
  job_fragmentation) job_fragmentation ;;
  job_edge_expandable) job_edge_expandable ;;
  job_edge_default) job_edge_default ;;
  job_expandable) job_expandable ;;
  job_allocation_traces) job_allocation_traces ;;
  job_replay_check) job_replay_check ;;
  *) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;  # no job without naming one: print the usage above
esac
