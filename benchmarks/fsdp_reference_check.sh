#!/usr/bin/env bash
# The reference outside gpuanat for decoders under FSDP2 (issue #34), on a machine with 2 GPUs, one call:
#   bash benchmarks/fsdp_reference_check.sh
# benchmarks/reference_fsdp_trainer.py (a plain HF Trainer script, the model built on the CPU in fp32) under torchrun
# for llama-3.1-8b at seq 1024 (SEQS="1024 4096" for both), then `gpuanat run --model` of the same config at seq 1024 on the same machine,
# and `gpuanat predict` of each. Writes $OUT/fsdp_reference/: reference-seqN.jsonl (a line a rank), run-seq1024.json,
# predict-seqN.json.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/fsdp_reference
mkdir -p "$OUT" /tmp/fsdpref
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/fsdpref/history.sqlite NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader | tee "$OUT/gpus.txt"
CONFIG=benchmarks/configs/llama-3.1-8b
for seq in ${SEQS:-1024}; do
  started=$(date +%s)
  OMP_NUM_THREADS=8 timeout ${REFERENCE_TIMEOUT_S:-200} torchrun --nproc-per-node 2 benchmarks/reference_fsdp_trainer.py \
    --config $CONFIG --seq-len $seq --steps ${STEPS:-8} > /tmp/fsdpref/ref-$seq.out 2>&1
  echo "reference seq $seq: exit $?"
  grep '^{' /tmp/fsdpref/ref-$seq.out > "$OUT/reference-seq$seq.jsonl"
  grep -v '^{' /tmp/fsdpref/ref-$seq.out | tail -60 > "$OUT/reference-seq$seq.log"  # comes back, whatever happened
  echo "reference seq $seq: $(( $(date +%s) - started )) s"; cat "$OUT/reference-seq$seq.jsonl"
  timeout 60 python3 -m gpuanat predict --model $CONFIG/config.json --gpus 2 --distributed fsdp --precision bf16 \
    --grad-checkpointing --batch-size 1 --seq-len $seq --json > "$OUT/predict-seq$seq.json"
done
started=$(date +%s)
timeout 240 python3 -m gpuanat run --model $CONFIG/config.json --gpus 2 --distributed fsdp --precision bf16 \
  --grad-checkpointing --batch-size 1 --seq-len 1024 --samples 64 --max-steps ${STEPS:-8} --json \
  > "$OUT/run-seq1024.json" 2> /tmp/fsdpref/run.err || tail -5 /tmp/fsdpref/run.err
echo "gpuanat run seq 1024: $(( $(date +%s) - started )) s"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
result = json.loads(open(f"{out}/run-seq1024.json").read().strip().splitlines()[-1])
for rank in result["ranks"]:
    print("gpuanat rank", rank["rank"], "peak allocated", rank["peak_allocated_bytes"], "peak reserved",
          rank["peak_reserved_bytes"], "used", rank["device_memory_used_bytes"])
PY
