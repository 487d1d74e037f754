"""The training child: builds model, data and HF Trainer from a RunConfig, trains, reports events.

Run as `python -m gpuanat.worker --events-fd FD --config JSON`. Events go to FD; stdout and stderr
stay the human log. Exit codes: 0 done, 1 exception, 2 config error, 3 out of memory, 130 stopped.

As a rank of a distributed run (started by torchrun through gpuanat.worker.launch) it is given
`--rank-socket PATH` instead: it connects there, says which rank it is, sends its events on the connection and
holds it as its lifeline. Each rank trains on the GPU of its local rank.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import signal
import sys
import tempfile
import traceback
from typing import Any

EXIT_OK, EXIT_EXCEPTION, EXIT_CONFIG, EXIT_OOM, EXIT_STOPPED = 0, 1, 2, 3, 130
LOGGING_STEPS = 10
"""Trainer logs (and so syncs for) the loss every this many steps."""
TOKEN_ID_LOW, TOKEN_ID_HIGH = 100, 30000
"""The docs' dummy data: random token ids in [100, 30000)."""


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def preset_model_config(preset: Any) -> Any:
    """The transformers config of a preset."""
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    if preset.family in ("llama", "qwen2", "mistral"):
        config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[preset.family]
        return config_class(
            vocab_size=preset.vocab_size, hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
            num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
            num_key_value_heads=preset.kv_heads, max_position_embeddings=preset.max_positions,
            tie_word_embeddings=preset.tie_word_embeddings,
        )
    if preset.family == "bert":
        return BertConfig(
            vocab_size=preset.vocab_size, hidden_size=preset.hidden_size, num_hidden_layers=preset.num_layers,
            num_attention_heads=preset.num_heads, intermediate_size=preset.intermediate_size,
            max_position_embeddings=preset.max_positions,
        )
    return GPT2Config(
        vocab_size=preset.vocab_size, n_embd=preset.hidden_size, n_layer=preset.num_layers, n_head=preset.num_heads,
        n_inner=preset.intermediate_size, n_positions=preset.max_positions, pad_token_id=preset.vocab_size - 1,
    )


def is_causal_lm(model_config: Any) -> bool:
    """Whether a config is trained as a causal LM: its `architectures` say so, else a decoder type (one that has a
    causal-LM head and no masked-LM head: encoders such as BERT have both)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = getattr(model_config, "architectures", None) or []
    if architectures:
        return any(name.endswith("ForCausalLM") for name in architectures)
    model_type = getattr(model_config, "model_type", "")
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def build_model(config: Any) -> Any:
    """The model for `config`: from_pretrained for a --model directory or Hub name; random weights from a --model
    config.json or from the preset. Decoders get a causal-LM head, the rest a 2-label classification head (the HF
    docs' workload). With LoRA the base is held in the run's 16-bit precision, as PEFT users load it; with QLoRA
    its linear layers are quantized to NF4 and PEFT prepares it for k-bit training. With Liger the causal LM's loss
    is Liger Kernel's fused linear cross-entropy."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from gpuanat.core.run.presets import PRESETS

    torch.manual_seed(config.seed)
    quantization = bnb_4bit_config(config) if config.load_in_4bit else None
    if config.model is not None and not config.model.endswith(".json"):
        model_config = AutoConfig.from_pretrained(config.model)
        head = AutoModelForCausalLM if is_causal_lm(model_config) else AutoModelForSequenceClassification
        if quantization is not None:  # transformers quantizes each weight of the checkpoint as it reaches the GPU
            model = head.from_pretrained(config.model, attn_implementation=config.attn,
                                         quantization_config=quantization, dtype=quantization.bnb_4bit_compute_dtype,
                                         device_map={"": training_device(config)})
        else:
            model = head.from_pretrained(config.model, attn_implementation=config.attn)
    else:
        model_config = (AutoConfig.from_pretrained(config.model) if config.model is not None
                        else preset_model_config(PRESETS[config.preset]))
        # A preset says what it trains (gpt2 is the docs' classifier, though its config is a decoder's)
        causal = (PRESETS[config.preset].objective == "causal-lm" if config.model is None
                  else is_causal_lm(model_config))
        head = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
        sixteen_bit = {} if quantization is None else {"dtype": quantization.bnb_4bit_compute_dtype}
        # Initialising on the target device is much faster than on the CPU and gives the same model.
        with torch.device(training_device(config)):
            model = head.from_config(model_config, attn_implementation=config.attn, **sixteen_bit)
        if quantization is not None:
            model = quantized_in_place(model, quantization, training_device(config))
    # Name the head, so that what reads the config later (labels, LoRA's task, Liger) knows which one it is
    model.config.architectures = [type(model).__name__]
    if not is_causal_lm(model.config) and model.config.problem_type is None and model.config.num_labels > 1:
        # What the classifier sets itself at its first forward for our integer labels: set before, it leaves
        # torch.compile's graph valid (else the change fails a guard and bert-large compiles twice)
        model.config.problem_type = "single_label_classification"
    if config.liger:
        with_liger_loss(model)
    if config.load_in_4bit:
        model = with_qlora(model, config)
        if config.device == "cuda":  # the 16-bit model that was quantized is gone: neither its peak nor the blocks
            torch.cuda.empty_cache()  # it left cached are the training's (peft 0.21 empties the cache too; older not)
            torch.cuda.reset_peak_memory_stats()
    elif config.lora:
        model = with_lora(model, config)
    return model


def lora_config(model: Any, config: Any) -> Any:
    """PEFT's LoRA config of rank `config.lora` (alpha 2R, no dropout) on `config.lora_targets`."""
    from peft import LoraConfig, TaskType

    targets = config.lora_targets if config.lora_targets == "all-linear" else config.lora_targets.split(",")
    task = TaskType.CAUSAL_LM if is_causal_lm(model.config) else TaskType.SEQ_CLS
    return LoraConfig(r=config.lora, lora_alpha=2 * config.lora, lora_dropout=0.0, target_modules=targets,
                      task_type=task)


def with_lora(model: Any, config: Any) -> Any:
    """`model` with LoRA adapters of rank `config.lora` on `config.lora_targets` (PEFT), its base frozen and held
    in the run's 16-bit precision (fp32 otherwise); the adapters stay fp32, as PEFT creates them."""
    import torch
    from peft import get_peft_model

    if config.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if config.precision == "bf16" else torch.float16)
    return get_peft_model(model, lora_config(model, config))


def bnb_4bit_config(config: Any) -> Any:
    """The QLoRA paper's quantization, as PEFT's and transformers' guides write it: NF4 with double quantization
    (the blocks' scales quantized too), computing in 16 bits (fp16 for an fp16 run, else bf16)."""
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.float16 if config.precision == "fp16" else torch.bfloat16)


def quantized_in_place(model: Any, quantization: Any, device: str) -> Any:
    """`model`, built with random weights in its compute dtype on `device`, with its linear layers quantized as
    `from_pretrained(quantization_config=...)` quantizes a checkpoint's: transformers' bitsandbytes quantizer
    replaces every linear layer but those it keeps (the LM head or classifier: the output embeddings and the last
    module) by a bitsandbytes Linear4bit, and each 16-bit weight becomes a Params4bit that is quantized as it moves to
    the device, freeing the 16-bit weight as it goes (transformers' `Bnb4bitQuantize`). Saving the random model and
    loading it back quantized would do the same through the disk: 16 GB written and read again for an 8B model."""
    import bitsandbytes as bnb
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization, pre_quantized=False)
    quantizer.validate_environment(device_map={"": device})
    originals = {name: module for name, module in model.named_modules()
                 if isinstance(module, (torch.nn.Linear, Conv1D))}
    quantizer.preprocess_model(model=model, dtype=quantization.bnb_4bit_compute_dtype, device_map={"": device},
                               checkpoint_files=None, use_kernels=False)
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        original = originals.pop(name)
        weight = original.weight.data.T if issubclass(module.source_cls, Conv1D) else original.weight.data
        module.weight = bnb.nn.Params4bit(weight, requires_grad=False, **module.weight.__dict__).to(device)
        if original.bias is not None:
            module.bias = original.bias
        del original, weight
    originals.clear()
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)  # marks it quantized, loaded in 4 bits, with its quantization config
    return model


def with_qlora(model: Any, config: Any) -> Any:
    """QLoRA as PEFT's guide trains it: `prepare_model_for_kbit_training` freezes the 4-bit model, casts its other
    16-bit parameters (embeddings, norms, LM head) to fp32 and, with checkpointing, makes the inputs require grad;
    then LoRA adapters of rank `config.lora`, fp32, on `config.lora_targets`."""
    from peft import get_peft_model, prepare_model_for_kbit_training

    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.grad_checkpointing)
    return get_peft_model(model, lora_config(model, config))


LIGER_KERNELS = {"fused_linear_cross_entropy": True, "cross_entropy": False, "rope": False, "rms_norm": False,
                 "swiglu": False, "geglu": False, "layer_norm": False}
"""Only the fused linear cross-entropy, so that a run with --liger differs from one without in the loss alone (the
LM head's matmul and the cross-entropy computed in chunks, the logits never whole); the other kernels stay off."""


def with_liger_loss(model: Any) -> None:
    """Patch `model` (a causal LM, before PEFT wraps it) with Liger Kernel's fused linear cross-entropy, as HF
    Trainer's `use_liger_kernel` does (`_apply_liger_kernel_to_instance`): its forward, in training with labels,
    returns the loss and no logits."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    from gpuanat.core.run.errors import ConfigError

    model_type = getattr(model.config, "model_type", None)
    if not is_causal_lm(model.config) or model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ConfigError("--liger", f"Liger Kernel has no fused loss for this model ({model_type}, "
                                     f"{type(model).__name__}): it patches causal LMs of the types it knows")
    _apply_liger_kernel_to_instance(model=model, **LIGER_KERNELS)


def training_device(config: Any) -> str:
    """This process's device: on CUDA, the GPU of its local rank (every rank sees all the run's GPUs)."""
    if config.device != "cuda":
        return config.device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def transformer_layer_class_names(model: Any) -> list[str]:
    """The model's repeated block class, which FSDP wraps one unit each: the class of the first ModuleList's items
    (BertLayer, GPT2Block, LlamaDecoderLayer). Not `_no_split_modules`, which may name the embeddings too: accelerate
    shards the input embeddings itself, and a module sharded twice fails."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return [type(module[0]).__name__]
    raise ValueError(f"cannot find the repeated layers of {type(model).__name__} for FSDP to wrap")


def deepspeed_config(stage: int) -> dict[str, Any]:
    """A DeepSpeed config that needs no compiled ops: ZeRO `stage`, the Trainer's own (torch) optimizer, no
    offload; batch, accumulation, precision and clipping from the TrainingArguments ("auto")."""
    return {
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True},
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }


def distributed_arguments(config: Any, model: Any) -> dict[str, Any]:
    """TrainingArguments for `config.distributed`: DDP needs none (torchrun's environment turns it on); FSDP2 wraps
    each transformer layer; ZeRO passes a DeepSpeed config."""
    from gpuanat.core.run.techniques import ZERO_STAGES

    if config.distributed == "fsdp":
        layers = transformer_layer_class_names(model)
        return {"fsdp": "full_shard", "fsdp_config": {"version": 2, "reshard_after_forward": True,
                                                      "transformer_layer_cls_to_wrap": layers}}
    if config.distributed in ZERO_STAGES:
        return {"deepspeed": deepspeed_config(ZERO_STAGES[config.distributed])}
    return {}


def build_dataset(config: Any, vocab_size: int, causal_lm: bool = False) -> Any:
    """The docs' dummy dataset: random token ids, labels drawn as in the docs (a causal LM's labels: its input ids,
    which the model shifts), torch format."""
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(config.seed)
    high = min(TOKEN_ID_HIGH, vocab_size)
    input_ids = rng.integers(min(TOKEN_ID_LOW, high - 1), high, (config.samples, config.seq_len))
    dataset = Dataset.from_dict({
        "input_ids": input_ids,
        "labels": input_ids.copy() if causal_lm else rng.integers(0, 1, config.samples),
    })
    dataset.set_format("pt")
    return dataset


def training_arguments_kwargs(config: Any, output_dir: str) -> dict[str, Any]:
    """TrainingArguments for `config` — shared with the plain-Trainer baseline benchmark."""
    import dataclasses

    from transformers import TrainingArguments

    # transformers 5.2x renamed gradient_checkpointing (deprecated) to activation_checkpointing.
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}
    checkpointing_key = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return {
        "output_dir": output_dir,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        checkpointing_key: config.grad_checkpointing,
        "fp16": config.precision == "fp16",
        "bf16": config.precision == "bf16",
        "tf32": config.tf32 if config.device == "cuda" else None,
        "optim": config.optim,
        "dataloader_num_workers": config.workers,
        "dataloader_pin_memory": config.pin_memory,
        "torch_compile": config.compile,
        "num_train_epochs": config.epochs,
        "max_steps": config.max_steps if config.max_steps is not None else -1,
        "use_cpu": config.device == "cpu",
        "seed": config.seed,
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_strategy": "steps",
        "logging_steps": LOGGING_STEPS,
        "log_level": "error",
    }


def _versions() -> dict[str, str]:
    import datasets
    import torch
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "datasets": datasets.__version__}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


MEMORY_HISTORY_MAX_EVENTS = 1_000_000
"""Allocator events a memory snapshot keeps (the oldest are dropped beyond): 2-step runs of bert-large made
14,000-88,000 on the H100 (benchmarks/results/h100/allocator/allocation_trace.log)."""


def record_memory_history(path: str | None) -> Any:
    """Start torch's allocator history when `path` is set (CUDA only); the returned function writes the snapshot
    there: pytorch.org/memory_viz reads it, and `gpuanat.core.memory.allocator` replays it. Besides torch's own keys it
    holds `gpuanat`: the device memory free when it was written (`torch.cuda.mem_get_info`)."""
    import pickle

    import torch

    if not path or not torch.cuda.is_available():
        return lambda: None
    torch.cuda.memory._record_memory_history(context="alloc", stacks="python", max_entries=MEMORY_HISTORY_MAX_EVENTS)

    def dump() -> None:
        snapshot = torch.cuda.memory._snapshot()
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        snapshot["gpuanat"] = {"device_free_bytes": free_bytes, "device_total_bytes": total_bytes,
                               "reserved_bytes": torch.cuda.memory_reserved()}
        with open(path, "wb") as file:
            pickle.dump(snapshot, file)

    return dump


def milestone_emitter(emit: Any) -> Any:
    """A function that reports a start-up or end milestone (protocol.MILESTONES) as reached now."""
    import time

    from gpuanat.core.run.protocol import Milestone

    return lambda name: emit(Milestone(name=name, monotonic_s=time.monotonic()))


def train(config: Any, emit: Any) -> int:
    import torch
    from transformers import Trainer, TrainingArguments

    from gpuanat.core.run.config import ALLOCATOR_CONF_VARIABLE, MEMORY_SNAPSHOT_VARIABLE
    from gpuanat.core.run.errors import ConfigError
    from gpuanat.core.run.protocol import Done, Error, Hello
    from gpuanat.worker.probe.hf import AnatomyCallback

    reached = milestone_emitter(emit)
    reached("imported")
    if config.device == "cuda":
        torch.cuda.set_device(training_device(config))  # before anything touches CUDA: one context, on our GPU
    device_name = torch.cuda.get_device_name() if config.device == "cuda" else platform.processor() or None
    emit(Hello(pid=os.getpid(), versions=_versions(), device=config.device, device_name=device_name,
               config=config.to_json(), allocator_conf=os.environ.get(ALLOCATOR_CONF_VARIABLE)))
    reached("cuda ready")
    dump_memory_snapshot = record_memory_history(os.environ.get(MEMORY_SNAPSHOT_VARIABLE))
    probe = AnatomyCallback(emit)
    trainer = None
    with tempfile.TemporaryDirectory(prefix="gpuanat-") as output_dir:
        try:
            try:
                model = build_model(config)
            except ConfigError as error:
                emit(Error(kind="config", flag=error.flag, message=error.message))
                return EXIT_CONFIG
            except (OSError, ValueError) as error:
                emit(Error(kind="config", flag="--model", message=f"cannot load model {config.model!r}: {error}"))
                return EXIT_CONFIG
            compiled_frames = 1 if config.compile else 0
            if config.compile_regions:  # one compiled frame a kind of module: its graph serves every layer
                compiled_frames = len({type(module) for module in compile_regions(model)})
            reached("model built")
            dataset = build_dataset(config, model.config.vocab_size, causal_lm=is_causal_lm(model.config))
            reached("dataset built")
            arguments = TrainingArguments(**training_arguments_kwargs(config, output_dir),
                                          **distributed_arguments(config, model))
            if config.engine == "accelerate":
                from gpuanat.worker.accelerate_loop import train_with_accelerate

                metrics = train_with_accelerate(config, model, dataset, probe, arguments, LOGGING_STEPS,
                                                on_ready=lambda: reached("trainer ready"))
                global_step = metrics["global_step"]
            else:
                trainer = Trainer(model=model, args=arguments, train_dataset=dataset, callbacks=[probe])
                reached("trainer ready")
                output = trainer.train()
                metrics, global_step = output.metrics, output.global_step
            reached("trained")
        except torch.OutOfMemoryError as error:
            dump_memory_snapshot()  # before the trainer's memory is freed (the frames unwound have freed theirs)
            # The model itself may not fit (no step yet), or a step ran out of memory.
            step = probe.steps + 1 if probe.started else 0
            peak_allocated, reserved = probe.peak_allocated_bytes, probe.peak_reserved_bytes
            if peak_allocated is None and config.device == "cuda":
                peak_allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved()
            trainer = model = None
            gc.collect()
            torch.cuda.empty_cache()
            emit(Error(kind="oom", message=str(error).splitlines()[0], step=step,
                       peak_allocated_bytes=peak_allocated, reserved_bytes=reserved))
            return EXIT_OOM
        except KeyboardInterrupt:
            dump_memory_snapshot()
            emit(Done(status="stopped", steps=probe.steps, samples=probe.samples,
                      train_runtime_s=None, samples_per_second=None, steady_samples_per_second=None,
                      warmup_steps=getattr(probe, "warmup_steps", 0), steady_reason="stopped before the end",
                      peak_allocated_bytes=probe.peak_allocated_bytes,
                      peak_reserved_bytes=probe.peak_reserved_bytes, bands=probe.last_bands,
                      probe_time_s=probe.probe_time_s, probe_time_by_part_s=dict(probe.probe_time_by_part_s)))
            return EXIT_STOPPED
    dump_memory_snapshot()
    steady = probe.steady_state()
    emit(Done(
        status="ok",
        steps=global_step,
        samples=probe.samples,
        train_runtime_s=metrics.get("train_runtime"),
        samples_per_second=metrics.get("train_samples_per_second"),
        steady_samples_per_second=steady["steady_samples_per_second"],
        warmup_steps=steady["warmup_steps"],
        steady_reason=steady["steady_reason"],
        train_loss=metrics.get("train_loss"),
        peak_allocated_bytes=probe.peak_allocated_bytes,
        peak_reserved_bytes=probe.peak_reserved_bytes,
        bands=probe.last_bands,
        probe_time_s=probe.probe_time_s,
        probe_time_by_part_s=dict(probe.probe_time_by_part_s),
        **probe.steady_phases(),
        compile_stats=compile_stats(compiled_frames) if compiled_frames else None,
    ))
    return EXIT_OK


def _holds_attention(module: Any) -> bool:
    return any("Attention" in type(inner).__name__ for inner in module.modules())


def _compile_outside_attention(module: Any) -> list[Any]:
    """Compile `module` whole when it holds no attention, else its children that hold none, leaving the innermost
    attention module (the one that calls the attention kernel, with its projections) eager; the modules compiled."""
    if not _holds_attention(module):
        module.compile()
        return [module]
    children = list(module.children())
    if not any(_holds_attention(child) for child in children):
        return []
    return [compiled for child in children for compiled in _compile_outside_attention(child)]


def compile_regions(model: Any) -> list[Any]:
    """`--compile-regions`: in each of the model's repeated blocks (its `_no_split_modules`: a BERT layer and its
    embeddings, a decoder layer), compile the parts outside attention in place, each part its own graph (the same
    code in every layer: one compilation serves all). Attention stays SDPA's fused kernel, which a whole compiled
    model loses to the unfused math once attention has dropout (1.7× the memory, slower, on the H100). Returns the
    modules it compiled."""
    block_names = next((set(inner._no_split_modules) for inner in model.modules()
                        if getattr(inner, "_no_split_modules", None)), set())
    blocks = [inner for inner in model.modules() if type(inner).__name__ in block_names]
    return [compiled for block in blocks for compiled in _compile_outside_attention(block)]


def compile_stats(frames: int) -> dict[str, int]:
    """TorchDynamo's counters: the unique graphs it compiled and the graph breaks it met, with the `frames` compiled
    (the whole model: 1; --compile-regions: one a kind of module). Each break splits a graph; graphs beyond
    breaks + frames are recompilations: new shapes, guards that failed."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())), "frames": frames}


def connect_rank_socket(path: str) -> int:
    """Connect to the rank launcher, say which rank this is, and hold the connection as this rank's lifeline;
    returns its descriptor, to write events to."""
    import socket

    from gpuanat.worker.lifeline import hold_lifeline_fd

    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    header = {"rank": int(os.environ.get("RANK", "0")), "pid": os.getpid()}
    connection.sendall((json.dumps(header) + "\n").encode())
    fd = connection.detach()
    hold_lifeline_fd(fd)
    return fd


def main(argv: list[str] | None = None, started_monotonic_s: float | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuanat.worker", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--events-fd", type=int, help="the pipe gpuanat reads events from")
    where.add_argument("--rank-socket", help="as a rank of a distributed run: the rank launcher's socket")
    parser.add_argument("--config", required=True, help="RunConfig as JSON")
    args = parser.parse_args(argv)

    from gpuanat.core.run.config import RunConfig
    from gpuanat.core.run.protocol import Error, Milestone
    from gpuanat.worker.events import EventWriter, ParentGone

    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    writer = EventWriter(args.events_fd if args.rank_socket is None else connect_rank_socket(args.rank_socket))
    config = RunConfig.from_json(json.loads(args.config))
    try:
        if started_monotonic_s is not None:
            writer.emit(Milestone(name="started", monotonic_s=started_monotonic_s))
        return train(config, writer.emit)
    except ParentGone:
        return EXIT_STOPPED
    except KeyboardInterrupt:
        return EXIT_STOPPED
    except Exception as error:
        with contextlib.suppress(ParentGone):
            writer.emit(Error(kind="exception", message=f"{type(error).__name__}: {error}",
                              traceback=traceback.format_exc()))
        traceback.print_exc()
        return EXIT_EXCEPTION


if __name__ == "__main__":
    sys.exit(main())
