"""What publishing for `gpuanat watch` costs a training step, paired inside one process.

One model trains in alternating blocks of `--steps` optimizer steps (a fresh Trainer each) in three arms:
"plain" (no gpuanat), "probe" (`AnatomyCallback(publish=False)`: measures, sends nothing) and "published"
(`AnatomyCallback()` as a user adds it: measures and publishes to the private per-user file). Rounds run
plain, probe, published, published, probe, plain so that drift cancels; each block's time per step leaves
out its first steps. The cost of publishing is published vs probe; the cost of the one-line opt-in is
published vs plain. It also times `Publisher.publish` alone, per written and per throttled step line.

    python benchmarks/publish_cost.py --out benchmarks/results/publish_cost_cpu.json [--rounds 4 --steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from gpuanat.core.measure.publish import Publisher
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import ProbeBands, Step
from gpuanat.worker.model import build_model
from gpuanat.worker.probe import sink
from gpuanat.worker.probe.hf import AnatomyCallback
from gpuanat.worker.train import build_dataset, training_arguments_kwargs

SKIPPED_STEPS = 5
ARMS_PER_ROUND = ("plain", "probe", "published", "published", "probe", "plain")


class BlockClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.start_s = self.end_s = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == SKIPPED_STEPS:
            self.start_s = time.perf_counter()
        elif state.global_step == state.max_steps:
            self.end_s = time.perf_counter()


def time_publish_calls(directory: Path, calls: int = 20_000) -> dict[str, float]:
    """Microseconds per `publish` of a plain step: written (no throttle) and throttled."""
    step = Step(step=1, samples=4, tokens=128, step_time_s=0.01, elapsed_s=1.0, loss=0.5, monotonic_s=1.0)
    results = {}
    for label, interval_s in (("written_us", 0.0), ("throttled_us", 3600.0)):
        publisher = Publisher(
            directory, pid=os.getpid() + 1_000_000 + int(interval_s), plain_step_interval_s=interval_s
        )
        publisher.publish(Step(**{**step.__dict__, "bands": ProbeBands(1, 1, 1, 1, "saved_tensors", 1, 1)}))
        publisher.publish(step)
        started = time.perf_counter()
        for _ in range(calls):
            publisher.publish(step)
        results[label] = (time.perf_counter() - started) / calls * 1e6
        publisher.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument(
        "--config",
        type=json.loads,
        default={"preset": "tiny", "device": "cpu", "seq_len": 64, "batch_size": 8, "samples": 4096},
    )
    args = parser.parse_args()
    runtime_dir = Path(tempfile.mkdtemp(prefix="gpuanat-bench-"))  # mode 0700, like $XDG_RUNTIME_DIR
    os.environ["XDG_RUNTIME_DIR"] = str(runtime_dir)
    config = RunConfig.from_json({**args.config, "max_steps": args.steps})
    torch.set_num_threads(1)  # two cores here: keep the run's own threads from fighting over them
    model = build_model(config)
    dataset = build_dataset(config, model.config.vocab_size)
    seconds_per_step: dict[str, list[float]] = {"plain": [], "probe": [], "published": []}
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(**{**training_arguments_kwargs(config, output_dir), "disable_tqdm": True})
        for round_index in range(args.rounds):
            for arm in ARMS_PER_ROUND:
                clock = BlockClock()
                callbacks: list[TrainerCallback] = [clock]
                if arm != "plain":
                    callbacks.append(AnatomyCallback(publish=arm == "published"))
                Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=callbacks).train()
                per_step = (clock.end_s - clock.start_s) / (args.steps - SKIPPED_STEPS)
                seconds_per_step[arm].append(per_step)
                print(f"round {round_index} {arm:<9} {per_step * 1000:.3f} ms/step", flush=True)
    published_file = sink.published_path()
    medians = {arm: statistics.median(values) for arm, values in seconds_per_step.items()}
    # Within a round the arms ran back to back (ABCCBA), so their ratio cancels slow drifts of the machine.
    per_round = len(ARMS_PER_ROUND) // 3

    def round_ratios(arm: str, baseline: str) -> list[float]:
        return [
            statistics.mean(seconds_per_step[arm][r * per_round : (r + 1) * per_round])
            / statistics.mean(seconds_per_step[baseline][r * per_round : (r + 1) * per_round])
            for r in range(args.rounds)
        ]

    result = {
        "device": "cpu",
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": 1,
        "config": config.to_json(),
        "rounds": args.rounds,
        "steps_per_block": args.steps,
        "seconds_per_step": seconds_per_step,
        "median_seconds_per_step": medians,
        "publishing_cost_percent_of_step_time": 100.0 * (medians["published"] - medians["probe"]) / medians["probe"],
        "opt_in_cost_percent_of_step_time": 100.0 * (medians["published"] - medians["plain"]) / medians["plain"],
        "published_over_probe_per_round": round_ratios("published", "probe"),
        "published_over_plain_per_round": round_ratios("published", "plain"),
        "publish_call": time_publish_calls(runtime_dir / "gpuanat"),
        "published_to": published_file,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: value for key, value in result.items() if key != "seconds_per_step"}, indent=2))


if __name__ == "__main__":
    main()
