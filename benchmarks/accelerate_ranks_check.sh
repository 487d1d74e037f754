#!/usr/bin/env bash
# Why did the Accelerate loop's ranks sometimes hold 1.24 GiB more at the peak than the others (issue #34)? One call
# of the device tool on 2 or more GPUs: bert-large under DDP as in benchmarks/multi_gpu_check.sh (bf16, batch 16,
# seq 512), each variant REPEAT times:
#   GPUS=2 STEPS=5 REPEAT=3 VARIANTS="accelerate accelerate-recordstreams trainer-ckpt" SNAPSHOT=0 \
#     bash benchmarks/accelerate_ranks_check.sh
# A variant: `accelerate` or `trainer` (the engine), `-nopin` (--no-pin-memory), `-ckpt` (--grad-checkpointing),
# `-recordstreams` (TORCH_NCCL_AVOID_RECORD_STREAMS=0: NCCL marks the tensors it reduces with record_stream instead
# of holding them until its watchdog sees the collective done). With SNAPSHOT=1 (the default) each run is recorded
# with `--memory-snapshot` (every rank writes its own) and benchmarks/snapshot_peak.py says what each rank held at its
# peak and where it was allocated. Writes $OUT/accelerate_ranks/: run-VARIANT-N.json (gpuanat run --json),
# peak-VARIANT-N.json, ranks.jsonl (a line a run: every rank's peak allocated and reserved), env.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/accelerate_ranks
GPUS=${GPUS:-2}
mkdir -p "$OUT" /tmp/accranks
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/accranks/history.sqlite NCCL_NVLS_ENABLE=0
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
} > "$OUT/env.txt" 2>&1
for variant in ${VARIANTS:-accelerate trainer}; do
  for repeat in $(seq 1 ${REPEAT:-1}); do
    name=$variant-$repeat engine=${variant%%-*} flags=() environment=()
    [[ $variant == *-nopin* ]] && flags+=(--no-pin-memory)
    [[ $variant == *-ckpt* ]] && flags+=(--grad-checkpointing)
    [[ $variant == *-recordstreams* ]] && environment+=(TORCH_NCCL_AVOID_RECORD_STREAMS=0)
    [ "${SNAPSHOT:-1}" = 1 ] && flags+=(--memory-snapshot /tmp/accranks/$name.pickle)
    started=$(date +%s)
    env "${environment[@]}" timeout 240 python3 -m gpuanat run --precision bf16 --batch-size 16 --seq-len 512 \
      --samples 4096 --max-steps ${STEPS:-6} --gpus "$GPUS" --distributed ddp --engine "$engine" "${flags[@]}" \
      --json > "$OUT/run-$name.json" 2> /tmp/accranks/$name.err || tail -20 /tmp/accranks/$name.err
    python3 - "$OUT/run-$name.json" "$name" "$(( $(date +%s) - started ))" <<'EOF' | tee -a "$OUT/ranks.jsonl"
import json, sys
result = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(json.dumps({"run": sys.argv[2], "status": result["status"], "steps": result.get("steps"), "wall_s": int(sys.argv[3]),
                  "peak_allocated_gib": [round(rank["peak_allocated_bytes"] / 2**30, 3) for rank in result["ranks"]],
                  "peak_reserved_gib": [round(rank["peak_reserved_bytes"] / 2**30, 3) for rank in result["ranks"]],
                  "predicted_peak_allocated_gib": round(result["predicted"]["peak_allocated_bytes"] / 2**30, 3)}))
EOF
    [ "${SNAPSHOT:-1}" = 1 ] || continue
    python3 benchmarks/snapshot_peak.py /tmp/accranks/$name.pickle /tmp/accranks/$name.rank*.pickle \
      > "$OUT/peak-$name.json" || echo "$name: no snapshot summary"
  done
done
