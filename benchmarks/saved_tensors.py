"""What autograd keeps for backward, tensor by tensor, in one layer of a model: the ground truth for the activation
formulas of `gpuanat/core/memory/bands/activations.py`.

One forward pass with labels, under the Trainer's autocast (bf16), inside `saved_tensors_hooks`: every tensor saved
for backward is recorded once per storage, with the module that was running, its dtype and shape. Parameters and
the 16-bit casts of parameters (autocast's weight copies) are told apart from activations. Prints, per model and
regime, the bytes per token of one decoder/encoder layer by module and dtype, and of the head and the loss.

    python benchmarks/saved_tensors.py [--out saved.json] [--seq-len 512]

Regimes: `amp` (fp32 weights under autocast: full fine-tuning as the Trainer does it with bf16=True) and `bf16-base`
(weights cast to bf16 first, as a LoRA base is held; autocast on).
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.worker.model import preset_model_config

DEVICE = "cuda"


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def allocated() -> int:
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


CASES = [
    ("llama-3.2-1b", "causal-lm"),
    ("qwen2.5-0.5b", "causal-lm"),
    ("gpt2", "classification"),
    ("bert-base", "classification"),
]


def measure(preset_name: str, objective: str, regime: str, seq_len: int, batch: int) -> dict:
    config = preset_model_config(PRESETS[preset_name])
    head = AutoModelForCausalLM if objective == "causal-lm" else AutoModelForSequenceClassification
    with torch.device(DEVICE):
        model = head.from_config(config, attn_implementation="sdpa")
    if regime == "bf16-base":
        model = model.to(torch.bfloat16)
    model.train()
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    param_shapes = {tuple(sorted(p.shape)) for p in model.parameters()}  # a saved cast may be transposed
    stack: list[str] = []
    hooks = []
    for name, module in model.named_modules():
        hooks.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
        hooks.append(module.register_forward_hook(lambda m, a, o: (stack.pop(), None)[1]))
    seen: dict[int, dict] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in seen and pointer not in param_storages:
            is_cast = tuple(sorted(tensor.shape)) in param_shapes and tensor.dtype != torch.float32
            kind = "weight cast" if is_cast else "act"
            seen[pointer] = {
                "module": stack[-1] if stack else "(top)",
                "shape": list(tensor.shape),
                "dtype": str(tensor.dtype).replace("torch.", ""),
                "bytes": storage.nbytes(),
                "kind": kind,
            }
        return tensor

    vocab = config.vocab_size
    ids = torch.randint(1000, min(vocab, 30000), (batch, seq_len), device=DEVICE)
    labels = ids if objective == "causal-lm" else torch.zeros(batch, dtype=torch.long, device=DEVICE)
    synchronize()
    before = allocated()
    with torch.autocast(DEVICE, dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output = model(input_ids=ids, labels=labels)
    synchronize()
    after = allocated()
    for hook in hooks:
        hook.remove()
    tokens = batch * seq_len
    layer0 = collections.Counter()
    other = collections.Counter()
    for entry in seen.values():
        module = entry["module"]
        parts = module.split(".")
        in_layer0 = any(
            part.isdigit() and part == "0" and parts[i - 1] in ("layers", "h", "layer") for i, part in enumerate(parts)
        )
        in_layers = any(part.isdigit() and parts[i - 1] in ("layers", "h", "layer") for i, part in enumerate(parts))
        generic = ".".join(part for part in parts if not part.isdigit())
        key = f"{entry['kind']} {generic} {entry['dtype']} {entry['shape'][-1] if entry['shape'] else ''}"
        if in_layer0:
            layer0[key] += entry["bytes"]
        elif not in_layers:
            other[key] += entry["bytes"]
    total = sum(entry["bytes"] for entry in seen.values() if entry["kind"] == "act")
    casts = sum(entry["bytes"] for entry in seen.values() if entry["kind"] == "weight cast")
    del output
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return {
        "preset": preset_name,
        "objective": objective,
        "regime": regime,
        "seq_len": seq_len,
        "batch": batch,
        "saved_activation_bytes": total,
        "saved_weight_cast_bytes": casts,
        "allocated_growth_bytes": after - before,
        "layer0_bytes_per_token": {k: v / tokens for k, v in sorted(layer0.items())},
        "outside_layers_bytes_per_token": {k: v / tokens for k, v in sorted(other.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--device", default="cuda", help="cpu: a check of the script (CPU autocast differs)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    results = []
    for preset_name, objective in CASES:
        for regime in ("amp", "bf16-base"):
            result = measure(preset_name, objective, regime, args.seq_len, args.batch)
            results.append(result)
            print(
                f"== {preset_name} {objective} {regime}: saved activations"
                f" {result['saved_activation_bytes'] / 2**20:.1f} MiB, weight casts"
                f" {result['saved_weight_cast_bytes'] / 2**20:.1f} MiB, allocated growth"
                f" {result['allocated_growth_bytes'] / 2**20:.1f} MiB"
            )
            for key, value in result["layer0_bytes_per_token"].items():
                print(f"   L0  {key:70s} {value:10.1f} B/token")
            for key, value in result["outside_layers_bytes_per_token"].items():
                print(f"   OUT {key:70s} {value:10.1f} B/token")
            if args.out:
                with open(args.out, "w") as handle:
                    json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
