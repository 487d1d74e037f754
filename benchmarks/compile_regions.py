"""Which parts of bert-large pay off under torch.compile? One GPU, a plain loop, one variant a process.

The whole model compiled through Dynamo ran slower than eager and took 1.7× the memory on the H100
(benchmarks/results/h100/compile_speed/): SDPA with attention dropout is not kept as the fused kernel in the
compiled graph. The variants, each at the same batch, bf16 autocast over fp32 weights, fused AdamW, TF32, SDPA:
- `eager`: no compile;
- `whole`: torch.compile(model);
- `whole-attention-eager`: torch.compile(model) with HF's SDPA attention function excluded from Dynamo (it runs
  eagerly between the compiled pieces: one graph break a layer);
- `regions`: each non-attention block compiled on its own (embeddings, the attention's output projection +
  residual + LayerNorm, the MLP), attention eager.

    python benchmarks/compile_regions.py --batch-size 128 --out regions.jsonl      # all variants, one process each
Each variant prints one JSON line: steady samples/s over `--steps` steps after `--warmup-steps`, peak allocated bytes,
the time of the first (compiling) step.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

VARIANTS = ("eager", "whole", "whole-attention-eager", "regions")


def train(variant: str, batch_size: int, seq_len: int, warmup_steps: int, steps: int, preset: str, device: str) -> dict:
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gpuanat.core.vocabulary.config import RunConfig
    from gpuanat.worker.model import build_model

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    config = RunConfig.from_json(
        {
            "preset": preset,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "device": device,
            "precision": "bf16" if device == "cuda" else "fp32",
            "tf32": device == "cuda",
        }
    )
    model = build_model(config)
    model.train()
    if variant in ("whole-attention-eager", "regions"):
        AttentionInterface.register("sdpa", torch.compiler.disable(sdpa_attention_forward))
    if variant.startswith("whole"):
        model = torch.compile(model)
    elif variant == "regions":
        from transformers.models.bert.modeling_bert import (
            BertEmbeddings,
            BertIntermediate,
            BertOutput,
            BertSelfOutput,
        )

        for module in model.modules():
            if isinstance(module, (BertEmbeddings, BertIntermediate, BertOutput, BertSelfOutput)):
                module.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=True)
    generator = torch.Generator(device=device).manual_seed(0)
    input_ids = torch.randint(1000, 30000, (batch_size, seq_len), device=device, generator=generator)
    labels = torch.zeros(batch_size, dtype=torch.long, device=device)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started_s = time.perf_counter()
    step()
    synchronize()
    first_step_s = time.perf_counter() - started_s
    for _ in range(warmup_steps - 1):
        step()
    synchronize()
    started_s = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    elapsed_s = time.perf_counter() - started_s
    from torch._dynamo.utils import counters

    return {
        "variant": variant,
        "batch_size": batch_size,
        "seq_len": seq_len,
        "steady_samples_per_second": steps * batch_size / elapsed_s,
        "first_step_s": first_step_s,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=VARIANTS, help="run this one variant here (default: each in a process)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--preset", default="bert-large")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="append each variant's JSON line here")
    args = parser.parse_args()
    if args.variant:
        try:
            result = train(
                args.variant, args.batch_size, args.seq_len, args.warmup_steps, args.steps, args.preset, args.device
            )
        except Exception as error:  # an OOM or a compile failure is a result too
            result = {
                "variant": args.variant,
                "batch_size": args.batch_size,
                "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
            }
        print(json.dumps(result), flush=True)
        return
    for variant in args.variants.split(","):
        command = [
            sys.executable,
            __file__,
            "--variant",
            variant,
            "--batch-size",
            str(args.batch_size),
            "--seq-len",
            str(args.seq_len),
            "--warmup-steps",
            str(args.warmup_steps),
            "--steps",
            str(args.steps),
            "--preset",
            args.preset,
            "--device",
            args.device,
        ]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        line = (
            completed.stdout.strip().splitlines()
            or [json.dumps({"variant": variant, "exit": completed.returncode, "stderr": completed.stderr[-1500:]})]
        )[-1]
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as file:
                file.write(line + "\n")


if __name__ == "__main__":
    main()
