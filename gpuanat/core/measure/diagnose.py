"""Where each step's time goes, and what to change: the bottleneck of a run and the fix to try.

The training process times each step's phases on the host with no synchronisation (`protocol.STEP_PHASES`); the
parent adds NVML's utilization (the share of time a kernel ran) over the same steady steps. `diagnose` turns that,
the memory and the configuration into findings, each with the measured evidence and the fix to try. The rules, and
the H100 runs each was checked on: docs/diagnosis.md.

HF Trainer synchronises with the GPU once a step (it asks whether the loss is NaN before adding it up), so its host
never runs more than a step ahead and the GPU is always caught up when a step begins (`Step.gpu_caught_up` was True
at every step of every H100 run, batch 32 too): NVML's utilization is what tells a busy GPU from one that waits.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuanat.core.vocabulary.protocol import STEP_PHASES
from gpuanat.core.vocabulary.result import RunResult

INPUT_BOUND_DATA_SHARE = 0.15
"""The data wait's share of the step above which a run whose GPU is not busy is input-bound: the GPU waits for the
DataLoader (the H100 runs of the docs' experiments waited 1-6% of a step for their in-memory batches)."""
HOST_BOUND_BUSY_PERCENT = 80.0
"""A GPU on which no kernel ran a fifth of the steady steps' time or more (NVML utilization below this) waits for the
host: host-bound. On the H100 the GPU-bound runs read 87% (fp32, batch 4: 50% of FP32's peak) and 90% (bf16, batch
32); the host-bound ones 13-73%."""
OPTIMIZER_HEAVY_SHARE = 0.2
"""The optimizer step's share of a host-bound step above which the fix names the optimizer first: fused AdamW's
step took 4-8% of the H100 runs' steps, Adafactor's 48% and 8-bit Adam's 26% (a few kernels per tensor, launched from
Python)."""
MEMORY_BOUND_SHARE = 0.9
"""Reserved memory's share of the GPU above which the run is close to the limit."""
DATA_MOVEMENT_SHARE = 0.25
"""Normalizations' and element-wise operators' share of a GPU-bound run's profiled GPU time above which moving memory,
not arithmetic, is worth fixing: the paper's BERT-large spent 39% there; on the H100 bert-large's eager bf16 steps
spent 39%, fp32's 6% (docs/operations.md)."""
SCALING_EFFICIENCY_FLOOR = 0.8
"""Several GPUs: per-GPU samples/s below this share of the same run on one GPU is communication-bound."""
THROTTLED_PERCENT = 20.0
"""The share of the steady steps' samples with a throttling reason set (`result.throttled_percent`) from which the
clocks are named as a cause: a GPU held down a fifth of its steps runs those steps slower than its clocks allow."""
HELD_DOWN_CLOCK_SHARE = 0.95
"""...and only where the SM clock's steady median is below this share of the GPU's highest: on the H100 bert-large
bf16 at batch 64 had the power cap's reason set in every sample with its clock at 1,965 of 1,980 MHz (no loss worth
naming); the GEMM loop's at 1,395 MHz (benchmarks/results/h100x2/gpm_same_steps/)."""
THROTTLE_FIXES = {
    "software power cap": "the GPU draws its power limit: a step does not get faster at this power; less work a sample "
    "(bf16 weights, fused kernels) gives more samples a joule; the limit itself: `nvidia-smi -q -d POWER` (an admin "
    "may raise it with `nvidia-smi -pl`)",
    "hardware slowdown": "the board slowed itself (power supply, a hardware event): `nvidia-smi -q -d PERFORMANCE` "
    "names it; ask the box's admin",
    "hardware power brake slowdown": "the board's power brake (its supply): `nvidia-smi -q -d PERFORMANCE`; ask the "
    "box's admin",
    "software thermal slowdown": "the GPU runs too hot: its cooling and airflow (`nvidia-smi -q -d TEMPERATURE`)",
    "hardware thermal slowdown": "the GPU runs too hot: its cooling and airflow (`nvidia-smi -q -d TEMPERATURE`)",
}
"""What to try for each throttling reason (`gpm.throttle_names`)."""


@dataclass(frozen=True)
class Finding:
    bottleneck: str
    """"input-bound", "host-bound", "gpu-bound", "memory-bound", "communication-bound", "data-movement" (kernels
    that move memory more than they compute), "compile", "throttled" (the GPU's clocks held down)."""
    evidence: str
    """What was measured that says so."""
    fix: str
    """What to try."""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def step_time_breakdown(
    phases_s: Mapping[str, float] | None,
    steps: int | None,
    caught_up_steps: int | None,
    step_ends_s: Mapping[int, float],
    gpu_busy: Sequence[tuple[float, float]],
    warmup_steps: int | None,
) -> dict[str, Any] | None:
    """The result's `step_time_breakdown`: the steady steps' mean seconds a step by phase and each phase's share, the
    share of steps at which the GPU had caught up, and NVML's mean utilization over the same steps (between the end of
    the warm-up step and the last step's end on the shared monotonic clock). None without steady steps."""
    if not phases_s or not steps:
        return None
    total_s = sum(phases_s.values())
    window = (step_ends_s.get(warmup_steps or 0), max(step_ends_s.values(), default=None))
    busy = (
        [percent for t_s, percent in gpu_busy if window[0] <= t_s <= window[1]]
        if window[0] is not None and window[1] is not None
        else []
    )
    return {
        "steps": steps,
        "step_s": total_s / steps,
        "per_step_s": {phase: phases_s.get(phase, 0.0) / steps for phase in STEP_PHASES},
        "share": {phase: (phases_s.get(phase, 0.0) / total_s if total_s > 0 else 0.0) for phase in STEP_PHASES},
        "gpu_caught_up_share": None if caught_up_steps is None else caught_up_steps / steps,
        "gpu_busy_percent": sum(busy) / len(busy) if busy else None,
    }


RATE_INDEPENDENT_FIELDS = {"samples", "epochs", "max_steps", "seed"}
"""Config fields that change how long a run trains, not how fast."""
ONE_GPU_FIELDS = {"gpus": None, "distributed": "none", "nproc": 1}


def reference_rates(
    config: Mapping[str, Any], runs: Sequence[tuple[Mapping[str, Any], str, RunResult]]
) -> dict[str, float | None]:
    """From earlier runs (config, status, result), newest first: the steady samples/s of the same training on one GPU
    (`one_gpu_samples_per_second`) and without torch.compile (`eager_samples_per_second`), for `diagnose`."""

    def same(other: Mapping[str, Any], changed: Mapping[str, Any]) -> bool:
        keys = (set(config) | set(other)) - RATE_INDEPENDENT_FIELDS
        return all(other.get(key) == changed.get(key, config.get(key)) for key in keys)

    def newest(changed: Mapping[str, Any]) -> float | None:
        return next(
            (
                result.steady_samples_per_second
                for other, status, result in runs
                if status == "ok" and result.steady_samples_per_second and same(other, changed)
            ),
            None,
        )

    several = (config.get("gpus") not in (None, "1")) or (config.get("nproc") or 1) > 1
    return {
        "one_gpu_samples_per_second": newest(ONE_GPU_FIELDS) if several else None,
        "eager_samples_per_second": (
            newest({"compile": False, "compile_regions": False})
            if config.get("compile") or config.get("compile_regions")
            else None
        ),
    }


LIVE_WINDOW_STEPS = 20
"""The dashboard's live breakdown and diagnosis: over this many latest steps (after the first, which warms up)."""


def recent_breakdown(
    steps: Sequence[Any], gpu_busy: Sequence[tuple[float, float]], window_steps: int = LIVE_WINDOW_STEPS
) -> dict[str, Any] | None:
    """`step_time_breakdown` of the latest `window_steps` steps (`protocol.Step`s with their phases), with NVML's
    utilization since the step before them ended: the dashboard's live strip. None before two steps have ended."""
    timed = [step for step in steps if step.phases_s is not None and step.step > 1][-window_steps:]
    if not timed:
        return None
    phases = {phase: sum(step.phases_s.get(phase, 0.0) for step in timed) for phase in STEP_PHASES}
    caught_up = [step.gpu_caught_up for step in timed if step.gpu_caught_up is not None]
    ends = {step.step: step.monotonic_s for step in steps if step.monotonic_s is not None}
    first = timed[0].step - 1
    start_s = ends.get(first)
    # the dashboard keeps minutes of samples: at each step, only the window's are read (newest first, time-ordered)
    recent = (
        [] if start_s is None else list(itertools.takewhile(lambda sample: sample[0] >= start_s, reversed(gpu_busy)))
    )
    return step_time_breakdown(
        phases, len(timed), sum(caught_up) if caught_up else None, ends, recent, first if start_s is not None else None
    )


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def diagnose(
    result: RunResult,
    *,
    one_gpu_samples_per_second: float | None = None,
    eager_samples_per_second: float | None = None,
) -> list[Finding]:
    """The findings for a run's result (its config, memory and `step_time_breakdown`), the main bottleneck first.
    `one_gpu_samples_per_second`: the same run on one GPU (several GPUs' scaling); `eager_samples_per_second`: the same
    run without torch.compile. Both from the history when it has them."""
    findings: list[Finding] = []
    config = result.config or {}
    breakdown = result.step_time_breakdown
    if breakdown:
        findings.extend(_time_findings(config, breakdown, result))
    findings.extend(_throttle_findings(result))
    total = result.device_memory_total_bytes
    reserved = result.peak_reserved_bytes
    if result.status == "oom" and config.get("device") == "cpu":  # bitsandbytes and the CUDA allocator: GPU only
        findings.insert(
            0,
            Finding(
                "memory-bound",
                "the run ran out of host memory (RAM)",
                "--grad-checkpointing, a smaller --batch-size with --grad-accum to keep the effective batch",
            ),
        )
    elif result.status == "oom":
        findings.insert(
            0,
            Finding(
                "memory-bound",
                "the run ran out of GPU memory",
                "--grad-checkpointing, --optim adamw_bnb_8bit, a smaller --batch-size with "
                "--grad-accum to keep the effective batch, --expandable-segments",
            ),
        )
    elif total and reserved and reserved / total >= MEMORY_BOUND_SHARE:
        findings.append(
            Finding(
                "memory-bound",
                f"reserved memory peaked at {_percent(reserved / total)} of the GPU",
                "little room left: --grad-checkpointing or --optim adamw_bnb_8bit frees memory; "
                "--expandable-segments cuts the allocator's fragmentation",
            )
        )
    samples_per_second = result.steady_samples_per_second
    ranks = len(result.ranks or []) or 1
    if ranks > 1 and samples_per_second and one_gpu_samples_per_second:
        efficiency = samples_per_second / ranks / one_gpu_samples_per_second
        if efficiency < SCALING_EFFICIENCY_FLOOR:
            on_gpus = config.get("device", "cuda") == "cuda"  # the CPU's ranks are processes (gloo), not GPUs
            trained_on, one = (f"{ranks} GPUs", "one GPU") if on_gpus else (f"{ranks} CPU ranks", "one rank")
            findings.insert(
                0,
                Finding(
                    "communication-bound",
                    f"{trained_on} trained {samples_per_second:.1f} samples/s, {_percent(efficiency)} of {ranks} × "
                    f"the {one_gpu_samples_per_second:.1f}/s of {one}",
                    "a larger --batch-size or --grad-accum (fewer gradient exchanges a sample); FSDP/ZeRO only when "
                    "memory needs them",
                ),
            )
    if any(finding.bottleneck == "gpu-bound" for finding in findings):
        findings.extend(_data_movement_findings(config, result.operations_anatomy))
    compile_stats = result.compile_stats
    if config.get("compile") or config.get("compile_regions"):
        flag = "--compile" if config.get("compile") else "--compile-regions"
        findings.extend(_compile_findings(compile_stats, samples_per_second, eager_samples_per_second, flag))
    return findings


def _time_findings(config: Mapping[str, Any], breakdown: Mapping[str, Any], result: RunResult) -> list[Finding]:
    share = breakdown["share"]
    busy = breakdown.get("gpu_busy_percent")
    busy_text = f"; NVML: a kernel ran {busy:.0f}% of the time" if busy is not None else ""
    # Input-bound only while the GPU waits: a host that waits in the data phase for a busy GPU (a blocking copy of
    # the batch to the device, behind the queued kernels: the Accelerate loop at 98% busy) is not waiting for data.
    if share["data"] >= INPUT_BOUND_DATA_SHARE and (busy is None or busy < HOST_BOUND_BUSY_PERCENT):
        workers = config.get("workers") or 0
        return [
            Finding(
                "input-bound",
                f"waiting for the next batch took {_percent(share['data'])} of each step" + busy_text,
                f"--workers {max(2, 2 * workers)}"
                + ("" if config.get("pin_memory") else " --pin-memory")
                + ": the DataLoader prepares batches in parallel with the step",
            )
        ]
    if busy is None:  # no NVML (or the CPU): nothing says whether the GPU waited
        return []
    if busy < HOST_BOUND_BUSY_PERCENT:
        evidence = (
            f"no kernel ran on the GPU {100 - busy:.0f}% of the time (NVML), while waiting for batches took "
            f"{_percent(share['data'])}"
        )
        if share["optimizer"] >= OPTIMIZER_HEAVY_SHARE:
            return [
                Finding(
                    "host-bound",
                    evidence + f"; the optimizer step took {_percent(share['optimizer'])} of each step",
                    f"{config.get('optim')} steps each tensor with kernels launched from Python: "
                    "adamw_torch_fused does all of them in a few (if its 12 bytes a parameter fit), then a "
                    "larger --batch-size",
                )
            ]
        fix = (
            "a larger --batch-size (more work a kernel launch)"
            if (config.get("batch_size") or 0) < 64
            else "fewer, larger kernels: torch.compile, fused kernels"
        )
        if config.get("grad_checkpointing"):
            fix += "; without --grad-checkpointing if memory allows (it runs the forward twice)"
        return [Finding("host-bound", evidence, fix)]
    mfu = result.mfu
    mfu_text = f"; MFU {_percent(mfu)}" if mfu is not None else ""
    if config.get("precision") == "fp32" and not config.get("tf32"):
        fix = "--precision bf16 or --tf32 computes on the tensor cores"
    elif not (config.get("compile_regions") or config.get("compile")):
        fix = "--compile-regions fuses the small kernels around attention (+8-10% on the H100's bert-large)"
    elif config.get("engine", "trainer") == "trainer" and (config.get("distributed") or "none") in ("none", "ddp"):
        fix = "--engine accelerate: a loop that does not synchronise every step as Trainer does"
    else:
        fix = "the GPU is busy: fused kernels (Liger for decoders), or less work a sample (--seq-len)"
    return [Finding("gpu-bound", _busy_evidence(busy, result) + mfu_text, fix)]


def _throttle_findings(result: RunResult) -> list[Finding]:
    """Clocks held down over the steady steps (`THROTTLED_PERCENT`): the reason set most often, and its fix."""
    share, reasons = result.throttled_percent, result.throttle_reasons or {}
    clock, highest, power = result.sm_clock_mhz, result.max_sm_clock_mhz, result.average_power_w
    if share is None or share < THROTTLED_PERCENT or not reasons:
        return []
    if clock is not None and highest and clock >= HELD_DOWN_CLOCK_SHARE * highest:
        return []
    reason, reason_share = max(reasons.items(), key=lambda item: item[1])
    clock_text = ""
    if clock is not None:
        clock_text = f"SM clock median {clock:,.0f} MHz" + (f" of its {highest:,.0f}" if highest else "")
    readings = ", ".join(text for text in (clock_text, f"{power:.0f} W" if power is not None else "") if text)
    others = [name for name in reasons if name != reason]
    evidence = (
        f"the GPU's clocks were held down by its {reason} in {reason_share:.0f}% of the steady steps' samples"
        + (f" (also: {', '.join(others)})" if others else "")
        + (f"; {readings}" if readings else "")
    )
    return [Finding("throttled", evidence, THROTTLE_FIXES.get(reason, "`nvidia-smi -q -d PERFORMANCE` names it"))]


TENSOR_IDLE_PERCENT = 50.0
"""Below this share of time with the tensor pipes active, a busy GPU is said to be busy with other work: on the H100
bert-large bf16 at batch 64 read 94.5% busy with the tensor pipes active 30% (benchmarks/results/h100/gpm/)."""


def _busy_evidence(busy: float, result: RunResult) -> str:
    """How busy the GPU was: NVML's utilization (a kernel ran) and, where GPM read them, its tensor pipes and DRAM."""
    tensor, dram = result.tensor_active_percent, result.dram_bandwidth_percent
    if tensor is None:
        return f"a kernel ran {busy:.0f}% of the time"
    dram_text = f", DRAM bandwidth {dram:.0f}%" if dram is not None else ""
    if tensor < TENSOR_IDLE_PERCENT:
        return f"the GPU was busy {busy:.0f}% of the time but its tensor pipes only {tensor:.0f}%{dram_text}"
    return f"a kernel ran {busy:.0f}% of the time, the tensor pipes {tensor:.0f}%{dram_text}"


def _data_movement_findings(config: Mapping[str, Any], anatomy: Any) -> list[Finding]:
    """A GPU-bound run whose profiled kernels spent a large share moving memory (normalizations, element-wise): the
    fusing techniques it does not use yet."""
    from gpuanat.core.operations.anatomy import group_share, memory_bound_share

    share = memory_bound_share(anatomy)
    if share is None or share < DATA_MOVEMENT_SHARE:
        return []
    groups = ("normalizations", "elementwise")
    flops = [flop for group in groups if (flop := group_share(anatomy, group, "flop_share")) is not None]
    flop_text = f" for {100 * sum(flops):.2f}% of the FLOPs" if len(flops) == len(groups) else ""
    fixes = []
    if config.get("attn") == "eager":
        fixes.append("--attn sdpa (the softmax fused into attention's kernel)")
    if not (config.get("compile") or config.get("compile_regions")):
        fixes.append("--compile-regions (the element-wise and normalization kernels around attention fused)")
    if _causal_lm(config) and not config.get("liger_layers"):
        fixes.append("--liger --liger-layers (fused RMSNorm, SwiGLU, RoPE and loss)")
    if config.get("precision") == "fp32":
        fixes.append("--precision bf16 (half the bytes a value)")
    return [
        Finding(
            "data-movement",
            f"normalizations and element-wise operators took {_percent(share)} of the profiled GPU time{flop_text}",
            "; ".join(fixes) if fixes else "the fusing techniques gpuanat has are on: this is what is left",
        )
    ]


def _causal_lm(config: Mapping[str, Any]) -> bool:
    from gpuanat.core.memory.model_config import trains_causal_lm
    from gpuanat.core.vocabulary.config import RunConfig

    try:
        return trains_causal_lm(RunConfig.from_json({key: value for key, value in config.items() if value is not None}))
    except (TypeError, ValueError, KeyError, OSError):
        return False


def _compile_findings(
    stats: Mapping[str, int] | None, compiled_rate: float | None, eager_rate: float | None, flag: str
) -> list[Finding]:
    findings = []
    if stats:
        graphs, breaks, frames = stats.get("graphs", 0), stats.get("graph_breaks", 0), stats.get("frames", 1)
        recompiles = max(0, graphs - breaks - frames)
        # One recompilation a frame is Dynamo specialising once (LoRA's first layer gets hidden states without
        # grad, the others with); more is a guard that keeps failing, each time a compilation.
        if breaks or recompiles > frames:
            findings.append(
                Finding(
                    "compile",
                    f"torch.compile met {breaks} graph break(s) and compiled {graphs} "
                    f"graph(s) ({recompiles} recompilation(s))",
                    "each break runs eagerly between graphs: TORCH_LOGS=graph_breaks names them",
                )
            )
    if compiled_rate and eager_rate and compiled_rate < eager_rate:
        findings.append(
            Finding(
                "compile",
                f"compiled it trained {compiled_rate:.1f} samples/s, eager {eager_rate:.1f}/s",
                f"leave {flag} off for this configuration",
            )
        )
    return findings


def diagnosis_line(findings: Sequence[Finding]) -> str | None:
    """ "host-bound — the GPU had finished …; try: a larger --batch-size …" for the first finding; None if none."""
    if not findings:
        return None
    first = findings[0]
    return f"{first.bottleneck} — {first.evidence}; try: {first.fix}"


def breakdown_line(breakdown: Mapping[str, Any] | None) -> str | None:
    """ "data 1%, forward 30%, backward 52%, optimizer 15%, gpu wait 2% of 84.1 ms a step" for the summary."""
    if not breakdown:
        return None
    parts = ", ".join(f"{phase} {_percent(breakdown['share'][phase])}" for phase in STEP_PHASES)
    return f"{parts} of {1000 * breakdown['step_s']:.1f} ms a step"
