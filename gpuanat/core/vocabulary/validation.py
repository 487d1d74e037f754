"""The checks of a RunConfig: a value that cannot run is refused with the flag to fix (`ConfigError`).

Validation happens in two stages, both before anything starts:
`validate_values` checks what can be judged from the values alone (and `check_hub_model` whether a --model
name can be had from the Hugging Face cache or Hub); `validate_for_machine` checks what needs the machine (CUDA,
compute capability, bitsandbytes), given a `Capabilities` reading taken by the worker's capability probe. The
first stage needs no torch, so a bad value is answered before the probe starts. Between the two,
`workload_for_device` (`config`) sizes the workload the user left to the defaults for the device it trains on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.gpu_request import parse_gpus
from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.core.vocabulary.techniques import (
    ATTENTION_IMPLEMENTATIONS,
    DEVICES,
    DISTRIBUTED,
    ENGINES,
    OPTIMIZERS,
    PADDINGS,
    PRECISIONS,
    WEIGHTS_DTYPES,
)

SHARDED = ("fsdp", "zero1", "zero2", "zero3")
"""The distributed techniques that shard the model's state, which some techniques do not train under here."""

# Upper bounds: no run on one device needs more, and a value beyond one is a typo (an extra zero or three) that
# would otherwise start a run that fails late or never ends. Generous on purpose: each is far past real use.
MAX_BATCH_SIZE = 65_536
"""Per-device batch: bert-large at seq 128 fits about a thousand samples on an 80 GiB GPU."""
MAX_GRAD_ACCUM = 65_536
"""Accumulation steps: with batch 1 that is an effective batch of 65,536 samples, past LLM pre-training's."""
MAX_SAMPLES = 10_000_000
"""Samples in the random dataset (the docs use 512)."""
MAX_SEQ_LEN = 131_072
"""Tokens per sample: the longest context open models are trained at on one device (a preset's or a local
checkpoint's position embeddings set a lower bound)."""
MAX_DATASET_TOKENS = 2**30
"""samples × seq-len: the child builds the random dataset in host memory at 8 bytes a token (int64), so this is
8 GiB of host memory; more epochs train longer without it."""
MAX_EPOCHS = 10_000
"""Passes over the dataset."""
MAX_WORKERS = 512
"""DataLoader worker processes: more than the cores of the largest single hosts."""
MAX_STEPS = 10_000_000
"""Optimizer steps: ten times a long LLM pre-training run."""
MAX_LORA_RANK = 4096
"""LoRA rank: the largest hidden size of the presets; real adapters use 8-256."""
MAX_CPU_RANKS = 64
"""Processes of a distributed run on the CPU: each takes a core or more."""


def _require_at_least(flag: str, value: int | None, minimum: int) -> None:
    if value is None or value < minimum:
        raise ConfigError(flag, f"must be an integer ≥ {minimum} (got {value})")


def _require_between(flag: str, value: int | None, minimum: int, maximum: int, why: str) -> None:
    _require_at_least(flag, value, minimum)
    assert value is not None
    if value > maximum:
        raise ConfigError(flag, f"must be ≤ {maximum:,}: {why} (got {value:,})")


def _require_choice(flag: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(flag, f"must be one of {', '.join(allowed)} (got {value!r})")


def _local_model_max_positions(model: str) -> int | None:
    """max_position_embeddings (or n_positions) from a local checkpoint's config.json, if readable."""
    config_path = Path(model) if model.endswith(".json") else Path(model) / "config.json"
    try:
        data = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(data.get(key), int):
            return int(data[key])
    return None


def model_is_path(model: str) -> bool:
    """Whether --model names a local directory rather than a Hugging Face Hub repo id ("name" or "org/name"):
    it starts like a path, has more than one slash or a backslash, or is an existing directory."""
    return (
        model.startswith((".", "/", "~"))
        or model.count("/") > 1
        or (os.sep != "/" and os.sep in model)
        or model.endswith(".json")
        or Path(model).expanduser().is_dir()
    )


def _validate_local_model(model: str) -> None:
    if model.endswith(".json"):  # a bare config: random weights of that architecture
        config_file = Path(model).expanduser()
        if not config_file.is_file():
            raise ConfigError("--model", f"no such file: {model}")
        try:
            data = json.loads(config_file.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError("--model", f"{model} is not a readable JSON config: {error}") from None
        if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
            raise ConfigError(
                "--model", f"{model} has no model_type: a config.json as transformers writes it is needed"
            )
        return
    directory = Path(model).expanduser()
    if not directory.is_dir():
        raise ConfigError(
            "--model",
            f"no such directory: {model} (a local model is a directory with config.json, as save_pretrained writes it)",
        )
    if not (directory / "config.json").is_file():
        raise ConfigError(
            "--model", f"{model} has no config.json (a local model is a directory as save_pretrained writes it)"
        )


def check_hub_model(model: str) -> str | None:
    """For a --model that is a Hub name: raise ConfigError when it is not in the local Hugging Face cache and
    HF_HUB_OFFLINE forbids downloading it; return a one-line note when the run will download it; None when it
    is cached (or a local directory, which `validate_values` checks)."""
    if model_is_path(model):
        return None
    # huggingface_hub comes with transformers and imports no torch (about 0.1 s); only a Hub name needs it.
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except HFValidationError:
        raise ConfigError(
            "--model", f"{model!r} is neither a local directory nor a Hugging Face repo id (name or org/name)"
        ) from None
    if isinstance(cached, str):
        return None
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            "--model",
            f"{model} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
            "and HF_HUB_OFFLINE is set, so it cannot be downloaded; download it while "
            "online, or give a local directory",
        )
    return f"--model {model} is not in the local Hugging Face cache; the run will download it from the Hub"


def _validate_data_tokenizer(config: RunConfig) -> None:
    """--data is tokenized with --model's tokenizer or --tokenizer: a preset (or a bare config.json) has none."""
    if config.data is None or config.tokenizer is not None:
        return
    if config.model is None or config.model.endswith(".json"):
        has = "a --preset" if config.model is None else "a bare config.json"
        raise ConfigError(
            "--tokenizer",
            f"{has} has no tokenizer to tokenize --data with: give --tokenizer PATH (a tokenizer directory or "
            "a Hub name in the local cache), or a --model directory that holds one",
        )


def validate_values(config: RunConfig) -> None:
    """Raise ConfigError for a value that is wrong whatever the machine."""
    _require_choice("--preset", config.preset, tuple(PRESETS))
    _require_choice("--device", config.device, DEVICES)
    _require_between("--batch-size", config.batch_size, 1, MAX_BATCH_SIZE, "no run needs a larger per-device batch")
    _require_between("--grad-accum", config.grad_accum, 1, MAX_GRAD_ACCUM, "no run needs more accumulation steps")
    _require_choice("--precision", config.precision, PRECISIONS)
    _require_choice("--optim", config.optim, OPTIMIZERS)
    _require_between("--workers", config.workers, 0, MAX_WORKERS, "no host has the cores for more DataLoader processes")
    _require_choice("--attn", config.attn, ATTENTION_IMPLEMENTATIONS)
    _require_between(
        "--seq-len", config.seq_len, 1, MAX_SEQ_LEN, "the longest context open models train at on one device"
    )
    _require_between(
        "--samples", config.samples, 1, MAX_SAMPLES, "a random dataset needs no more; train longer with --epochs"
    )
    if config.samples * config.seq_len > MAX_DATASET_TOKENS:
        raise ConfigError(
            "--samples",
            f"samples × seq-len must be ≤ {MAX_DATASET_TOKENS:,} tokens (the random "
            "dataset is built in host memory, 8 bytes a token); train longer with "
            f"--epochs (got {config.samples:,} × {config.seq_len:,})",
        )
    _require_between("--epochs", config.epochs, 1, MAX_EPOCHS, "no run needs more passes")
    _require_choice("--padding", config.padding, PADDINGS)
    _validate_data_tokenizer(config)
    if config.max_steps is not None:
        _require_between("--max-steps", config.max_steps, 1, MAX_STEPS, "no run needs more optimizer steps")
    _validate_ranks(config)
    _require_between(
        "--lora", config.lora, 0, MAX_LORA_RANK, "adapters past the hidden size train no less than the full weights"
    )
    if config.lora and config.distributed in SHARDED and (config.distributed != "fsdp" or config.load_in_4bit):
        technique = "QLoRA" if config.load_in_4bit else "LoRA"
        where = "with ddp" if config.load_in_4bit else "with ddp or fsdp"
        raise ConfigError("--lora", f"{technique} trains on one GPU or {where} here; not with {config.distributed}")
    _require_choice("--weights-dtype", config.weights_dtype, WEIGHTS_DTYPES)
    if config.weights_dtype == "fp16":
        raise ConfigError(
            "--weights-dtype",
            "fp16 weights do not train here: HF Trainer's fp16 gradient scaler "
            "refuses fp16 gradients, and without one they underflow; use bf16",
        )
    if config.weights_dtype == "bf16":
        if config.precision != "bf16":
            raise ConfigError("--weights-dtype", "a bf16 model computes in bf16: give --precision bf16 too")
        if config.lora or config.load_in_4bit:
            raise ConfigError("--weights-dtype", "LoRA's frozen base is held in 16 bits already; leave it fp32")
    if config.selective_checkpointing and not config.grad_checkpointing:
        raise ConfigError(
            "--selective-checkpointing", "chooses what checkpointing keeps: give --grad-checkpointing too"
        )
    if not config.autocast:
        if config.weights_dtype != "bf16":
            raise ConfigError(
                "--no-autocast", "computes in the model's own dtype: give --weights-dtype bf16 too (pure bf16 training)"
            )
        if config.distributed not in ("none", "ddp"):
            raise ConfigError(
                "--no-autocast", f"{config.distributed} computes in 16 bits without autocast already; leave it out"
            )
    if not 0.0 <= config.lora_dropout < 1.0:
        raise ConfigError("--lora-dropout", f"a probability in [0, 1) (got {config.lora_dropout})")
    if config.lora_dropout and not config.lora:
        raise ConfigError("--lora-dropout", "drops the LoRA adapters' input: add --lora R (e.g. --lora 16)")
    if config.load_in_4bit and not config.lora:
        raise ConfigError(
            "--load-in-4bit",
            "QLoRA trains LoRA adapters on a frozen 4-bit base, and a 4-bit weight "
            "cannot train itself: add --lora R (e.g. --lora 16)",
        )
    if config.load_in_4bit and config.model is None and PRESETS[config.preset].objective != "causal-lm":
        raise ConfigError(
            "--load-in-4bit",
            f"QLoRA is for causal LMs here (the llama, qwen2 and mistral presets, or "
            f"a --model); {config.preset} is a {PRESETS[config.preset].family} "
            "classifier",
        )
    _validate_liger(config)
    if config.compile_regions and config.compile:
        raise ConfigError("--compile-regions", "--compile already compiles the whole model: choose one")
    if config.compile_regions and config.distributed in SHARDED:
        raise ConfigError(
            "--compile-regions", f"compiled regions train on one GPU or with ddp here; not with {config.distributed}"
        )
    if not config.lora_targets.strip() or any(not name.strip() for name in config.lora_targets.split(",")):
        raise ConfigError(
            "--lora-targets", f"all-linear, or module names separated by commas (got {config.lora_targets!r})"
        )
    if config.model is not None and model_is_path(config.model):
        _validate_local_model(config.model)
    max_positions = PRESETS[config.preset].max_positions
    source = f"preset {config.preset}"
    if config.model is not None:
        local_max = _local_model_max_positions(config.model)
        if local_max is None:
            max_positions, source = 0, ""
        else:
            max_positions, source = local_max, config.model
    if max_positions and config.seq_len > max_positions:
        raise ConfigError(
            "--seq-len", f"must be ≤ {max_positions}, the position embeddings of {source} (got {config.seq_len})"
        )


def refusal(config: RunConfig) -> ConfigError | None:
    """Why `validate_values` refuses `config`, or None where this version can train it."""
    try:
        validate_values(config)
    except ConfigError as error:
        return error
    return None


def _validate_liger(config: RunConfig) -> None:
    """--liger replaces a causal LM's loss, which reads the LM head's weight whole: a classifier has none to fuse
    (a --model's head is known once the worker builds it), and a weight sharded over ranks is not whole.
    --liger-layers patches a causal LM's layers: a classifier preset has none Liger knows."""
    preset = PRESETS[config.preset]
    if config.liger_layers and config.model is None and preset.objective != "causal-lm":
        raise ConfigError(
            "--liger-layers",
            f"Liger's layer kernels patch causal LMs; {config.preset} is a "
            f"{preset.family} classifier (choose a llama, qwen2 or mistral preset)",
        )
    if not config.liger:
        return
    if config.model is None and preset.objective != "causal-lm":
        raise ConfigError(
            "--liger",
            f"Liger's fused linear cross-entropy replaces a causal LM's loss; {config.preset} "
            f"is a {preset.family} classifier (choose a llama, qwen2 or mistral preset)",
        )
    if config.distributed in ("fsdp", "zero3"):
        raise ConfigError(
            "--liger",
            f"Liger's fused loss reads the LM head's weight whole, which {config.distributed} "
            "shards; use it on one GPU, with ddp, zero1 or zero2",
        )


def _validate_ranks(config: RunConfig) -> None:
    """--gpus, --nproc and --distributed together: a spec that parses, the right one for the device, and a
    distributed technique exactly when there are several ranks."""
    _require_choice("--distributed", config.distributed, DISTRIBUTED)
    _require_choice("--engine", config.engine, ENGINES)
    if config.engine == "accelerate" and config.distributed not in ("none", "ddp"):
        raise ConfigError(
            "--engine",
            f"the accelerate engine trains with none or ddp; {config.distributed} trains with --engine trainer",
        )
    _require_between("--nproc", config.nproc, 1, MAX_CPU_RANKS, "each rank takes a core or more")
    if config.device == "cuda":
        if config.nproc != 1:
            raise ConfigError("--nproc", "counts ranks on the CPU; on GPUs each GPU is a rank: use --gpus N")
        if config.gpus is not None:
            parse_gpus(config.gpus)
    elif config.gpus is not None:
        raise ConfigError("--gpus", f"this run is on the {config.device}; spread it over processes with --nproc N")
    ranks = config.ranks
    if config.distributed != "none" and ranks == 1:
        more = "--gpus 2" if config.device == "cuda" else "--nproc 2"
        raise ConfigError(
            "--distributed", f"{config.distributed} spreads a run over several ranks; this one has one (add {more})"
        )
    if config.distributed == "none" and ranks is not None and ranks > 1:
        raise ConfigError(
            "--distributed", f"none trains on one rank; with {ranks} choose ddp, fsdp, zero1, zero2 or zero3"
        )
    if config.distributed not in ("none", "ddp") and config.device != "cuda":
        raise ConfigError("--distributed", f"{config.distributed} shards over GPUs; on the CPU use ddp")


def _cuda_and_package(cuda: bool, version: str | None, error: str | None, package: str) -> str:
    """What a CUDA-only technique that needs a package lacks here, as "a CUDA GPU and bitsandbytes (…)"; empty if
    nothing. `package` ends with the open parenthesis of its install hint, closed here with the import error."""
    missing = [] if cuda else ["a CUDA GPU"]
    if version is None:
        missing.append(package + (f"; {error})" if error else ")"))
    return " and ".join(missing)


def machine_unsupported_reasons(config: RunConfig, capabilities: Capabilities) -> list[tuple[str, str]]:
    """Every (flag, reason) why this machine cannot run `config`, in the order of the flags; empty when it can."""
    reasons: list[tuple[str, str]] = []
    cuda = config.device == "cuda"
    if cuda and not capabilities.cuda_available:
        reasons.append(
            ("--device", f"cuda is not available here ({capabilities.reason or 'no CUDA GPU'}); use --device cpu")
        )
    if config.precision == "fp16" and not cuda:
        reasons.append(("--precision", "fp16 needs a CUDA GPU; use bf16 or fp32 on CPU"))
    if config.tf32 and not cuda:
        reasons.append(("--tf32", "tf32 needs a CUDA GPU (Ampere or newer)"))
    if config.expandable_segments and not cuda:
        reasons.append(
            ("--expandable-segments", "expandable segments are an option of the CUDA allocator; this run is on cpu")
        )
    compute_capability = capabilities.cuda_compute_capability
    if cuda and compute_capability is not None and compute_capability < (8, 0):
        this_gpu = f"this GPU has {compute_capability[0]}.{compute_capability[1]}"
        if config.tf32:
            reasons.append(("--tf32", f"tf32 needs compute capability ≥ 8.0 ({this_gpu})"))
        if config.precision == "bf16":
            reasons.append(("--precision", f"bf16 needs compute capability ≥ 8.0 ({this_gpu}); use fp16"))
    if config.lora and capabilities.peft_version is None:
        detail = f": {capabilities.peft_error}" if capabilities.peft_error else ""
        reasons.append(("--lora", f"LoRA needs PEFT (pip install 'gpuanat[llm]'){detail}"))
    if config.load_in_4bit:
        missing = _cuda_and_package(
            cuda,
            capabilities.bitsandbytes_version,
            capabilities.bitsandbytes_error,
            "bitsandbytes (pip install 'gpuanat[bnb]'",
        )
        if missing:
            reasons.append(("--load-in-4bit", f"QLoRA's 4-bit base (bitsandbytes NF4) needs {missing}"))
    if config.liger or config.liger_layers:
        missing = _cuda_and_package(
            cuda, capabilities.liger_version, capabilities.liger_error, "liger-kernel (pip install 'gpuanat[llm]'"
        )
        for flag, what, on in (
            ("--liger", "fused linear cross-entropy", config.liger),
            ("--liger-layers", "layer kernels", config.liger_layers),
        ):
            if missing and on:
                reasons.append((flag, f"Liger's {what} (Triton kernels) needs {missing}"))
    if config.distributed.startswith("zero") and capabilities.deepspeed_version is None:
        detail = f": {capabilities.deepspeed_error}" if capabilities.deepspeed_error else ""
        reasons.append(
            (
                "--distributed",
                f"{config.distributed} needs DeepSpeed (pip install deepspeed; README: Several GPUs){detail}",
            )
        )
    if config.optim == "adamw_bnb_8bit":
        missing = _cuda_and_package(
            cuda,
            capabilities.bitsandbytes_version,
            capabilities.bitsandbytes_error,
            "bitsandbytes (pip install 'gpuanat[bnb]'",
        )
        if missing:
            reasons.append(("--optim", f"8-bit Adam (adamw_bnb_8bit) needs {missing}"))
    return reasons


def machine_unsupported_reason(config: RunConfig, capabilities: Capabilities) -> tuple[str, str] | None:
    """The first (flag, reason) why this machine cannot run `config`, else None."""
    reasons = machine_unsupported_reasons(config, capabilities)
    return reasons[0] if reasons else None


def validate_for_machine(config: RunConfig, capabilities: Capabilities) -> None:
    """Raise ConfigError when this machine cannot run `config`."""
    unsupported = machine_unsupported_reason(config, capabilities)
    if unsupported is not None:
        raise ConfigError(*unsupported)
