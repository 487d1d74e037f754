"""What a round of `gpuanat tune` tries first, read from the kept trial's operations anatomy: the recorded H100
profiles (tests/data/operations/h100_kernels.json) ordered by the real `move_order`, and a search whose made-up
trials carry such an anatomy. The weights move (fp32 master weights, bf16 under autocast, pure bf16) and its
place in the search space."""

from __future__ import annotations

import re

import pytest
from conftest import last_json, run_cli
from test_operations_h100 import anatomy_of
from test_tune_search import H100, H100_NVML_TOTAL_BYTES, FakeTrials, tune

from gpuanat.cli.common import config_from_args
from gpuanat.cli.parser import build_parser
from gpuanat.core.memory.predict import estimate_memory
from gpuanat.core.operations.classify import GROUPS
from gpuanat.core.run.tune.candidates import Predictor, Search
from gpuanat.core.run.tune.moves import ANATOMY_SHARE_FLOOR, groups_to_attack, move_order, tune_profiled_steps
from gpuanat.core.run.tune.space import DIMENSIONS, search_space
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import weights_mode, with_weights_mode

GPU_BOUND = [{"bottleneck": "gpu-bound", "evidence": "", "fix": ""}]
HOST_BOUND = [{"bottleneck": "host-bound", "evidence": "", "fix": ""}]


def test_bert_large_in_bf16_spends_its_time_moving_memory_so_pure_bf16_and_fusion_come_first():
    """The H100's bert-large bf16 profile: element-wise 26%, optimizer 22%, normalizations 13% of the kernels'
    time. A GPU-bound round tries the weights (pure bf16 halves what those kernels move), then compiled regions,
    before the bottleneck's other moves; the reason names the groups."""
    anatomy = anatomy_of("bert-bf16")
    assert [group for group, _ in groups_to_attack(anatomy)] == ["elementwise", "optimizer", "normalizations"]
    order = move_order(DIMENSIONS, RunResult(operations_anatomy=anatomy, diagnosis=GPU_BOUND))
    assert order.dimensions[:5] == ["weights", "compile", "liger", "optim", "engine"]
    assert sorted(order.dimensions) == sorted(DIMENSIONS)
    assert order.reason == (
        "element-wise 26%, optimizer 22%, normalizations 13% of the profiled time; gpu-bound → weights, compile, "
        "liger, optim, engine first"
    )


def test_a_run_that_is_all_math_keeps_the_bottlenecks_order():
    """fp32 bert-large: contractions 88% of the time, no other group at 5%: the anatomy orders nothing."""
    anatomy = anatomy_of("bert-fp32")
    assert all(anatomy[group]["time_share"] < ANATOMY_SHARE_FLOOR for group in ("elementwise", "normalizations"))
    assert groups_to_attack(anatomy) == []
    order = move_order(DIMENSIONS, RunResult(operations_anatomy=anatomy, diagnosis=GPU_BOUND))
    assert order.dimensions[:3] == ["compile", "engine", "liger"]
    assert order.reason == "gpu-bound → compile, engine, liger first"
    assert move_order(DIMENSIONS, RunResult()) == type(order)(list(DIMENSIONS), "")


def test_a_host_bound_run_tries_its_bottlenecks_moves_before_the_anatomys():
    order = move_order(DIMENSIONS, RunResult(operations_anatomy=anatomy_of("bert-bf16"), diagnosis=HOST_BOUND))
    assert order.dimensions[:5] == ["batch", "engine", "compile", "weights", "liger"]


def test_only_the_dimensions_searched_are_ordered():
    order = move_order(("batch", "compile"), RunResult(operations_anatomy=anatomy_of("llama-3.2-1b-bf16")))
    assert order.dimensions == ["compile", "batch"]
    assert order.reason.startswith("element-wise 38%")


def test_the_search_tries_pure_bf16_first_where_the_anatomy_says_memory_moves():
    """A made-up GPU-bound trial whose anatomy is the recorded bf16 one until the model is pure bf16: the round
    after the start tries the weights first (bf16 under autocast, then pure bf16), keeps pure bf16, then compiles
    its regions."""
    bf16_anatomy, pure_anatomy = anatomy_of("bert-bf16"), anatomy_of("bert-fp32")

    def speedup(config: RunConfig) -> float:
        return (1.17 if not config.autocast else 1.0) * (1.08 if config.compile_regions else 1.0)

    trials = FakeTrials(
        bottleneck=lambda config: "gpu-bound",
        speedup=speedup,
        anatomy=lambda config: pure_anatomy if not config.autocast else bf16_anatomy,
    )
    orders: list[str] = []
    _, result = tune(trials, on_round=lambda center, reason: orders.append(reason))
    assert [weights_mode(trial.config) for trial in result.trials[:3]] == ["fp32", "bf16", "pure-bf16"]
    assert [trial.dimension for trial in result.trials[1:4]] == ["weights", "weights", "compile"]
    assert result.best is not None and weights_mode(result.best.config) == "pure-bf16"
    assert result.best.config.compile_regions and result.best.config.precision == "bf16"
    assert orders[0].startswith("element-wise 26%") and "→ weights, compile" in orders[0]


def test_the_weights_are_searched_on_a_bf16_gpu_for_a_model_trained_whole():
    base = RunConfig()
    assert "weights" in search_space(base, H100, set(), gpu_memory_bytes=H100_NVML_TOTAL_BYTES).dimensions
    volta = Capabilities(torch_version="2.11", cuda_available=True, cuda_compute_capability=(7, 0))
    for capabilities, config, given in (
        (volta, base, set()),  # no bf16
        (H100, base.replace(lora=8), set()),  # LoRA's base is 16-bit already
        (H100, base.replace(precision="fp32"), {"precision"}),  # the user holds fp32
        (H100, base.replace(autocast=False, weights_dtype="bf16", precision="bf16"), {"autocast"}),
    ):
        assert "weights" not in search_space(config, capabilities, given, gpu_memory_bytes=80 * 2**30).dimensions


def test_the_weights_move_tries_each_other_mode_and_a_precision_move_brings_fp32_weights_back():
    base = RunConfig(precision="bf16", tf32=True, batch_size=64)
    space = search_space(base, H100, set(), gpu_memory_bytes=H100_NVML_TOTAL_BYTES)
    search = Search(base, space, Predictor(space))
    assert [weights_mode(candidate) for candidate in search.alternatives("weights", base)] == ["bf16", "pure-bf16"]
    pure = with_weights_mode(base, "pure-bf16")
    (fp32,) = search.alternatives("precision", pure)
    assert (fp32.precision, fp32.weights_dtype, fp32.autocast) == ("fp32", "fp32", True)


@pytest.mark.parametrize("batch_size", [64, 128])
def test_pure_bf16_is_predicted_below_bf16_under_autocast(batch_size):
    """Pure bf16 keeps every activation in 16 bits, the residual stream too (bert-large seq 512 on the H100:
    53.65 GiB at batch 128 against 68.11 under autocast, benchmarks/results/h100/tune54/)."""
    autocast = RunConfig(batch_size=batch_size, precision="bf16", weights_dtype="bf16")
    pure = autocast.replace(autocast=False)
    assert estimate_memory(pure).activations_bytes < estimate_memory(autocast).activations_bytes
    assert estimate_memory(pure).weights_bytes == estimate_memory(autocast).weights_bytes


@pytest.mark.parametrize(
    ("asked", "trial_steps", "profiled"), [(None, 20, 2), (None, 10, 2), (None, 9, 0), (0, 20, 0), (3, 4, 3)]
)
def test_trials_long_enough_are_profiled_unless_asked_otherwise(asked, trial_steps, profiled):
    assert tune_profiled_steps(asked, trial_steps) == profiled


def test_a_real_search_profiles_its_trials_and_prints_why_the_moves_come_in_their_order(db_path):
    """The tiny BERT on the CPU, the batch searched up to 8, 10 steps a trial: each trial's profiled steps give
    its anatomy, the next round's order says what they found, and the best's anatomy and its timed command are
    printed (the rate still steady: the profiled steps are out of its window)."""
    arguments = ["tune", "--device", "cpu", "--preset", "tiny", "--seq-len", "32", "--search", "batch"]
    completed = run_cli(
        [*arguments, "--max-batch", "8", "--trial-steps", "10", "--budget", "3", "--json"], db_path, timeout_s=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = last_json(completed.stdout)
    # the groups it found, whose moves (compile, …) are not searched here
    assert re.search(
        r"^tune: moves from tune 1: [a-z -]+ \d+%.* of the profiled time: none of their moves is searched$",
        completed.stderr,
        re.M,
    )
    best = summary["best"]
    anatomy = best["operations_anatomy"]
    assert anatomy["profiled_steps"] == 2 and "kernels" not in anatomy
    assert sum(anatomy[group]["time_share"] for group in GROUPS) == pytest.approx(1.0)
    assert all(trial["rate_source"] == "steady" for trial in summary["trials"])
    timed = config_from_args(build_parser().parse_args(best["trial_command"].split()[1:]), cuda_available=False)
    assert timed.max_steps == 10 and timed.batch_size == best["config"]["batch_size"]
    with HistoryStore(db_path) as store:
        assert all(run.result.operations_anatomy["profiled_steps"] == 2 for run in store.runs())
