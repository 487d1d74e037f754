"""What each probe costs its training loop, paired: blocks without the probe (A) and with it (B) alternate ABBA in
one process, on one model, for each loop of benchmarks/loops — a plain PyTorch loop (`gpuanat.probe.track`), a
Lightning fit (`LightningAnatomyCallback`) and a TRL SFTTrainer fine-tune (`AnatomyCallback`). Every block is a
fresh run of `--steps` optimizer steps (a new probe, Trainer or SFTTrainer), timed by the same steady clock in both
arms (CUDA syncs at the end of step `--warmup` and of the last step). Between separate processes the same run's
speed varies by several percent on the lent GPUs, more than the 1% a probe may cost; within one process, drift
cancels in ABBA. The probe publishes its events for `gpuanat watch` as in a user's run. A TRL block trains a fresh model
(the same seed): SFTTrainer changes the model it is given.

    python benchmarks/loop_probe_cost.py --out loop_probe_cost.json [--loops plain lightning trl] [--rounds 2]
        [the options of benchmarks/loops/common.py: --config DIR --seq-len N --batch-size N --steps N --warmup N]
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent / "loops"))
from common import build_model, device, options

MODULES = {"plain": "plain_loop", "lightning": "lightning_fit", "trl": "trl_sft"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--loops", nargs="+", default=list(MODULES), choices=list(MODULES))
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds per loop (4 blocks each)")
    parser.add_argument(
        "--budget-s", type=float, default=480, help="stop starting rounds after this long (each loop gets its share)"
    )
    known, rest = parser.parse_known_args()
    args = options(__doc__, rest)
    started_s = time.monotonic()
    report: dict[str, Any] = {
        "config": str(args.config),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps_per_block": args.steps,
        "warmup_steps": args.warmup,
        "loops": {},
    }
    for position, loop in enumerate(known.loops):
        loop_deadline_s = started_s + known.budget_s * (position + 1) / len(known.loops)
        train = importlib.import_module(MODULES[loop]).train
        # TRL's SFTTrainer changes the model it is given (gradient checkpointing, its input hooks): each of its blocks
        # trains a copy of its own of one model kept on the host, or a block would inherit the earlier ones' changes.
        fresh_model = loop == "trl"
        model = build_model(args)
        if fresh_model:
            model = model.to("cpu")
        blocks: list[dict[str, Any]] = []
        for round_index in range(known.rounds):
            if round_index and time.monotonic() > loop_deadline_s:
                break
            for probe in (False, True, True, False):
                args.probe = probe
                gc.collect()  # the earlier blocks' trainers and copies gone before this one starts
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                with GpuClocks() as clocks:
                    reading = train(args, copy.deepcopy(model).to(device()) if fresh_model else model)
                blocks.append({**reading, **clocks.reading()})
                print(json.dumps({"loop": loop, **blocks[-1]}), flush=True)
                report["loops"][loop] = summary_of(blocks)
                known.out.write_text(json.dumps(report, indent=1))  # after every block: a timeout keeps them
        del model
        summary = report["loops"][loop]
        print(
            f"{loop}: {summary['s_per_step_without']:.4f} s/step without, {summary['s_per_step_with']:.4f} with: "
            f"{summary['cost_percent']:+.2f}% (pairs {', '.join(f'{p:+.2f}' for p in summary['pair_cost_percent'])}; "
            f"spread without {summary['spread_without_percent']:.2f}%)",
            flush=True,
        )


class GpuClocks:
    """NVML's SM clock, power and temperature of GPU 0, sampled every 0.2 s while a block runs: drift between blocks
    that the GPU's own clocks explain is not the probe's."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            return
        while not self._stop.wait(0.2):
            try:
                self.samples.append(
                    (
                        pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                        pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                    )
                )
            except Exception:
                return

    def __enter__(self) -> GpuClocks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def reading(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        clocks, watts, temperatures = zip(*self.samples, strict=True)
        return {
            "sm_clock_mhz_median": statistics.median(clocks),
            "sm_clock_mhz_min": min(clocks),
            "power_w_median": statistics.median(watts),
            "temperature_c_max": max(temperatures),
        }


def summary_of(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The blocks so far, and what they say: mean s/step without and with the probe, the cost, each ABBA pair's
    cost, the spread of the blocks without it. With `--step-times`, each block's median step rather than its mean."""
    key = "median_step_s" if all(block.get("median_step_s") for block in blocks) else "s_per_step"
    without = [block[key] for block in blocks if not block["probe"] and block[key]]
    with_probe = [block[key] for block in blocks if block["probe"] and block[key]]
    mean_without = statistics.mean(without) if without else None
    mean_with = statistics.mean(with_probe) if with_probe else None
    return {
        "blocks": blocks,
        "timed_by": key,
        "s_per_step_without": mean_without,
        "s_per_step_with": mean_with,
        "cost_percent": 100 * (mean_with - mean_without) / mean_without if mean_without and mean_with else None,
        "pair_cost_percent": [100 * (b - a) / a for a, b in zip(without, with_probe, strict=False)],
        "spread_without_percent": (100 * (max(without) - min(without)) / mean_without if len(without) > 1 else None),
    }


if __name__ == "__main__":
    main()
