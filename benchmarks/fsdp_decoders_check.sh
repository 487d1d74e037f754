#!/usr/bin/env bash
# FSDP2 on GPUs for decoders, in one call of the device tool on a machine with 2 or more GPUs:
#   bash benchmarks/fsdp_decoders_check.sh
# 1. (#30) A user's plain PyTorch loop sharded by FSDP2 (benchmarks/loops/plain_loop.py --fsdp: each decoder layer
#    and the model `fully_shard`ed, NCCL), qwen3-0.6b bf16, with `gpuanat.probe.track`, under torchrun on 2 GPUs, watched
#    through its torchrun PID (`gpuanat watch PID --json`): every rank's bands against NVML on its GPU.
# 2. (#34) `gpuanat predict` then `gpuanat run` of llama-3.1-8b under FSDP on 2 GPUs (bf16 autocast over fp32 weights,
#    checkpointing, batch 1) at two sequence lengths, and mistral-7b: each rank's predicted peak against the measured.
# Writes $OUT/fsdp_decoders/: records_fsdp_loop.jsonl, predict-NAME.json, run-NAME.json, summary.txt, env.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/fsdp_decoders
mkdir -p "$OUT" /tmp/fsdp
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/fsdp/history.sqlite NCCL_NVLS_ENABLE=0
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

torchrun --nproc-per-node 2 benchmarks/loops/plain_loop.py --fsdp --probe --steps ${LOOP_STEPS:-60} --hold-s 2 \
  > /tmp/fsdp/loop.out 2>&1 &
pid=$!
timeout 240 python3 -m gpuanat watch "$pid" --json > "$OUT/records_fsdp_loop.jsonl" 2> /tmp/fsdp/watch.err \
  || tail -3 /tmp/fsdp/watch.err
wait "$pid"; echo "fsdp loop exit $?"; grep '^{' /tmp/fsdp/loop.out
python3 benchmarks/rank_bands_check.py "$OUT/records_fsdp_loop.jsonl" | tee -a "$OUT/summary.txt"

LLAMA=(--preset llama-3.1-8b --gpus 2 --distributed fsdp --precision bf16 --grad-checkpointing
       --batch-size 1 --samples 64 --max-steps ${STEPS:-8})
case_run() {  # NAME FLAGS...
  local name=$1; shift
  timeout 60 python3 -m gpuanat predict "${LLAMA[@]}" "$@" --json > "$OUT/predict-$name.json" 2> /tmp/fsdp/p-$name.err \
    || tail -3 /tmp/fsdp/p-$name.err
  started=$(date +%s)
  timeout 300 python3 -m gpuanat run "${LLAMA[@]}" "$@" --json --name "$name" > "$OUT/run-$name.json" \
    2> /tmp/fsdp/r-$name.err || tail -5 /tmp/fsdp/r-$name.err
  echo "$name: $(( $(date +%s) - started )) s, $(pgrep -f gpuanat.worker | wc -l) training processes left" \
    | tee -a "$OUT/summary.txt"
  python3 - "$OUT/predict-$name.json" "$OUT/run-$name.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
try:
    predicted = json.load(open(sys.argv[1]))
    result = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
except Exception as error:
    print("  no result:", error); sys.exit()
peak = predicted.get("peak_device_bytes")
print(f"  status {result['status']} steps {result['steps']} predicted peak device {peak}")
for rank in result.get("ranks") or []:
    measured = rank.get("device_memory_used_bytes")
    print(f"  rank {rank.get('rank')} gpu {rank.get('gpu_index')}: peak allocated {rank.get('peak_allocated_bytes')} "
          f"(predicted {predicted.get('peak_allocated_bytes')}), peak reserved {rank.get('peak_reserved_bytes')} "
          f"(predicted {predicted.get('peak_reserved_bytes')})"
          f" used {rank.get('device_memory_used_bytes')} bands sum {sum(v for k, v in (rank.get('bands') or {}).items() if v and k != 'free_bytes')}"
          f" vs predicted {peak}: {100 * (peak - measured) / measured if peak and measured else None:+.1f}%")
PY
}
case_run seq1024 --seq-len 1024
case_run seq4096 --seq-len 4096
case_run mistral-seq2048 --seq-len 2048 --preset mistral-7b
tar czf "$OUT/logs.tar.gz" -C /tmp/fsdp . 2>/dev/null
