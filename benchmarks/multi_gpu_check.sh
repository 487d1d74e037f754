#!/usr/bin/env bash
# Several GPUs (issue #15), on a machine with 2 or more GPUs: the docs' bert-large at one batch under each
# distributed technique, every rank's bands against NVML on its GPU, samples/s, and what `gpuanat run` without
# --gpus does there. One call of the device tool:
#   WHAT="default busy0 ddp fsdp zero1 zero2 zero3 ddp-oom" benchmarks/multi_gpu_check.sh
#   GPUS=4 WHAT="ddp fsdp zero2 zero3 accelerate" OUT=... benchmarks/multi_gpu_check.sh   (4 GPUs; the Accelerate loop)
# writes to $OUT/multi/: results.jsonl (one `gpuanat run --json` result a line, with "technique" added),
# env.txt (GPUs, topology, versions), logs.tar.gz (the runs' logs and stderr), trace-ddp.jsonl (an NVML trace).
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/multi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 GPUANAT_DB=/tmp/multi/gpu.sqlite NCCL_NVLS_ENABLE=0
mkdir -p /tmp/multi/stderr
python3 -m pip install -q --no-index --find-links .whl -e . deepspeed > /tmp/multi/stderr/pip.txt 2>&1 \
  || { tail -20 /tmp/multi/stderr/pip.txt; exit 1; }
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  python3 --version
  python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|accelerate|deepspeed|datasets) "
} > "$OUT/env.txt" 2>&1

WORKLOAD=(--precision bf16 --batch-size ${BATCH:-16} --seq-len 512 --samples 4096 --max-steps ${STEPS:-40})
for technique in ${WHAT:-default busy0 ddp fsdp zero1 zero2 zero3 ddp-oom}; do
  holder=
  case $technique in
    default) flags=() ;;
    # GPU 0 busy with another process: the default run must take GPU 1.
    busy0) flags=(--max-steps 10)
           python3 -c "import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda:0'); time.sleep(600)" &
           holder=$!; sleep 25 ;;
    # A batch no GPU holds: every rank out of memory, the run says oom, nothing left running.
    ddp-oom) flags=(--gpus ${GPUS:-2} --distributed ddp --batch-size 2048) ;;
    # The docs' Accelerate loop over the same GPUs (it trains with DDP under torchrun).
    accelerate) flags=(--gpus ${GPUS:-2} --distributed ddp --engine accelerate) ;;
    *) flags=(--gpus ${GPUS:-2} --distributed "$technique") ;;
  esac
  trace=()
  [ "$technique" = ddp ] && trace=(--trace-out "$OUT/trace-ddp.jsonl")
  started=$(date +%s)
  timeout 240 gpuanat run "${WORKLOAD[@]}" "${flags[@]}" "${trace[@]}" --json \
    > /tmp/multi/$technique.json 2> /tmp/multi/stderr/$technique.txt
  code=$?
  [ -n "$holder" ] && kill $holder
  left=$(pgrep -f "gpuanat.worker" | wc -l)
  python3 - "$technique" "$code" "$(( $(date +%s) - started ))" "$left" "${GPUS:-2}" <<'EOF' >> "$OUT/results.jsonl"
import json, sys
technique, code, wall, left = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
try:
    result = json.loads(open(f"/tmp/multi/{technique}.json").read().strip().splitlines()[-1])
except Exception as error:
    result = {"status": "no result", "why": str(error)}
print(json.dumps({"technique": technique, "gpus_asked": sys.argv[5], "exit_code": code, "wall_s": wall,
                  "training_processes_left": left, **result}))
EOF
  echo "$technique: exit $code, $(( $(date +%s) - started )) s, $left training processes left"
done
tar czf "$OUT/logs.tar.gz" -C /tmp/multi stderr logs 2>/dev/null
python3 benchmarks/multi_gpu_table.py "$OUT/results.jsonl" || true
