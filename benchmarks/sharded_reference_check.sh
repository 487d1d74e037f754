#!/usr/bin/env bash
# Decoders sharded over several GPUs against a reference outside gpuanat (issue #34), one call of the device tool on a
# machine with 2 or more GPUs:
#   CASES="fsdp-1024 lora-1024" bash benchmarks/sharded_reference_check.sh
# Each case runs benchmarks/reference_sharded_trainer.py (a plain HF Trainer script: the model from a random bf16
# checkpoint with from_pretrained, Trainer's FSDP2, DeepSpeed ZeRO-1/2/3 or PEFT's LoRA) under torchrun, then
# `gpuanat run` of the same training on the same GPUs (from the checkpoint; `random-SEQ` from its config.json, random
# weights), and benchmarks/sharded_reference_summary.py puts each rank's peaks beside gpuanat's measurement and
# prediction, and its bands beside NVML. Writes $OUT/sharded_reference.tgz (the device tool returns few files):
# reference-CASE.jsonl (a line a rank), run-CASE.json, summary.jsonl, summary.txt, env.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/sharded_reference
GPUS=${GPUS:-2}
mkdir -p "$OUT" /tmp/shref
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/shref/history.sqlite NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=8
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__)"
  python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

checkpoint() {  # NAME: a random bf16 checkpoint of benchmarks/configs/NAME (or of a preset's config), once
  local dir=/dev/shm/$1
  [ -f "$dir/config.json" ] && return
  if [ ! -d benchmarks/configs/$1 ]; then
    python3 -c "import sys; from gpuanat.core.vocabulary.presets import PRESETS; from gpuanat.worker.model import preset_model_config
c = preset_model_config(PRESETS[sys.argv[1]]); c.architectures = [c.model_type.capitalize() + 'ForCausalLM']
c.save_pretrained('/tmp/shref/config-' + sys.argv[1])" "$1"
    python3 benchmarks/random_checkpoint.py /tmp/shref/config-$1 "$dir" 2>&1 | tail -1
  else
    python3 benchmarks/random_checkpoint.py benchmarks/configs/$1 "$dir" 2>&1 | tail -1
  fi
}

one_case() {  # NAME MODEL SEQ "REFERENCE FLAGS" "GPUANAT FLAGS" [config: gpuanat builds random weights]
  local name=$1 model=$2 seq=$3 source=${6:-checkpoint}
  checkpoint "$model"
  local started=$(date +%s)
  timeout ${REFERENCE_TIMEOUT_S:-200} torchrun --nproc-per-node "$GPUS" benchmarks/reference_sharded_trainer.py \
    --checkpoint /dev/shm/$model --seq-len "$seq" --steps ${STEPS:-8} $4 > /tmp/shref/ref-$name.out 2>&1
  echo "$name reference: exit $?, $(( $(date +%s) - started )) s"
  grep '^{"' /tmp/shref/ref-$name.out > "$OUT/reference-$name.jsonl" || tail -20 /tmp/shref/ref-$name.out \
    > "$OUT/reference-$name.log"
  started=$(date +%s)
  local model_flag=(--model "/dev/shm/$model")
  [ "$source" = config ] && model_flag=(--model "/dev/shm/$model/config.json")
  timeout ${RUN_TIMEOUT_S:-200} python3 -m gpuanat run "${model_flag[@]}" --gpus "$GPUS" --precision bf16 \
    --grad-checkpointing --batch-size 1 --seq-len "$seq" --samples 64 --max-steps ${STEPS:-8} $5 --json \
    --name "$name" > "$OUT/run-$name.json" 2> /tmp/shref/run-$name.err || tail -20 /tmp/shref/run-$name.err \
    > "$OUT/run-$name.log"
  echo "$name gpuanat: $(( $(date +%s) - started )) s"
  python3 benchmarks/sharded_reference_summary.py "$name" "$OUT" | tee -a "$OUT/summary.txt"
  tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"  # one file back (the device tool returns few), after
}                                                                 # every case: a call cut by its limit keeps the rest

# Cases: fsdp-SEQ, random-SEQ, bf16w-SEQ, lora-SEQ, zero1-SEQ, zero2-SEQ, zero3-SEQ, batch2-SEQ (llama-3.1-8b;
# batch2: batch 2), mistral-SEQ (mistral-7b), qwen-SEQ (qwen2.5-7b), mistrallora-SEQ, qwenlora-SEQ (with LoRA 16)
for case in ${CASES:-fsdp-1024}; do
  case $case in
    fsdp-*) one_case "$case" llama-3.1-8b "${case#fsdp-}" "--sharding fsdp" "--distributed fsdp" ;;
    random-*) one_case "$case" llama-3.1-8b "${case#random-}" "--sharding fsdp" "--distributed fsdp" config ;;
    bf16w-*) one_case "$case" llama-3.1-8b "${case#bf16w-}" "--sharding fsdp" "--distributed fsdp --weights-dtype bf16" ;;
    lora-*) one_case "$case" llama-3.1-8b "${case#lora-}" "--sharding fsdp --lora 16" "--distributed fsdp --lora 16" ;;
    zero?-*) one_case "$case" llama-3.1-8b "${case#zero?-}" "--sharding ${case%%-*}" "--distributed ${case%%-*}" ;;
    mistrallora-*) one_case "$case" mistral-7b "${case#mistrallora-}" "--sharding fsdp --lora 16" "--distributed fsdp --lora 16" ;;
    qwenlora-*) one_case "$case" qwen2.5-7b "${case#qwenlora-}" "--sharding fsdp --lora 16" "--distributed fsdp --lora 16" ;;
    mistral-*) one_case "$case" mistral-7b "${case#mistral-}" "--sharding fsdp" "--distributed fsdp" ;;
    qwen-*) one_case "$case" qwen2.5-7b "${case#qwen-}" "--sharding fsdp" "--distributed fsdp" ;;
    batch2-*) one_case "$case" llama-3.1-8b "${case#batch2-}" "--sharding fsdp --batch-size 2" \
                "--distributed fsdp --batch-size 2" ;;
    *) echo "unknown case $case" ;;
  esac
done
rm -rf "$OUT"
