"""A run's result, typed: what `gpuanat run --json` prints, the history stores and every room reads.

`RunResult` is the whole run's (its top level is rank 0's memory and bands; samples and rates are every rank's);
`RankResult` one rank's; `Bands` the memory bands of one moment; `RunError` what ended a failed run; `Prediction`
the memory predicted before the run. Each reads and writes its JSON object byte for byte (`JsonRecord`): results
written by older versions, with keys missing or no longer written, read and write back unchanged.

The parts that stay open JSON — a run's config (`RunConfig.to_json`), the versions, why a value is missing, the
step time's breakdown, the diagnosis, where the wall time went — are plain mappings.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuanat.core.vocabulary.json_record import JsonRecord, record_or_as_is, records_or_as_is


@dataclass
class Bands(JsonRecord):
    """GPU memory at one moment (the end of the forward pass of the probe's last measured step) in bands that add up
    to what NVML reports as used; a band that cannot be measured is None (the result's `unavailable` says why)."""

    other_processes_bytes: int | None = None
    """NVML device used minus this run's per-process use."""
    cuda_context_bytes: int | None = None
    """NVML per-process use minus torch's reserved memory: context, kernels, cuBLAS workspaces."""
    weights_bytes: int | None = None
    gradients_bytes: int | None = None
    """The gradients alive at the end of forward: those kept by accumulation."""
    optimizer_state_bytes: int | None = None
    activations_bytes: int | None = None
    temporaries_and_cache_bytes: int | None = None
    """Reserved memory not held by the tensor bands: the batch, transient buffers and the allocator's cache."""
    free_bytes: int | None = None

    def values(self) -> dict[str, int | None]:
        """The bands by name, in stack order (the bands this gpuanat writes)."""
        return {name: getattr(self, name) for name in self.default_keys()}


@dataclass
class RunError(JsonRecord):
    """What ended a run that did not finish."""

    kind: str = ""
    """`oom` | `exception` | `config` | `exited` (a rank that died without a word) | `interrupted` (the recorder
    stopped first)."""
    message: str = ""
    step: int | None = None
    """The step it happened in, when known."""
    flag: str | None = None
    """The command-line flag a config error is about."""


EXITED_ERROR_KEYS = ("kind", "flag", "step", "message")
"""The error of a training process that exited without finishing, as written."""
RANK_ERROR_KEYS = ("kind", "message", "step")
"""The error in a rank's entry, as written."""


@dataclass
class Prediction(JsonRecord):
    """One rank's memory predicted before the run from the model's shape and the techniques (`memory.predict`)."""

    weights_bytes: int | None = None
    gradients_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    activations_bytes: int | None = None
    """As the probe reports them: allocated at the end of forward minus the other tensor bands and the batch."""
    gradients_at_forward_end_bytes: int | None = None
    """Gradients alive at the end of forward: all of them when accumulating, else none."""
    temporaries_bytes: int | None = None
    """Transient memory of the backward pass above what is alive at the end of forward."""
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    cuda_context_bytes: int | None = None
    communication_buffers_bytes: int | None = None
    """Kept all run long by a distributed wrapper (DDP's gradient buckets)."""
    ddp_first_buckets_bytes: int | None = None
    peak_device_bytes: int | None = None
    """Allocator reservation plus the CUDA context at the peak."""
    ranks: int | None = None
    logits_bytes: int | None = None
    confidence: str | None = None
    """`checked` (measurements held the model for this configuration) or `unchecked`."""
    caveat: str | None = None
    """What no measurement has checked; None when `confidence` is checked."""
    seq_len: int | None = None
    """The sequence length predicted at where it is not --seq-len: a --data run's longest batch
    (`memory.data_length`); None, and not written, at --seq-len."""

    @classmethod
    def default_keys(cls) -> tuple[str, ...]:
        """`seq_len` is written once set: a prediction at --seq-len writes the keys it always wrote."""
        return tuple(key for key in super().default_keys() if key != "seq_len")


@dataclass
class RankResult(JsonRecord):
    """One rank's entry in a result's `ranks`: its process, its status and its GPU's memory."""

    rank: int = 0
    pid: int | None = None
    gpu_index: int | None = None
    """NVML index of its GPU; None when unknown."""
    status: str | None = None
    samples: int | None = None
    steady_samples_per_second: float | None = None
    gradients_after_backward_bytes: int | None = None
    """The gradients' own maximum, after backward: beside the bands, not in them."""
    error: RunError | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_memory_used_bytes: int | None = None
    process_memory_used_bytes: int | None = None
    device_memory_total_bytes: int | None = None
    bands: Bands | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    """Name of a value that is None -> why."""

    DECODERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "error": record_or_as_is(RunError),
        "bands": record_or_as_is(Bands),
    }


RUN_RESULT_KEYS = (
    *("run_id", "name", "status", "config", "params", "trainable_params", "train_runtime_s", "samples_per_second"),
    *("steady_samples_per_second", "tokens_per_second", "steady_tokens_per_second", "flops_per_sample"),
    *("achieved_tflops", "peak_tflops", "mfu", "logits_bytes", "warmup_steps", "steps", "samples", "train_loss"),
    *("probe_time_s", "probe_time_by_part_s", "probe_cost_percent", "peak_allocated_bytes", "peak_reserved_bytes"),
    *("device_memory_used_bytes", "process_memory_used_bytes", "device_memory_total_bytes", "bands", "device"),
    *("device_name", "gpu_name", "gpus", "versions", "gradients_after_backward_bytes", "unavailable", "error"),
    *("exit_code", "log_error", "log_path", "malformed_events", "ranks", "predicted", "prediction_error_percent"),
    *("step_time_breakdown", "compile_stats", "operations_anatomy", "diagnosis", "wall_breakdown_s"),
    "time_to_first_step_s",
    *("modules", "out_of_memory"),
    *("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent"),
    *("average_power_w", "energy_joules", "joules_per_sample", "joules_per_token"),
    *("sm_clock_mhz", "max_sm_clock_mhz", "throttled_percent", "throttle_reasons"),
    *("final_loss", "min_loss", "loss_curve"),
    *("padding_percent", "real_tokens_per_second", "steady_real_tokens_per_second", "length_histogram"),
)
"""The keys of a launched run's result (`measure.result.build_result`), in order; the session adds `start` and
`history_error` after them."""


@dataclass
class RunResult(JsonRecord):
    """A run's result: the JSON contract of `gpuanat run --json`. The top level is rank 0's (its memory, its bands);
    samples and steady samples/s are the whole run's; `ranks` has one entry per rank. A watched run's and an
    interrupted run's results carry fewer keys (`json_keys`)."""

    run_id: int | None = None
    name: str | None = None
    kind: str | None = None
    """A watched run's: what was watched (`watch.loop_kind`)."""
    status: str | None = None
    """`ok` | `oom` | `failed` | `stopped` | `interrupted`; a watched run's `ok` | `exited` | `detached`."""
    config: dict[str, Any] = field(default_factory=dict)
    """The run's configuration (`RunConfig.to_json`; a watched run's: what the probe reported, or the command)."""
    params: int | None = None
    trainable_params: int | None = None
    train_runtime_s: float | None = None
    samples_per_second: float | None = None
    """HF's rate: samples over the whole training time, warm-up included."""
    steady_samples_per_second: float | None = None
    """After warm-up, every rank's summed."""
    tokens_per_second: float | None = None
    steady_tokens_per_second: float | None = None
    flops_per_sample: float | None = None
    """Model FLOPs: 6 × matmul weights + attention, a token, times the sequence length."""
    achieved_tflops: float | None = None
    peak_tflops: float | None = None
    """The GPUs' dense peak."""
    mfu: float | None = None
    """Model FLOPs utilization: achieved over peak TFLOPS, 0..1."""
    logits_bytes: int | None = None
    warmup_steps: int | None = None
    steps: int | None = None
    samples: int | None = None
    train_loss: float | None = None
    probe_time_s: float | None = None
    probe_time_by_part_s: dict[str, float] | None = None
    probe_cost_percent: float | None = None
    """The probe's work in the training steps as a share of the training time without it."""
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_memory_used_bytes: int | None = None
    """NVML's peak device used on rank 0's GPU."""
    process_memory_used_bytes: int | None = None
    device_memory_total_bytes: int | None = None
    peak_rss_bytes: int | None = None
    """A watched run's: the process tree's peak resident memory."""
    peak_cpu_percent: float | None = None
    bands: Bands | None = None
    device: str | None = None
    device_name: str | None = None
    gpu_name: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    """The GPUs the run was given (`GpuChoice`)."""
    versions: dict[str, str] = field(default_factory=dict)
    gradients_after_backward_bytes: int | None = None
    """The gradients' own maximum, after backward: beside the bands, not in them."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """Name of a value that is None -> why."""
    published: bool | None = None
    """A watched run's: whether its probe published its events."""
    watched_s: float | None = None
    pid_namespace_note: str | None = None
    error: RunError | None = None
    exit_code: int | None = None
    log_error: str | None = None
    log_path: str | None = None
    malformed_events: int | None = None
    ranks: list[RankResult] = field(default_factory=list)
    predicted: Prediction | None = None
    prediction_error_percent: float | None = None
    """Predicted peak allocated memory against the measured one, in percent."""
    step_time_breakdown: dict[str, Any] | None = None
    compile_stats: dict[str, Any] | None = None
    operations_anatomy: dict[str, Any] | None = None
    diagnosis: list[dict[str, Any]] = field(default_factory=list)
    """Findings (`measure.diagnose.Finding.to_json`): what limits the run and what to change."""
    wall_breakdown_s: dict[str, float] | None = None
    time_to_first_step_s: float | None = None
    modules: list[dict[str, Any]] | None = None
    """Memory by module (`protocol.ModuleMemory`'s fields), rank 0's: at the peak of its last measured step, or at
    the failing allocation of an out-of-memory run; its top modules, "(the rest)" and "(no module)"."""
    out_of_memory: dict[str, Any] | None = None
    """An out-of-memory run's failing allocation (`protocol.OutOfMemory`'s fields but its bands, which are the
    failing rank's `bands`; and that `rank`): the phase, the module and line that asked, the allocation, the
    allocator's and NVML's readings then, the largest live tensors."""
    sm_active_percent: float | None = None
    """Rank 0's GPU over the steady steps (`measure.activity`): NVML GPM's median share of time its SMs were
    active; `tensor_active_percent` its tensor pipes (what "busy" means for matmuls), `dram_bandwidth_percent` its
    memory bandwidth, `sm_occupancy_percent` the warps resident."""
    sm_occupancy_percent: float | None = None
    tensor_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None
    average_power_w: float | None = None
    """From NVML's energy counter over the steady steps."""
    energy_joules: float | None = None
    """The whole run's, NVML's energy counter from the first sample to the last."""
    joules_per_sample: float | None = None
    """At the steady rate: average power over steady samples/s."""
    joules_per_token: float | None = None
    sm_clock_mhz: float | None = None
    """Rank 0's GPU over the steady steps: the SM clock's median; `max_sm_clock_mhz` the highest it runs at."""
    max_sm_clock_mhz: float | None = None
    throttled_percent: float | None = None
    """The share of the steady steps' samples in which something held the GPU's clocks down (power or thermal
    caps, hardware slowdowns: `gpm.THROTTLING_REASONS`); `throttle_reasons` that share by reason."""
    throttle_reasons: dict[str, float] | None = None
    final_loss: float | None = None
    """The last loss the loop logged (HF Trainer's: the mean over its last logging window), beside `train_loss`, the
    whole run's mean; None with its reason in `unavailable` when the loop logged none."""
    min_loss: float | None = None
    """The lowest logged loss."""
    loss_curve: list[list[float]] | None = None
    """[step, loss] of each logged loss, in step order; at most 500 points, a longer run's downsampled keeping
    each stretch's lowest and highest (`measure.loss_curve`)."""
    padding_percent: float | None = None
    """A --data run's: the share of the token positions trained that were padding (0 when packed)."""
    real_tokens_per_second: float | None = None
    """The data's own tokens a second, padding left out, over the whole training time (as samples/s)."""
    steady_real_tokens_per_second: float | None = None
    """The same at the steady samples/s."""
    length_histogram: dict[str, int] | None = None
    """The rows trained by token length: buckets up to an eighth, a quarter, half and all of --seq-len, and beyond."""
    start: dict[str, Any] | None = None
    """How the training process started (`run.warm`: prepared ahead or cold)."""
    history_error: str | None = None
    """What of the run the history could not save; None when all was saved."""

    DECODERS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "bands": record_or_as_is(Bands),
        "error": record_or_as_is(RunError),
        "ranks": records_or_as_is(RankResult),
        "predicted": record_or_as_is(Prediction),
    }

    @classmethod
    def default_keys(cls) -> tuple[str, ...]:
        return RUN_RESULT_KEYS

    @property
    def error_message(self) -> str | None:
        """The error's message; None when the run reports no error."""
        return self.error.message if self.error is not None else None
