"""The reference for a decoder under FSDP2 on several GPUs (issue #34), outside gpuanat: a plain HF Trainer script as a
user writes it — the model built from its config.json on the CPU in fp32 (as `from_pretrained` loads a checkpoint by
default), Trainer's own FSDP2 (`fsdp="full_shard"`, each decoder layer wrapped), bf16 autocast, checkpointing, fused
AdamW, random tokens — and nothing of gpuanat's. Each rank prints one JSON line: torch's peak allocated and reserved
over the run, NVML's reading of its GPU and of its own process after the last step, and seconds per step.

    torchrun --nproc-per-node 2 benchmarks/reference_fsdp_trainer.py --config benchmarks/configs/llama-3.1-8b \
        --seq-len 1024 [--batch-size 1] [--steps 8] [--no-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

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
    own = [process.usedGpuMemory for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
           if process.pid == os.getpid()]
    return {"device_used_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
            "process_used_bytes": own[0] if own else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="2 small layers on the CPU (gloo): the script's smoke test")
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    on_gpu = torch.cuda.is_available() and not args.tiny
    if on_gpu:
        torch.cuda.set_device(local_rank)
    config = AutoConfig.from_pretrained(args.config)
    if args.tiny:
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
        config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size = 2, 1, 32, 1000
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)  # fp32, on the CPU, as from_pretrained loads by default
    layer_class = type(model.model.layers[0]).__name__
    tokens = torch.randint(0, config.vocab_size, (args.batch_size * args.steps * 2, args.seq_len),
                           generator=torch.Generator().manual_seed(0))
    dataset = Dataset.from_dict({"input_ids": tokens.tolist(), "labels": tokens.tolist()}).with_format("torch")
    clock = Clock()
    with tempfile.TemporaryDirectory() as output_dir:
        training = TrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=args.batch_size, max_steps=args.steps, bf16=on_gpu,
            use_cpu=not on_gpu,
            gradient_checkpointing=not args.no_checkpointing, optim="adamw_torch_fused", report_to="none",
            save_strategy="no", logging_steps=1_000_000, fsdp="full_shard",
            fsdp_config={"version": 2, "reshard_after_forward": True, "transformer_layer_cls_to_wrap": [layer_class]})
        trainer = Trainer(model=model, args=training, train_dataset=dataset, callbacks=[clock])
        trainer.train()
    steps_s = [later - earlier for earlier, later in zip(clock.ends_s, clock.ends_s[1:], strict=False)]
    print(json.dumps({"rank": int(os.environ.get("RANK", "0")), "local_rank": local_rank, "config": args.config,
                      "seq_len": args.seq_len, "batch_size": args.batch_size, "steps": len(clock.ends_s),
                      "checkpointing": not args.no_checkpointing,
                      "peak_allocated_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved() if on_gpu else None,
                      **(nvml_reading(local_rank) if on_gpu else {}),
                      "s_per_step_median": sorted(steps_s)[len(steps_s) // 2] if steps_s else None,
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}),
          flush=True)


if __name__ == "__main__":
    main()
