#!/usr/bin/env bash
# Several GPUs, live (issue #15), on a machine with 4 GPUs, in one call of the device tool:
#   benchmarks/multi_gpu_live.sh
# At the same time: a bert-large job started outside gpuanat with torchrun on GPUs 2 and 3 (each rank with the
# one-line callback), watched by the torchrun PID (`gpuanat watch PID --json`, and the watch dashboard's screenshot);
# and the dashboard (the real app, headless) running its own DDP run with `--gpus 2`, which must pick the idle GPUs
# 0 and 1, saved mid-run with its two lanes. Writes to $OUT/live/.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/live
mkdir -p "$OUT" /tmp/live
export PYTHONUNBUFFERED=1 GPUANAT_DB=/tmp/live/gpu.sqlite NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
python3 -m pip install -q --no-index --find-links .whl -e . > /tmp/live/pip.txt 2>&1 || { tail -20 /tmp/live/pip.txt; exit 1; }
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader > "$OUT/gpus_before.txt"

ready=/tmp/live/ready
CUDA_VISIBLE_DEVICES=2,3 CUDA_DEVICE_ORDER=PCI_BUS_ID torchrun --standalone --nproc-per-node 2 \
  scripts/bert_large_external.py --max-steps 1500 --batch-size 8 --precision bf16 --ready-file $ready \
  > /tmp/live/torchrun.txt 2>&1 &
torchrun_pid=$!
for _ in $(seq 240); do [ -s $ready ] && break; sleep 0.5; done
echo "torchrun $torchrun_pid ready: $(cat $ready 2>/dev/null)" | tee "$OUT/torchrun_ready.txt"
sleep 5  # both ranks publish their first steps
timeout 60 gpuanat watch $torchrun_pid --json --duration 20 > "$OUT/watch_torchrun.jsonl" 2> "$OUT/watch_torchrun.err" &
watch_json=$!
timeout 90 python3 scripts/take_screenshots.py --out-dir "$OUT" --watch-pid $torchrun_pid --mid-run-s 20 \
  > "$OUT/watch_shot.log" 2>&1 &
watch_shot=$!
# The dashboard's own run: GPUs 2 and 3 are busy with the job above, so --gpus 2 must take 0 and 1.
timeout 200 python3 scripts/take_screenshots.py --out-dir "$OUT" --gpus 2 --distributed ddp --precision bf16 \
  --batch-size 16 --samples 32768 --max-steps 1200 --mid-run-s 20 --filename dashboard_two_gpus.svg \
  > "$OUT/dashboard_shot.log" 2>&1
echo "dashboard screenshot: exit $?"
nvidia-smi > "$OUT/nvidia_smi_during.txt"
wait $watch_json; echo "watch --json: exit $?"
wait $watch_shot; echo "watch screenshot: exit $?"
kill -TERM $torchrun_pid; wait $torchrun_pid; echo "torchrun: exit $?"
tail -5 /tmp/live/torchrun.txt > "$OUT/torchrun_tail.txt"
sqlite3 /tmp/live/gpu.sqlite .dump > /dev/null 2>&1
gpuanat history --json > "$OUT/history.json" 2>&1
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
records = [json.loads(line) for line in open(f"{out}/watch_torchrun.jsonl") if line.strip()]
print(f"watch records: {len(records)}")
for record in records[-1:]:
    for rank in record.get("ranks") or []:
        bands = {k: round(v / 2**30, 2) for k, v in (rank.get("bands") or {}).items() if isinstance(v, (int, float))}
        print("rank", {k: rank.get(k) for k in ("pid", "gpu_index", "rank")}, bands)
PY
pgrep -af "bert_large_external|gpuanat.worker" || echo "no training process left"
# The device tool brings back few files: the small ones travel in one archive, the screenshots beside it.
tar czf "$OUT/live.tar.gz" -C "$OUT" --exclude '*.svg' --exclude live.tar.gz . && find "$OUT" -type f ! -name '*.svg' ! -name live.tar.gz -delete
