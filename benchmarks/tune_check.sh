#!/usr/bin/env bash
# `gpuanat tune` on one GPU (issue #19), in one call of the device tool (carry .whl):
#   BUDGET=8.5 benchmarks/tune_check.sh
# bert-large seq 512 (the docs' workload), every technique searched, BUDGET minutes; then the front as an SVG.
# Writes $OUT/tune/: tune.json, the progress log, front.svg and the history (steps and NVML samples) as a tarball.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/tune
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 GPUANAT_DB=/tmp/tune-history.sqlite
python3 -m pip install -q --no-index --find-links ${WHEELS:-.whl} -e . > "$OUT/pip.txt" 2>&1 || { tail -20 "$OUT/pip.txt"; exit 1; }
timeout ${TUNE_S:-560} gpuanat tune --preset bert-large --seq-len 512 --budget ${BUDGET:-8.5} --json \
  > "$OUT/tune.json" 2> "$OUT/log.txt"
echo "tune: exit $?" | tee -a "$OUT/log.txt"
python3 scripts/plot_tune_front.py "$OUT/tune.json" "$OUT/front.svg"
(cd /tmp && tar czf "$OUT/history.tar.gz" tune-history.sqlite*)
tail -30 "$OUT/log.txt"
