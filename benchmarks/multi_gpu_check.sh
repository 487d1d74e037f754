#!/usr/bin/env bash
# Several GPUs (issue #15), on a machine with 2 or more GPUs: the docs' bert-large at one batch under each
# distributed technique, every rank's bands against NVML on its GPU, samples/s, and what `gpuanat run` without
# --gpus does there. One call of the device tool:
#   WHAT="default ddp fsdp zero1 zero2 zero3" benchmarks/multi_gpu_check.sh
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
for technique in ${WHAT:-default ddp fsdp zero1 zero2 zero3}; do
  case $technique in
    default) flags=() ;;
    *) flags=(--gpus ${GPUS:-2} --distributed "$technique") ;;
  esac
  trace=()
  [ "$technique" = ddp ] && trace=(--trace-out "$OUT/trace-ddp.jsonl")
  started=$(date +%s)
  timeout 240 gpuanat run "${WORKLOAD[@]}" "${flags[@]}" "${trace[@]}" --json \
    > /tmp/multi/$technique.json 2> /tmp/multi/stderr/$technique.txt
  code=$?
  python3 - "$technique" "$code" "$(( $(date +%s) - started ))" <<'EOF' >> "$OUT/results.jsonl"
import json, sys
technique, code, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    result = json.loads(open(f"/tmp/multi/{technique}.json").read().strip().splitlines()[-1])
except Exception as error:
    result = {"status": "no result", "why": str(error)}
print(json.dumps({"technique": technique, "exit_code": code, "wall_s": wall, **result}))
EOF
  echo "$technique: exit $code, $(( $(date +%s) - started )) s"
done
tar czf "$OUT/logs.tar.gz" -C /tmp/multi stderr logs 2>/dev/null
python3 benchmarks/multi_gpu_table.py "$OUT/results.jsonl" || true
