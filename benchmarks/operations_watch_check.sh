#!/usr/bin/env bash
# The operations anatomy beyond gpuanat's own runs, on a GPU, in one call of the device tool:
#   bash benchmarks/operations_watch_check.sh
# 1. A plain PyTorch loop (benchmarks/loops/plain_loop.py, qwen3-0.6b config, bf16 weights) started outside gpuanat
#    with GPUANAT_PROFILE_OPS=3, watched by PID: the records carry its operations -> watch_plain.jsonl.
# 2. The same loop under `gpuanat run --script --profile-ops` (the flag reaches the script's probe) -> script.json.
# 3. A model gpuanat's presets do not have, from its config.json (`--model`, qwen3-0.6b, bf16) -> model.json.
# Then operations_check.py's table of 2 and 3 and the watch's anatomy -> summary.txt.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/operations_watch
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 GPUANAT_DB=/tmp/operations-watch.sqlite
loop=(benchmarks/loops/plain_loop.py --probe --steps 40 --warmup 10 --batch-size 8)
GPUANAT_PROFILE_OPS=3 python3 "${loop[@]}" --hold-s 2 > /tmp/plain.out 2> /tmp/plain.err &
timeout 240 python3 -m gpuanat watch $! --json > "$OUT/watch_plain.jsonl" 2> /tmp/watch.err || tail -3 /tmp/watch.err
wait
python3 - "$OUT/watch_plain.jsonl" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from gpuanat.core.operations.report import summary_lines
records = [json.loads(line) for line in open(sys.argv[1])]
carrying = [record for record in records if record.get("operations_anatomy")]
print(f"== watched plain loop: {len(records)} records, {len(carrying)} with operations "
      f"(the last: {'exited' if records and records[-1].get('exited') else 'not exited'})")
for line in summary_lines(records[-1].get("operations_anatomy") if records else None):
    print("   " + line)
PY
timeout 200 python3 -m gpuanat run --script "${loop[0]}" --profile-ops --profile-ops-trace /tmp/script.trace.json \
    --json -- "${loop[@]:1}" > /tmp/script.out 2> /tmp/script.err || tail -3 /tmp/script.err
python3 benchmarks/operations_check.py /tmp/script.out /tmp/script.trace.json plain-loop-run-script \
    "$OUT/results.jsonl" | grep -v "^   \(contractions\|normalizations\|elementwise\|optimizer\|memory_copies\|other\) " \
    | tee -a "$OUT/summary.txt"
timeout 200 python3 -m gpuanat run --model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 \
    --weights-dtype bf16 --seq-len 1024 --batch-size 8 --max-steps 30 --samples 4096 --profile-ops \
    --profile-ops-trace /tmp/model.trace.json --json > /tmp/model.out 2> /tmp/model.err || tail -3 /tmp/model.err
python3 benchmarks/operations_check.py /tmp/model.out /tmp/model.trace.json qwen3-0.6b-model-bf16 \
    "$OUT/results.jsonl" | grep -v "^   \(contractions\|normalizations\|elementwise\|optimizer\|memory_copies\|other\) " \
    | tee -a "$OUT/summary.txt"
