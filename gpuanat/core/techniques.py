"""The registry of training techniques: one entry per RunConfig field the user can change.

The CLI builds its flags from this table and the TUI (later) its key bindings, so a technique is
described once: its flag, allowed values, help text and the TrainingArguments field it sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuanat.core.presets import PRESETS

PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "sgd")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Technique:
    field: str
    """RunConfig field name."""
    flag: str
    kind: str
    """"int", "bool", "choice", "float" or "str": how the CLI parses it."""
    help: str
    choices: tuple[str, ...] = ()
    training_args_key: str | None = None
    """The transformers.TrainingArguments field it maps to; None when the worker applies it itself."""
    technique: bool = True
    """True for the memory/speed techniques the docs compare; False for workload settings."""


TECHNIQUES: tuple[Technique, ...] = (
    Technique("preset", "--preset", "choice", "model shape, built with random weights (no download)",
              choices=tuple(PRESETS), technique=False),
    Technique("model", "--model", "str",
              "load real weights with from_pretrained from this name or local path (overrides --preset)",
              technique=False),
    Technique("device", "--device", "choice", "where to train (default: cuda when available, else cpu)",
              choices=("cuda", "cpu"), technique=False),
    Technique("batch_size", "--batch-size", "int", "per-device batch size",
              training_args_key="per_device_train_batch_size"),
    Technique("grad_accum", "--grad-accum", "int", "gradient accumulation steps",
              training_args_key="gradient_accumulation_steps"),
    Technique("grad_checkpointing", "--grad-checkpointing", "bool",
              "recompute activations in backward instead of keeping them",
              training_args_key="gradient_checkpointing"),
    Technique("precision", "--precision", "choice", "mixed precision (fp16 needs CUDA; bf16 needs Ampere+ or CPU)",
              choices=PRECISIONS),
    Technique("tf32", "--tf32", "bool", "TF32 matmuls (Ampere+ CUDA GPUs)", training_args_key="tf32"),
    Technique("optim", "--optim", "choice", "optimizer (adamw_bnb_8bit needs bitsandbytes and CUDA)",
              choices=OPTIMIZERS, training_args_key="optim"),
    Technique("workers", "--workers", "int", "DataLoader worker processes",
              training_args_key="dataloader_num_workers"),
    Technique("pin_memory", "--pin-memory", "bool", "DataLoader pin_memory (default on, as in Trainer)",
              training_args_key="dataloader_pin_memory"),
    Technique("attn", "--attn", "choice", "attention implementation", choices=ATTENTION_IMPLEMENTATIONS),
    Technique("compile", "--compile", "bool", "torch.compile the model", training_args_key="torch_compile"),
    Technique("seq_len", "--seq-len", "int", "tokens per sample", technique=False),
    Technique("samples", "--samples", "int", "samples in the random dataset (the docs use 512)",
              technique=False),
    Technique("epochs", "--epochs", "int", "passes over the dataset", training_args_key="num_train_epochs",
              technique=False),
    Technique("max_steps", "--max-steps", "int", "stop after this many optimizer steps (overrides --epochs)",
              training_args_key="max_steps", technique=False),
)

TECHNIQUES_BY_FIELD: dict[str, Technique] = {technique.field: technique for technique in TECHNIQUES}


WORKER_CHOICES = (0, 1, 2, 4, 8)
BATCH_SIZE_STEPS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
GRAD_ACCUM_STEPS = (1, 2, 4, 8, 16, 32, 64)


def _step_through(values: tuple[int, ...], current: int, direction: int) -> int:
    """The next value of an ordered ladder in `direction` (±1), from wherever `current` sits."""
    if direction > 0:
        return next((value for value in values if value > current), values[-1] if current < values[-1] else current * 2)
    return next((value for value in reversed(values) if value < current), max(1, values[0]))


def _cycle(values: tuple[str, ...], current: str) -> str:
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


def changed_config(config: Any, field: str, direction: int = 1) -> Any:
    """`config` with one technique moved to its next value: bools flip, choices cycle, numbers step."""
    if field == "batch_size":
        return config.replace(batch_size=_step_through(BATCH_SIZE_STEPS, config.batch_size, direction))
    if field == "grad_accum":
        return config.replace(grad_accum=_step_through(GRAD_ACCUM_STEPS, config.grad_accum, direction))
    if field == "workers":
        return config.replace(workers=WORKER_CHOICES[(WORKER_CHOICES.index(config.workers) + 1) % len(WORKER_CHOICES)]
                              if config.workers in WORKER_CHOICES else 0)
    technique = TECHNIQUES_BY_FIELD[field]
    if technique.kind == "bool":
        return config.replace(**{field: not getattr(config, field)})
    if technique.kind == "choice":
        return config.replace(**{field: _cycle(technique.choices, getattr(config, field))})
    raise ValueError(f"{field} cannot be changed by a key")
