"""Memory by module against MemTracker (`torch.distributed._tools.mem_tracker`, torch's own per-module tracker), on
an encoder (bert-base) and a decoder (a Qwen2.5-0.5B-shaped model), on the GPU (#49).

Step 1 trains under gpuanat's probe (a measured step: its modules' rows and its activations band); step 2 under
MemTracker, which attributes every tensor the forward pass creates to the module that created it. Both are rolled up
to the layer (`…layer.N` / `…layers.N`), where the two attributions — saved in a module vs created in it — meet.
Prints one JSON object: the probe's activations band, its rows' sum, MemTracker's activations at the end of the
root's forward, and the layers side by side.

Usage: python benchmarks/oom/modules_reference.py > OUT.json
"""

from __future__ import annotations

import json
import re
import sys

import torch
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _ModState
from transformers import BertConfig, BertForSequenceClassification, Qwen2Config, Qwen2ForCausalLM

from gpuanat.core.vocabulary.protocol import NO_MODULE
from gpuanat.probe import track

LAYER = re.compile(r"^(.*?\.(?:layer|layers|h)\.\d+)")


def layer_of(module: str) -> str:
    match = LAYER.match(module)
    return match.group(1) if match else (module.rsplit(".", 1)[0] if "." in module else module)


def compare(name: str, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    events: list = []
    with track(model, optimizer, total_steps=1, emit=events.append) as probe:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        probe.step()
    bands = next(event.bands for event in events if getattr(event, "bands", None) is not None)
    rows = bands.modules or []
    ours_by_layer: dict[str, int] = {}
    # every module's, not only the rows' top ones (the probe keeps them all until it sends its rows)
    for module_name, size in (probe._activations_by_module or {}).items():
        ours_by_layer[layer_of(module_name)] = ours_by_layer.get(layer_of(module_name), 0) + size

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    device = torch.device("cuda", torch.cuda.current_device())
    with tracker:
        loss = model(**batch).loss
        root = tracker.memory_tracking[model]
        root_activations = root.snapshots[_ModState.POST_FW][-1][device][_MemRefType.ACT]
        theirs_by_layer: dict[str, int] = {}
        names = {module: module_name for module_name, module in model.named_modules()}
        for module, stats in tracker.memory_tracking.items():
            module_name = names.get(module)
            if module_name is None or layer_of(module_name) != module_name:  # the layers themselves, whole
                continue
            before = stats.snapshots[_ModState.PRE_FW][-1][device][_MemRefType.ACT]
            after = stats.snapshots[_ModState.POST_FW][-1][device][_MemRefType.ACT]
            theirs_by_layer[module_name] = max(0, after - before)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    no_module = next((row.activations_bytes for row in rows if row.module == NO_MODULE), 0)
    top = sorted(theirs_by_layer)
    return {
        "model": name,
        "probe_activations_band_bytes": bands.activations_bytes,
        "probe_activations_method": bands.activations_method,
        "probe_rows_sum_bytes": sum(row.activations_bytes for row in rows),
        "probe_no_module_bytes": no_module,
        "memtracker_root_activations_bytes": root_activations,
        "memtracker_layers_sum_bytes": sum(theirs_by_layer.values()),
        "probe_layers_sum_bytes": sum(ours_by_layer.get(layer, 0) for layer in theirs_by_layer),
        "band_vs_memtracker_percent": 100.0 * (bands.activations_bytes - root_activations) / root_activations,
        "layers_compared": [
            {"layer": layer, "memtracker_bytes": theirs_by_layer[layer], "probe_bytes": ours_by_layer.get(layer, 0)}
            for layer in top
        ],
        "probe_rows": [row.__dict__ for row in rows],
    }


def main() -> int:
    torch.manual_seed(0)
    results = []
    bert = BertForSequenceClassification(BertConfig(num_labels=2))
    ids = torch.randint(0, 30522, (32, 512), device="cuda")
    results.append(
        compare("bert-base encoder, batch 32 x 512, fp32", bert, {"input_ids": ids, "labels": ids[:, 0] % 2})
    )
    del bert
    torch.cuda.empty_cache()
    decoder = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
        )
    )
    ids = torch.randint(0, 151936, (4, 1024), device="cuda")
    results.append(
        compare("qwen2.5-0.5b-shaped decoder, batch 4 x 1024, fp32", decoder, {"input_ids": ids, "labels": ids})
    )
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
