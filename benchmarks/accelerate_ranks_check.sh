#!/usr/bin/env bash
# Why did the Accelerate loop's even ranks hold 1.24 GiB more at the peak than the odd ones (issue #34)? One call of
# the device tool on 2 or more GPUs: bert-large under DDP as in benchmarks/multi_gpu_check.sh, with `--engine
# accelerate` and with Trainer, each recorded with `--memory-snapshot` (every rank writes its own), and
# benchmarks/snapshot_peak.py says what each rank held at its peak and where it was allocated.
#   GPUS=2 bash benchmarks/accelerate_ranks_check.sh
# Writes $OUT/accelerate_ranks/: run-ENGINE.json (gpuanat run --json), peak-ENGINE.json, env.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/accelerate_ranks
GPUS=${GPUS:-2}
mkdir -p "$OUT" /tmp/accranks
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/accranks/history.sqlite NCCL_NVLS_ENABLE=0
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
} > "$OUT/env.txt" 2>&1
for engine in ${ENGINES:-accelerate trainer}; do
  started=$(date +%s)
  timeout 240 python3 -m gpuanat run --precision bf16 --batch-size 16 --seq-len 512 --samples 4096 \
    --max-steps ${STEPS:-6} --gpus "$GPUS" --distributed ddp --engine "$engine" \
    --memory-snapshot /tmp/accranks/$engine.pickle --json > "$OUT/run-$engine.json" 2> /tmp/accranks/$engine.err \
    || tail -20 /tmp/accranks/$engine.err
  echo "$engine: $(( $(date +%s) - started )) s"
  python3 benchmarks/snapshot_peak.py /tmp/accranks/$engine.pickle /tmp/accranks/$engine.rank*.pickle \
    > "$OUT/peak-$engine.json" || echo "$engine: no snapshot summary"
  python3 - "$OUT/peak-$engine.json" <<'EOF'
import json, sys
peaks = json.load(open(sys.argv[1]))
for name, peak in peaks["snapshots"].items():
    print(name, f"peak {peak['peak_traced_allocated_bytes'] / 2**30:.3f} GiB")
for row in peaks["differences"][:8]:
    print(" ", [f"{held / 2**30:.3f}" for held in row["bytes_by_snapshot"]], row["place"][:160])
EOF
done
