"""Issue #54 exploration: how fast can bert-large (seq 512) and a llama-3.2-1b-shaped decoder (seq 2048) train on
this GPU by plain torch means — autocast against bf16 weights, eager against torch.compile of the whole model, the
fused AdamW — outside gpuanat, one configuration per process (an OOM cannot poison the next).

    python3 benchmarks/tune54/paths.py --out results.jsonl [--budget-s 540]        # all, in order, within the budget
    python3 benchmarks/tune54/paths.py --one NAME                                 # one configuration, a JSON line

MFU: the model's training FLOPs (6 × the layers' parameters × tokens, plus attention's 12 × layers × seq² × hidden per
sample, plus the head) over the GPU's dense bf16 peak (--peak-tflops, 989 for an H100 SXM's spec sheet; the issue uses
~790 measured). Random ids, random labels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CONFIGS = {
    # name: (model, batch, weights, compile, fused_adamw)
    "bert-amp-b64": ("bert", 64, "amp", False, False),
    "bert-bf16w-b64": ("bert", 64, "bf16", False, True),
    "bert-bf16w-b64-compile": ("bert", 64, "bf16", True, True),
    "bert-amp-b64-compile": ("bert", 64, "amp", True, True),
    "bert-bf16w-b128-compile": ("bert", 128, "bf16", True, True),
    "llama-amp-b4": ("llama", 4, "amp", False, False),
    "llama-bf16w-b4-compile": ("llama", 4, "bf16", True, True),
}


def build(model_name: str):
    import torch
    from transformers import BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM

    if model_name == "bert":
        config = BertConfig(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            vocab_size=30522,
            max_position_embeddings=512,
            num_labels=2,
            attn_implementation="sdpa",
        )
        return BertForSequenceClassification(config), 512, config
    config = LlamaConfig(
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        vocab_size=128256,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
        torch_dtype=torch.float32,
    )
    return LlamaForCausalLM(config), 2048, config


def training_flops_per_sample(model, seq: int, config, model_name: str) -> float:
    embedding = sum(p.numel() for n, p in model.named_parameters() if "embed" in n)
    dense = sum(p.numel() for p in model.parameters()) - embedding
    attention = 12 * config.num_hidden_layers * seq * seq * config.hidden_size
    head = 6 * seq * config.hidden_size * config.vocab_size if model_name == "llama" else 0
    if model_name == "llama":
        attention //= 2  # causal: half the score matrix (as FlashAttention counts it)
    return 6 * dense * seq + attention + head


def one(name: str, steps: int, peak_tflops: float) -> dict:
    import torch

    model_name, batch, weights, compiled, fused = CONFIGS[name]
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    model, seq, config = build(model_name)
    flops = training_flops_per_sample(model, seq, config, model_name)
    model = model.cuda()
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=fused)
    forward = torch.compile(model) if compiled else model
    ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
    labels = ids if model_name == "llama" else torch.randint(0, 2, (batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=weights == "amp"):
            loss = forward(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - started
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        step()
    end.record()
    torch.cuda.synchronize()
    step_ms = start.elapsed_time(end) / steps
    samples_per_s = batch * 1000 / step_ms
    return {
        "name": name,
        "model": model_name,
        "batch": batch,
        "seq": seq,
        "weights": weights,
        "compile": compiled,
        "fused_adamw": fused,
        "step_ms": round(step_ms, 2),
        "samples_per_s": round(samples_per_s, 1),
        "tokens_per_s": round(samples_per_s * seq),
        "tflops_per_sample": round(flops / 1e12, 4),
        "achieved_tflops": round(samples_per_s * flops / 1e12, 1),
        "mfu_percent": round(100 * samples_per_s * flops / 1e12 / peak_tflops, 1),
        "peak_tflops": peak_tflops,
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "warm_s": round(warm_s, 1),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one")
    parser.add_argument("--out")
    parser.add_argument("--only", nargs="*", default=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=540)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    arguments = parser.parse_args()
    if arguments.one:
        print(json.dumps(one(arguments.one, arguments.steps, arguments.peak_tflops)), flush=True)
        return
    began = time.monotonic()
    for name in arguments.only:
        left = arguments.budget_s - (time.monotonic() - began)
        if left < 45:
            print(f"{name}: skipped, {left:.0f} s left", flush=True)
            continue
        command = [
            sys.executable,
            __file__,
            "--one",
            name,
            "--steps",
            str(arguments.steps),
            "--peak-tflops",
            str(arguments.peak_tflops),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=left - 5)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            record = json.loads(lines[-1]) if lines else {"name": name, "error": done.stderr.strip()[-600:]}
        except subprocess.TimeoutExpired:
            record = {"name": name, "error": f"timed out after {left - 5:.0f} s"}
        record["wall_s"] = round(time.monotonic() - began, 1)
        print(json.dumps(record), flush=True)
        if arguments.out:
            with open(arguments.out, "a") as out:
                out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
