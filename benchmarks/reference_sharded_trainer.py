"""The reference for a decoder sharded over several GPUs (issue #34), outside gpuanat: a plain HF Trainer script as a
user writes it from the transformers and accelerate docs, and nothing of gpuanat's. The model comes from a checkpoint
with `from_pretrained` onto the host in the checkpoint's dtype (transformers 5's default; a bf16 checkpoint, as
llama-3.1-8b ships) — or from a config.json with `from_config`, in the dtype it names — then Trainer's own FSDP2
(`fsdp=True`, full sharding, each decoder layer wrapped: accelerate upcasts the trained parameters to fp32) or DeepSpeed
ZeRO-1/2/3 (for ZeRO-3 the TrainingArguments made first, so that transformers loads the model inside
`deepspeed.zero.Init`, as the docs say), optionally PEFT's LoRA on the 16-bit base; bf16 autocast, checkpointing,
fused AdamW, random tokens.
Each rank prints one JSON line: torch's peak allocated and reserved over the run, NVML's reading of its GPU and of
its own process after the last step, and seconds per step.

    torchrun --nproc-per-node 2 benchmarks/reference_sharded_trainer.py --checkpoint DIR --seq-len 1024 \\
        [--sharding fsdp|zero1|zero2|zero3] [--lora R] [--batch-size 1] [--steps 8] [--no-checkpointing]
    torchrun --nproc-per-node 2 benchmarks/reference_sharded_trainer.py --config benchmarks/configs/llama-3.1-8b ...
    python3 benchmarks/reference_sharded_trainer.py --config benchmarks/configs/llama-3.1-8b --tiny  # smoke test
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any

import torch
import transformers
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.ends_s: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends_s.append(time.perf_counter())


def nvml_reading(local_rank: int) -> dict[str, int | None]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(local_rank)
    own = [
        process.usedGpuMemory
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if process.pid == os.getpid()
    ]
    return {
        "device_used_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
        "process_used_bytes": own[0] if own else None,
    }


def training_arguments(args: argparse.Namespace, output_dir: str, on_gpu: bool, layer_class: str | None) -> Any:
    fields = {field.name for field in dataclasses.fields(TrainingArguments)}  # renamed in transformers 5.2x
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    sharding: dict = {}
    if args.sharding == "fsdp":
        sharding = {
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "reshard_after_forward": True,
                "transformer_layer_cls_to_wrap": [layer_class],
            },
        }
    elif args.sharding and args.sharding.startswith("zero"):
        sharding = {
            "deepspeed": {
                "zero_optimization": {"stage": int(args.sharding[-1])},
                "bf16": {"enabled": "auto"},
                "train_micro_batch_size_per_gpu": "auto",
                "train_batch_size": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": "auto",
                "zero_allow_untested_optimizer": True,
            }
        }
    return TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=args.batch_size,
        max_steps=args.steps,
        bf16=on_gpu,
        use_cpu=not on_gpu,
        **{checkpointing: not args.no_checkpointing},
        optim="adamw_torch_fused",
        report_to="none",
        save_strategy="no",
        logging_steps=1_000_000,
        **sharding,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a directory from save_pretrained: from_pretrained, its dtype")
    source.add_argument("--config", help="a directory with a config.json: from_config, random fp32 weights")
    parser.add_argument("--sharding", choices=("fsdp", "zero1", "zero2", "zero3"), default="fsdp")
    parser.add_argument("--lora", type=int, default=0, help="PEFT LoRA of this rank on all linear layers")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="2 small layers on the CPU, no sharding: a smoke test")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = torch.cuda.is_available() and not args.tiny
    if on_gpu:
        torch.cuda.set_device(local_rank)
    config = AutoConfig.from_pretrained(args.checkpoint or args.config)
    if args.tiny:
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size = 2, 1, 32, 1000
        args.sharding = None
    output_dir = tempfile.mkdtemp()
    started_s = time.perf_counter()
    # ZeRO-3: the arguments before the model (transformers reads DeepSpeed's config from them as it loads)
    arguments = training_arguments(args, output_dir, on_gpu, None) if args.sharding == "zero3" else None
    torch.manual_seed(0)
    if args.checkpoint and not args.tiny:
        model = AutoModelForCausalLM.from_pretrained(args.checkpoint)
    else:
        model = AutoModelForCausalLM.from_config(config)
    if args.lora:
        from peft import LoraConfig, TaskType, get_peft_model

        model = get_peft_model(
            model.to(torch.bfloat16) if on_gpu else model,
            LoraConfig(
                r=args.lora, lora_alpha=2 * args.lora, target_modules="all-linear", task_type=TaskType.CAUSAL_LM
            ),
        )
    loaded_s = time.perf_counter() - started_s
    layer_class = type(model.get_decoder().layers[0]).__name__
    arguments = arguments or training_arguments(args, output_dir, on_gpu, layer_class)
    tokens = torch.randint(
        0,
        config.vocab_size,
        (args.batch_size * args.steps * 2, args.seq_len),
        generator=torch.Generator().manual_seed(0),
    )
    dataset = Dataset.from_dict({"input_ids": tokens.tolist(), "labels": tokens.tolist()}).with_format("torch")
    clock = Clock()
    trainer = Trainer(model=model, args=arguments, train_dataset=dataset, callbacks=[clock])
    trainer.train()
    steps_s = [later - earlier for earlier, later in zip(clock.ends_s, clock.ends_s[1:], strict=False)]
    # One write a line: the ranks share torchrun's stdout, and with PYTHONUNBUFFERED print writes the line and its
    # newline apart (on 4 H200s two ranks' lines ran together)
    line = {
        "rank": int(os.environ.get("RANK", "0")),
        "local_rank": local_rank,
        "model": args.checkpoint or args.config,
        "sharding": args.sharding,
        "lora": args.lora,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps": len(clock.ends_s),
        "checkpointing": not args.no_checkpointing,
        "loaded_s": round(loaded_s, 1),
        "weights_dtype_loaded": str(next(model.parameters()).dtype),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if on_gpu else None,
        **(nvml_reading(local_rank) if on_gpu else {}),
        "s_per_step_median": sorted(steps_s)[len(steps_s) // 2] if steps_s else None,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
