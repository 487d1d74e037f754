"""The registry of training techniques: one entry per RunConfig field the user can change.

The CLI builds its flags from this table and the TUI cycles values with it, so a technique is
described once: its flag, allowed values and help text (the worker maps them to TrainingArguments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuanat.core.vocabulary.presets import PRESETS

if TYPE_CHECKING:
    from gpuanat.core.vocabulary.config import RunConfig

PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "adafactor", "adamw_bnb_8bit", "sgd")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
DEVICES = ("cuda", "cpu")
DISTRIBUTED = ("none", "ddp", "fsdp", "zero1", "zero2", "zero3")
"""How a run spreads over several ranks: DDP (every rank holds everything, gradients all-reduced), FSDP2 (weights,
gradients and optimizer state sharded), DeepSpeed ZeRO stage 1 (optimizer state sharded), 2 (+ gradients),
3 (+ weights)."""
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
BY_SHARDING = ("none", "ddp", "zero1", "zero2", "fsdp", "zero3")
"""The distributed techniques by how much of the model's state each rank holds, most first (FSDP2 shards as ZeRO-3
does, in torch, and comes first of the two)."""
PADDINGS = ("longest", "max", "pack")
"""How --data's rows make batches: padded to the longest row of each batch, every row padded to --seq-len, or rows
packed end to end into --seq-len blocks (docs/data.md)."""
ENGINES = ("trainer", "accelerate")
"""What runs the training loop: HF Trainer, or the docs' custom loop with 🤗 Accelerate."""


def with_distributed(config: RunConfig, technique: str) -> RunConfig:
    """`config` trained with `technique`: the Accelerate loop trains with DDP only, so a sharded one
    takes Trainer."""
    return config.replace(distributed=technique, engine=config.engine if technique in ("none", "ddp") else "trainer")


@dataclass(frozen=True)
class Technique:
    field: str
    """RunConfig field name."""
    flag: str
    kind: str
    """"int", "float", "bool", "choice" or "str": how the CLI parses it."""
    help: str
    choices: tuple[str, ...] = ()


WEIGHTS_DTYPES = ("fp32", "bf16", "fp16")
"""`--weights-dtype`'s values; fp16 is named to be refused with its reason (`validation`)."""


TECHNIQUES: tuple[Technique, ...] = (
    Technique(
        "preset", "--preset", "choice", "model shape, built with random weights (no download)", choices=tuple(PRESETS)
    ),
    Technique(
        "model",
        "--model",
        "str",
        "load real weights with from_pretrained from this name or local directory, or train random weights of "
        "a bare config.json (overrides --preset)",
    ),
    Technique(
        "device",
        "--device",
        "choice",
        "where to train (default: cuda when available, else cpu)",
        choices=("cuda", "cpu"),
    ),
    Technique("batch_size", "--batch-size", "int", "per-device batch size"),
    Technique("grad_accum", "--grad-accum", "int", "gradient accumulation steps"),
    Technique(
        "grad_checkpointing",
        "--grad-checkpointing",
        "bool",
        "recompute activations in backward instead of keeping them (all of each layer's; with "
        "--selective-checkpointing only what lies between its matmuls)",
    ),
    Technique(
        "selective_checkpointing",
        "--selective-checkpointing",
        "bool",
        "with --grad-checkpointing: keep every matmul's and attention's output and recompute only the element-wise "
        "and normalization kernels between them (torch's selective activation checkpointing): more memory than "
        "full checkpointing, little recomputation",
    ),
    Technique(
        "precision",
        "--precision",
        "choice",
        "mixed precision (fp16 needs CUDA; bf16 needs Ampere+ or CPU)",
        choices=PRECISIONS,
    ),
    Technique("tf32", "--tf32", "bool", "TF32 matmuls (Ampere+ CUDA GPUs)"),
    Technique(
        "optim", "--optim", "choice", "optimizer (adamw_bnb_8bit needs bitsandbytes and CUDA)", choices=OPTIMIZERS
    ),
    Technique("workers", "--workers", "int", "DataLoader worker processes"),
    Technique("pin_memory", "--pin-memory", "bool", "DataLoader pin_memory (default on, as in Trainer)"),
    Technique("attn", "--attn", "choice", "attention implementation", choices=ATTENTION_IMPLEMENTATIONS),
    Technique("compile", "--compile", "bool", "torch.compile the whole model (HF Trainer's torch_compile)"),
    Technique(
        "compile_regions",
        "--compile-regions",
        "bool",
        "torch.compile each layer's blocks outside attention (MLP, output projections with residual and "
        "LayerNorm, embeddings); attention stays SDPA's fused kernel",
    ),
    Technique(
        "expandable_segments",
        "--expandable-segments",
        "bool",
        "CUDA allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF): less fragmentation, so a larger "
        "batch fits, and the largest one is predicted better",
    ),
    Technique(
        "gpus",
        "--gpus",
        "str",
        "GPUs to train on: a count (2), NVML indices as nvidia-smi shows them (0,2; one index: 3,) or all "
        "(default: one GPU, the first idle one)",
    ),
    Technique(
        "distributed",
        "--distributed",
        "choice",
        "spread the run over several ranks: ddp, fsdp (FSDP2), DeepSpeed zero1/zero2/zero3 (needs "
        "deepspeed); launched with torchrun (default: none on one rank, ddp on several)",
        choices=DISTRIBUTED,
    ),
    Technique("nproc", "--nproc", "int", "ranks on the CPU (one process each, gloo); on GPUs --gpus decides"),
    Technique(
        "weights_dtype",
        "--weights-dtype",
        "choice",
        "the dtype the model is held in: fp32 (master weights under autocast, the HF docs' setting) or bf16 "
        "(the model, its gradients and optimizer state in bf16, as from_pretrained loads bf16 checkpoints "
        "and TRL trains them; with --precision bf16; with --no-autocast pure bf16); fp16 is refused",
        choices=WEIGHTS_DTYPES,
    ),
    Technique(
        "autocast",
        "--autocast",
        "bool",
        "with --weights-dtype bf16: --no-autocast trains pure bf16, no autocast, every activation (the residual "
        "stream and LayerNorm outputs too) in bf16: less memory traffic, faster where element-wise kernels weigh "
        "(default on: HF Trainer's bf16 autocast over the bf16 model, as TRL trains)",
    ),
    Technique(
        "lora",
        "--lora",
        "int",
        "LoRA adapters of this rank on a frozen base held in the run's 16-bit precision (PEFT; 0: off)",
    ),
    Technique(
        "lora_targets",
        "--lora-targets",
        "str",
        "modules the LoRA adapters wrap: all-linear, or names separated by commas (q_proj,v_proj)",
    ),
    Technique(
        "lora_dropout",
        "--lora-dropout",
        "float",
        "dropout on the LoRA adapters' input (PEFT's lora_dropout; 0.05-0.1 is usual): its masks, a byte an "
        "input element of every adapted layer, stay until backward",
    ),
    Technique(
        "load_in_4bit",
        "--load-in-4bit",
        "bool",
        "QLoRA: hold the frozen base's linear layers in 4 bits (bitsandbytes NF4, double quantization) under "
        "the --lora adapters, prepared with PEFT's prepare_model_for_kbit_training (CUDA, needs bitsandbytes)",
    ),
    Technique(
        "liger",
        "--liger",
        "bool",
        "compute a causal LM's loss with Liger Kernel's fused linear cross-entropy, in chunks, so the logits "
        "are never held whole (CUDA, needs liger-kernel: pip install 'gpuanat[llm]')",
    ),
    Technique(
        "liger_layers",
        "--liger-layers",
        "bool",
        "Liger Kernel's RMSNorm, SwiGLU/GeGLU and RoPE kernels in a causal LM's layers (with --liger: what HF "
        "Trainer's use_liger_kernel applies; CUDA, needs liger-kernel)",
    ),
    Technique(
        "engine",
        "--engine",
        "choice",
        "the training loop: HF Trainer, or the docs' custom loop with Accelerate (with none or ddp)",
        choices=ENGINES,
    ),
    Technique("seq_len", "--seq-len", "int", "tokens per sample"),
    Technique(
        "samples",
        "--samples",
        "int",
        "samples in the random dataset (with --data: its first rows), the run's length (the docs use 512)",
    ),
    Technique("epochs", "--epochs", "int", "passes over the dataset"),
    Technique("max_steps", "--max-steps", "int", "stop after this many optimizer steps (overrides --epochs)"),
    Technique(
        "data",
        "--data",
        "str",
        "train on your own text: a .jsonl, .json, .csv, .parquet or .arrow file, a saved dataset directory "
        "(Dataset.save_to_disk) or a Hub dataset name already in the local cache (never downloaded); its first "
        "--samples rows, tokenized with --model's tokenizer or --tokenizer (default: the docs' random token ids)",
    ),
    Technique(
        "text_field",
        "--text-field",
        "str",
        "the column of --data holding the text (default: the first of text, content, sentence, document, body, "
        "else chat messages, rendered with the tokenizer's chat template)",
    ),
    Technique(
        "tokenizer",
        "--tokenizer",
        "str",
        "the tokenizer for --data: a directory or a Hub name in the local cache (default: --model's; a --preset "
        "has none)",
    ),
    Technique(
        "padding",
        "--padding",
        "choice",
        "with --data: pad each batch to its longest row, pad every row to --seq-len (max), or pack rows end to "
        "end into --seq-len blocks, attention kept within each row where the model can",
        choices=PADDINGS,
    ),
)

TECHNIQUES_BY_FIELD: dict[str, Technique] = {technique.field: technique for technique in TECHNIQUES}


COMPILE_MODES = ("off", "regions", "model")
"""What torch.compile covers: nothing, the layers' blocks outside attention (`compile_regions`), the whole model
(`compile`); two RunConfig fields, at most one of them on."""


def compile_mode(config: Any) -> str:
    return "model" if config.compile else "regions" if config.compile_regions else "off"


def with_compile_mode(config: Any, mode: str) -> Any:
    return config.replace(compile_regions=mode == "regions", compile=mode == "model")


CHECKPOINTING_MODES = ("off", "full", "selective")
"""Activation checkpointing (`checkpointing_mode`): none, every layer recomputed, or only what lies between its
matmuls (`--selective-checkpointing`); the dashboard's `g` steps through them."""


def checkpointing_mode(config: Any) -> str:
    if not config.grad_checkpointing:
        return "off"
    return "selective" if config.selective_checkpointing else "full"


WEIGHTS_MODES = ("fp32", "bf16", "pure-bf16")
"""How the model is held and computed (`weights_mode`): fp32 master weights (under autocast with --precision bf16),
bf16 weights under autocast, bf16 weights computed in pure bf16 (no autocast); `tune`'s weights move and the
dashboard's `W` step through them."""


def weights_mode(config: Any) -> str:
    if config.weights_dtype == "fp32":
        return "fp32"
    return config.weights_dtype if config.autocast else f"pure-{config.weights_dtype}"


def with_weights_mode(config: Any, mode: str) -> Any:
    """`config` with its model held (and computed) as `mode` says; bf16 weights bring --precision bf16."""
    if mode == "fp32":
        return config.replace(weights_dtype="fp32", autocast=True)
    return config.replace(weights_dtype="bf16", precision="bf16", autocast=mode == "bf16")


WORKER_CHOICES = (0, 1, 2, 4, 8)
BATCH_SIZE_STEPS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
GRAD_ACCUM_STEPS = (1, 2, 4, 8, 16, 32, 64)
SAMPLES_STEPS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""The run lengths the dashboard's `[` and `]` step through (samples of the random dataset)."""
LORA_RANKS = (0, 8, 16, 32, 64)
"""The ranks the LoRA key cycles through (0: every weight trains)."""
QLORA_DEFAULT_RANK = 16
"""The adapters' rank when the 4-bit key turns QLoRA on without LoRA."""


def _step_through(values: tuple[int, ...], current: int, direction: int) -> int:
    """The next value of an ordered ladder in `direction` (±1), from wherever `current` sits."""
    if direction > 0:
        return next((value for value in values if value > current), values[-1] if current < values[-1] else current * 2)
    return next((value for value in reversed(values) if value < current), max(1, values[0]))


def _cycle(values: tuple[str, ...], current: str) -> str:
    return values[(values.index(current) + 1) % len(values)] if current in values else values[0]


def changed_config(config: Any, field: str, direction: int = 1) -> Any:
    """`config` with one technique moved to its next value: bools flip, choices cycle, numbers step; compile cycles
    eager, regions compiled, model compiled."""
    if field == "batch_size":
        return config.replace(batch_size=_step_through(BATCH_SIZE_STEPS, config.batch_size, direction))
    if field == "grad_accum":
        return config.replace(grad_accum=_step_through(GRAD_ACCUM_STEPS, config.grad_accum, direction))
    if field == "samples":
        return config.replace(samples=_step_through(SAMPLES_STEPS, config.samples, direction))
    if field == "lora":  # back to 0 the 4-bit base goes too: QLoRA without adapters trains nothing
        lora = LORA_RANKS[(LORA_RANKS.index(config.lora) + 1) % len(LORA_RANKS)] if config.lora in LORA_RANKS else 0
        return config.replace(lora=lora, load_in_4bit=config.load_in_4bit and lora > 0)
    if field == "load_in_4bit":  # QLoRA needs adapters: turning it on without them adds the usual rank
        return config.replace(load_in_4bit=not config.load_in_4bit, lora=config.lora or QLORA_DEFAULT_RANK)
    if field == "compile":  # off → the regions outside attention → the whole model → off
        return with_compile_mode(config, _cycle(COMPILE_MODES, compile_mode(config)))
    if field == "grad_checkpointing":  # off → full → selective → off
        mode = _cycle(CHECKPOINTING_MODES, checkpointing_mode(config))
        return config.replace(grad_checkpointing=mode != "off", selective_checkpointing=mode == "selective")
    if field == "weights_dtype":  # fp32 → bf16 under autocast → pure bf16 → fp32; the precision follows to bf16
        if config.weights_dtype == "fp32":
            return with_weights_mode(config, "bf16").replace(lora=0, load_in_4bit=False)
        if config.autocast and config.distributed in ("none", "ddp"):
            return with_weights_mode(config, "pure-bf16")
        return with_weights_mode(config, "fp32")
    if field == "workers":
        return config.replace(
            workers=WORKER_CHOICES[(WORKER_CHOICES.index(config.workers) + 1) % len(WORKER_CHOICES)]
            if config.workers in WORKER_CHOICES
            else 0
        )
    technique = TECHNIQUES_BY_FIELD[field]
    if technique.kind == "bool":
        return config.replace(**{field: not getattr(config, field)})
    if technique.kind == "choice":
        return config.replace(**{field: _cycle(technique.choices, getattr(config, field))})
    raise ValueError(f"{field} cannot be changed by a key")


def next_gpu_count(config: Any, gpu_count: int) -> Any:
    """`config` with one GPU more, back to one after all `gpu_count` of them; several take DDP unless a
    distributed technique is chosen already, one takes none."""
    current = config.ranks or gpu_count
    following = current + 1 if current < gpu_count else 1
    if following == 1:
        return config.replace(gpus=None, distributed="none")
    distributed = "ddp" if config.distributed == "none" else config.distributed
    return config.replace(gpus=str(following), distributed=distributed)


def next_distributed(config: Any) -> Any | None:
    """`config` with the next distributed technique for its ranks; None with one rank (none is the only one)."""
    ranks = config.ranks
    if ranks == 1:
        return None
    several = DISTRIBUTED[1:] if config.device == "cuda" else ("ddp",)
    return config.replace(distributed=_cycle(several, config.distributed))
