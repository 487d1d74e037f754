"""What a model is, for the bytes model: one general description of a transformer, read from a Hugging Face
config.json (`model_config`) or from a preset's dimensions, the same way (no torch).

Every band reads a model through this: its dimensions, how a layer is built (which norms, where, of what kind; fused
or separate projections; a gated or plain MLP and its activation; q/k norms; biases; a parallel or sequential
residual; experts), and what its forward pass does that keeps memory (dropout, logit soft-capping, sliding-window
masks). Nothing in it is fitted: each field is a fact of the architecture, as transformers implements it.
"""

from __future__ import annotations

from dataclasses import dataclass

NORM_KINDS = ("rms", "rms_fp32", "layer", "layer_no_bias", "layer_weight_only", "layer_1p", "layer_python")
"""How a norm computes, which decides what it keeps for backward:
rms — Llama's RMSNorm: normalizes in fp32, casts back to the input's dtype, then multiplies by its weight;
rms_fp32 — multiplies by its weight in fp32, then casts (Gemma's (1 + w), OLMo-2's);
layer — torch's LayerNorm (autocast runs it in fp32), with a bias; layer_no_bias — without (OLMo's has no weight);
layer_weight_only — torch's LayerNorm with a weight and no bias (MPT);
layer_1p — Nemotron's LayerNorm1P: torch's kernel with (1 + weight) and a bias, its input cast to autocast's 16-bit
dtype and autocast then turned off, so it runs and keeps in 16 bits;
layer_python — Cohere's LayerNorm written out in fp32 (no bias): it keeps the centred input twice (two
subtractions), the reciprocal deviation and the normalized value its weight multiplies, not its input."""

ACTIVATION_KINDS = ("saves_input", "saves_output", "tanh_composed", "sigmoid_composed", "squared_relu")
"""What an MLP's activation keeps for backward: its input (SiLU, exact GELU, torch's tanh GELU, BLOOM's GELU
function); its output (ReLU); the intermediates of GELU's tanh formula written out in Python (`gelu_new`:
x³ in fp32 under autocast, its tanh, x/2 and 1 + tanh); x and sigmoid(1.702x) (`quick_gelu`); squared ReLU
(`relu2`: relu keeps its output, which `square` — `pow`, fp32 under autocast — reads, so an fp32 copy under autocast,
and the square, fp32 under autocast, is what the next linear layer reads)."""


@dataclass(frozen=True)
class Architecture:
    family: str
    """transformers' `model_type` (a preset's family: "bert", "gpt2", "llama", "qwen2", "mistral")."""
    objective: str
    """"causal-lm" (a decoder's LM head and loss) or "classification" (a 2-label head, as in the HF docs)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    """The dense MLP's width (of a MoE model's dense layers, if any; each expert's is `expert_intermediate_size`)."""
    vocab_size: int
    max_positions: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Biases on the query, key and value projections."""
    output_bias: bool = False
    """A bias on the attention's output projection."""
    mlp_bias: bool = False
    gated_mlp: bool = True
    """gate, up and down (SwiGLU, GeGLU); else a plain two-layer MLP (fc1, activation, fc2)."""
    activation: str = "saves_input"
    """One of `ACTIVATION_KINDS`."""
    fused_qkv: bool = False
    """One projection makes q, k and v (GPT-NeoX, Phi-3, BLOOM): v stays a view of its output."""
    fused_gate_up: bool = False
    norm: str = "rms"
    """One of `NORM_KINDS`."""
    pre_norms: int = 2
    """Norms a layer applies to its input: 2 (before attention, before the MLP), 1 (one shared by both: Phi), 0."""
    post_norms: int = 0
    """Norms applied to the attention's and the MLP's outputs before the residual addition (Gemma-2/3, OLMo-2)."""
    post_layer_norm: bool = False
    """The norms come after the residual additions (OPT-350m, BERT): each norm reads the sum."""
    parallel_residual: bool = False
    """Attention and MLP read the same input and are added to it together (GPT-NeoX, Phi, GPT-J)."""
    qk_norm: str = "none"
    """"none", "head" (a norm over each head's query and key), or "full" (over the whole query and key widths)."""
    qk_norm_kind: str = "rms"
    final_norm: bool = True
    lm_head_bias: bool = False
    positions: str = "rotary"
    """"rotary", "learned" (a position embedding table of `max_positions` rows) or "alibi"."""
    position_embedding_rows: int = 0
    """Rows of a learned position table (OPT adds 2 to max_positions)."""
    token_types: int = 0
    """BERT's token type embeddings (0: none)."""
    embedding_size: int = 0
    """The embeddings' width where it differs from hidden_size (OPT-350m's 512, projected in and out); 0: the same."""
    embedding_norm: bool = False
    """A LayerNorm on the embeddings (BLOOM, BERT)."""
    scaled_embedding: bool = False
    """Gemma's embeddings multiply by √hidden, an fp32 scalar buffer."""
    rotary_buffers: int = 1
    """Rotary embedding modules holding fp32 frequency buffers (Gemma-3 has a local and a global one)."""
    rotary_dim: int = 0
    """Dimensions of each head that are rotated (partial rotary); 0: all of them."""
    sliding_window_layers: int = 0
    sliding_window: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    moe_layers: int = 0
    """Layers whose MLP is the experts (the others are dense)."""
    router_bias: bool = False
    residual_dropout: float = 0.0
    """Dropout on the attention's and the MLP's outputs in training (a 1-byte mask each)."""
    residual_dropout_sites: int = 2
    """Where that dropout applies in a layer: after attention and after the MLP, or the MLP only (StableLM)."""
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    final_logit_softcapping: float = 0.0
    logits_scaled: bool = False
    """The logits are multiplied or divided by a constant before the loss (Cohere's `logit_scale`, Granite's
    `logits_scaling`): one more vocabulary-sized tensor in the forward and in the backward."""
    kv_broadcast_to_heads: bool = False
    """Keys and values of fewer heads than the queries reach SDPA without `enable_gqa` (Falcon's multi-query layers):
    no fused kernel takes them, so torch runs its math attention — in fp32 for 16-bit inputs — which keeps the query,
    the key and value expanded to every head, and every score's probability."""
    kv_expanded: bool = False
    """Keys and values are broadcast to every head and copied before attention (Falcon's new decoder architecture)."""
    materialized_mask_heads: int = 0
    """Falcon builds one float attention mask for all layers, batch × this many heads × seq² in the embeddings' dtype
    (its heads with ALiBi, whose slopes it holds; 1 without), which SDPA's kernels keep for the backward; 0: none."""
    bias_after_matmul: bool = False
    """A projection's bias is added after its matmul (Falcon's FalconLinear): under autocast, fp32 biases make the
    outputs fp32."""
    qkv_split_copies: bool = False
    """The fused q/k/v output is split into copies (CodeGen's interleaved layout), so it is not kept itself."""
    eager_only: bool = False
    """transformers gives the family no SDPA attention (BLOOM, MPT, GPT-Neo: their attention is written out), so it
    trains with eager attention only."""
    extra_buffer_bytes: int = 0
    """Buffers besides the rotary frequencies: GPT-J's sinusoid table, GPT-BigCode's and GPT-Neo's causal masks."""
    assumed: tuple[str, ...] = ()
    """What the reader assumed because the config did not say (an unknown model_type): the prediction's caveat."""

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def query_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size
