"""The search of `gpuanat tune` on its own: the Pareto front, when a move is kept, what is pruned, what is held,
the budget and a stop. Trials here are a made-up speed model standing in for the runs (the real runs are in
tests/test_tune_cpu.py); the memory prediction and the search are the real code."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuanat.cli.common import config_from_args
from gpuanat.cli.parser import build_parser
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.run.tune.moves import move_order
from gpuanat.core.run.tune.result import NOISE_FRACTION, beats, pareto_front
from gpuanat.core.run.tune.runs import run_flags
from gpuanat.core.run.tune.search import Progress, run_tune
from gpuanat.core.run.tune.space import DIMENSIONS, search_space
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import compile_mode

H100 = Capabilities(
    torch_version="2.11",
    cuda_available=True,
    cuda_device_name="NVIDIA H100 80GB HBM3",
    cuda_compute_capability=(9, 0),
    cuda_total_memory_bytes=81559 * 2**20,
    cuda_device_count=1,
)
H100_NVML_TOTAL_BYTES = 81559 * 2**20
TRIAL_S = 40.0


class FakeTrials:
    """Runs that take TRIAL_S of a fake clock and train at a rate made up from the techniques; `oom` decides
    which run out of memory."""

    def __init__(
        self,
        oom=lambda config: False,
        stop_at: int | None = None,
        stop: threading.Event | None = None,
        speedup=lambda config: 1.0,
        bottleneck=lambda config: None,
        trial_s=lambda config: TRIAL_S,
        joules=lambda config: None,
        anatomy=lambda config: None,
    ):
        self.now_s = 0.0
        self.anatomy = anatomy
        self.joules = joules
        self.trial_s = trial_s
        self.bottleneck = bottleneck
        self.speedup = speedup
        self.configs: list[RunConfig] = []
        self.oom = oom
        self.stop_at, self.stop = stop_at, stop
        self._ids = itertools.count(1)

    def clock(self) -> float:
        return self.now_s

    def __call__(self, config: RunConfig, *, store: Any, log_dir: Path, name: str) -> RunResult:
        self.configs.append(config)
        self.now_s += self.trial_s(config)
        run_id = next(self._ids)
        if self.stop_at == run_id:
            assert self.stop is not None
            self.stop.set()
            return RunResult(run_id=run_id, status="stopped", steady_samples_per_second=None, samples_per_second=None)
        if self.oom(config):
            return RunResult(run_id=run_id, status="oom", steady_samples_per_second=None, samples_per_second=None)
        rate = {"bf16": 300.0, "fp16": 300.0, "fp32": 150.0}[config.precision] * (1.05 if config.tf32 else 1.0)
        rate *= min(1.0, config.batch_size / 64) ** 0.1 * (0.75 if config.grad_checkpointing else 1.0)
        rate *= (0.8 if config.attn == "eager" else 1.0) * (0.7 if config.compile else 1.0) * self.speedup(config)
        bottleneck = self.bottleneck(config)
        return RunResult(
            run_id=run_id,
            status="ok",
            steady_samples_per_second=rate,
            samples_per_second=rate * 0.9,
            peak_reserved_bytes=config.batch_size * 2**28,
            joules_per_sample=self.joules(config),
            operations_anatomy=self.anatomy(config),
            diagnosis=[{"bottleneck": bottleneck, "evidence": "", "fix": ""}] if bottleneck else [],
        )


BERT_LARGE = RunConfig()


def tune(
    trials: FakeTrials,
    base: RunConfig = BERT_LARGE,
    given: frozenset[str] = frozenset(),
    budget_s: float = 3600.0,
    **options: Any,
):
    space = search_space(base, H100, given, gpu_memory_bytes=H100_NVML_TOTAL_BYTES)
    return space, run_tune(
        base,
        space,
        store=None,
        log_dir=Path("unused"),
        trial_steps=20,
        budget_s=budget_s,
        run_trial=trials,
        clock=trials.clock,
        **options,
    )


def test_the_front_keeps_what_nothing_beats_on_both_counts():
    points = [
        (100.0, 10, "a"),
        (90.0, 12, "dominated"),
        (150.0, 20, "b"),
        (150.0, 25, "slower for more"),
        (80.0, 5, "c"),
        (150.0, 20, "same point again"),
    ]
    assert pareto_front(points) == ["c", "a", "b"]
    assert pareto_front([]) == []


def test_a_move_is_kept_only_beyond_the_noise():
    assert not beats(101.9, 100.0) and beats(102.1, 100.0)
    assert NOISE_FRACTION == 0.02


def test_bert_large_on_an_h100_starts_strong_and_prunes_before_running():
    trials = FakeTrials()
    pruned = []
    space, result = tune(trials, on_pruned=pruned.append)
    start = result.trials[0].config
    assert (start.precision, start.tf32, start.attn, start.optim, start.grad_checkpointing, start.compile) == (
        "bf16",
        True,
        "sdpa",
        "adamw_torch_fused",
        False,
        False,
    )
    usable = space.usable_memory_bytes
    assert usable == H100_NVML_TOTAL_BYTES - int(0.02 * H100_NVML_TOTAL_BYTES)
    largest_bf16 = largest_batch(start, usable).batch_size
    assert start.batch_size == 128 and 128 <= largest_bf16 < 256  # the largest power of two predicted to fit
    for config in trials.configs:
        search = RunConfig.from_json({**config.to_json(), "samples": 512, "max_steps": None})
        assert search.batch_size <= largest_batch(search, usable).batch_size  # nothing ran that was predicted over
        assert search.optim != "sgd"
    assert pruned and all(
        refused.config.batch_size > largest_batch(refused.config, usable).batch_size for refused in pruned
    )
    tried = {trial.config for trial in result.trials}
    assert not tried & {refused.config for refused in pruned}
    # checkpointing only where it lets a larger batch fit than without it
    checkpointed = [trial.config for trial in result.trials if trial.config.grad_checkpointing]
    assert checkpointed and all(config.batch_size > 128 for config in checkpointed)
    # torch.compile is the last move of a round: its trials are the longest
    assert [trial.dimension for trial in result.trials if trial.dimension != "start"][-1] == "compile"
    assert result.stop_reason == "converged"
    best = result.best
    assert best is not None and best in result.front
    assert best.samples_per_second == max(trial.samples_per_second for trial in result.ok_trials)


def test_an_oom_rules_its_direction_out_for_later_rounds():
    # DataLoader workers help, and with them batch 64 more: round 1 keeps workers, compiled regions run out of
    # memory; round 2 keeps batch 64, from which compiled regions would be a new candidate
    def speedup(config: RunConfig) -> float:
        return (1.1 if config.workers else 1.0) * (1.05 if config.workers and config.batch_size == 64 else 1.0)

    trials = FakeTrials(oom=lambda config: config.compile_regions, speedup=speedup)
    _, result = tune(trials)
    compiled = [trial for trial in result.trials if trial.config.compile_regions]
    assert len(compiled) == 1 and compiled[0].status == "oom" and compiled[0].config.batch_size == 128
    kept = [trial for trial in result.trials if trial.index in result.kept]
    assert [(trial.config.batch_size, trial.config.workers) for trial in kept] == [(128, 0), (128, 2), (64, 2)]
    assert all(trial.ok for trial in result.front)


def test_an_oom_at_the_start_steps_down_the_ladder():
    trials = FakeTrials(oom=lambda config: config.batch_size > 64)
    _, result = tune(trials)
    assert [(trial.config.batch_size, trial.status) for trial in result.trials[:2]] == [(128, "oom"), (64, "ok")]
    assert result.kept[0] == 2
    same_techniques = [
        trial
        for trial in result.trials[2:]
        if trial.config.precision == "bf16"
        and not trial.config.grad_checkpointing
        and trial.config.attn == "sdpa"
        and not trial.config.compile
    ]
    assert all(trial.config.batch_size < 128 for trial in same_techniques)


def test_flags_the_user_gave_are_held():
    base = RunConfig(precision="fp32", attn="eager")
    space, result = tune(FakeTrials(), base=base, given=frozenset({"precision", "attn"}))
    assert "precision" not in space.dimensions and "attn" not in space.dimensions
    assert {(trial.config.precision, trial.config.attn) for trial in result.trials} == {("fp32", "eager")}


def test_the_budget_stops_before_a_trial_would_overrun_it():
    trials = FakeTrials()
    _, result = tune(trials, budget_s=3.5 * TRIAL_S)
    assert len(result.trials) == 3 and result.stop_reason == "budget"
    assert result.front and result.best is not None


def test_a_stop_returns_the_front_so_far():
    stop = threading.Event()
    trials = FakeTrials(stop_at=3, stop=stop)
    _, result = tune(trials, stop=stop)
    assert len(result.trials) == 3 and result.trials[-1].status == "stopped"
    assert result.stop_reason == "interrupted"
    assert [trial.index for trial in result.ok_trials] == [1, 2] and result.best in result.front


@pytest.mark.parametrize(
    "config",
    [
        RunConfig(precision="bf16", tf32=True, batch_size=128, expandable_segments=True),
        RunConfig(
            preset="tiny",
            device="cpu",
            seq_len=32,
            batch_size=16,
            attn="eager",
            workers=2,
            grad_accum=4,
            pin_memory=False,
            samples=64,
        ),
    ],
)
def test_the_best_prints_as_run_flags_that_give_it_back(config):
    args = build_parser().parse_args(["run", *run_flags(config)])
    assert config_from_args(args, cuda_available=True) == config


def test_the_cpu_searches_what_it_can_run():
    cpu = Capabilities(torch_version="2.11", cuda_available=False, reason="no GPU")
    base = RunConfig(preset="tiny", device="cpu")
    space = search_space(base, cpu, set(), gpu_memory_bytes=None)
    assert space.dimensions == ("batch", "precision", "attn", "workers", "engine", "compile")
    assert space.half_precision == "bf16" and space.max_batch == 64
    older = Capabilities(
        torch_version="2.11", cuda_available=True, cuda_compute_capability=(7, 5), bitsandbytes_version="0.45"
    )
    space = search_space(RunConfig(), older, set(), gpu_memory_bytes=16 * 2**30)
    assert space.half_precision == "fp16" and "tf32" not in space.dimensions
    assert space.optimizers == ("adamw_torch_fused", "adamw_bnb_8bit")
    assert set(space.dimensions) == set(DIMENSIONS) - {"tf32", "liger", "distributed", "weights"}  # one GPU, fp16


def test_a_gpu_bound_run_tries_the_fused_kernels_first_its_regions_compiled():
    """The H100's bert-large at batch 128 is GPU-bound (98% busy): only less GPU work a sample helps, so the
    round tries compile first (its regions; never the whole model, whose memory is not predicted) instead of last;
    regions are kept."""
    trials = FakeTrials(
        bottleneck=lambda config: "gpu-bound", speedup=lambda config: 1.1 if config.compile_regions else 1.0
    )
    _, result = tune(trials)
    moves = [(trial.dimension, trial.config.compile_regions, trial.config.compile) for trial in result.trials[1:2]]
    assert moves == [("compile", True, False)]
    assert result.trials[2].dimension != "compile"
    assert result.best is not None and result.best.config.compile_regions
    assert result.trials[1].index in result.kept


def test_without_a_diagnosis_the_moves_keep_their_order():
    assert move_order(DIMENSIONS, RunResult()).dimensions == list(DIMENSIONS)
    host_bound = RunResult(diagnosis=[{"bottleneck": "host-bound"}, {"bottleneck": "compile"}])
    assert move_order(("batch", "precision", "engine", "compile"), host_bound).dimensions == [
        "batch",
        "engine",
        "compile",
        "precision",
    ]


TWO_H100 = Capabilities(
    torch_version="2.11",
    cuda_available=True,
    cuda_device_name="NVIDIA H100 80GB HBM3",
    cuda_compute_capability=(9, 0),
    cuda_total_memory_bytes=81559 * 2**20,
    cuda_device_count=2,
    deepspeed_version="0.18.0",
)
SHARDING_SPEED = {"ddp": 1.0, "zero1": 0.97, "zero2": 0.95, "fsdp": 0.9, "zero3": 0.85}
"""Made up: each step of sharding costs some communication."""


def test_on_several_gpus_the_distributed_technique_is_searched_from_the_least_sharding_that_fits():
    """llama-3.1-8b on 2 H100s: DDP holds the whole model's state on each GPU and is predicted not to fit at any
    batch, so the start takes the least sharding that does; the other techniques are moves like any other, each
    fitted to the memory, and the fastest that fits is kept."""
    base = RunConfig(
        preset="llama-3.1-8b", gpus="2", distributed="ddp", precision="bf16", seq_len=1024, batch_size=1, samples=64
    )
    space = search_space(
        base,
        TWO_H100,
        frozenset({"seq_len"}),
        gpu_memory_bytes=H100_NVML_TOTAL_BYTES,
        only=["batch", "distributed", "grad-checkpointing"],
    )
    assert space.dimensions == ("batch", "distributed", "grad-checkpointing")
    assert space.distributed_techniques == ("ddp", "zero1", "zero2", "fsdp", "zero3")
    trials = FakeTrials(speedup=lambda config: SHARDING_SPEED[config.distributed])
    result = run_tune(
        base,
        space,
        store=None,
        log_dir=Path("unused"),
        trial_steps=20,
        budget_s=3600.0,
        run_trial=trials,
        clock=trials.clock,
    )
    start = result.trials[0].config
    usable = space.usable_memory_bytes
    assert largest_batch(base, usable).batch_size == 0  # DDP: no batch fits
    # the least sharding predicted to fit: ZeRO-1/2's step holds the gradients' partition in fp32 beside the state
    # (89.81 GiB measured on 2 H200s), more than an H100 has
    assert start.distributed == "fsdp"
    tried = {trial.config.distributed for trial in result.trials}
    assert "zero3" in tried and not {"ddp", "zero1", "zero2"} & tried  # pruned by the prediction, never run
    assert result.best is not None and result.best.samples_per_second == max(
        trial.samples_per_second for trial in result.ok_trials
    )


def test_one_gpu_or_a_workload_sharding_cannot_train_has_no_distributed_dimension():
    one = search_space(
        RunConfig(preset="llama-3.1-8b", precision="bf16"), H100, frozenset(), gpu_memory_bytes=H100_NVML_TOTAL_BYTES
    )
    assert "distributed" not in one.dimensions and one.distributed_techniques == ()
    lora = search_space(
        RunConfig(preset="llama-3.1-8b", gpus="2", distributed="ddp", precision="bf16", lora=16),
        TWO_H100,
        frozenset(),
        gpu_memory_bytes=H100_NVML_TOTAL_BYTES,
    )
    assert lora.distributed_techniques == ("ddp", "fsdp")  # LoRA trains with ddp or fsdp here
    no_deepspeed = search_space(
        RunConfig(gpus="2", distributed="ddp"),
        dataclasses.replace(TWO_H100, deepspeed_version=None),
        frozenset(),
        gpu_memory_bytes=H100_NVML_TOTAL_BYTES,
    )
    assert no_deepspeed.distributed_techniques == ("ddp", "fsdp")


CPU_TRIAL_S = {"off": 14.0, "regions": 63.0, "model": 107.0}
"""Wall time of a trial by its kind, start-up included, as a real `gpuanat tune --device cpu --preset tiny --seq-len
64` took them on the 2-core development machine (20 steps; eager trials 11-20 s, compiled regions 63 s, the whole
model compiled 107 s): a compiled trial costs several eager ones."""


def test_the_time_left_is_the_trials_left_each_at_its_kinds_measured_time():
    """Issue #48, point 5: "about 17 s left" for a tune that took 2 min 58 s. Fed the real trials' times by kind, the
    time left is "estimating…" while a kind still to run was never timed, never more than what is left, and once no
    move helps any more, exactly what is left."""
    trials = FakeTrials(
        trial_s=lambda config: CPU_TRIAL_S[compile_mode(config)],
        speedup=lambda config: 1.2 if config.workers == 2 else 1.0,
    )
    seen: list[tuple[int, Progress]] = []
    _, result = tune(trials, on_trial=lambda trial, progress: seen.append((trial.index, progress)))
    assert result.stop_reason == "converged" and len(result.trials) >= 6
    last_kept = max(result.kept)
    assert last_kept > 1  # a move helped: more rounds than the first one's trials
    for index, progress in seen:
        left_s = result.elapsed_s - progress.elapsed_s
        done = result.trials[:index]
        timed = {compile_mode(trial.config) for trial in done}
        still_to_run = {compile_mode(trial.config) for trial in result.trials[index:]}
        if progress.estimated_left_s is None:
            assert progress.untimed_kind not in timed, (index, progress)
            assert progress.left_words(str).startswith("estimating… at least")
            assert progress.timed_left_s <= left_s + 1e-9, (index, progress, left_s)
            continue
        assert still_to_run <= timed or index < last_kept, (index, progress)
        assert progress.estimated_left_s <= left_s + 1e-9, (index, progress, left_s)
        if index > last_kept:
            assert progress.estimated_left_s == pytest.approx(left_s), (index, progress)
            assert progress.trials_left == len(result.trials) - index
    assert any(progress.estimated_left_s is None for _, progress in seen)  # a compiled trial was left untimed
    assert seen[-1][1].trials_left == 0 and seen[-1][1].left_words(str) == "no trial left unless a move helps"


def test_the_energy_objective_keeps_the_move_that_lowers_the_energy_a_sample_not_the_fastest():
    """With --objective energy a move is kept when it lowers the joules a sample by more than the noise, whatever
    its speed: here fp32 trains at half bf16's rate and, in this made-up model, on a third of the energy a sample."""

    def joules(config: RunConfig) -> float:
        return 1.0 if config.precision == "fp32" else 3.0

    _space, fastest = tune(FakeTrials(joules=joules))
    assert fastest.objective == "throughput" and fastest.best is not None
    assert fastest.best.config.precision in ("bf16", "fp16")
    _space, thriftiest = tune(FakeTrials(joules=joules), objective="energy")
    assert thriftiest.objective == "energy" and thriftiest.best is not None
    assert thriftiest.best.config.precision == "fp32"
    assert thriftiest.best.joules_per_sample == 1.0
    assert (
        thriftiest.best.rate("energy") == 1.0 and thriftiest.best.rate("throughput") < fastest.best.samples_per_second
    )
    _space, unread = tune(FakeTrials(), objective="energy")  # no energy read: nothing to choose by
    assert unread.best is None
