#!/usr/bin/env bash
# torch.compile against eager at a batch that fills the GPU, both engines, one GPU, one call of the device tool:
#   benchmarks/compile_speed_check.sh            # batch 128, 4096 samples
#   RUNS="64:--engine accelerate;64:--engine accelerate --compile" benchmarks/compile_speed_check.sh
# bert-large bf16 + tf32, by default at batch 128: eager (Trainer), eager (Accelerate loop), compiled (Trainer),
# compiled (Accelerate loop); RUNS lists other "batch:flags" runs, separated by ';'. In one history (a compiled run's diagnosis compares with the eager one). Dynamo's recompilations and graph breaks
# go to each run's log (TORCH_LOGS). Writes $OUT/compile_speed/runs.jsonl, log.txt and logs.tar.gz.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/compile_speed
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=$OUT/history.sqlite
python3 -m pip install -q --no-index --find-links ${WHEELS:-.whl} -e . > "$OUT/pip.txt" 2>&1 || { tail -20 "$OUT/pip.txt"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt"
RUNS=${RUNS:-"128:--engine trainer;128:--engine accelerate;128:--engine trainer --compile;128:--engine accelerate --compile"}
IFS=';' read -ra runs <<< "$RUNS"
for run in "${runs[@]}"; do
  batch=${run%%:*} flags=${run#*:}
  started=$SECONDS
  TORCH_LOGS=recompiles,graph_breaks timeout ${RUN_S:-240} gpuanat run --precision bf16 --tf32 \
    --batch-size $batch --samples ${SAMPLES:-4096} $flags --json 2>> "$OUT/log.txt" | tail -1 >> "$OUT/runs.jsonl"
  echo "batch $batch, flags '$flags': exit ${PIPESTATUS[0]} after $((SECONDS - started)) s" | tee -a "$OUT/log.txt"
  tail -1 "$OUT/runs.jsonl" | python3 -c "import json,sys; r=json.loads(sys.stdin.read() or '{}'); print(r.get('status'), \
    r.get('steady_samples_per_second'), r.get('samples_per_second'), r.get('peak_allocated_bytes'), r.get('compile_stats'), \
    r.get('time_to_first_step_s'), [f['bottleneck'] for f in r.get('diagnosis') or []])" 2>&1 | tee -a "$OUT/log.txt"
done
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs 2>/dev/null
rm -rf "$OUT/logs" "$OUT/history.sqlite"*
