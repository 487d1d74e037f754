"""What each rank holds of the model's state, by distributed technique (no torch): DDP replicates the weights,
gradients and optimizer state and keeps its gradient buckets; FSDP2 shards them; DeepSpeed ZeRO-1/2/3 shards as
the ZeRO paper accounts, with its buckets and ZeRO-3's gathered parameters; and each rank's communication context
(NCCL's, DeepSpeed's) outside torch's allocator. A run on one GPU is the one-rank case: `rank_state` gives it its
weights, gradients and optimizer state too, LoRA's and QLoRA's frozen bases included.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.bands.optimizer import optimizer_state_bytes, step_counter_bytes
from gpuanat.core.memory.bands.precision import computes_in_16_bit, is_mixed, parameter_element_bytes
from gpuanat.core.memory.bands.weights import half_weight_copies_bytes, qlora_base_bytes, qlora_head_copy_bytes
from gpuanat.core.memory.shapes import ParameterShapes, lora_shapes
from gpuanat.core.memory.sizes import MIB
from gpuanat.core.vocabulary.config import RunConfig

RANK_COMMUNICATION_CONTEXT_BYTES = {"ddp": 850 * MIB, "fsdp": 850 * MIB, "zero": 1330 * MIB}
"""Per rank of a distributed run, on top of the CUDA context: NCCL's buffers and streams (and DeepSpeed's), outside
torch's allocator. Measured on 2 H200s, bert-large bf16: 1.57 GiB of context per rank with DDP and 2.04 GiB with
DeepSpeed ZeRO against 0.74 GiB alone (benchmarks/results/h200x2/multi/results.jsonl); FSDP taken as DDP."""


@dataclass(frozen=True)
class RankState:
    """What one rank holds of the model's state, by distributed technique."""

    weights_bytes: int
    gradients_bytes: int
    gradients_at_peak_bytes: int
    optimizer_state_bytes: int
    communication_buffers_bytes: int
    half_weight_copies_bytes: int
    """AMP's 16-bit copies of the matmul weights, which a model already in 16 bits (DeepSpeed) does not make."""
    gathered_parameters_bytes: int = 0
    """ZeRO-3: the parameters gathered in full and still alive as the forward pass ends (in the activations)."""
    step_temporaries_bytes: int = 0
    """DeepSpeed: what its optimizer step allocates beside the state (0: the optimizer's own, as on one GPU)."""
    step_segments_bytes: int = 0
    """ZeRO-3: the step's sub-group gradients, which the allocator reserves anew beside what the forward and backward
    passes left cached (no block they freed is as large)."""
    first_buckets_bytes: int = 0
    """DDP's first buckets, which a rank may still hold beside the rebuilt ones as step 2's forward pass ends
    (`ddp_first_buckets_may_outlive`)."""


def _shard(size: int, ranks: int) -> int:
    return -(-size // ranks)


DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's `reduce_bucket_size` default (gpuanat's config leaves it): the elements of one gradient bucket."""
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
"""DeepSpeed's `stage3_max_live_parameters` default: ZeRO-3 keeps up to this many parameters gathered."""
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000
"""DeepSpeed's `sub_group_size` default: ZeRO-3 steps a rank's partition in sub-groups of at least this many
elements."""


def zero3_largest_sub_group_elements(trained: ParameterShapes, ranks: int) -> int:
    """The elements of a rank's largest ZeRO-3 sub-group (`_create_fp16_sub_groups`, `deepspeed/runtime/zero/
    stage3.py`): each of the optimizer's parameter groups — Trainer's two: the matrices, decayed, and the vectors —
    is cut in the model's order into sub-groups whose partitions add up to `sub_group_size` or just over it."""
    largest = 0
    for group in ([rows * columns for rows, columns in trained.matrices], list(trained.vectors)):
        elements = 0
        for size in group:
            elements += _shard(size, ranks)
            if elements >= DEEPSPEED_SUB_GROUP_ELEMENTS:
                largest, elements = max(largest, elements), 0
        largest = max(largest, elements)
    return largest


def zero3_step_gradients_bytes(config: RunConfig, trained: ParameterShapes) -> int:
    """What ZeRO-3's optimizer step allocates for a sub-group before stepping it (`_prepare_fp32_grad_for_sub_group`):
    its 16-bit gradients flattened and, from them, the fp32 gradient of its fp32 master weights (in fp32 the flat copy
    is that gradient). A memory snapshot of llama-3.1-8b on 4 H200s (benchmarks/results/h200x4/zero3_peak/) peaked
    there, at 4.015 + 2.007 GB for a sub-group of 1.004e9 elements, beside the state, the gradient partitions and
    the bucket: 39.21 GB, 39.22 measured."""
    elements = zero3_largest_sub_group_elements(trained, config.ranks or 1)
    return elements * (2 + 4 if is_mixed(config) else 4)


def deepspeed_bucket_bytes(config: RunConfig) -> int:
    """DeepSpeed's gradient buckets, whole whatever the model's size (`deepspeed/runtime/zero/stage_1_and_2.py`,
    `setup_buckets`; `stage3.py`): ZeRO-1/2 allocate two of `reduce_bucket_size` elements as backward begins (with
    `overlap_comm`, as gpuanat's config sets), ZeRO-3 one at start-up, in the model's dtype. On 2 and 4 H200s
    (bert-large, bf16) the peak exceeded the bands by 2.00 GiB with ZeRO-1/2 (two buckets: 1.86) and by 1.05 GiB
    with ZeRO-3 (one: 0.93)."""
    buckets = 1 if config.distributed == "zero3" else 2
    return buckets * DEEPSPEED_REDUCE_BUCKET_ELEMENTS * (2 if is_mixed(config) else 4)


def rank_state(config: RunConfig, arch: Architecture, shapes: ParameterShapes) -> RankState:
    """Weights, gradients and optimizer state on each rank (the ZeRO paper's accounting, as the H200s measured it):
    DDP replicates them and keeps a bucket copy of the gradients; FSDP2 shards all three; DeepSpeed trains a
    16-bit model (with bf16/fp16) whose fp32 master weights count as optimizer state, ZeRO-1/2 sharding the
    optimizer state and keeping a partition of the reduced gradients for the step, ZeRO-3 everything."""
    ranks = config.ranks or 1
    params = shapes.params
    element = parameter_element_bytes(config)
    weights, gradients = element * params + shapes.buffer_bytes, element * params
    optimizer = optimizer_state_bytes(config, shapes)
    accumulating = config.grad_accum > 1
    half_copies = half_weight_copies_bytes(config, shapes)
    trained, buffers = shapes, shapes.buffer_bytes
    if config.lora:  # a frozen base in the run's precision; only the fp32 adapters have gradients and state
        adapters = trained = lora_shapes(arch, config)
        if config.load_in_4bit:  # QLoRA: NF4 matrices, the rest fp32
            weights = qlora_base_bytes(arch, shapes) + 4 * adapters.params
            half_copies = qlora_head_copy_bytes(config, arch)
        else:
            # the cast to 16 bits takes the decoders' float buffers (rotary frequencies) along; BERT's are integers
            buffers = (
                shapes.buffer_bytes // 2 if is_mixed(config) and arch.objective == "causal-lm" else shapes.buffer_bytes
            )
            weights = (2 if is_mixed(config) else 4) * params + 4 * adapters.params + buffers
            half_copies = 0
        gradients, optimizer = 4 * adapters.params, optimizer_state_bytes(config, adapters)
    if config.distributed == "fsdp":  # its gathered parameters are 16-bit already: no autocast copies
        # Buffers (rotary frequencies) and the optimizer's step counters are whole on every rank
        counters = step_counter_bytes(config, trained)
        return RankState(
            _shard(weights - buffers, ranks) + buffers,
            _shard(gradients, ranks),
            _shard(gradients, ranks) if accumulating else 0,
            _shard(optimizer - counters, ranks) + counters,
            0,
            0 if computes_in_16_bit(config) else half_copies,
        )
    if config.distributed.startswith("zero"):
        sixteen_bit = is_mixed(config)
        model_weights = (2 if sixteen_bit else 4) * params + shapes.buffer_bytes
        model_gradients = (2 if sixteen_bit else 4) * params
        state = _shard(optimizer + (4 * params if sixteen_bit else 0), ranks)
        buckets = deepspeed_bucket_bytes(config)
        if config.distributed == "zero3":  # a persistent flat buffer of gradient partitions
            # Parameters reused within `stage3_max_reuse_distance` stay gathered: as the forward pass ends, all of
            # them up to `stage3_max_live_parameters` (measured: the activations 0.63 GiB above ZeRO-1/2's)
            gathered = min(params, DEEPSPEED_MAX_LIVE_PARAMETERS) * (2 if sixteen_bit else 4)
            # Its step prepares one sub-group's gradients at a time, beside the bucket it keeps all run long
            sub_group = zero3_step_gradients_bytes(config, trained)
            return RankState(
                _shard(model_weights, ranks),
                _shard(model_gradients, ranks),
                _shard(model_gradients, ranks),
                state,
                buckets,
                0,
                gathered_parameters_bytes=gathered,
                step_temporaries_bytes=sub_group + buckets,
                step_segments_bytes=sub_group,
            )
        # As the ZeRO optimizer's step begins, ZeRO-1 and ZeRO-2 alike hold this rank's 16-bit partition of the
        # reduced gradients (measured on 2 H200s: 0.31 GiB each for bert-large's 0.62), and free it in the step
        partition = _shard(model_gradients, ranks)
        # Its step copies the partition to fp32 for the fp32 master weights, beside another 16-bit copy: on 2 H200s
        # llama-3.1-8b's ZeRO-2 peak was 22.5 GiB above its state, three partitions' worth (22.4); bert-large's peak
        # is its forward pass's
        step = 3 * partition if sixteen_bit else 2 * partition
        return RankState(
            model_weights, partition, partition if accumulating else 0, state, buckets, 0, step_temporaries_bytes=step
        )
    buckets = gradients if config.distributed == "ddp" else 0
    return RankState(
        weights,
        gradients,
        gradients if accumulating else 0,
        optimizer,
        buckets,
        half_copies,
        first_buckets_bytes=buckets if ddp_first_buckets_may_outlive(config) else 0,
    )


def ddp_first_buckets_may_outlive(config: RunConfig) -> bool:
    """Whether a rank may hold DDP's first gradient buckets beside the rebuilt ones as step 2's forward pass ends.

    torch's reducer rebuilds the buckets once, as step 2 begins, in the order step 1's gradients became ready, unless
    `find_unused_parameters` is set (`should_rebuild_buckets`, reducer.hpp): HF Trainer sets it where the model does
    not checkpoint (`find_unused = not is_activation_checkpointing`), the Accelerate loop's `Accelerator` never does.
    On 2 and 4 H200s (bert-large; h200x2/ and h200x4/accelerate_ranks/) 20 of 40 ranks of the Accelerate loop
    peaked one bucket set (1.245 GiB for 1.249) above the others, at step 2, at random among ranks and runs, also with
    TORCH_NCCL_AVOID_RECORD_STREAMS=0, and none of 6 recorded with torch's allocator history (which slows the host);
    Trainer with checkpointing rebuilds too, but none of its 6 ranks held them, and Trainer without it never
    rebuilds. Where they may outlive the rebuild, the peak predicted is the higher one, which the GPU must hold."""
    return config.distributed == "ddp" and config.engine == "accelerate"


FSDP_TRAINED_LAYER_CACHE = 1.75
"""Fitted, not derived: the reduce-scatter blocks of a trained layer's unsharded fp32 gradients that the cache keeps
beyond the peak, in layers' worth (`fsdp_cache_bytes`)."""


def _fsdp_units(config: RunConfig, arch: Architecture, shapes: ParameterShapes) -> tuple[int, int, bool]:
    """A decoder under FSDP2 as accelerate wraps it: one unit a layer, the input embeddings one, the final norm and
    the LM head one (the embeddings with it where tied). (16-bit bytes of a layer, 16-bit bytes of a vocabulary
    matrix, whether the full weights train.)"""
    vocab_matrix = arch.vocab_size * arch.hidden_size
    heads = 0 if arch.tie_word_embeddings else vocab_matrix
    layer = (shapes.params - shapes.embedding_params - heads) // max(arch.num_layers, 1)
    return 2 * layer, 2 * vocab_matrix, not config.lora


def fsdp_decoder(config: RunConfig, arch: Architecture) -> bool:
    return config.distributed == "fsdp" and arch.objective == "causal-lm" and is_mixed(config)


def fsdp_tail_bytes(config: RunConfig, arch: Architecture, shapes: ParameterShapes) -> int:
    """The LM head's unit, gathered in 16 bits as the forward pass reaches it and kept so until backward has
    passed it (accelerate shards it with reshard_after_forward=False): in the activations as the forward pass ends.
    Measured on 2 H200s: the activations 0.98 GiB above one GPU's for llama-3.1-8b (its head's 16-bit size), less
    the logits' 16 bits (`decoder_activations_bytes`), at every sequence length, with LoRA too."""
    return _fsdp_units(config, arch, shapes)[1] if fsdp_decoder(config, arch) else 0


def fsdp_backward_units_bytes(config: RunConfig, arch: Architecture, shapes: ParameterShapes) -> int:
    """As backward reaches the embeddings, beside every sharded gradient: their unit gathered in 16 bits and, where
    they train, its unsharded 16-bit gradient before the reduce-scatter, with the next layer still gathered. On 2
    H200s (checkpointing, batch 1) the peak was 2.51 GiB above weights, gradients and optimizer state for
    llama-3.1-8b at seq 1024 and 4096 alike (this: 2.36), 1.12 and 1.72 GiB for mistral-7b at 2048 and 4096 (0.89)."""
    if not fsdp_decoder(config, arch):
        return 0
    layer, vocab, trained = _fsdp_units(config, arch, shapes)
    return (2 if trained else 1) * vocab + layer


FSDP_INIT_LEFTOVER_VOCABULARY = 0.5
"""Fitted, not derived: in vocabulary matrices' worth, what is left free of the segments that held the embeddings and
the LM head whole as FSDP2 moved them to the GPU to shard them (`_move_states_to_device`), which later requests fill
only partly: 0.23, 1.26 and 0.53 GB in the snapshots of llama-3.1-8b with LoRA at seq 1024, 4096 and 8192 on 4 H200s
(1.05 GB a matrix)."""


def fsdp_cache_bytes(
    config: RunConfig, arch: Architecture, shapes: ParameterShapes, logits_bytes: int, *, logits_in_use_at_peak: bool
) -> int:
    """What torch's allocator holds cached above the peak under FSDP2 (in place of the one-GPU cache fraction):
    blocks of the sizes FSDP's collectives and the loss come and go in, which later, smaller requests split. Two
    gathered 16-bit layers (the one computing and the one prefetched), where the weights train the fp32 unsharded
    gradients of the embeddings and the LM head and 1.75 layers' (fitted), and the loss's blocks that are free at
    the peak:
    - peak at the optimizer step (full fine-tuning at short sequences): the loss's three fp32 logits' worth (the
      logits, their upcast and their gradient). On 2 H200s the reserve above the peak was 7.70 and 12.08 GiB for
      llama-3.1-8b at seq 1024 and 4096 (this: 7.61, 12.02), 4.02 and 4.59 for mistral-7b at 2048 and 4096 (3.94,
      4.67): benchmarks/results/h200x2/sharded_reference/.
    - peak in the passes, at the loss or as backward begins (LoRA; a full fine-tune at large batches): those three
      are in use there and the 16-bit logits' block holds the gradient's 16-bit cast; free are one fp32 logits' block
      (the upcast's), an all-gather buffer of the LM head's unit and init's leftovers (`FSDP_INIT_LEFTOVER_VOCABULARY`).
      Memory snapshots of llama-3.1-8b with LoRA 16 on 4 H200s (benchmarks/results/h200x4/lora_reserve/) held free
      at the peak 2.42, 4.95 and 6.77 GB at seq 1024, 4096 and 8192 (this: 2.98, 4.55, 6.66) in segments of those
      sizes; at batch 10 and 11 (seq 4096) 19.40 and 22.59 (23.47, 25.56), a full fine-tune at batch 14 and 15 (seq
      2048) 21.43 and 23.88 (22.89, 23.94; h200x4/batches/). Three fp32 logits' worth said 13.5 at seq 8192, and
      one fp32 and one 16-bit logits +14% reserved at batch 10. Held out at batch 8 (seq 4096): not sized where a
      layer's transient blocks or the logits outweigh the rest (mistral-7b LoRA: 8.94 GB free, this 5.55; llama-3.2-1b
      full: 10.67, this 19.32), docs/several-gpus.md."""
    if not fsdp_decoder(config, arch):
        return 0
    layer, vocab, trained = _fsdp_units(config, arch, shapes)
    vocab_units = 1 if arch.tie_word_embeddings else 2
    trained_bytes = 2 * vocab * vocab_units + int(FSDP_TRAINED_LAYER_CACHE * 2 * layer) if trained else 0
    passes = logits_bytes + vocab + int(FSDP_INIT_LEFTOVER_VOCABULARY * vocab)
    return (passes if logits_in_use_at_peak else 3 * logits_bytes) + 2 * layer + trained_bytes
