"""The diagnosis against the H100 runs of the docs' experiments (benchmarks/diagnosis_check.sh, results in
benchmarks/results/h100/diagnosis/): each rule that fires names the bottleneck those runs had, for the reasons
docs/diagnosis.md gives; and the rules that need other evidence (memory, several GPUs, compile) on results made
from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuanat.core.measure import diagnose as diagnosis
from gpuanat.core.measure.diagnose import breakdown_line, diagnosis_line
from gpuanat.core.store import compare
from gpuanat.core.vocabulary.result import RunResult

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h100" / "diagnosis"


def diagnose(result: dict, **rates: float | None) -> list[diagnosis.Finding]:
    """The findings for a result given as its JSON (a committed one, or one made from it), read as the history
    reads it."""
    return diagnosis.diagnose(RunResult.from_json(result), **rates)


def compare_runs(run_ids: list[int], configs: list[dict], results: list[dict]) -> compare.Comparison:
    return compare.compare_runs(run_ids, configs, [RunResult.from_json(result) for result in results])


def recorded_runs() -> dict[str, dict]:
    runs = {row["name"]: row for row in json.loads((RESULTS / "sweep.json").read_text())}
    for line in (RESULTS / "extra.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["status"] == "ok":
            runs[f"bf16 batch {row['config']['batch_size']}"] = row
    return runs


RUNS = recorded_runs()
# The docs' experiments at batch 4 (accumulation: batch 1 × 4) leave the H100's tensor cores idle: 0.6-5% MFU in
# 16 bits; fp32 at batch 4 reaches half of FP32's peak, and bf16 at batch 32 keeps a kernel running 90% of the time.
VERDICTS = {
    "vanilla": "gpu-bound",
    "grad accumulation": "host-bound",
    "+ grad checkpointing": "host-bound",
    "fp16": "host-bound",
    "accum + gc + fp16": "host-bound",
    "bf16": "host-bound",
    "tf32": "host-bound",
    "adafactor": "host-bound",
    "accum + gc + fp16 + adafactor": "host-bound",
    "8-bit adam": "host-bound",
    "bf16 batch 32": "gpu-bound",
}


@pytest.mark.parametrize(("name", "bottleneck"), VERDICTS.items())
def test_each_recorded_h100_run_gets_the_bottleneck_it_had(name, bottleneck):
    run = RUNS[name]
    findings = diagnose(run)
    assert [finding.bottleneck for finding in findings] == [bottleneck]


def test_the_verdicts_follow_the_measured_evidence():
    for name, bottleneck in VERDICTS.items():
        breakdown = RUNS[name]["step_time_breakdown"]
        assert breakdown["share"]["data"] < 0.15  # batches from memory: never input-bound
        busy = breakdown["gpu_busy_percent"]
        assert (busy >= 80) == (bottleneck == "gpu-bound"), (name, busy)


def test_a_slow_optimizer_is_named_first_and_fp32_is_told_of_the_tensor_cores():
    for name in ("adafactor", "8-bit adam"):
        (finding,) = diagnose(RUNS[name])
        assert "the optimizer step took" in finding.evidence and "adamw_torch_fused" in finding.fix, name
    (finding,) = diagnose(RUNS["fp16"])
    assert "optimizer" not in finding.evidence and "--batch-size" in finding.fix
    (finding,) = diagnose(RUNS["vanilla"])
    assert "--precision bf16" in finding.fix and "MFU 50%" in finding.evidence
    (finding,) = diagnose(RUNS["+ grad checkpointing"])
    assert "without --grad-checkpointing" in finding.fix


def test_memory_several_gpus_and_compile_rules_on_results_made_from_a_recorded_run():
    run = RUNS["bf16 batch 32"]
    near_the_limit = {**run, "peak_reserved_bytes": int(0.95 * run["device_memory_total_bytes"])}
    assert [f.bottleneck for f in diagnose(near_the_limit)] == ["gpu-bound", "memory-bound"]
    assert diagnose({**run, "status": "oom"})[0].bottleneck == "memory-bound"
    two_gpus = {**run, "ranks": [{}, {}], "steady_samples_per_second": 1.2 * run["steady_samples_per_second"]}
    (first, *_) = diagnose(two_gpus, one_gpu_samples_per_second=run["steady_samples_per_second"])
    assert first.bottleneck == "communication-bound" and "60%" in first.evidence
    assert first.evidence.startswith("2 GPUs trained") and first.evidence.endswith("of one GPU")
    two_cpu_ranks = {**two_gpus, "config": {**run["config"], "device": "cpu"}}
    (first_on_the_cpu, *_) = diagnose(two_cpu_ranks, one_gpu_samples_per_second=run["steady_samples_per_second"])
    assert first_on_the_cpu.evidence.startswith("2 CPU ranks trained"), first_on_the_cpu.evidence
    assert first_on_the_cpu.evidence.endswith("of one rank") and "GPU" not in first_on_the_cpu.evidence
    scaled = diagnose(
        {**two_gpus, "steady_samples_per_second": 1.9 * run["steady_samples_per_second"]},
        one_gpu_samples_per_second=run["steady_samples_per_second"],
    )
    assert "communication-bound" not in [f.bottleneck for f in scaled]
    compiled = {
        **run,
        "config": {**run["config"], "compile": True},
        "compile_stats": {"graphs": 5, "graph_breaks": 2},
        "steady_samples_per_second": 163.0,
    }
    compile_findings = [f for f in diagnose(compiled, eager_samples_per_second=247.0) if f.bottleneck == "compile"]
    assert len(compile_findings) == 2
    assert "2 graph break(s)" in compile_findings[0].evidence and "2 recompilation(s)" in compile_findings[0].evidence
    assert "163.0 samples/s, eager 247.0/s" in compile_findings[1].evidence


def test_the_summary_lines_and_compare_rows_of_a_recorded_run():
    run = RUNS["adafactor"]
    assert diagnosis_line(diagnose(run)).startswith("host-bound — no kernel ran on the GPU 42% of the time")
    line = breakdown_line(run["step_time_breakdown"])
    assert line.startswith("data 2%, forward 9%, backward 40%, optimizer 48%, gpu wait 0% of ") and line.endswith(
        " ms a step"
    )
    comparison = compare_runs([1, 2], [RUNS["vanilla"]["config"], run["config"]], [RUNS["vanilla"], run])
    rows = {row.key: row for row in comparison.metrics}
    assert rows["step_optimizer_s"].values[1] == pytest.approx(run["step_time_breakdown"]["per_step_s"]["optimizer"])
    assert rows["step_optimizer_s"].deltas_percent[1] > 500  # Adafactor's step against fused AdamW's


def test_the_same_training_eager_or_on_one_gpu_is_found_in_earlier_runs():
    from gpuanat.core.measure.diagnose import reference_rates

    run = RUNS["bf16 batch 32"]
    config = run["config"]
    compiled = {**config, "compile": True}
    earlier = [
        ({**config, "samples": 4096}, "ok", RunResult(steady_samples_per_second=250.0)),  # eager, longer: same rate
        ({**config, "batch_size": 64}, "ok", RunResult(steady_samples_per_second=290.0)),  # another batch: not it
        (config, "ok", RunResult(steady_samples_per_second=240.0)),  # an older eager run: the newest counts
    ]
    assert reference_rates(compiled, earlier) == {"one_gpu_samples_per_second": None, "eager_samples_per_second": 250.0}
    assert (
        reference_rates(compiled, [(config, "oom", RunResult(steady_samples_per_second=1.0))])[
            "eager_samples_per_second"
        ]
        is None
    )
    on_two = {**config, "gpus": "2", "distributed": "ddp"}
    assert reference_rates(on_two, earlier)["one_gpu_samples_per_second"] == 250.0


def recorded_steps_and_busy(tmp_path, name: str):
    """A recorded H100 run's steps (decoded by the real protocol code) and its GPU's NVML utilization, from the
    history that benchmarks/diagnosis_check.sh kept."""
    import tarfile

    from gpuanat.core.store.history import HistoryStore
    from gpuanat.core.vocabulary.protocol import decode

    with tarfile.open(RESULTS / "history.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    with HistoryStore(tmp_path / "history.sqlite", read_only=True) as store:
        run = next(row for row in store.runs() if row.name == name)
        steps = [decode(json.dumps({**record, "type": "step", "v": 1})) for record in store.steps(run.id)]
        busy = [
            (sample["t_s"], sample["gpus"][0]["gpu_util_percent"])
            for sample in store.samples(run.id)
            if sample["gpus"] and sample["gpus"][0]["gpu_util_percent"] is not None
        ]
    return steps, busy


@pytest.mark.parametrize("name", ["vanilla", "fp16", "adafactor"])
def test_the_live_window_of_the_last_steps_reads_like_the_whole_run(tmp_path, name):
    from gpuanat.core.measure.diagnose import LIVE_WINDOW_STEPS, recent_breakdown

    steps, busy = recorded_steps_and_busy(tmp_path, name)
    assert len(steps) == 64 and all(step.phases_s is not None for step in steps)
    final = RUNS[name]["step_time_breakdown"]
    live = recent_breakdown(steps, busy)
    assert live["steps"] == LIVE_WINDOW_STEPS
    for phase, share in final["share"].items():
        assert live["share"][phase] == pytest.approx(share, abs=0.05), phase
    assert live["gpu_busy_percent"] == pytest.approx(final["gpu_busy_percent"], abs=8)
    live_findings = diagnose({"config": RUNS[name]["config"], "step_time_breakdown": live})
    assert [f.bottleneck for f in live_findings] == [VERDICTS[name]]
    assert recent_breakdown(steps[:1], busy) is None  # the first step warms up: nothing to show yet


def test_a_busy_gpu_is_gpu_bound_wherever_the_host_waits():
    # bert-large bf16 tf32 batch 136 on the H100 through the Accelerate loop, which never synchronises a step: the
    # host waited a third of each step in the data phase (its blocking copy of the batch sat behind the queued
    # kernels) while a kernel ran 98% of the time (benchmarks/results/h100/tune/engines_bs136.jsonl)
    runs = [json.loads(line) for line in (RESULTS.parent / "tune" / "engines_bs136.jsonl").read_text().splitlines()]
    accelerate = next(run for run in runs if run["config"]["engine"] == "accelerate")
    breakdown = accelerate["step_time_breakdown"]
    assert breakdown["share"]["data"] > 0.3 and breakdown["gpu_busy_percent"] > 95
    assert [finding.bottleneck for finding in diagnose(accelerate)] == ["gpu-bound", "memory-bound"]
    # the same phases on a GPU that waited: input-bound
    idle = {**accelerate, "step_time_breakdown": {**breakdown, "gpu_busy_percent": 40.0}}
    assert diagnose(idle)[0].bottleneck == "input-bound"
    assert diagnose(idle)[0].fix.startswith("--workers 2")


def test_the_eleventh_experiment_is_host_bound():
    (run,) = json.loads((RESULTS / "sweep11.json").read_text())
    assert run["name"] == "accum + gc + fp16 + 8-bit adam" and run["status"] == "ok"
    (finding,) = diagnose(run)
    assert finding.bottleneck == "host-bound" and "without --grad-checkpointing" in finding.fix


COMPILE_SPEED = RESULTS.parent / "compile_speed"


def compile_speed_runs(name: str) -> list[dict]:
    return [json.loads(line) for line in (COMPILE_SPEED / name).read_text().splitlines()]


def test_the_compiled_runs_on_the_h100_whole_model_slower_regions_not():
    """benchmarks/compile_speed_check.sh: the whole compiled model at batch 64 is one graph with no break now, and
    slower than the same run eager (the history's reference); compiled regions at 128 are four graphs, four frames,
    no recompilation, and faster: no compile finding. Each diagnosed again here from its result and its eager twin."""
    runs = compile_speed_runs("bs64_96_112.jsonl")
    eager_64 = next(r for r in runs if r["config"]["batch_size"] == 64 and not r["config"]["compile"])
    whole_64 = next(r for r in runs if r["config"]["batch_size"] == 64 and r["config"]["compile"])
    assert whole_64["compile_stats"] == {"graphs": 1, "graph_breaks": 0}
    assert [f["bottleneck"] for f in whole_64["diagnosis"]] == ["gpu-bound", "compile"]
    (finding,) = [
        f
        for f in diagnose(whole_64, eager_samples_per_second=eager_64["steady_samples_per_second"])
        if f.bottleneck == "compile"
    ]
    assert finding.evidence == "compiled it trained 250.1 samples/s, eager 302.1/s"
    assert finding.fix == "leave --compile off for this configuration"
    regions = compile_speed_runs("regions_bs128.jsonl")
    eager_128 = next(r for r in regions if r["config"]["engine"] == "accelerate" and not r["config"]["compile_regions"])
    regions_128 = next(r for r in regions if r["config"]["engine"] == "accelerate" and r["config"]["compile_regions"])
    assert regions_128["compile_stats"] == {"graphs": 4, "graph_breaks": 0, "frames": 4}
    assert [
        f.bottleneck for f in diagnose(regions_128, eager_samples_per_second=eager_128["steady_samples_per_second"])
    ] == ["gpu-bound"]
    slower = {**regions_128, "steady_samples_per_second": 300.0}
    assert [
        f.fix
        for f in diagnose(slower, eager_samples_per_second=eager_128["steady_samples_per_second"])
        if f.bottleneck == "compile"
    ] == ["leave --compile-regions off for this configuration"]


def test_a_gpu_bound_run_is_told_the_next_thing_that_helped_on_the_h100():
    """bf16 at batch 32 (gpu-bound, eager, Trainer): compiled regions first; with them, the Accelerate loop; with
    both, fused kernels or less work — the order in which the H100's bert-large gained (docs/compile.md)."""
    run = RUNS["bf16 batch 32"]

    def fix(**config):
        return diagnose({**run, "config": {**run["config"], **config}})[0].fix

    assert fix().startswith("--compile-regions")
    assert fix(compile_regions=True).startswith("--engine accelerate")
    assert fix(compile_regions=True, engine="accelerate").startswith("the GPU is busy")


def test_one_recompilation_a_frame_is_a_specialisation_more_is_a_failing_guard():
    """LoRA on llama-tiny with compiled regions (the CPU here): the RMSNorm compiles twice, once for the first layer's
    input without grad and once for the rest, 3 graphs for 2 frames: not a finding. A frame recompiled at every step
    (the probe's traced hooks did that: a guard on its counter) is."""
    run = RUNS["bf16 batch 32"]
    regions = {**run, "config": {**run["config"], "compile_regions": True}}

    def compile_findings(stats):
        return [f for f in diagnose({**regions, "compile_stats": stats}) if f.bottleneck == "compile"]

    assert compile_findings({"graphs": 3, "graph_breaks": 0, "frames": 2}) == []
    (finding,) = compile_findings({"graphs": 10, "graph_breaks": 0, "frames": 2})
    assert finding.evidence == "torch.compile met 0 graph break(s) and compiled 10 graph(s) (8 recompilation(s))"


def test_a_busy_gpu_whose_tensor_pipes_idle_says_so():
    """bert-large bf16 at batch 64 through gpuanat on the H100 (benchmarks/results/h100/gpm/bert.json), with the tensor
    pipes' and DRAM's activity an independent GPM sampler read over the run (benchmarks/results/h100/gpm/
    independent.jsonl, the run's window: medians 27.3% and 44.2%)."""
    lines = (RESULTS.parent / "gpm" / "bert.json").read_text().splitlines()
    run = json.loads([line for line in lines if line.startswith("{")][-1])
    (finding,) = [f for f in diagnose(run) if f.bottleneck == "gpu-bound"]
    assert "tensor" not in finding.evidence  # recorded before the result carried GPM's readings
    run.update(tensor_active_percent=27.3, dram_bandwidth_percent=44.2)
    (finding,) = [f for f in diagnose(run) if f.bottleneck == "gpu-bound"]
    busy = run["step_time_breakdown"]["gpu_busy_percent"]
    assert finding.evidence.startswith(f"the GPU was busy {busy:.0f}% of the time but its tensor pipes only 27%")
    assert "DRAM bandwidth 44%" in finding.evidence
    run.update(tensor_active_percent=93.6)  # a GEMM-bound step's
    (finding,) = [f for f in diagnose(run) if f.bottleneck == "gpu-bound"]
    assert "the tensor pipes 94%" in finding.evidence


def test_a_gpu_held_down_by_its_power_cap_is_named_with_its_fix():
    """The bert-large run above with the clocks of two runs on the H100 x2 (benchmarks/results/h100x2/gpm_same_steps/):
    the GEMM loop held at 1,395 of 1,980 MHz by its power cap is named; bert-large bf16 at batch 64, whose power cap
    reason was set in every sample with its clock at 1,965 MHz, is not (no loss worth naming)."""
    lines = (RESULTS.parent / "gpm" / "bert.json").read_text().splitlines()
    run = json.loads([line for line in lines if line.startswith("{")][-1])
    assert not [f for f in diagnose(run) if f.bottleneck == "throttled"]  # recorded without the clocks
    run.update(
        throttled_percent=100.0,
        throttle_reasons={"software power cap": 100.0},
        sm_clock_mhz=1395.0,
        max_sm_clock_mhz=1980.0,
        average_power_w=696.1,
    )
    (finding,) = [f for f in diagnose(run) if f.bottleneck == "throttled"]
    assert finding.evidence == (
        "the GPU's clocks were held down by its software power cap in 100% of the steady steps' samples; "
        "SM clock median 1,395 MHz of its 1,980, 696 W"
    )
    assert "nvidia-smi -q -d POWER" in finding.fix
    run.update(sm_clock_mhz=1965.0, average_power_w=654.9)  # bert-large's own clocks: the reason set, no loss
    assert not [f for f in diagnose(run) if f.bottleneck == "throttled"]
    run.update(
        sm_clock_mhz=1500.0,
        throttled_percent=30.0,
        throttle_reasons={"hardware thermal slowdown": 25.0, "software power cap": 5.0},
    )
    (finding,) = [f for f in diagnose(run) if f.bottleneck == "throttled"]
    assert "by its hardware thermal slowdown in 25%" in finding.evidence
    assert "(also: software power cap)" in finding.evidence
    assert "too hot" in finding.fix
    run.update(throttled_percent=diagnosis.THROTTLED_PERCENT - 1)  # a few samples: clocks mostly free
    assert not [f for f in diagnose(run) if f.bottleneck == "throttled"]
