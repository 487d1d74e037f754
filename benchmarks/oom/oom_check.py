"""Out-of-memory anatomies on a GPU against torch's own snapshot at the failure (#49).

Each case is a real `gpuanat run` that runs out of GPU memory, with `--keep-oom-snapshot`: the allocator's snapshot
written inside the failing allocation (torch's OOM observer, as memory_viz users take it). From that snapshot: the
allocated bytes (the active blocks), the reserved bytes (the segments) and the failed allocation (the trace's `oom`
entry: its size, and the device's free memory then); from gpuanat's result: the same three as it read them, its
bands, the phase, module and line, the largest tensors. One JSON file a case (`OUT/NAME.check.json`), and the run's
`--json` result beside it.

Usage: python benchmarks/oom/oom_check.py OUT_DIR [CASE ...]   (cases: see CASES)
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

from gpuanat.core.measure.anatomy import stack_total_bytes

HERE = Path(__file__).resolve().parent
CASES = {
    # the issue's own: a batch too large for bert-large in fp32 (forward)
    "batch": ["--preset", "bert-large", "--precision", "fp32", "--batch-size", "384"],
    # whole-model torch.compile at a batch that fits eager (on the H200: 128)
    "compile": ["--preset", "bert-large", "--compile", "--batch-size", "128"],
    # a decoder's logits: batch 96 x 1024 tokens x 151,936 vocabulary, bf16, the layers checkpointed (so that their
    # activations, 0.35 of the logits' per token without, are not what fills the GPU first)
    "logits": [
        *("--preset", "qwen2.5-0.5b", "--precision", "bf16", "--grad-checkpointing"),
        *("--batch-size", "96", "--seq-len", "1024"),
    ],
    # an optimizer step (a plain loop under gpuanat run --script)
    "optimizer": ["--script", str(HERE / "optimizer_step.py")],
    # the backward of a batch whose forward fits (H200: the forward alone fills about 0.83 GB a sample)
    "backward": ["--preset", "bert-large", "--precision", "fp32", "--batch-size", "172"],
}


def snapshot_figures(path: Path) -> dict:
    snapshot = pickle.loads(path.read_bytes())
    segments = snapshot.get("segments", [])
    traces = [entry for device in snapshot.get("device_traces", []) for entry in device]
    ooms = [entry for entry in traces if entry.get("action") == "oom"]
    return {
        "allocated_bytes": sum(segment["allocated_size"] for segment in segments),
        "reserved_bytes": sum(segment["total_size"] for segment in segments),
        "oom_entry_size_bytes": ooms[-1]["size"] if ooms else None,
        "oom_entry_device_free_bytes": ooms[-1].get("device_free", ooms[-1].get("addr")) if ooms else None,
        "oom_frames": [
            f"{frame['filename']}:{frame['line']} {frame['name']}" for frame in (ooms[-1].get("frames") or [])
        ][:12]
        if ooms
        else [],
    }


def percent(ours: int | None, theirs: int | None) -> float | None:
    return None if ours is None or not theirs else round(100.0 * (ours - theirs) / theirs, 3)


def run_case(name: str, out: Path) -> dict:
    snapshot = out / f"{name}.pickle"
    snapshot.unlink(missing_ok=True)
    options = ["--json", "--db", str(out / "history.sqlite"), "--name", f"oom {name}"]
    options += ["--keep-oom-snapshot", str(snapshot)]
    steps = [] if CASES[name][0] == "--script" else ["--max-steps", "3"]  # (a script's arguments come last)
    command = [sys.executable, "-m", "gpuanat", "run", *options, *steps, *CASES[name]]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    (out / f"{name}.err").write_text(done.stderr[-20000:])
    (out / f"{name}.json").write_text(done.stdout)
    check: dict = {
        "case": name,
        "command": command[2:],
        "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - started, 1),
    }
    try:
        result = json.loads(done.stdout)
    except ValueError:
        check["error"] = "no JSON result"
        return check
    failure = result.get("out_of_memory") or {}
    check["status"] = result.get("status")
    check["ours"] = {
        key: failure.get(key)
        for key in (
            "phase",
            "module",
            "operation",
            "step",
            "failed_allocation_bytes",
            "device_free_bytes",
            "allocated_bytes",
            "reserved_bytes",
        )
    }
    check["bands"] = result.get("bands")
    check["device_memory_used_bytes"] = result.get("device_memory_used_bytes")
    bands = result.get("bands") or {}
    check["bands_sum_bytes"] = stack_total_bytes(bands)  # the used bands, summed (None when one is missing)
    check["largest_tensors"] = failure.get("largest_tensors")
    check["modules"] = (result.get("modules") or [])[:6]
    if snapshot.is_file():
        theirs = snapshot_figures(snapshot)
        check["snapshot"] = theirs
        check["snapshot_bytes"] = snapshot.stat().st_size
        check["allocated_error_percent"] = percent(failure.get("allocated_bytes"), theirs["allocated_bytes"])
        check["reserved_error_percent"] = percent(failure.get("reserved_bytes"), theirs["reserved_bytes"])
        tensor_bands = [
            bands.get(k)
            for k in (
                "weights_bytes",
                "gradients_bytes",
                "optimizer_state_bytes",
                "activations_bytes",
                "temporaries_and_cache_bytes",
            )
        ]
        check["tensor_bands_vs_snapshot_reserved_percent"] = (
            percent(sum(tensor_bands), theirs["reserved_bytes"]) if None not in tensor_bands else None
        )
        check["failed_allocation_equals_trace"] = (
            failure.get("failed_allocation_bytes") == theirs["oom_entry_size_bytes"]
        )
        if os.environ.get("KEEP_SNAPSHOTS") != "1":
            snapshot.unlink()
    return check


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:] or list(CASES):
        check = run_case(name, out)
        (out / f"{name}.check.json").write_text(json.dumps(check, indent=1))
        print(
            json.dumps(
                {
                    k: check.get(k)
                    for k in (
                        "case",
                        "exit_code",
                        "status",
                        "wall_s",
                        "ours",
                        "allocated_error_percent",
                        "reserved_error_percent",
                        "tensor_bands_vs_snapshot_reserved_percent",
                        "failed_allocation_equals_trace",
                    )
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
