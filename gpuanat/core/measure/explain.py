"""A recorded run explained (`gpuanat explain`): where its memory was — at the allocation that failed for a run that
ran out of memory, else at its peak — by band and by module; of an out-of-memory run, what failed, how far over
the GPU it was, how the prediction made before the run compares with what it reached, and what is predicted to
fit. What a result lacks (a run recorded by an earlier gpuanat, a probe that saw no step, a script gpuanat does not
predict) is said, with why, so an old history still explains what it has.

The stored values (bands, modules, the failure) are passed on exactly as recorded; this module only adds what is
computed from them. The command line prints it (`cli/explain.py`).

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.memory.fit_ladder import FitSuggestion, what_would_fit
from gpuanat.core.percent import percent_delta
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import Bands, Prediction, RunResult

EARLIER_GPUANAT = "recorded by an earlier gpuanat, which did not record"
"""The start of why a value is missing from a run recorded before gpuanat kept it."""
NOT_CONFIGURED = "gpuanat predicts only the runs it configures, and this one's {what} chose its own techniques"
"""Why a script's run or a watched process has no prediction and no fit suggestion."""


@dataclass(frozen=True)
class PredictionCheck:
    """The memory predicted before the run against what the run allocated."""

    predicted_peak_allocated_bytes: int
    predicted_peak_device_bytes: int | None
    """The allocator's reservation plus the CUDA context, at the predicted peak."""
    measured_bytes: int | None
    """The run's peak allocated memory. Of an out-of-memory run the least its peak would have been: what was
    allocated when it failed plus the allocation that failed (without the failure's readings, its peak so far)."""
    measured_is_a_floor: bool
    """True for a run that ran out of memory: it never reached its peak."""
    missed_bytes: int | None
    """Predicted minus measured: negative where the prediction was low. Where the measurement is a floor, a positive
    value only says that the prediction was above what the run reached before it failed."""
    missed_percent: float | None
    """`missed_bytes` as a percentage of the measured bytes."""
    why_not_measured: str | None = None
    """Why `measured_bytes` is None (a CPU run has no allocator peak)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "predicted_peak_allocated_bytes": self.predicted_peak_allocated_bytes,
            "predicted_peak_device_bytes": self.predicted_peak_device_bytes,
            "measured_bytes": self.measured_bytes,
            "measured_is_a_floor": self.measured_is_a_floor,
            "missed_bytes": self.missed_bytes,
            "missed_percent": self.missed_percent,
            "why_not_measured": self.why_not_measured,
        }


@dataclass(frozen=True)
class Explanation:
    """One recorded run explained."""

    run_id: int
    name: str | None
    kind: str
    """`launched` or `watched`."""
    status: str
    config: dict[str, Any]
    at: str
    """Which moment the bands and modules describe: `failure` (the allocation that failed) or `peak` (the last
    measured step's)."""
    bands: dict[str, int | None] | None
    """The bands by name, in stack order, as recorded; None when the result has none."""
    why_bands_missing: dict[str, str]
    """Band name -> why it is None."""
    gradients_after_backward_bytes: int | None
    modules: list[dict[str, Any]] | None
    """Memory by module as recorded: its top modules, "(the rest)" and "(no module)"."""
    out_of_memory: dict[str, Any] | None
    """The failing allocation as recorded; None for a run that did not run out of memory or did not record it."""
    over_bytes: int | None
    """How far over the GPU the failing allocation was: its size minus the device's free memory then."""
    prediction: PredictionCheck | None
    would_fit: FitSuggestion | None
    """Of an out-of-memory run that gpuanat configured: what to change."""
    missing: dict[str, str] = field(default_factory=dict)
    """What this explanation lacks (`modules`, `out_of_memory`, `prediction`, `would_fit`) -> why."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "config": self.config,
            "at": self.at,
            "bands": self.bands,
            "why_bands_missing": self.why_bands_missing,
            "gradients_after_backward_bytes": self.gradients_after_backward_bytes,
            "modules": self.modules,
            "out_of_memory": self.out_of_memory,
            "over_bytes": self.over_bytes,
            "prediction": self.prediction.to_json() if self.prediction is not None else None,
            "would_fit": self.would_fit.to_json() if self.would_fit is not None else None,
            "missing": self.missing,
        }


def explain_run(run_id: int, name: str | None, kind: str, status: str, result: RunResult) -> Explanation:
    """Run `run_id` of the history (its `name`, `kind` and `status` as the history has them) explained from its
    stored `result`."""
    missing: dict[str, str] = {}
    ran_out = status == "oom"
    failure = result.out_of_memory if isinstance(result.out_of_memory, dict) else None
    if ran_out and failure is None:
        missing["out_of_memory"] = (
            f"{EARLIER_GPUANAT} the failing allocation"
            if "out_of_memory" not in result.json_keys
            else "the run's probe did not report the allocation that failed"
        ) + "; the bands are the last measured step's"
    modules = result.modules if isinstance(result.modules, list) else None
    if modules is None:
        missing["modules"] = _why_no_modules(result)
    bands = result.bands.values() if isinstance(result.bands, Bands) else None
    configured = _configured(kind, result.config)
    prediction = _prediction_check(result, failure, ran_out)
    if prediction is None:
        missing["prediction"] = _why_no_prediction(result, configured)
    would_fit = None
    if ran_out:
        if configured is not None:
            gpu_total = result.device_memory_total_bytes or _int(failure, "device_total_bytes")
            would_fit = what_would_fit(configured, gpu_total)
        else:
            missing["would_fit"] = _not_configured(result.config)
    failed, free = _int(failure, "failed_allocation_bytes"), _int(failure, "device_free_bytes")
    return Explanation(
        run_id=run_id,
        name=name,
        kind=kind,
        status=status,
        config=result.config,
        at="failure" if failure is not None else "peak",
        bands=bands,
        why_bands_missing={
            band: result.unavailable[band]
            for band, value in (bands or dict.fromkeys(Bands.default_keys())).items()
            if value is None and band in result.unavailable
        },
        gradients_after_backward_bytes=result.gradients_after_backward_bytes,
        modules=modules,
        out_of_memory=failure,
        over_bytes=failed - free if failed is not None and free is not None else None,
        prediction=prediction,
        would_fit=would_fit,
        missing=missing,
    )


def _int(mapping: Mapping[str, Any] | None, key: str) -> int | None:
    """`mapping[key]` where it is an integer (a result from another version may hold anything)."""
    value = mapping.get(key) if mapping is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _configured(kind: str, config: Mapping[str, Any]) -> RunConfig | None:
    """The run's configuration where gpuanat configured it (not a script's, not a watched process's)."""
    if kind != "launched" or "script" in config:
        return None
    return RunConfig.from_json({key: value for key, value in config.items() if value is not None})


def _not_configured(config: Mapping[str, Any]) -> str:
    return NOT_CONFIGURED.format(what="script" if "script" in config else "process")


def _why_no_modules(result: RunResult) -> str:
    if "modules" not in result.json_keys:
        return f"{EARLIER_GPUANAT} memory by module"
    if result.config.get("compile"):
        return "the model was compiled whole (--compile): the probe follows no modules under torch.compile"
    not_measured = result.unavailable.get("activations_bytes")
    if not_measured:
        return f"no activations were measured: {not_measured}"
    return "the probe did not follow this run's modules"


def _why_no_prediction(result: RunResult, configured: RunConfig | None) -> str:
    if configured is None:
        return _not_configured(result.config)
    if "predicted" not in result.json_keys:
        return f"{EARLIER_GPUANAT} its prediction"
    if isinstance(result.predicted, Prediction) and result.predicted.caveat:  # no peak, and why (--compile)
        return f"no peak was predicted: {result.predicted.caveat}"
    return "the memory model made no prediction for this run"


def _prediction_check(result: RunResult, failure: Mapping[str, Any] | None, ran_out: bool) -> PredictionCheck | None:
    predicted = result.predicted
    if not isinstance(predicted, Prediction) or predicted.peak_allocated_bytes is None:
        return None
    allocated, failed = _int(failure, "allocated_bytes"), _int(failure, "failed_allocation_bytes")
    measured = allocated + failed if allocated is not None and failed is not None else result.peak_allocated_bytes
    return PredictionCheck(
        predicted_peak_allocated_bytes=predicted.peak_allocated_bytes,
        predicted_peak_device_bytes=predicted.peak_device_bytes,
        measured_bytes=measured,
        measured_is_a_floor=ran_out,
        missed_bytes=predicted.peak_allocated_bytes - measured if measured is not None else None,
        missed_percent=percent_delta(predicted.peak_allocated_bytes, measured),
        why_not_measured=result.unavailable.get("peak_allocated_bytes") if measured is None else None,
    )
