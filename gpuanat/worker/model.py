"""The model a run trains, built inside the training process: a preset's transformers config (or the user's
`--model`), with random or real weights on this rank's device, the classifier's problem type set, and the run's
model techniques applied — LoRA through PEFT, QLoRA's 4-bit base through bitsandbytes, Liger Kernel's fused loss —
and `--compile-regions`' compiled parts outside attention, with TorchDynamo's counters of what it compiled.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuanat.core.vocabulary.config import RunConfig


def preset_model_config(preset: Any) -> Any:
    """The transformers config of a preset."""
    from transformers import BertConfig, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    if preset.family in ("llama", "qwen2", "mistral"):
        config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[preset.family]
        return config_class(
            vocab_size=preset.vocab_size,
            hidden_size=preset.hidden_size,
            intermediate_size=preset.intermediate_size,
            num_hidden_layers=preset.num_layers,
            num_attention_heads=preset.num_heads,
            num_key_value_heads=preset.kv_heads,
            max_position_embeddings=preset.max_positions,
            tie_word_embeddings=preset.tie_word_embeddings,
        )
    if preset.family == "bert":
        return BertConfig(
            vocab_size=preset.vocab_size,
            hidden_size=preset.hidden_size,
            num_hidden_layers=preset.num_layers,
            num_attention_heads=preset.num_heads,
            intermediate_size=preset.intermediate_size,
            max_position_embeddings=preset.max_positions,
        )
    return GPT2Config(
        vocab_size=preset.vocab_size,
        n_embd=preset.hidden_size,
        n_layer=preset.num_layers,
        n_head=preset.num_heads,
        n_inner=preset.intermediate_size,
        n_positions=preset.max_positions,
        pad_token_id=preset.vocab_size - 1,
    )


def is_causal_lm(model_config: Any) -> bool:
    """Whether a config is trained as a causal LM: its `architectures` say so, else a decoder type (one that has a
    causal-LM head and no masked-LM head: encoders such as BERT have both)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = getattr(model_config, "architectures", None) or []
    if architectures:
        return any(name.endswith("ForCausalLM") for name in architectures)
    model_type = getattr(model_config, "model_type", "")
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def training_device(config: RunConfig) -> str:
    """This process's device: on CUDA, the GPU of its local rank (every rank sees all the run's GPUs)."""
    if config.device != "cuda":
        return config.device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"


def build_model(config: Any) -> Any:
    """The model for `config`, held in `config.weights_dtype`: from_pretrained for a --model directory or Hub name;
    random weights from a --model config.json or from the preset. Decoders get a causal-LM head, the rest a 2-label
    classification head (the HF docs' workload). With LoRA the base is held in the run's 16-bit precision, as PEFT
    users load it; with QLoRA its linear layers are quantized to NF4 and PEFT prepares it for k-bit training. With
    Liger the causal LM's loss is Liger Kernel's fused linear cross-entropy."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from gpuanat.core.vocabulary.presets import PRESETS

    torch.manual_seed(config.seed)
    quantization = bnb_4bit_config(config) if config.load_in_4bit else None
    if config.model is not None and not config.model.endswith(".json"):
        model_config = AutoConfig.from_pretrained(config.model)
        head = AutoModelForCausalLM if is_causal_lm(model_config) else AutoModelForSequenceClassification
        if quantization is not None:  # transformers quantizes each weight of the checkpoint as it reaches the GPU
            model = head.from_pretrained(
                config.model,
                attn_implementation=config.attn,
                quantization_config=quantization,
                dtype=quantization.bnb_4bit_compute_dtype,
                device_map={"": training_device(config)},
            )
        else:  # in the dtype --weights-dtype asks for, not the checkpoint's (transformers 5 loads that by default)
            model = head.from_pretrained(
                config.model,
                attn_implementation=config.attn,
                dtype=torch.bfloat16 if config.weights_dtype == "bf16" else torch.float32,
            )
    else:
        model_config = (
            AutoConfig.from_pretrained(config.model)
            if config.model is not None
            else preset_model_config(PRESETS[config.preset])
        )
        # A preset says what it trains (gpt2 is the docs' classifier, though its config is a decoder's)
        causal = PRESETS[config.preset].objective == "causal-lm" if config.model is None else is_causal_lm(model_config)
        head = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
        # The dtype always given: transformers 5 builds a config.json's model in the dtype the config names
        # (bf16 for most decoders' own), and --weights-dtype says fp32 unless asked
        dtype = (
            quantization.bnb_4bit_compute_dtype
            if quantization is not None
            else torch.bfloat16
            if config.weights_dtype == "bf16"
            else torch.float32
        )
        # Initialising on the target device is much faster than on the CPU and gives the same model.
        with torch.device(training_device(config)):
            # (transformers leaves the auto classes' from_config unannotated)
            model = head.from_config(  # type: ignore[no-untyped-call]
                model_config, attn_implementation=config.attn, dtype=dtype
            )
        if quantization is not None:
            model = quantized_in_place(model, quantization, training_device(config))
    # Name the head, so that what reads the config later (labels, LoRA's task, Liger) knows which one it is
    model.config.architectures = [type(model).__name__]
    if not is_causal_lm(model.config) and model.config.problem_type is None and (model.config.num_labels or 0) > 1:
        # What the classifier sets itself at its first forward for our integer labels: set before, it leaves
        # torch.compile's graph valid (else the change fails a guard and bert-large compiles twice)
        model.config.problem_type = "single_label_classification"
    if config.liger or config.liger_layers:
        with_liger_kernels(model, config)
    if config.load_in_4bit:
        model = with_qlora(model, config)
        if config.device == "cuda":  # the 16-bit model that was quantized is gone: neither its peak nor the blocks
            torch.cuda.empty_cache()  # it left cached are the training's (peft 0.21 empties the cache too; older not)
            torch.cuda.reset_peak_memory_stats()
    elif config.lora:
        model = with_lora(model, config)
    return model


def lora_config(model: Any, config: Any) -> Any:
    """PEFT's LoRA config of rank `config.lora` (alpha 2R, dropout `config.lora_dropout`) on `config.lora_targets`."""
    from peft import LoraConfig, TaskType

    targets = config.lora_targets if config.lora_targets == "all-linear" else config.lora_targets.split(",")
    task = TaskType.CAUSAL_LM if is_causal_lm(model.config) else TaskType.SEQ_CLS
    return LoraConfig(
        r=config.lora,
        lora_alpha=2 * config.lora,
        lora_dropout=config.lora_dropout,
        target_modules=targets,
        task_type=task,
    )


def with_lora(model: Any, config: Any) -> Any:
    """`model` with LoRA adapters of rank `config.lora` on `config.lora_targets` (PEFT), its base frozen and held
    in the run's 16-bit precision (fp32 otherwise); the adapters stay fp32, as PEFT creates them."""
    import torch
    from peft import get_peft_model

    if config.precision in ("bf16", "fp16"):
        model = model.to(torch.bfloat16 if config.precision == "bf16" else torch.float16)
    return get_peft_model(model, lora_config(model, config))


def bnb_4bit_config(config: Any) -> Any:
    """The QLoRA paper's quantization, as PEFT's and transformers' guides write it: NF4 with double quantization
    (the blocks' scales quantized too), computing in 16 bits (fp16 for an fp16 run, else bf16)."""
    import torch
    from transformers import BitsAndBytesConfig

    # (transformers leaves BitsAndBytesConfig's __init__ unannotated)
    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.float16 if config.precision == "fp16" else torch.bfloat16,
    )


def quantized_in_place(model: Any, quantization: Any, device: str) -> Any:
    """`model`, built with random weights in its compute dtype on `device`, with its linear layers quantized as
    `from_pretrained(quantization_config=...)` quantizes a checkpoint's: transformers' bitsandbytes quantizer
    replaces every linear layer but those it keeps (the LM head or classifier: the output embeddings and the last
    module) by a bitsandbytes Linear4bit, and each 16-bit weight becomes a Params4bit that is quantized as it moves to
    the device, freeing the 16-bit weight as it goes (transformers' `Bnb4bitQuantize`). Saving the random model and
    loading it back quantized would do the same through the disk: 16 GB written and read again for an 8B model."""
    import bitsandbytes as bnb
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.auto import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization, pre_quantized=False)
    quantizer.validate_environment(device_map={"": device})
    originals = {
        name: module for name, module in model.named_modules() if isinstance(module, (torch.nn.Linear, Conv1D))
    }
    quantizer.preprocess_model(
        model=model,
        dtype=quantization.bnb_4bit_compute_dtype,
        device_map={"": device},
        checkpoint_files=None,
        use_kernels=False,
    )
    for name, module in model.named_modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        original = originals.pop(name)
        weight = original.weight.data.T if issubclass(module.source_cls, Conv1D) else original.weight.data
        module.weight = bnb.nn.Params4bit(weight, requires_grad=False, **module.weight.__dict__).to(device)
        if original.bias is not None:
            module.bias = original.bias
        del original, weight
    originals.clear()
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)  # marks it quantized, loaded in 4 bits, with its quantization config
    return model


def with_qlora(model: Any, config: Any) -> Any:
    """QLoRA as PEFT's guide trains it: `prepare_model_for_kbit_training` freezes the 4-bit model, casts its other
    16-bit parameters (embeddings, norms, LM head) to fp32 and, with checkpointing, makes the inputs require grad;
    then LoRA adapters of rank `config.lora`, fp32, on `config.lora_targets`."""
    from peft import get_peft_model, prepare_model_for_kbit_training

    # (peft leaves prepare_model_for_kbit_training unannotated)
    model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
        model, use_gradient_checkpointing=config.grad_checkpointing
    )
    return get_peft_model(model, lora_config(model, config))


def liger_kernels(config: Any) -> dict[str, bool]:
    """The keyword arguments of Liger's `apply_liger_kernel_to_<family>` for `config`: the fused linear cross-entropy
    for --liger, RMSNorm, SwiGLU/GeGLU and RoPE for --liger-layers, so that each differs from a run without it in
    its own kernels alone (Liger keeps the arguments its family's function takes)."""
    layers = bool(config.liger_layers)
    return {
        "fused_linear_cross_entropy": bool(config.liger),
        "cross_entropy": False,
        "rope": layers,
        "rms_norm": layers,
        "swiglu": layers,
        "geglu": layers,
        "layer_norm": False,
    }


def with_liger_kernels(model: Any, config: Any) -> None:
    """Patch `model` (a causal LM, before PEFT wraps it) with Liger Kernel's kernels as HF Trainer's
    `use_liger_kernel` does (`_apply_liger_kernel_to_instance`, on the built model): with --liger its forward, in
    training with labels, returns the loss and no logits; with --liger-layers its norms, MLPs and rotary embedding
    run Liger's Triton kernels."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    from gpuanat.core.vocabulary.errors import ConfigError

    flag = "--liger" if config.liger else "--liger-layers"
    model_type = getattr(model.config, "model_type", None)
    if not is_causal_lm(model.config) or model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ConfigError(
            flag,
            f"Liger Kernel has no kernels for this model ({model_type}, "
            f"{type(model).__name__}): it patches causal LMs of the types it knows",
        )
    _apply_liger_kernel_to_instance(model=model, **liger_kernels(config))


def _holds_attention(module: Any) -> bool:
    return any("Attention" in type(inner).__name__ for inner in module.modules())


def _compile_outside_attention(module: Any) -> list[Any]:
    """Compile `module` whole when it holds no attention, else its children that hold none, leaving the innermost
    attention module (the one that calls the attention kernel, with its projections) eager; the modules compiled."""
    if not _holds_attention(module):
        module.compile()
        return [module]
    children = list(module.children())
    if not any(_holds_attention(child) for child in children):
        return []
    return [compiled for child in children for compiled in _compile_outside_attention(child)]


def compile_regions(model: Any) -> list[Any]:
    """`--compile-regions`: in each of the model's repeated blocks (its `_no_split_modules`: a BERT layer and its
    embeddings, a decoder layer), compile the parts outside attention in place, each part its own graph (the same
    code in every layer: one compilation serves all). Attention stays SDPA's fused kernel, which a whole compiled
    model loses to the unfused math once attention has dropout (1.7× the memory, slower, on the H100). Returns the
    modules it compiled."""
    block_names = next(
        (set(inner._no_split_modules) for inner in model.modules() if getattr(inner, "_no_split_modules", None)), set()
    )
    blocks = [inner for inner in model.modules() if type(inner).__name__ in block_names]
    return [compiled for block in blocks for compiled in _compile_outside_attention(block)]


SELECTIVE_SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
"""The aten operators whose outputs selective checkpointing keeps: the matmuls (a linear layer is addmm or mm) and
fused attention; everything else in a layer is recomputed in backward."""


def enable_checkpointing(model: Any, config: Any) -> None:
    """`--grad-checkpointing --selective-checkpointing`: each layer checkpointed (non-reentrant, as torch's selective
    checkpointing needs) with a policy that keeps the outputs of `SELECTIVE_SAVED_OPS`."""
    import functools

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = {getattr(torch.ops.aten, name).default for name in SELECTIVE_SAVED_OPS if hasattr(torch.ops.aten, name)}

    def policy(context: Any, operator: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if operator in saved else CheckpointPolicy.PREFER_RECOMPUTE

    arguments = {"use_reentrant": False, "context_fn": functools.partial(create_selective_checkpoint_contexts, policy)}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5.2x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=arguments)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=arguments)


def compile_stats(frames: int) -> dict[str, int]:
    """TorchDynamo's counters: the unique graphs it compiled and the graph breaks it met, with the `frames` compiled
    (the whole model: 1; --compile-regions: one a kind of module). Each break splits a graph; graphs beyond
    breaks + frames are recompilations: new shapes, guards that failed."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "frames": frames,
    }
