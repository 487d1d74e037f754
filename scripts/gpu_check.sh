#!/usr/bin/env bash
# GPU verification on the lent GPU machine (see ../shared/GPU.md). Writes everything under $OUT.
#   scripts/gpu_check.sh sweep      the docs' table with bert-large, an NVML trace, a real OOM
#   scripts/gpu_check.sh overhead   gpuanat vs plain HF Trainer on the sweep's configs
#   scripts/gpu_check.sh tests      the GPU-marked tests
# The machine has no network: wheels for what it lacks travel in .whl/ (see README, "GPU checks").
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
export GPUANAT_DB=$OUT/gpu.sqlite

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers, datasets; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'datasets', datasets.__version__)"
  python3 -c "import bitsandbytes; print('bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

case "${1:-sweep}" in
  sweep)
    python3 -m gpuanat sweep --json > "$OUT/sweep.json" 2> "$OUT/sweep.log"
    echo "sweep exit $?"; tail -15 "$OUT/sweep.log"
    python3 -m gpuanat run --precision bf16 --batch-size 8 --max-steps 60 --trace-out "$OUT/nvml_trace_h100.jsonl" \
      --json > "$OUT/trace_run.json" 2>/dev/null
    echo "trace run exit $?"
    python3 -m gpuanat run --batch-size 512 --max-steps 3 --json > "$OUT/oom.json" 2> "$OUT/oom.log"
    echo "oom run exit $? (expect 3)"; tail -3 "$OUT/oom.log"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader > "$OUT/after_oom_memory_used.txt"
    echo "device memory used after the OOM run: $(cat "$OUT/after_oom_memory_used.txt")"
    ;;
  overhead)
    python3 benchmarks/overhead.py --out "$OUT/overhead.json" "${@:2}"
    ;;
  tests)
    python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log"
    ;;
esac
