"""RunConfig: every technique of one training run as a typed value, and what follows from it before the run.

`RunConfig` is what flags or technique keys make and what the history keeps (`to_json`); `Capabilities` is what
the machine can run, as the worker's capability probe reads it. Both are checked against each other in
`validation`. What the user left untouched follows the machine: `workload_for_device` sizes the workload for the
device it trains on, `distributed_for_ranks` picks DDP for several ranks; `child_environment` hands the allocator
technique to the training child.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gpuanat.core.vocabulary.gpu_request import requested_count
from gpuanat.core.vocabulary.presets import DEFAULT_PRESET


@dataclass(frozen=True)
class RunConfig:
    preset: str = DEFAULT_PRESET
    model: str | None = None
    """Name or path for from_pretrained; None builds `preset` with random weights."""
    device: str = "cuda"
    batch_size: int = 4
    grad_accum: int = 1
    grad_checkpointing: bool = False
    selective_checkpointing: bool = False
    """With `grad_checkpointing`: keep every matmul's and attention's output (torch's selective activation
    checkpointing) and recompute in backward only the element-wise and normalization kernels between them — more
    memory than full checkpointing, a fraction of its recomputation."""
    precision: str = "fp32"
    tf32: bool = False
    optim: str = "adamw_torch_fused"
    """The HF Trainer default."""
    workers: int = 0
    pin_memory: bool = True
    """The HF Trainer default."""
    attn: str = "sdpa"
    compile: bool = False
    compile_regions: bool = False
    """torch.compile each repeated layer's blocks that hold no attention (a BERT layer's MLP, its output projections
    with their residual and LayerNorm; the embeddings): their small kernels fused, attention left to SDPA's fused
    kernel, which a whole compiled model loses with attention dropout."""
    expandable_segments: bool = False
    """CUDA caching allocator option (`PYTORCH_CUDA_ALLOC_CONF`): grow segments by mapping pages instead of
    allocating fixed blocks, so memory freed between tensors can be reused. Off, as in PyTorch."""
    gpus: str | None = None
    """`--gpus` as given (a count, NVML indices, or "all"); None trains on one GPU, the first idle one. The GPUs a
    run used are in its result (`gpus`)."""
    distributed: str = "none"
    nproc: int = 1
    """Ranks on the CPU; on CUDA every chosen GPU is a rank."""
    engine: str = "trainer"
    weights_dtype: str = "fp32"
    """The dtype the trained model is held in: fp32 (master weights; with --precision bf16/fp16 autocast computes
    in 16 bits, the HF docs' setting) or bf16 (the model itself in bf16, as `from_pretrained` loads a bf16
    checkpoint, its gradients and AdamW's states too, as TRL and plain loops train it; needs --precision bf16)."""
    autocast: bool = True
    """With a bf16 model: True runs HF Trainer's bf16 autocast over it (TRL's setting: LayerNorm, softmax and the
    loss in fp32, so the residual stream is fp32 after every LayerNorm); False computes straight in the model's bf16,
    no autocast — pure bf16, as a plain bf16 loop trains: every activation, the residual stream too, in 16 bits, half
    the bytes the element-wise and normalization kernels move. Either way the weights are updated in bf16 (an update
    under 1/256 of a weight rounds away). Needs `weights_dtype` bf16."""
    lora: int = 0
    """LoRA rank; 0 trains every weight."""
    lora_targets: str = "all-linear"
    lora_dropout: float = 0.0
    """PEFT's dropout on the adapters' input (0.05-0.1 is usual): each adapted layer keeps its mask, a byte an input
    element, until backward."""
    load_in_4bit: bool = False
    """QLoRA: the frozen base's linear layers held in bitsandbytes NF4 (double quantization, 16-bit compute), the
    LM head and the other parameters in fp32 as PEFT's `prepare_model_for_kbit_training` leaves them; needs `lora`."""
    liger: bool = False
    """Liger Kernel's fused linear cross-entropy: a causal LM's loss computed from the hidden states in chunks,
    without the logits."""
    liger_layers: bool = False
    """Liger Kernel's kernels inside a causal LM's layers: RMSNorm, SwiGLU/GeGLU and RoPE (with `liger`: what HF
    Trainer's `use_liger_kernel` applies)."""
    seq_len: int = 512
    samples: int = 512
    epochs: int = 1
    max_steps: int | None = None
    seed: int = 42
    data: str | None = None
    """The user's data (`--data`): a local jsonl/json/csv/parquet/arrow file, a saved dataset directory or a cached
    Hub dataset name; None trains on the docs' random token ids."""
    text_field: str | None = None
    """The column of `data` that holds the text; None: found by its name (`gpuanat.user_data.TEXT_FIELDS`)."""
    tokenizer: str | None = None
    """The tokenizer `data` is tokenized with (a directory or a cached Hub name); None: `model`'s."""
    padding: str = "longest"
    """How `data`'s rows of different lengths make batches (`techniques.PADDINGS`): padded to each batch's longest,
    every row padded to `seq_len`, or packed into `seq_len` blocks. Random data has no padding."""

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step on one rank."""
        return self.batch_size * self.grad_accum

    @property
    def ranks(self) -> int | None:
        """Training processes: `nproc` on the CPU, one per GPU asked for on CUDA (None for `--gpus all`, known
        once the GPUs are read)."""
        if self.device != "cuda":
            return self.nproc
        return requested_count(self.gpus)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def techniques_summary(self) -> str:
        """Short human label of the techniques that differ from plain training, e.g. 'bs4 fp16 gc'."""
        parts = [f"bs{self.batch_size}"]
        if self.grad_accum > 1:
            parts.append(f"accum{self.grad_accum}")
        if self.grad_checkpointing:
            parts.append("gc-selective" if self.selective_checkpointing else "gc")
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.weights_dtype != RunConfig.weights_dtype:
            parts.append(f"{self.weights_dtype}-weights" if self.autocast else f"pure-{self.weights_dtype}")
        if self.tf32:
            parts.append("tf32")
        if self.optim != RunConfig.optim:
            parts.append(self.optim)
        if self.attn != RunConfig.attn:
            parts.append(self.attn)
        if self.compile:
            parts.append("compile")
        if self.compile_regions:
            parts.append("compile-regions")
        if self.expandable_segments:
            parts.append("expseg")
        if self.workers:
            parts.append(f"workers{self.workers}")
        if self.lora:
            parts.append(
                ("qlora" if self.load_in_4bit else "lora")
                + str(self.lora)
                + (f"[{self.lora_targets}]" if self.lora_targets != "all-linear" else "")
                + (f" dropout{self.lora_dropout:g}" if self.lora_dropout else "")
            )
        if self.liger:
            parts.append("liger")
        if self.liger_layers:
            parts.append("liger-layers")
        if self.data is not None and self.padding != RunConfig.padding:
            parts.append("pack" if self.padding == "pack" else f"pad-{self.padding}")
        if self.engine != "trainer":
            parts.append(self.engine)
        if self.distributed != "none":
            parts.append(f"{self.distributed}×{self.gpus if self.device == 'cuda' and self.gpus else self.nproc}")
        elif self.gpus:
            parts.append(f"gpus {self.gpus}")
        return " ".join(parts)


@dataclass(frozen=True)
class Capabilities:
    """What the machine can run, as read by the worker's capability probe (which imports torch)."""

    torch_version: str | None
    cuda_available: bool
    cuda_device_name: str | None = None
    cuda_compute_capability: tuple[int, int] | None = None
    cuda_total_memory_bytes: int | None = None
    bitsandbytes_version: str | None = None
    """None when bitsandbytes cannot be imported."""
    bitsandbytes_error: str | None = None
    peft_version: str | None = None
    """None when peft cannot be imported."""
    peft_error: str | None = None
    liger_version: str | None = None
    """None when liger-kernel is not installed."""
    liger_error: str | None = None
    deepspeed_version: str | None = None
    """None when deepspeed cannot be imported."""
    deepspeed_error: str | None = None
    cuda_device_count: int = 0
    reason: str | None = None
    """Why CUDA is unavailable, when it is."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Capabilities:
        data = dict(data)
        if data.get("cuda_compute_capability") is not None:
            data["cuda_compute_capability"] = tuple(data["cuda_compute_capability"])
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def distributed_for_ranks(config: RunConfig, untouched: Collection[str]) -> RunConfig:
    """`config` with DDP, the plain way to train on several ranks, when the user asked for several (--gpus 2,
    --nproc 2) and chose no technique."""
    ranks = config.ranks
    if "distributed" in untouched and config.distributed == "none" and (ranks is None or ranks > 1):
        return config.replace(distributed="ddp")
    return config


CPU_WORKLOAD: dict[str, Any] = {"preset": "tiny", "seq_len": 64, "samples": 64}
"""The workload a CPU trains when the user chose none: bert-large (the GPU default) trains at 0.1 samples/s on
a CPU, about 85 minutes a run. This one — 16 steps at the default batch 4 — takes a whole `gpuanat run` 6.2-6.7 s
wall on an idle 2-core CPU (0.2 s of it training; the rest is imports, the capability probe and the model's
construction), 14-16 s wall while other tests ran there."""
DASHBOARD_CPU_SAMPLES = 2048
"""Samples of the dashboard's CPU run when the user chose none: a run there is to be watched, and `CPU_WORKLOAD`'s 64
were over in 0.27 s of training (issue #48). 2048 at the default batch 4 are 512 steps: ~8.6 s of training at the
pace seen then (64 samples in 0.27 s), 25 s on the 2-core development machine under other sessions' load (82 samples/s
measured at load 5.5, one torch thread). `[` and `]` change it."""
WORKLOAD_CHOICE_FIELDS = ("preset", "model")
"""Either, given by the user, means they chose the workload: the device never changes it."""


def workload_for_device(
    config: RunConfig, untouched: Collection[str], *, watched: bool = False
) -> tuple[RunConfig, str | None]:
    """`config` with its workload sized for the device it trains on, and what it trains now in a few words
    (None when nothing changed). `untouched` names the fields the user did not give: on the CPU, when neither
    preset nor model was given, those of `CPU_WORKLOAD` take its values (a --seq-len or --samples given stays); a
    `watched` run (the dashboard's) takes `DASHBOARD_CPU_SAMPLES` samples."""
    if config.device != "cpu" or not all(field in untouched for field in WORKLOAD_CHOICE_FIELDS):
        return config, None
    workload = CPU_WORKLOAD | ({"samples": DASHBOARD_CPU_SAMPLES} if watched else {})
    changes = {field: value for field, value in workload.items() if field in untouched}
    sized = config.replace(**changes)
    if sized == config:
        return config, None
    return sized, f"training the {sized.preset} preset, seq {sized.seq_len}, {sized.samples} samples"


ALLOCATOR_CONF_VARIABLE = "PYTORCH_CUDA_ALLOC_CONF"
MEMORY_SNAPSHOT_VARIABLE = "GPUANAT_MEMORY_SNAPSHOT"
"""Where the training child writes torch's allocator history (`gpuanat run --memory-snapshot`)."""
OOM_SNAPSHOT_VARIABLE = "GPUANAT_KEEP_OOM_SNAPSHOT"
"""Where the training child writes the allocator's snapshot when it runs out of memory (`--keep-oom-snapshot`)."""
OOM_SNAPSHOT_EVENTS = 100_000
"""Allocator events that snapshot keeps (the oldest dropped beyond): bounded, whatever the run's length."""
PROFILE_OPS_VARIABLE = "GPUANAT_PROFILE_OPS"
"""Steps the probe profiles for the operations anatomy (`gpuanat run --profile-ops N`; any probe reads it, so a
script watched by PID can be asked too); unset or 0: none."""
PROFILE_OPS_TRACE_VARIABLE = "GPUANAT_PROFILE_OPS_TRACE"
"""Where the probe writes the profiled steps' Chrome/Perfetto trace (`--profile-ops-trace FILE`)."""
TRIAL_PROFILED_STEPS = 2
"""Steps of each `tune` trial profiled for its operations anatomy (after warm-up, out of the steady window): what
the round that trial starts tries first (`core.run.tune.moves`)."""
PROFILED_TRIAL_MIN_STEPS = 10
"""The shortest trial `tune` profiles unasked: warm-up, the profiler's own warm-up step and the profiled steps leave
too few steps of a shorter trial for its steady rate."""
DEFAULT_PROFILE_OPS_STEPS = 3
"""Steps `--profile-ops` profiles when given no count: enough to average a step's kernels, few enough that the
profile is read in seconds."""


def _allocator_options(environment: Mapping[str, str]) -> list[tuple[str, str]]:
    """`PYTORCH_CUDA_ALLOC_CONF`'s options as (name, value) pairs, e.g. [("expandable_segments", "True")]."""
    pairs = (option.partition(":") for option in environment.get(ALLOCATOR_CONF_VARIABLE, "").split(","))
    return [(name.strip(), value.strip()) for name, _, value in pairs if name.strip()]


def expandable_segments_enabled(environment: Mapping[str, str]) -> bool:
    """Whether `environment`'s `PYTORCH_CUDA_ALLOC_CONF` turns expandable segments on (the technique's default)."""
    return any(
        name == "expandable_segments" and value.lower() == "true" for name, value in _allocator_options(environment)
    )


def child_environment(config: RunConfig, base: Mapping[str, str]) -> dict[str, str]:
    """The training child's environment: `base` with `PYTORCH_CUDA_ALLOC_CONF`'s expandable_segments option
    set from `config` (the technique decides), its other options kept."""
    options = [f"{name}:{value}" for name, value in _allocator_options(base) if name != "expandable_segments"]
    options.append(f"expandable_segments:{config.expandable_segments}")
    return {**base, ALLOCATOR_CONF_VARIABLE: ",".join(options)}
