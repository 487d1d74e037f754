"""The probe's adapter for HF `Trainer`: `AnatomyCallback`, a `TrainerCallback` that calls the framework-free `Probe`
(`core`) where Trainer calls its callbacks, reading what the probe needs from Trainer's arguments and state.

Usable in anyone's script (`from gpuanat.probe import AnatomyCallback`) and used by gpuanat's own worker; the
docs' Accelerate loop (`worker/accelerate_loop.py`) calls the same callback methods where Trainer would.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from transformers import TrainerCallback

from gpuanat.worker.probe.core import Probe

SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_loss")
"""The figures Trainer logs at the end of training that the probe's `done` reports."""


def _training_config(args: Any, model: Any, device: torch.device, total_steps: int) -> dict[str, Any]:
    """The run's techniques in RunConfig's terms, so a watched run compares with launched ones."""
    model_config = getattr(model, "config", None)
    optim = getattr(args, "optim", None)
    return {
        "loop": "trainer",
        "model": getattr(model_config, "_name_or_path", None) or type(model).__name__,
        "device": device.type,
        "batch_size": getattr(args, "per_device_train_batch_size", None),
        "grad_accum": getattr(args, "gradient_accumulation_steps", None),
        "grad_checkpointing": bool(
            getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False)
        ),
        "precision": "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32",
        "tf32": bool(getattr(args, "tf32", False)),
        "optim": getattr(optim, "value", optim),
        "workers": getattr(args, "dataloader_num_workers", None),
        "pin_memory": getattr(args, "dataloader_pin_memory", None),
        "attn": getattr(model_config, "_attn_implementation", None),
        "compile": bool(getattr(args, "torch_compile", False)),
        "max_steps": total_steps,
    }


class AnatomyCallback(Probe, TrainerCallback):
    """Measures weights, gradients, optimizer state, activations and throughput of a Trainer run (`Probe`, called
    from Trainer's callbacks).

    `emit` receives each event. Without it, events go to gpuanat when gpuanat launched the script
    (`gpuanat run --script`), else to this user's private publication file for `gpuanat watch PID`
    (unless `publish=False`); either way the latest are also kept on the callback (`last_step`,
    `last_bands`, `summary`). The probe never raises into training: a parent that went away ends the
    run gracefully, and any other failure turns the probe off with one warning.

    The hooks take Trainer's `TrainingArguments`, `TrainerState` and `TrainerControl`, or the stand-ins the
    Accelerate loop passes (`worker/accelerate_loop.py`), hence `Any`; each returns its `control`.
    """

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> Any:
        total_steps = int(state.max_steps or 0)
        self.begin(
            model,
            optimizer,
            total_steps=total_steps,
            compiled=bool(getattr(args, "torch_compile", False)),
            training_config=lambda device: _training_config(args, model, device, total_steps),
            framework_versions={"transformers": transformers.__version__},
        )
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.step_begins(state.global_step + 1)
        return control

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.optimizer_begins()
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> Any:
        logs = logs or {}
        self.logged(
            logs.get("loss"),
            {key: logs[key] for key in SUMMARY_KEYS if key in logs},
            step=state.global_step,
            learning_rate=logs.get("learning_rate"),
            grad_norm=logs.get("grad_norm"),
        )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.step_ends(state.global_step, state.max_steps):
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.end(state.global_step)
        return control
