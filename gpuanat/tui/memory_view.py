"""What the launching dashboard's memory bar and GPU lanes show, painted on the event loop.

Beside the configured run's predicted bands (`show_predicted`), the bar shows the measured ones: of the run in
progress (`show_live`, from its `LiveRun`; a lane per rank), else of the last run (`show_result`), else the GPU as it
is before any run (`show_idle`). The app calls these at its paint tick and when the configuration changes.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuanat.core.measure.anatomy import gradients_after_backward_bytes, stack_total_bytes
from gpuanat.core.measure.live_run import LiveRun, trainable_weights_bytes
from gpuanat.core.measure.samples import GpuSample, Sample
from gpuanat.core.memory.model_config import architecture_of
from gpuanat.core.memory.predict import MemoryEstimate, peak_reserved_bytes
from gpuanat.core.memory.shapes import lora_shapes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.widgets.gpu_lanes import Lane
from gpuanat.tui.widgets.memory_bar import MemoryBar


class MemoryView:
    """The memory bar, and the lanes through `show_lanes` (which fits the bar's legend to them)."""

    def __init__(self, memory_bar: MemoryBar, show_lanes: Callable[[list[Lane]], None]) -> None:
        self._memory_bar = memory_bar
        self._show_lanes = show_lanes
        self._predicted_logits_bytes: int | None = None
        self._predicted_trainable_bytes: int | None = None
        """The configured run's adapters (fp32), computed when the configuration changes, not at each paint."""
        self._predicted_gradients_bytes: int | None = None
        self._measured_gradients_bytes: int | None = None

    def show_predicted(
        self,
        config: RunConfig,
        estimate: MemoryEstimate | None,
        context: int,
        gpu_total_bytes: int | None,
        compact: bool,
    ) -> None:
        """The configured run's predicted bands (none in the compact layout), with `context` bytes of CUDA context."""
        self._predicted_logits_bytes = estimate.logits_bytes if estimate is not None and not compact else None
        self._predicted_trainable_bytes = (
            4 * lora_shapes(architecture_of(config), config).params
            if config.lora and estimate is not None and not compact
            else None
        )
        now, peak, _ = self._memory_bar.logits
        self._show_logits(now, peak)
        self._show_trainable(self._memory_bar.trainable[0])  # what was measured stays
        self._predicted_gradients_bytes = estimate.gradients_bytes if estimate is not None and not compact else None
        self._show_gradients_after_backward(self._measured_gradients_bytes)
        if estimate is None or compact:
            self._memory_bar.update_predicted(None)
        else:
            on_gpu = config.device == "cuda"  # the activation model is of CUDA memory; none on the CPU
            tensors = (
                estimate.weights_bytes
                + estimate.optimizer_state_bytes
                + estimate.activations_bytes
                + estimate.gradients_at_peak_bytes
            )
            self._memory_bar.update_predicted(
                {
                    "weights_bytes": estimate.weights_bytes,
                    "optimizer_state_bytes": estimate.optimizer_state_bytes,
                    "activations_bytes": estimate.activations_bytes if on_gpu else None,
                    "gradients_bytes": estimate.gradients_at_peak_bytes,
                    # once the peak has passed, torch keeps what it reserved for it: at every later forward pass's end
                    # the rest of the reserve beside these tensors (so the bands add up to the predicted device memory)
                    "temporaries_and_cache_bytes": peak_reserved_bytes(estimate) - tensors if on_gpu else None,
                    "cuda_context_bytes": context if config.device == "cuda" else None,
                },
                gpu_total_bytes,
            )

    def _show_logits(self, now: int | None, peak: int | None) -> None:
        """The logits row under the activations: measured, and predicted for the configured run."""
        self._memory_bar.update_logits(now, peak, self._predicted_logits_bytes)

    def _show_gradients_after_backward(self, measured: int | None) -> None:
        """The gradients' size after backward beside their band (another moment than the bars'): measured, and the
        configured run's as predicted."""
        self._measured_gradients_bytes = measured
        self._memory_bar.update_gradients_after_backward(measured, self._predicted_gradients_bytes)

    def _show_trainable(self, measured: int | None) -> None:
        """The weights that train, where the rest is frozen (`trainable_weights_bytes`), and the configured run's
        adapters as predicted."""
        self._memory_bar.update_trainable(measured, self._predicted_trainable_bytes)

    def show_moment(self, *, at_failure: bool) -> None:
        """Whether the measured bands are of an out-of-memory failure's allocation rather than a forward pass's end."""
        self._memory_bar.show_moment(at_failure)

    def show_idle(self, sample: Sample) -> None:
        gpu = sample.gpus[0]
        self._show_lanes([])
        free = gpu.total_bytes - gpu.used_bytes if gpu.total_bytes is not None and gpu.used_bytes is not None else None
        self._memory_bar.update_bands(
            {"other_processes_bytes": gpu.used_bytes, "free_bytes": free}, None, gpu.total_bytes, {}
        )

    def show_live(self, live: LiveRun, sample: Sample | None, gpu_index: int | None) -> None:
        """The run in progress: rank 0's bands on GPU `gpu_index` of `sample`, now and at the peak; a lane per rank."""
        gpu, values, unavailable = live.rank_bands(0, sample, gpu_index)
        lanes = []
        for rank, index in enumerate(live.gpu_indices):
            rank_gpu, rank_values, _ = live.rank_bands(rank, sample, index)
            reading = rank_gpu or GpuSample(index, "", None, None, None, None, None, None, None, ())
            lanes.append(
                Lane(
                    index,
                    rank,
                    rank_values,
                    reading.used_bytes,
                    reading.total_bytes,
                    reading.gpu_util_percent,
                    reading.tensor_active_percent,
                )
            )
        self._show_lanes(lanes)
        # without a sample of the GPU (a failure's readings are its probe's) the bands that add up to it say it
        live.observe_peak(values, gpu.used_bytes if gpu else stack_total_bytes(values))
        self._memory_bar.update_bands(values, live.peak_bands, gpu.total_bytes if gpu else None, unavailable)
        logits = live.probe_bands.logits_bytes if live.probe_bands else None
        self._show_logits(logits, logits)
        self._show_trainable(
            trainable_weights_bytes(live.model.params, live.model.trainable_params) if live.model else None
        )
        self._show_gradients_after_backward(gradients_after_backward_bytes(live.probe_bands))

    def show_result(self, result: RunResult) -> None:
        # The bands are one moment's, the end of forward (only accumulated gradients are alive then).
        bands = result.bands.values() if result.bands is not None else {}
        self._memory_bar.update_bands(bands, bands, result.device_memory_total_bytes, result.unavailable)
        self._show_logits(result.logits_bytes, result.logits_bytes)
        self._show_trainable(trainable_weights_bytes(result.params, result.trainable_params))
        self._show_gradients_after_backward(result.gradients_after_backward_bytes)
        self._show_lanes(
            [
                Lane(
                    rank.gpu_index,
                    rank.rank,
                    rank.bands.values() if rank.bands is not None else {},
                    rank.device_memory_used_bytes,
                    rank.device_memory_total_bytes,
                    None,
                )
                for rank in result.ranks or []
                if rank.gpu_index is not None
            ]
        )
