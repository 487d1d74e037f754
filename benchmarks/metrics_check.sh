#!/usr/bin/env bash
# The Prometheus export (issue #33) on a GPU, in one call of the device tool:
#   bash benchmarks/metrics_check.sh
# 1. metrics_cost.py: `gpuanat run` (bert-large, docs' settings) with and without --metrics, alternated, the endpoint
#    scraped every second: steady samples/s, CPU seconds of gpuanat's own process, last scrape's bands vs the result's.
# 2. metrics_probe_cost.py: a plain PyTorch loop with the probe, GPUANAT_METRICS off and on, ABBA in one process:
#    s/step and the training process's CPU seconds.
# 3. metrics_dashboard.py: the dashboard driven with Pilot during a real run: scraped bands vs the bar on screen.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/metrics
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv > "$OUT/gpu.txt"
python3 -c "import importlib.metadata, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'prometheus-client', importlib.metadata.version('prometheus-client'))" | tee "$OUT/versions.txt"
GPUANAT_DB=/tmp/metrics-cost.sqlite timeout 240 python3 benchmarks/metrics_cost.py "$OUT/run_cost" --pairs 2 --steps ${STEPS:-200} 2>&1 | tail -8
timeout 170 python3 benchmarks/metrics_probe_cost.py --out "$OUT/probe_cost.json" --rounds 3 --batch-size 8 --steps 60 \
    --warmup 10 --budget-s 110 2>&1 | grep -v "^gpuanat:" | tail -14
timeout 150 python3 benchmarks/metrics_dashboard.py "$OUT/dashboard.json" --steps ${DASHBOARD_STEPS:-300} 2>&1 | tail -4
