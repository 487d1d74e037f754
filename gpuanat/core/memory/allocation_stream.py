"""The allocation requests of a training run, derived from the model and the techniques (no torch), for replaying
torch's caching allocator (`allocator.replay`): what it reserves above what is allocated, and whether a batch fits.

A real run's requests were recorded on the H100 (`benchmarks/llm_matrix.py --trace-dir`): replayed, they reserve what
the run reserved (benchmarks/results/h100/reserve/). What decides the reserve is which blocks are freed and what is
asked for next. The largest transient tensors — the logits and their fp32 copies, the log-probabilities and their
gradients, each batch × seq × vocabulary — are freed after the loss's backward; the gradients that backward
allocates next, and the optimizer's states at the first step, are cut from those free segments; the next step's
logits find them in use and reserve new ones. So the stream follows a step as HF Trainer runs it, tensor by
tensor where sizes differ, in the order torch allocates and frees them:

- the model built: every parameter in module order (LoRA's adapters after the 16-bit base);
- each step's forward: the embeddings' output; per layer, autocast's 16-bit copies of its fp32 weights (kept for
  backward; with checkpointing in autocast's cache until the forward returns) and the tensors it saves for backward
  (`decoder_layers.layer_tensors_per_token`; with checkpointing only the layer's input, its own saved tensors
  made and freed); what the final norm and the LM head keep; the logits (the compute dtype), their fp32 copy for the
  loss, the fp32 log-probabilities the loss keeps, and the fp32 logits accelerate returns under autocast;
- the backward: the log-probabilities' gradient and the logits' (fp32), the 16-bit gradient the LM head reads;
  then per layer in reverse (recomputed first with checkpointing), each weight's gradient — under autocast a 16-bit
  gradient then the fp32 one it is accumulated into —, the gradient flowing into the layer's widest activation, and
  the layer's saved tensors freed; the embeddings' gradient;
- the optimizer step: at the first, every state tensor (`optimizer_state_tensors` of the parameters the optimizer
  band counts, `shapes.parameter_shapes` or `lora_shapes`: matrices, then vectors, as Trainer's groups order them), the
  foreach AdamW's temporaries; then `zero_grad` frees every gradient (set to None).

Sizes are rounded by the allocator itself in the replay. Steps: two (`STEPS_REPLAYED`: the reserve grows in the
first two, as measured), fewer if the run has fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.bands.activations import logits_element_bytes
from gpuanat.core.memory.bands.decoder_layers import (
    eager_scores_bytes,
    layer_tensors_per_token,
    outside_layers_tensors_per_token,
    residual_element_bytes,
    wrapped_expert_merged_bytes,
)
from gpuanat.core.memory.bands.optimizer import optimizer_state_tensors
from gpuanat.core.memory.bands.precision import autocast_on, is_mixed, parameter_element_bytes
from gpuanat.core.memory.shapes import (
    layer_linears,
    layer_vectors,
    lora_expert_matrices,
    lora_shapes,
    lora_target_names,
    model_linears,
    parameter_shapes,
)
from gpuanat.core.vocabulary.config import RunConfig

STEPS_REPLAYED = 2
"""Optimizer steps the stream follows: the first allocates the optimizer's states, the second finds the segments
they took; on the H100 the reserve grew in steps 1 and 2 and not after (benchmarks/results/h100/reserve/), and a
third replayed step changed none of 329 predictions' verdicts within 5% or 10%."""


@dataclass(frozen=True)
class AllocationStream:
    """Requests in `allocator.Requests`' form: -1 allocates the next size, k >= 0 frees allocation k."""

    operations: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def peak_allocated_bytes(self) -> int:
        """The most allocated at once (each request rounded as the allocator rounds it)."""
        live = peak = 0
        index = 0
        for operation in self.operations:
            if operation < 0:
                live += _rounded(self.sizes[index])
                index += 1
                peak = max(peak, live)
            else:
                live -= _rounded(self.sizes[operation])
        return peak


def _rounded(size: int) -> int:
    return max(512, -(-size // 512) * 512)


class _Stream:
    def __init__(self) -> None:
        self.operations: list[int] = []
        self.sizes: list[int] = []

    def alloc(self, size: int) -> int:
        self.operations.append(-1)
        self.sizes.append(max(1, int(size)))
        return len(self.sizes) - 1

    def free(self, *handles: int | None) -> None:
        for handle in handles:
            if handle is not None:
                self.operations.append(handle)

    def transient(self, size: int) -> None:
        self.free(self.alloc(size))


@dataclass(frozen=True)
class _LayerParameters:
    matrices: tuple[tuple[tuple[int, int], bool], ...]
    """(rows, columns) and whether autocast casts it (a linear layer's weight; not a mixture's 3-D experts)."""
    vectors: tuple[int, ...]
    adapters: tuple[tuple[int, int], ...]
    """LoRA's A and B of the layer's adapted linear layers (and of the experts PEFT wraps)."""
    merged: tuple[int, ...] = ()
    """Where PEFT wraps a mixture's router and experts: the weights each merges per forward pass and the matmul keeps
    (bytes; `decoder_layers.wrapped_expert_weights_bytes`), router, gate-up, down."""


def _layer_parameters(arch: Architecture, config: RunConfig, moe: bool) -> _LayerParameters:
    linears = layer_linears(arch, moe)
    matrices = [(shape, True) for _, shape in linears]
    if moe:
        e, width, h = arch.experts, arch.expert_intermediate_size, arch.hidden_size
        matrices += [((e, h), True), ((e * 2 * width, h), False), ((e * h, width), False)]
    adapters: list[tuple[int, int]] = []
    if config.lora:
        targets = lora_target_names(arch, config)
        for name, (out, inp) in linears:
            if name in targets:
                adapters += [(config.lora, inp), (out, config.lora)]
    merged: list[int] = []
    if config.lora and moe:
        adapters += [shape for matrices in lora_expert_matrices(arch, config).values() for shape in matrices]
        merged = wrapped_expert_merged_bytes(config, arch)
    return _LayerParameters(tuple(matrices), tuple(layer_vectors(arch, moe)), tuple(adapters), tuple(merged))


def decoder_stream(config: RunConfig, arch: Architecture) -> AllocationStream:
    """The requests of a causal LM's training on one GPU; see the module's docstring. (Its branches for a 2-label
    head are what a classifier would take; `stream_for` does not give it one: their activations are no tensor list.)"""
    stream = _Stream()
    tokens = config.batch_size * config.seq_len
    h, e, v = arch.hidden_size, arch.embedding_width, arch.vocab_size
    lora = bool(config.lora)
    weight_bytes = 2 if lora else parameter_element_bytes(config)
    grad_bytes = 4 if lora else weight_bytes
    casts = autocast_on(config) and weight_bytes == 4 and not lora
    causal = arch.objective == "causal-lm"
    layers = [_layer_parameters(arch, config, moe=index >= arch.dense_layers) for index in range(arch.num_layers)]
    scores = config.batch_size * arch.num_heads * config.seq_len**2
    score_bytes = eager_scores_bytes(config, arch)  # eager attention's probabilities: fp32, then their 16-bit cast
    eager = [scores * 4, scores * (score_bytes - 4)] if score_bytes else []
    layer_saved = {
        moe: [per_token * tokens for per_token in layer_tensors_per_token(config, arch, moe=moe)] + eager
        for moe in {index >= arch.dense_layers for index in range(arch.num_layers)}
    }
    outside_saved = [per_token * tokens for per_token in outside_layers_tensors_per_token(config, arch)]
    head_untied = causal and not arch.tie_word_embeddings
    head_rows = v if causal else 2
    outside_matrices = [(v, e)] + [shape for _, shape in model_linears(arch)]
    if arch.positions == "learned":
        outside_matrices.append((arch.position_embedding_rows, h))

    # the model built
    for rows, cols in outside_matrices:
        stream.alloc(rows * cols * weight_bytes)
    for layer in layers:
        for (rows, cols), _cast in layer.matrices:
            stream.alloc(rows * cols * weight_bytes)
        for length in layer.vectors:
            stream.alloc(length * weight_bytes)
    stream.alloc(h * weight_bytes)  # the final norm
    if head_untied or not causal:
        stream.alloc(head_rows * e * weight_bytes)
    else:  # transformers builds the LM head's own weight, then ties it to the embeddings'
        stream.transient(v * e * weight_bytes)
    for layer in layers:
        for rows, cols in layer.adapters:
            stream.alloc(rows * cols * 4)
    trained = lora_shapes(arch, config) if lora else parameter_shapes(arch)  # as the optimizer band counts them

    steps = max(1, min(STEPS_REPLAYED, config.max_steps or STEPS_REPLAYED))
    for step in range(steps):
        gradients: dict[tuple[object, ...], int] = {}
        for _micro in range(max(1, config.grad_accum)):
            _forward_backward(stream, config, arch, layers, layer_saved, outside_saved, gradients, tokens, casts)
        if step == 0:
            for tensor in optimizer_state_tensors(config, trained):
                stream.alloc(tensor.bytes)
        if config.optim == "adamw_torch":  # foreach AdamW: the square roots of a group's second moments at once
            temporaries = [stream.alloc(rows * cols * grad_bytes) for rows, cols in trained.matrices]
            stream.free(*temporaries)
        stream.free(*gradients.values())
    return AllocationStream(tuple(stream.operations), tuple(stream.sizes))


def _forward_backward(
    stream: _Stream,
    config: RunConfig,
    arch: Architecture,
    layers: list[_LayerParameters],
    layer_saved: dict[bool, list[int]],
    outside_saved: list[int],
    gradients: dict[tuple[object, ...], int],
    tokens: int,
    casts: bool,
) -> None:
    """One forward and backward pass, gradients allocated into `gradients` (by parameter) or accumulated there."""
    h, e, v = arch.hidden_size, arch.embedding_width, arch.vocab_size
    lora = bool(config.lora)
    weight_bytes = 2 if lora else parameter_element_bytes(config)
    grad_bytes = 4 if lora else weight_bytes
    compute = 2 if is_mixed(config) else 4
    residual = residual_element_bytes(config)
    causal = arch.objective == "causal-lm"
    checkpointing = config.grad_checkpointing

    batch = [stream.alloc(tokens * 8) for _ in range(3 if causal else 2)]  # ids, mask, labels (or the label)
    embedded = stream.alloc(tokens * e * residual)
    kept: list[list[int]] = []
    copies: list[list[int]] = []
    cache: list[int] = []
    for index, layer in enumerate(layers):
        moe = index >= arch.dense_layers
        layer_copies = [stream.alloc(rows * cols * 2) for (rows, cols), cast in layer.matrices if casts and cast]
        if checkpointing:
            cache += layer_copies
            copies.append([])
            own = [stream.alloc(size) for size in (*layer.merged, *layer_saved[moe])]
            stream.free(*own)
            kept.append([stream.alloc(tokens * h * residual)])
        else:
            copies.append(layer_copies)
            kept.append([stream.alloc(size) for size in (*layer.merged, *layer_saved[moe])])
    outside = [stream.alloc(size) for size in outside_saved]
    head_copy = stream.alloc(v * e * 2) if casts and causal else None
    logits = log_probabilities = None
    if causal:
        logits = stream.alloc(tokens * v * compute)
        for _operation in range(_logits_operations(arch)):  # each makes a new tensor from the last
            following = stream.alloc(tokens * v * compute)
            stream.free(logits)
            logits = following
        upcast = stream.alloc(tokens * v * 4) if compute != 4 else None
        log_probabilities = stream.alloc(tokens * v * 4)
        stream.free(upcast)
        returned = stream.alloc(tokens * v * logits_element_bytes(config)) if compute != 4 else None
        stream.free(logits)
        stream.free(returned)
    stream.free(*cache)  # autocast's cache, emptied as the forward returns

    # backward
    if causal:
        log_probabilities_gradient = stream.alloc(tokens * v * 4)
        logits_gradient = stream.alloc(tokens * v * 4)
        stream.free(log_probabilities_gradient, log_probabilities)
        head_input_gradient_16 = stream.alloc(tokens * v * compute) if compute != 4 else None
        stream.free(logits_gradient)
        for _operation in range(_logits_operations(arch)):
            following = stream.alloc(tokens * v * compute)
            stream.free(head_input_gradient_16)
            head_input_gradient_16 = following
        flowing = stream.alloc(tokens * e * compute)  # the gradient flowing into the LM head's input
        if lora:  # (a LoRA base's head is frozen)
            stream.free(head_input_gradient_16, head_copy)
        else:  # the weight's gradient (16-bit under autocast), then the logits' gradient and the cast weight go
            weight_gradient = stream.alloc(v * e * (2 if casts else grad_bytes))
            stream.free(head_input_gradient_16, head_copy)
            if casts:  # cast back to fp32, accumulated into .grad
                gradients[("head",)] = stream.alloc(v * e * 4)
                stream.free(weight_gradient)
            else:
                gradients[("head",)] = weight_gradient
    else:
        flowing = stream.alloc(tokens * h * compute)
    stream.free(*outside)
    for index in reversed(range(len(layers))):
        layer = layers[index]
        moe = index >= arch.dense_layers
        recomputed: list[int] = []
        if checkpointing:
            copies[index] = [stream.alloc(rows * cols * 2) for (rows, cols), cast in layer.matrices if casts and cast]
            recomputed = [stream.alloc(size) for size in (*layer.merged, *layer_saved[moe])]
        widest = max([arch.intermediate_size, arch.expert_intermediate_size * arch.experts_per_token, arch.hidden_size])
        inner = stream.alloc(tokens * widest * compute)
        for merged in reversed(layer.merged):  # the merged weight's whole gradient, reduced to its factors'
            stream.transient(merged)
        if lora:
            for position, (rows, cols) in enumerate(layer.adapters):
                _gradient(stream, gradients, (index, "adapter", position), rows * cols, 4, False)
        else:
            for position, ((rows, cols), cast) in reversed(list(enumerate(layer.matrices))):
                _gradient(stream, gradients, (index, position), rows * cols, grad_bytes, casts and cast)
            for position, length in enumerate(layer.vectors):
                _gradient(stream, gradients, (index, "vector", position), length, grad_bytes, False)
        stream.free(inner)
        next_flowing = stream.alloc(tokens * h * compute)
        stream.free(flowing)
        flowing = next_flowing
        stream.free(*reversed(recomputed), *copies[index], *reversed(kept[index]))
    if not lora:
        key: tuple[object, ...] = ("head",) if causal and arch.tie_word_embeddings else ("embeddings",)
        if key in gradients and casts:  # tied: the embeddings' dense gradient is added to the head's, in place
            stream.transient(v * e * 4)
        elif key in gradients:  # with bf16 or fp32 weights the sum is made out of place (`weights.py`,
            dense = stream.alloc(v * e * grad_bytes)  # tied_embedding_gradient_bytes)
            total = stream.alloc(v * e * grad_bytes)
            stream.free(dense, gradients[key])
            gradients[key] = total
        else:
            _gradient(stream, gradients, key, v * e, grad_bytes, False)
    stream.free(flowing, embedded, *batch)


def _logits_operations(arch: Architecture) -> int:
    """Element-wise operations on the logits before the loss, each a new vocabulary-sized tensor: soft-capping's
    division, tanh and multiplication (Gemma), the scaling of Cohere's and Granite's logits."""
    return (3 if arch.final_logit_softcapping else 0) + (1 if arch.logits_scaled else 0)


def _gradient(
    stream: _Stream,
    gradients: dict[tuple[object, ...], int],
    key: tuple[object, ...],
    elements: int,
    grad_bytes: int,
    cast: bool,
) -> None:
    """A parameter's gradient: under autocast a 16-bit one first, accumulated into the fp32 `.grad` (the first
    backward allocates it; later micro-steps add in place)."""
    half = stream.alloc(elements * 2) if cast else None
    if key not in gradients:
        gradients[key] = stream.alloc(elements * grad_bytes)
    stream.free(half)


def stream_for(config: RunConfig, arch: Architecture) -> AllocationStream | None:
    """The stream of a single-GPU causal LM's run; None where this module does not describe it: an encoder
    classifier (its activations are a measured per-layer total, not tensor by tensor; BERT's largest batches are
    replayed from recorded runs, `allocation_templates`), several GPUs, QLoRA's 4-bit base, Liger's fused loss."""
    if arch.objective != "causal-lm":
        return None
    if (config.ranks or 1) > 1 or config.distributed != "none" or config.load_in_4bit or config.liger:
        return None
    return decoder_stream(config, arch)
