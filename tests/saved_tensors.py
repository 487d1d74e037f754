"""What autograd saves for backward while one layer of a model runs, measured on the CPU (the tests of
test_any_model.py and test_families.py hold it against the derivation of `bands/decoder_layers`)."""

from __future__ import annotations

import torch

TINY = {  # the tiny decoders the saved-tensor checks build: 3 layers, so the second is a middle one
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def saved_bytes_per_token_of_one_layer(model, tokens: torch.Tensor) -> float:
    """What autograd saves while the model's second layer runs, once per storage, parameters and buffers (the weights
    band: GPT-Neo's mask buffer, which its attention slices) left out, per token."""
    (layer,) = [module for name, module in model.named_modules() if name.endswith(("layers.1", "h.1", "blocks.1"))]
    held = {tensor.untyped_storage().data_ptr() for tensor in [*model.parameters(), *model.buffers()]}
    inside, seen, charged = [False], set(), [0]
    layer.register_forward_pre_hook(lambda module, args: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda module, args, output: inside.__setitem__(0, False))

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in held and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            charged[0] += storage.nbytes() if inside[0] else 0
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=tokens, labels=tokens)
    return charged[0] / tokens.numel()
