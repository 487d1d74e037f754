#!/usr/bin/env bash
# The probe's cost before #49 and with it (memory by module, the out-of-memory observer), on the GPU: the tree of
# f123593 unpacked in .old/ (`git archive f123593 gpuanat | tar -x -C .old`) against this one, alternated ABBA ABBA,
# `gpuanat run --preset bert-large --max-steps 40` (the docs' reference workload). Each run's result goes to
# $W/cost_ARM_N.json; probe_cost_percent and probe_time_by_part_s are its figures.
# Usage: W=OUT_DIR benchmarks/oom/probe_cost_ab.sh   (after the carried wheels are installed in /tmp/site)
set -u
n=0
for arm in old new new old old new new old; do
  n=$((n + 1))
  if [ "$arm" = old ]; then tree=$PWD/.old; else tree=$PWD; fi
  PYTHONPATH=/tmp/site:$tree timeout 120 python3 -m gpuanat run --preset bert-large --max-steps 40 --json \
    --db /tmp/ab.sqlite > "$W/cost_${arm}_$n.json" 2> "$W/cost_${arm}_$n.err"
done
