#!/usr/bin/env bash
# The Accelerate loop's runs with gpuanat as it was at earlier commits (issue #34: did a change make or remove the
# extra 1.24 GiB?), one call of the device tool on 2 GPUs. Prepare the trees here first (they travel with the
# working tree, untracked):
#   for s in 64240f2 66607f5 2920b14 dfd4bc3 4249f2b 8755789; do mkdir -p bisect/$s; git archive $s gpuanat | tar -x -C bisect/$s; done
# then on the device: TREES="64240f2 ... HEAD" bash benchmarks/accelerate_ranks_bisect.sh (HEAD: the working tree).
# Each tree trains bert-large bf16 batch 16 seq 512, 30 steps, over 2 GPUs with --engine accelerate, run from its own
# folder so that its gpuanat is the one imported; writes $OUT/bisect.tgz (each run's --json result and its history,
# whose steps hold rank 0's peak a step). benchmarks/results/h200x2/accelerate_ranks/bisect.jsonl was made from it.
set -uo pipefail
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp/xdg} HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpuanat-out}
root=$PWD site=${SITE:-/tmp/site}
mkdir -p /tmp/bisect "$OUT"
for tree in ${TREES:-HEAD}; do
  dir=$root/bisect/$tree
  [ "$tree" = HEAD ] && dir=$root
  cd "$dir" || continue
  PYTHONPATH=$site:$dir GPUANAT_DB=/tmp/bisect/$tree.sqlite timeout 150 python3 -m gpuanat run --precision bf16 \
    --batch-size 16 --seq-len 512 --samples 4096 --max-steps 30 --gpus 2 --distributed ddp --engine accelerate --json \
    > /tmp/bisect/run-$tree.json 2> /tmp/bisect/run-$tree.err || tail -5 /tmp/bisect/run-$tree.err
  python3 -c "import json, sys; d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(sys.argv[2], d['status'], [round(r['peak_allocated_bytes'] / 2**30, 3) for r in d['ranks']])" \
    /tmp/bisect/run-$tree.json "$tree" || echo "$tree: no result"
  cd "$root"
done
tar czf "$OUT/bisect.tgz" -C /tmp/bisect .
