#!/usr/bin/env bash
# The watch's CPU on a GPU machine, thread by thread (issue #18 item 3), in one call of the device tool:
#   bash benchmarks/watch_cost_check.sh
# One bert-large bf16 batch-32 training (benchmarks/plain_trainer.py); beside it: each NVML reading the watch makes,
# timed apart (benchmarks/sampler_host_cost.py --nvml); then the monitors of the issue one after the other in a 120×40
# pseudo-terminal (benchmarks/tui_cost.py --side-by-side: nvitop at 0.25 s and 2 s, `gpuanat watch`, `watch --json`,
# nvidia-smi dmon), each monitor's CPU per thread (the watch's sampler thread is "gpuanat-sampler"); then the
# recorded watch replayed on the same machine (no NVML, no live process tree: what is left is the interface's); then,
# the training stopped, the dashboard during its own run (bf16, batch 32), per thread too. ROUNDS=N repeats the side by
# side and the dashboard's run N times (files _1 … _N).
# Writes $OUT/watch/*.json and the log.
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}/watch
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
python3 -m pip install -q --no-index --find-links .whl -e . nvitop > "$OUT/pip.txt" 2>&1 || { tail -20 "$OUT/pip.txt"; exit 1; }
rm "$OUT/pip.txt"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "processes: $(ls -d /proc/[0-9]* | wc -l)";
  lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/env.txt"
python3 benchmarks/plain_trainer.py --config '{"precision": "bf16", "batch_size": 32, "samples": 100000}' \
  > /tmp/watch_trainer.log 2>&1 &
trainer=$!
sleep "${TRAINER_WARMUP_S:-50}"
python3 benchmarks/sampler_host_cost.py --nvml --seconds 15 --out "$OUT/sampler_cost.json" > /dev/null \
  2> "$OUT/sampler_cost.err" || tail -5 "$OUT/sampler_cost.err"
[ -s "$OUT/sampler_cost.err" ] || rm -f "$OUT/sampler_cost.err"
rounds=${ROUNDS:-1}
for round in $(seq 1 "$rounds"); do
  suffix=$([ "$rounds" = 1 ] || echo "_$round")
  python3 benchmarks/tui_cost.py --side-by-side --pid "$trainer" --window-s "${WINDOW_S:-20}" \
    --out "$OUT/side_by_side$suffix.json" 2>&1 | grep "^tui_cost"
done
python3 benchmarks/tui_cost.py --replay watch --window-s "${WINDOW_S:-20}" --out "$OUT/replay_watch.json" > /dev/null
kill "$trainer"; wait "$trainer" 2> /dev/null
for round in $(seq 1 "$rounds"); do
  suffix=$([ "$rounds" = 1 ] || echo "_$round")
  python3 benchmarks/tui_cost.py --stream-s "${WINDOW_S:-20}" --out "$OUT/dashboard$suffix.json" \
    -- --precision bf16 --batch-size 32 --samples 20000 > /dev/null
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
cost = json.loads((out / "sampler_cost.json").read_text()) if (out / "sampler_cost.json").exists() else {}
for name, timing in (cost.get("nvml_readings_of_gpu_0") or {}).items():
    print(f"nvml {name}: {timing}")
print("paced:", cost.get("at_the_watch_pace"), "processes on machine:", cost.get("processes_on_machine"))
for path in sorted(out.glob("side_by_side*.json")):
    for monitor in json.loads(path.read_text())["monitors"]:
        print(path.stem, monitor["monitor"], monitor.get("cpu_percent_of_one_core"), monitor.get("terminal_bytes_per_s"),
              monitor.get("cpu_percent_by_thread"))
replay = json.loads((out / "replay_watch.json").read_text())
print("replay watch", replay.get("cpu_percent_of_one_core"), replay.get("terminal_bytes_per_s"),
      replay.get("cpu_percent_by_thread"), replay.get("error", ""))
for path in sorted(out.glob("dashboard*.json")):
    dashboard = json.loads(path.read_text())
    print(path.stem, "during its run", dashboard.get("tui_cpu_percent_of_one_core"),
          dashboard.get("terminal_bytes_per_s"), dashboard.get("tui_cpu_percent_by_thread"), dashboard.get("error", ""))
PY
