"""What autograd keeps for backward of one decoder layer, per token, for any layer an `Architecture` describes (no
torch): the tensors each operation saves, as torch and transformers implement them, in the dtypes the run's
precision gives them. Derived on Llama and Qwen2 from `benchmarks/saved_tensors.py`'s tensor-by-tensor listing on the
H100 (benchmarks/results/h100/llm/saved_tensors.json) and generalized operation by operation; nothing is fitted.

The rules, each an implementation fact:
- A norm keeps an fp32 view of its input (the input itself when it is fp32; a copy when 16-bit) and, for Llama's
  RMSNorm, its normalized value in the input's dtype (which its weight multiplies), for Gemma's and OLMo-2's the fp32
  normalized value; torch's LayerNorm keeps its input and per-token statistics (autocast runs it in fp32).
- A linear layer keeps its input. Under autocast an fp32 input is cast anew for each linear that reads it (a 16-bit
  copy each); a 16-bit input is shared. A fused q/k/v projection is read once, and its v stays a view of its output,
  keeping the whole output alive.
- SDPA keeps q and k after rotary (new tensors), v, its output (which the output projection reads) and an fp32
  log-sum-exp per head; eager attention keeps the fp32 probabilities and their 16-bit cast, with the keys and values
  repeated to every head.
- A gated MLP keeps gate and up (or the fused output they view), the activation's output and the product; a plain MLP
  fc1's output and the activation's; an activation written out in Python (`gelu_new`) its intermediates, fp32 under
  autocast where `pow` runs in fp32. A mixture of experts keeps, for each of the token's experts, its input, the
  expert MLP's tensors and its output (which the routing weight multiplies), and the router's fp32 probabilities;
  where PEFT wraps the experts' weights (LoRA), each layer also keeps the merged weights its matmuls read.
- Dropout keeps a 1-byte mask.
- Liger Kernel's layer kernels (`--liger-layers`), each an autograd Function over Triton kernels, which autocast
  leaves alone: its RMSNorm keeps its input as it is, in the input's dtype, and an fp32 reciprocal root mean square a
  row, frozen or not, and returns the input's dtype; its SwiGLU/GeGLU keeps gate and up and recomputes the activation
  in backward; its RoPE rotates q and k in place (what SDPA keeps is unchanged). It patches the layers' and the final
  norm, and the q/k norms only where its patch names them (`LIGER_PATCHED_QK_NORMS`).
"""

from __future__ import annotations

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.bands.precision import autocast_on, computes_in_16_bit, is_mixed
from gpuanat.core.memory.shapes import (
    attention_linears,
    gated_mlp_linears,
    lora_expert_matrices,
    lora_expert_parameters,
    lora_target_names,
    mlp_linears,
)
from gpuanat.core.vocabulary.config import RunConfig

NORM_STATISTICS_BYTES = 8
"""LayerNorm's per-token mean and reciprocal deviation, fp32."""
RMS_STATISTICS_BYTES = 4
"""An RMSNorm's reciprocal root mean square, fp32, per normalized vector."""
LIGER_PATCHED_QK_NORMS = frozenset(
    {"gemma3", "gemma3_text", "gemma4_text", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "exaone4"}
)
"""The families whose q/k norms Liger's patch of a built model replaces (liger-kernel 0.8.5, monkey_patch: for the
others it patches the norm's class, which a built model's q/k norms no longer read)."""


def residual_element_bytes(config: RunConfig) -> int:
    """Bytes per element of a decoder's residual stream: fp32 with fp32 weights (also under autocast, which leaves the
    additions and the norms alone) and with QLoRA (`prepare_model_for_kbit_training` makes the embeddings and norms
    fp32); 16-bit where the weights are (LoRA's base, FSDP2's and DeepSpeed's 16-bit compute, bf16 weights)."""
    if not is_mixed(config) or config.load_in_4bit:
        return 4
    return 2 if config.lora or computes_in_16_bit(config) else 4


class SavedBytes:
    """Bytes per token saved for backward, kept as the list of what each operation added (`+=`): the tensors, in the
    order the forward pass allocates them, which the allocator's replay needs (`allocation_stream`)."""

    def __init__(self) -> None:
        self.tensors: list[int] = []

    def __iadd__(self, bytes_per_token: int) -> SavedBytes:
        if bytes_per_token:
            self.tensors.append(int(bytes_per_token))
        return self

    def __int__(self) -> int:
        return sum(self.tensors)


class _Layer:
    """One layer's saved bytes per token, added up operation by operation."""

    def __init__(self, config: RunConfig, arch: Architecture) -> None:
        self.arch = arch
        self.autocast = autocast_on(config)
        self.stream = residual_element_bytes(config)
        self.compute = 2 if is_mixed(config) else 4
        self.frozen = bool(config.lora)
        """A LoRA or QLoRA base: its weights need no gradient, so nothing is kept to compute one."""
        self.adapted = lora_target_names(arch, config) if config.lora else set()
        self.wrapped = lora_expert_parameters(arch, config)
        """The router's and experts' parameters PEFT adapts through `ParamWrapper` (`shapes.PEFT_EXPERT_PARAMETERS`)."""
        self.lora_rank = config.lora
        self.liger = config.liger_layers and arch.objective == "causal-lm"
        self.saved = SavedBytes()

    def liger_norm(self, width: int, input_bytes: int, input_kept: bool, vectors: int) -> int:
        """Liger's RMSNorm: the input itself (unless already kept) and the fp32 statistics; its output in the
        input's dtype."""
        self.saved += RMS_STATISTICS_BYTES * vectors + (0 if input_kept else input_bytes * width)
        return input_bytes

    def norm(
        self, kind: str, width: int, input_bytes: int, input_kept: bool = False, vectors: int = 1, qk: bool = False
    ) -> int:
        """Add a norm's saved tensors, per token; returns its output's element bytes. `input_kept`: another norm of
        the same fp32 input keeps it already; `vectors`: how many vectors of a token it normalizes (q/k norms: one a
        head); `qk`: a q/k norm. A frozen weight's multiplication keeps nothing (its gradient is not computed)."""
        if kind == "layer_python":  # two centred fp32 copies, 1/σ, and the normalized value the weight multiplies
            self.saved += 8 * width + RMS_STATISTICS_BYTES * vectors + (0 if self.frozen else 4 * width)
            return input_bytes
        if kind == "layer_1p" and self.autocast:  # cast to 16 bits, then torch's kernel with autocast off
            self.saved += NORM_STATISTICS_BYTES + (0 if input_bytes == 2 and input_kept else 2 * width)
            return 2
        if kind in ("layer", "layer_no_bias", "layer_weight_only", "layer_1p"):  # torch's kernel keeps its input and
            # statistics, frozen or not
            fp32_input = self.autocast or input_bytes == 4
            self.saved += NORM_STATISTICS_BYTES * vectors
            kept_input = 4 if fp32_input else input_bytes
            if not (input_kept and (input_bytes == 4 or not self.autocast)):
                self.saved += kept_input * width
            return 4 if self.autocast else input_bytes
        if self.liger and (not qk or self.arch.family in LIGER_PATCHED_QK_NORMS):
            return self.liger_norm(width, input_bytes, input_kept, vectors)
        self.saved += RMS_STATISTICS_BYTES * vectors
        if not (input_kept and input_bytes == 4):
            self.saved += 4 * width  # the fp32 input (or its fp32 copy)
        if kind == "rms_fp32":
            self.saved += 0 if self.frozen else 4 * width
            return input_bytes
        self.saved += 0 if self.frozen else input_bytes * width  # the normalized value the weight multiplies
        return max(self.stream, input_bytes)  # the weight's dtype is the stream's: fp32 with fp32 weights

    def read_by_linears(self, element_bytes: int, width: int, names: list[str], kept_elsewhere: bool = False) -> None:
        """The input the linear layers `names` keep. Training: a 16-bit copy each of an fp32 input under autocast,
        else the input, shared. On a frozen base only LoRA's adapters keep it, each its own 16-bit copy under mixed
        precision (PEFT casts the input to the adapter's fp32, autocast casts it back); a router whose weight PEFT
        wraps is a linear layer of the merged weight, which keeps the input itself; `kept_elsewhere`: another
        operation keeps the input itself."""
        if self.frozen:
            adapted = sum(1 for name in names if name in self.adapted)
            wrapped = "router" in names and "router" in self.wrapped
            self.saved += adapted * self.lora_rank * self.compute  # lora_A's output, which lora_B keeps
            if self.compute == 2:
                self.saved += 2 * width * adapted + (element_bytes * width if wrapped and not kept_elsewhere else 0)
            elif (adapted or wrapped) and not kept_elsewhere:
                self.saved += element_bytes * width
        elif self.autocast and element_bytes == 4:
            self.saved += 2 * width * len(names)
        elif not kept_elsewhere:
            self.saved += element_bytes * width

    def attention(self, config: RunConfig, output_projection: str) -> None:
        arch, c = self.arch, self.compute
        q, kv = arch.query_width, arch.kv_width
        eager, rotary = config.attn == "eager", arch.positions == "rotary"
        fused_views = arch.fused_qkv and not arch.qkv_split_copies
        if arch.qk_norm != "none":  # (reading views of a fused output, it keeps that output unless it casts them)
            self.norm(
                arch.qk_norm_kind,
                q + kv,
                c,
                input_kept=fused_views,
                vectors=arch.num_heads + arch.kv_heads if arch.qk_norm == "head" else 2,
                qk=True,
            )
            if fused_views and not self.autocast and eager and rotary:  # SDPA's views keep the output below
                self.saved += c * (q + 2 * kv)
        if arch.kv_expanded:
            kv = q  # keys and values copied to every head before attention
        math = arch.kv_broadcast_to_heads and not eager  # torch's math attention: fp32 q and expanded k, v
        if math and config.batch_size == 1:  # matmul broadcasts one sequence's single k, v head as a view
            qkv = q + 2 * kv
        elif math or (eager and kv != q):
            qkv = 3 * q  # the keys and values repeated to every head (copies)
        elif self.fp32_biased_outputs(arch.attention_bias) or arch.qkv_split_copies or arch.kv_expanded:
            qkv = q + 2 * kv  # SDPA's 16-bit casts of fp32 q, k, v; CodeGen's and Falcon-40B's copies
        elif arch.fused_qkv and not (eager and rotary):
            qkv = q + 2 * kv + (q + kv if rotary else 0)  # SDPA's v (and without rotary q and k) view the fused output
        else:  # (eager attention's matmul copies a strided v)
            qkv = q + 2 * kv  # q and k (after rotary, new tensors) and v
        lse = 0 if eager or math else 4 * arch.num_heads  # SDPA's log-sum-exp
        self.saved += (4 if math else c) * (qkv - 2 * kv)  # q (with the fused output's views)
        self.saved += (4 if math else c) * kv  # k
        self.saved += (4 if math else c) * kv  # v
        self.saved += c * q + lse  # the output
        self.read_by_linears(c, q, [output_projection], kept_elsewhere=True)

    def fp32_biased_outputs(self, biased: bool) -> bool:
        """Falcon's projections add their bias after the matmul: under autocast an fp32 bias makes the output fp32."""
        return self.arch.bias_after_matmul and biased and self.autocast and self.stream == 4

    def mlp(self, names: list[str]) -> None:
        """A gated or plain MLP's own tensors and its output projection's input (`names`: its linear layers)."""
        arch = self.arch
        c = 4 if self.fp32_biased_outputs(arch.mlp_bias) else self.compute
        width, kind, down = arch.intermediate_size, arch.activation, names[-1]
        if arch.gated_mlp:  # gate (the activation's input), the activation and up (the product's); Liger: gate, up
            for _tensor in range(2 if kind == "saves_output" or self.liger else 3):
                self.saved += c * width
            self.read_by_linears(c, width, [down])
            return
        if kind == "tanh_composed":
            # x³'s fp32 input, tanh, 1 + tanh (fp32 under autocast, where pow runs in fp32) and x / 2; the output is
            # fp32 then
            self.saved += (3 * 4 + c if self.autocast else 4 * c) * width
            self.read_by_linears(4 if self.autocast else c, width, [down])
        elif kind == "squared_relu":  # relu's output, pow's fp32 copy of it under autocast; the square is read
            self.saved += c * width + (4 * width if self.autocast and c == 2 else 0)
            self.read_by_linears(4 if self.autocast else c, width, [down])
        elif kind == "sigmoid_composed":
            self.saved += 2 * c * width
            self.read_by_linears(c, width, [down])
        elif kind == "saves_output":
            self.saved += c * width
            self.read_by_linears(c, width, [down], kept_elsewhere=True)
        else:
            self.saved += c * width
            self.read_by_linears(c, width, [down])

    def experts(self, shared_down: list[str]) -> None:
        """A mixture of experts past the router's input: per token and expert it visits, the gathered input, gate-up,
        the activation, the product and the expert's output (which the routing weight multiplies) — in fp32 under
        autocast with fp32 weights (transformers' grouped matmul is no autocast operation), without the input and the
        product on a frozen base, unless PEFT wraps the weight that reads them (gate-up reads the input, down the
        product: the merged weight needs its gradient) — and the router's fp32 probabilities. Every token visits
        `experts_per_token` experts, which the grouped matmul processes as one batch of tokens × experts_per_token
        rows, so how the router spreads them over the experts changes no size."""
        arch = self.arch
        h, width = arch.hidden_size, arch.expert_intermediate_size
        element = 4 if self.autocast and self.stream == 4 and not self.frozen else self.compute
        visits = arch.experts_per_token
        self.saved += 4 * arch.experts  # the router's probabilities
        if not self.frozen or "gate_up" in self.wrapped:
            self.saved += visits * element * h  # the gathered input
        self.saved += visits * element * 2 * width  # gate-up's output: the activation's input and up
        self.saved += visits * element * width  # the activation's output
        if not self.frozen or "down" in self.wrapped:
            self.saved += visits * element * width  # the product
        self.saved += visits * element * h  # the expert's output, which the routing weight multiplies
        if arch.shared_expert_intermediate_size:
            self.saved += 3 * self.compute * arch.shared_expert_intermediate_size
            self.read_by_linears(self.compute, arch.shared_expert_intermediate_size, shared_down)
            if arch.shared_expert_gate:
                self.saved += self.compute * h + self.compute  # the shared expert's output and its sigmoid gate


def layer_bytes_per_token(config: RunConfig, arch: Architecture, moe: bool = False) -> int:
    """Bytes one decoder layer keeps for backward, per token (see the module's docstring)."""
    return int(_layer_saved(config, arch, moe))


def layer_tensors_per_token(config: RunConfig, arch: Architecture, moe: bool = False) -> list[int]:
    """What one decoder layer keeps for backward, per token, tensor by tensor in the order the forward makes them."""
    return _layer_saved(config, arch, moe).tensors


def _layer_saved(config: RunConfig, arch: Architecture, moe: bool) -> SavedBytes:
    layer = _Layer(config, arch)
    h = arch.hidden_size
    stream, compute = layer.stream, layer.compute
    attention = [name for name, _ in attention_linears(arch)]
    readers_of_attention_input, output_projection = attention[:-1], attention[-1]
    if moe:  # the router, the shared expert's gate and up and its sigmoid gate read the MLP's input
        mlp = (
            [name for name, _ in gated_mlp_linears(arch, arch.shared_expert_intermediate_size)]
            if arch.shared_expert_intermediate_size
            else []
        )
        mlp_inputs = [*mlp[:-1], *(["shared_expert_gate"] if arch.shared_expert_gate else []), "router"]
    else:
        mlp = [name for name, _ in mlp_linears(arch)]
        mlp_inputs = mlp[:-1]
    if arch.post_layer_norm:  # OPT-350m: the norms read the sums; the stream is their output (fp32 under autocast)
        stream = 4 if layer.autocast else stream
        layer.read_by_linears(stream, h, readers_of_attention_input)
        out = layer.norm(arch.norm, h, max(stream, compute))
        layer.read_by_linears(out, h, mlp_inputs)
        layer.norm(arch.norm, h, max(out, compute))
    elif arch.pre_norms == 1:  # one norm, read by both blocks
        out = layer.norm(arch.norm, h, stream)
        layer.read_by_linears(out, h, readers_of_attention_input + mlp_inputs)
    elif arch.pre_norms == 2:
        out = layer.norm(arch.norm, h, stream)
        layer.read_by_linears(out, h, readers_of_attention_input)
        out = layer.norm(arch.norm, h, stream, input_kept=arch.parallel_residual)
        layer.read_by_linears(out, h, mlp_inputs)
    else:  # OLMo-2: the blocks read the stream
        layer.read_by_linears(stream, h, readers_of_attention_input)
        layer.read_by_linears(stream, h, mlp_inputs)
    layer.attention(config, output_projection)
    if moe:
        layer.experts(mlp[-1:])
    else:
        layer.mlp(mlp)
    for _ in range(arch.post_norms):
        layer.norm(arch.norm, h, compute)
    if arch.residual_dropout:
        layer.saved += h * arch.residual_dropout_sites  # dropout masks
    return layer.saved


def _base_element_bytes(config: RunConfig) -> int:
    """Bytes per element of a LoRA base's expert weights: 16-bit under mixed precision, fp32 otherwise and with QLoRA
    (bitsandbytes quantizes linear layers only; `prepare_model_for_kbit_training` casts the 3-D experts to fp32)."""
    return 2 if is_mixed(config) and not config.load_in_4bit else 4


def wrapped_expert_weights_bytes(config: RunConfig, arch: Architecture) -> int:
    """What one MoE layer keeps per forward pass, whatever its tokens, where PEFT wraps its router's and experts'
    parameters (`shapes.PEFT_EXPERT_PARAMETERS`): each `ParamWrapper` merges its weight for the forward pass
    (peft 0.21: the experts' W + scaling·(B·A) in one `baddbmm` of the experts' factors, the router's W + ΔW), and
    the matmul that reads the merged weight keeps it for the gradient of its input — a whole copy of the experts'
    weights per layer, in the base's dtype. Under mixed precision the fp32 factors are cast to it and kept too:
    `baddbmm`'s, cast by PEFT, and the router's B·A, cast by autocast."""
    merged = wrapped_expert_merged_bytes(config, arch)
    if not merged:
        return 0
    element = _base_element_bytes(config)
    factors = sum(rows * cols for matrices in lora_expert_matrices(arch, config).values() for rows, cols in matrices)
    return sum(merged) + (element * factors if element != 4 else 0)


def wrapped_expert_merged_bytes(config: RunConfig, arch: Architecture) -> list[int]:
    """The merged weights of one MoE layer whose parameters PEFT wraps, in the base's dtype, router, gate-up, down (of
    those it wraps): what `wrapped_expert_weights_bytes` counts beside the cast factors."""
    wrapped = lora_expert_parameters(arch, config)
    e, h, width = arch.experts, arch.hidden_size, arch.expert_intermediate_size
    sizes = {"router": e * h, "gate_up": e * 2 * width * h, "down": e * width * h}
    return [_base_element_bytes(config) * sizes[name] for name in ("router", "gate_up", "down") if name in wrapped]


def wrapped_expert_gradient_bytes(config: RunConfig, arch: Architecture) -> int:
    """What the backward of one MoE layer whose expert weights PEFT wraps holds beyond what the forward kept (0 where
    it wraps none): the grouped matmul's backward makes the merged weight's gradient whole before `baddbmm`'s backward
    reduces it to the factors'. Down's comes first, beside every merged weight; gate-up's, twice its size, once down's
    merged weight is freed: one down-sized gradient beyond the kept tensors, or gate-up's where only it is wrapped.
    With checkpointing the recomputed layer holds its merged weights anew: the largest merged weight twice (with its
    gradient). In the base's dtype."""
    wrapped = lora_expert_parameters(arch, config) - {"router"}
    if not wrapped:
        return 0
    element = _base_element_bytes(config)
    down = arch.experts * arch.expert_intermediate_size * arch.hidden_size
    largest = 2 * down if "gate_up" in wrapped else down
    if config.grad_checkpointing:
        return element * 2 * largest
    return element * (largest if wrapped == {"gate_up"} else down)


def eager_scores_bytes(config: RunConfig, arch: Architecture) -> int:
    """Eager attention's probabilities per score and layer: fp32 from the softmax and the 16-bit cast the matmul with
    v keeps (fp32: the one tensor); with attention dropout its mask and its output in place of the cast."""
    if arch.kv_broadcast_to_heads and config.attn != "eager":
        return 4  # torch's math attention keeps the fp32 probabilities (Falcon's multi-query layers under SDPA)
    if config.attn != "eager":
        return 0
    if is_mixed(config):
        return 4 + (1 + 2 if arch.attention_dropout else 2)
    return 4 + (1 + 4 if arch.attention_dropout else 0)


def outside_layers_bytes_per_token(config: RunConfig, arch: Architecture) -> int:
    """What the embeddings' side and the final norm and LM head's input keep, per token."""
    return int(_outside_layers_saved(config, arch))


def outside_layers_tensors_per_token(config: RunConfig, arch: Architecture) -> list[int]:
    """The same, tensor by tensor."""
    return _outside_layers_saved(config, arch).tensors


def _outside_layers_saved(config: RunConfig, arch: Architecture) -> SavedBytes:
    layer = _Layer(config, arch)
    h, e = arch.hidden_size, arch.embedding_width
    if arch.embedding_dropout:
        layer.saved += e
    if arch.embedding_norm:
        layer.norm(arch.norm, e, layer.stream)
    if arch.embedding_size:  # OPT: project_in reads the embeddings, project_out the last layer's output
        layer.read_by_linears(layer.stream, e, ["project_in"])
        out = layer.norm(arch.norm, h, layer.stream) if arch.final_norm else layer.stream
        layer.read_by_linears(4 if layer.autocast else out, h, ["project_out"])
        layer.read_by_linears(layer.compute, e, ["lm_head"])  # project_out's output, read by the LM head
        return layer.saved
    out = layer.norm(arch.norm, h, layer.stream) if arch.final_norm else layer.stream
    layer.read_by_linears(out, h, ["lm_head"])  # the LM head's input (on a frozen base: kept by nothing)
    return layer.saved
