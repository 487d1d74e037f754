"""The probe's adapter for a training loop of one's own — plain PyTorch, Accelerate, FSDP2 — which has no callbacks:

    with gpuanat.probe.track(model, optimizer) as probe:
        for batch in loader:
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            probe.step(samples=len(batch["input_ids"]))

The loop says only where each optimizer step ends (`LoopProbe.step`); the rest the probe finds itself: a step begins
at its first training forward pass (the model's forward hooks, as with Trainer), its gradients are complete when the
optimizer's `step` begins (a step pre-hook on the torch optimizer, also inside accelerate's wrapper), training begins
and ends with the `with` block. An exception that leaves the block is reported (out of memory, or its message) and
the run ends "stopped"; the exception goes on as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

import torch

from gpuanat.core.vocabulary.protocol import Event
from gpuanat.worker.probe.core import Probe
from gpuanat.worker.probe.tensors import optimizer_chain

LOSS_READ_EVERY_STEPS = 10
"""A loss given as a tensor is read (a wait for the GPU) every this many steps, as Trainer logs by default."""


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer that steps, inside accelerate's or another wrapper; None when there is none."""
    return next(
        (wrapped for wrapped in reversed(optimizer_chain(optimizer)) if isinstance(wrapped, torch.optim.Optimizer)),
        None,
    )


def _training_config(model: Any, optimizer: Any, device: torch.device, total_steps: int | None) -> dict[str, Any]:
    """What a plain loop's run is, in RunConfig's terms, as far as the model and optimizer tell."""
    inner = getattr(model, "module", model)  # DDP's wrapper
    model_config = getattr(inner, "config", None)
    stepping = _torch_optimizer(optimizer) or optimizer
    parameter = next(inner.parameters(), None)
    return {
        "loop": "plain",
        "model": getattr(model_config, "_name_or_path", None) or type(getattr(inner, "_orig_mod", inner)).__name__,
        "device": device.type,
        "weights_dtype": str(parameter.dtype).removeprefix("torch.") if parameter is not None else None,
        "optim": type(stepping).__name__,
        "attn": getattr(model_config, "_attn_implementation", None),
        "compile": hasattr(model, "_orig_mod"),
        "max_steps": total_steps,
    }


class LoopProbe(Probe):
    """A `Probe` for a loop without callbacks: a context manager (`track`), told where each step ends (`step`).

    Events go where a `Probe`'s go: to `emit` when given, else to gpuanat when it launched the script (`gpuanat run
    --script`), else to this user's publication for `gpuanat watch PID` (unless `publish=False`)."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        *,
        total_steps: int | None = None,
        emit: Callable[[Event], None] | None = None,
        publish: bool = True,
        exact_every_steps: int = 50,
        profile_ops: int | None = None,
        profile_ops_trace: str | None = None,
    ) -> None:
        super().__init__(
            emit,
            exact_every_steps=exact_every_steps,
            publish=publish,
            profile_ops=profile_ops,
            profile_ops_trace=profile_ops_trace,
        )
        self._loop_model, self._loop_optimizer, self._total_steps = model, optimizer, total_steps
        self._optimizer_hook: Any = None
        self._step_count = 0

    def __enter__(self) -> LoopProbe:
        model, optimizer, total_steps = self._loop_model, self._loop_optimizer, self._total_steps
        self.begin(
            model,
            optimizer,
            total_steps=total_steps,
            compiled=hasattr(model, "_orig_mod"),
            training_config=lambda device: _training_config(model, optimizer, device, total_steps),
            framework_versions={},
            steps_begin_at_forward=True,
        )
        stepping = _torch_optimizer(optimizer)
        if stepping is not None and self.disabled_reason is None:
            self._optimizer_hook = stepping.register_step_pre_hook(lambda *_: self.optimizer_begins())
        return self

    def step(
        self,
        samples: int | None = None,
        loss: float | torch.Tensor | None = None,
        tokens: int | None = None,
        *,
        learning_rate: float | torch.Tensor | None = None,
        grad_norm: float | torch.Tensor | None = None,
    ) -> bool:
        """An optimizer step ended, having trained on `samples` samples (`tokens` tokens; each None: the probe
        counts the rows and elements of each forward pass's first tensor) with `loss`, `learning_rate` and
        `grad_norm` (e.g. what `clip_grad_norm_` returned), each a number or a tensor; any tensor among them makes
        the step's values read every `LOSS_READ_EVERY_STEPS` steps (and at the last). Returns whether to stop:
        gpuanat, which launched the script, went away."""
        self._step_count += 1
        step = self._step_count
        stop = bool(self.step_ends(step, self._total_steps, samples=samples, tokens=tokens))
        values = {"loss": loss, "learning_rate": learning_rate, "grad_norm": grad_norm}
        given = [value for value in values.values() if value is not None]
        # `logged` reads the numbers, never raising into the loop; tensors only at the logging steps
        if given and (
            not any(isinstance(value, torch.Tensor) for value in given)
            or step % LOSS_READ_EVERY_STEPS == 0
            or step == self._total_steps
        ):
            self.logged(loss, {}, step=step, learning_rate=learning_rate, grad_norm=grad_norm)
        return stop

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> Literal[False]:
        if self._optimizer_hook is not None:
            self._optimizer_hook.remove()
        if error is not None and not isinstance(error, KeyboardInterrupt):
            self.failed(error)
        self.end(self._step_count, status="ok" if error is None else "stopped")
        return False  # the loop's exception, if any, goes on


def track(
    model: Any,
    optimizer: Any,
    *,
    total_steps: int | None = None,
    emit: Callable[[Event], None] | None = None,
    publish: bool = True,
    profile_ops: int | None = None,
    profile_ops_trace: str | None = None,
) -> LoopProbe:
    """Measure a training loop of one's own: `with track(model, optimizer) as probe:` around the loop, and
    `probe.step(samples=n)` at the end of each optimizer step. `total_steps`, when known, places the warm-up (the
    first tenth, 2 to 20 steps; 10 when not known) and closes the steady window at the last step. `profile_ops`:
    steps to profile after warm-up for the operations anatomy (default: `GPUANAT_PROFILE_OPS`), their Chrome trace
    written to `profile_ops_trace`."""
    return LoopProbe(
        model,
        optimizer,
        total_steps=total_steps,
        emit=emit,
        publish=publish,
        profile_ops=profile_ops,
        profile_ops_trace=profile_ops_trace,
    )
