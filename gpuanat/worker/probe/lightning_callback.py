"""The probe's adapter for PyTorch Lightning: `LightningAnatomyCallback`, a Lightning `Callback` that calls the
framework-free `Probe` (`core`) from Lightning's hooks:

    trainer = lightning.Trainer(callbacks=[gpuanat.probe.LightningAnatomyCallback()])

Lightning runs the forward pass inside `training_step`, which need not call the module's own `forward`, so the probe
sets no forward hooks: the forward pass begins at `on_train_batch_start` (the batch is on the device) and ends at
`on_before_backward` (the loss is computed); the gradients are complete at `on_before_optimizer_step`, and a step
ends at the `on_train_batch_end` whose optimizer step advanced `global_step` (with `accumulate_grad_batches` the
others are its micro-batches). Built on whichever of `lightning` and `pytorch_lightning` is installed — both, when
both are, so either's `Trainer` takes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpuanat.core.vocabulary.protocol import Event
from gpuanat.worker.probe.core import Probe
from gpuanat.worker.probe.loop_inputs import batch_tensors


def _lightning_bases() -> tuple[tuple[type, ...], dict[str, str]]:
    """Lightning's `Callback` classes that are installed, and their packages' versions."""
    bases: list[type] = []
    versions: dict[str, str] = {}
    try:
        import lightning
        from lightning.pytorch import Callback

        bases.append(Callback)
        versions["lightning"] = lightning.__version__
    except ImportError:
        pass
    try:
        import pytorch_lightning
        from pytorch_lightning import Callback as LegacyCallback

        if LegacyCallback not in bases:
            bases.append(LegacyCallback)
            # (pytorch_lightning defines __version__ but leaves it out of its __all__)
            versions["pytorch_lightning"] = pytorch_lightning.__version__  # type: ignore[attr-defined]
    except ImportError:
        pass
    if not bases:
        raise ImportError(
            "gpuanat's LightningAnatomyCallback needs PyTorch Lightning: pip install lightning (or pytorch-lightning)"
        )
    return tuple(bases), versions


_CALLBACK_BASES, LIGHTNING_VERSIONS = _lightning_bases()


def _total_steps(trainer: Any) -> int | None:
    """The optimizer steps the fit will run, when Lightning can tell."""
    try:
        estimated = trainer.estimated_stepping_batches
    except Exception:  # Lightning raises when it cannot estimate (an iterable without a length)
        return None
    return int(estimated) if isinstance(estimated, (int, float)) and math.isfinite(estimated) else None


def _training_config(trainer: Any, module: Any, device: Any, total_steps: int | None) -> dict[str, Any]:
    """What a Lightning run is, in RunConfig's terms, as far as its Trainer tells."""
    optimizers = list(getattr(trainer, "optimizers", None) or [])
    inner = getattr(module, "model", None)
    model_config = getattr(inner, "config", None) or getattr(module, "config", None)
    return {
        "loop": "lightning",
        "model": getattr(model_config, "_name_or_path", None) or type(module).__name__,
        "device": device.type,
        "precision": str(getattr(trainer, "precision", None)),
        "grad_accum": getattr(trainer, "accumulate_grad_batches", None),
        "optim": type(optimizers[0]).__name__ if optimizers else None,
        "attn": getattr(model_config, "_attn_implementation", None),
        "max_steps": total_steps,
    }


def _logged_metrics(trainer: Any) -> dict[str, Any]:
    """The learning rate and gradients' norm Lightning has: a metric the module or `LearningRateMonitor` logged
    (`lr-…`, "learning_rate"), else the first optimizer's first group's; `grad_norm` utilities' total ("grad_norm",
    "grad_2.0_norm_total")."""
    metrics = dict(getattr(trainer, "callback_metrics", None) or {})
    learning_rate = next(
        (value for key, value in metrics.items() if key == "learning_rate" or key.startswith("lr-")), None
    )
    if learning_rate is None:
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        groups = getattr(optimizers[0], "param_groups", None) if optimizers else None
        learning_rate = groups[0].get("lr") if groups else None
    grad_norm = next(
        (value for key, value in metrics.items() if key == "grad_norm" or key.endswith("norm_total")), None
    )
    return {"learning_rate": learning_rate, "grad_norm": grad_norm}


class LightningAnatomyCallback(Probe, *_CALLBACK_BASES):  # type: ignore[misc]
    """Measures weights, gradients, optimizer state, activations and throughput of a Lightning fit (`Probe`, called
    from Lightning's callback hooks).

    Events go where a `Probe`'s go: to `emit` when given, else to gpuanat when it launched the script (`gpuanat run
    --script`), else to this user's publication for `gpuanat watch PID` (unless `publish=False`). The loss is read
    when Lightning logs (every `log_every_n_steps`), never more often.
    """

    def __init__(
        self,
        emit: Callable[[Event], None] | None = None,
        *,
        exact_every_steps: int = 50,
        publish: bool = True,
        profile_ops: int | None = None,
        profile_ops_trace: str | None = None,
    ) -> None:
        Probe.__init__(
            self,
            emit,
            exact_every_steps=exact_every_steps,
            publish=publish,
            profile_ops=profile_ops,
            profile_ops_trace=profile_ops_trace,
        )
        self._in_step: int | None = None
        self._batch: list[Any] = []
        self._total_steps: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        total_steps = self._total_steps = _total_steps(trainer)
        self.begin(
            pl_module,
            optimizers[0] if optimizers else None,
            total_steps=total_steps,
            compiled=hasattr(pl_module, "_orig_mod"),
            training_config=lambda device: _training_config(trainer, pl_module, device, total_steps),
            framework_versions=LIGHTNING_VERSIONS,
            forward_hooks=False,
        )

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._in_step is None:  # the optimizer step's first micro-batch
            self._in_step = trainer.global_step + 1
            self.step_begins(self._in_step)
        self._batch = batch_tensors(batch)
        self.forward_begins(self._batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.forward_ends(self._batch)
        self._batch = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.optimizer_begins()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self._in_step is None or step < self._in_step:
            return  # a micro-batch: the optimizer step is still to come
        self._in_step = None
        if self.step_ends(step, self._total_steps):
            trainer.should_stop = True
        every = getattr(trainer, "log_every_n_steps", 50) or 50
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and (step % every == 0 or step == self._total_steps):
            # read in the probe, which never raises into the fit
            self.logged(loss, {}, step=step, **_logged_metrics(trainer))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.end(trainer.global_step, status="stopped" if getattr(trainer, "interrupted", False) else "ok")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt):
            self.failed(exception)
        self.end(trainer.global_step, status="stopped")
