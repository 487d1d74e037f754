"""Write the config.json files of issue #50's held-out set (benchmarks/configs/<name>/config.json).

Each is built with transformers' own config class at the published checkpoint's sizes; where the published model
cannot train with AdamW on one 80 GB GPU, only its number of layers is cut, and the directory's name says so
(`-8l`: 8 layers). Families new to gpuanat's layout table (falcon, gpt_bigcode, mpt, persimmon, nemotron, gptj,
codegen, cohere2, gpt_neo) and families in it that no development run measured (qwen2, llama 3B, gemma2, phi3,
starcoder2, and the experts of olmoe, qwen3_moe, mixtral, qwen2_moe).

    python benchmarks/make_held_out_configs.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import transformers

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"

HELD_OUT_50: dict[str, tuple[str, dict[str, Any]]] = {
    # families outside the table
    "falcon-rw-1b": (
        "FalconConfig",
        dict(
            vocab_size=50304,
            hidden_size=2048,
            num_hidden_layers=24,
            num_attention_heads=32,
            alibi=True,
            bias=True,
            parallel_attn=False,
            multi_query=False,
            new_decoder_architecture=False,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            max_position_embeddings=2048,
        ),
    ),
    "falcon-7b-8l": ("FalconConfig", dict(num_hidden_layers=8)),  # the defaults are falcon-7b's: MQA, parallel
    "santacoder": (
        "GPTBigCodeConfig",
        dict(
            vocab_size=49280,
            n_positions=2048,
            n_embd=2048,
            n_layer=24,
            n_head=16,
            multi_query=True,
            activation_function="gelu_pytorch_tanh",
            bos_token_id=49152,
            eos_token_id=49152,
        ),
    ),
    "mpt-1.3b": (
        "MptConfig",
        dict(
            d_model=2048, n_heads=16, n_layers=24, expansion_ratio=4, max_seq_len=2048, vocab_size=50432, no_bias=True
        ),
    ),
    "persimmon-8b-4l": ("PersimmonConfig", dict(num_hidden_layers=4)),  # the defaults are persimmon-8b's
    "nemotron-mini-4b-8l": (
        "NemotronConfig",
        dict(
            hidden_size=3072,
            num_hidden_layers=8,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=9216,
            vocab_size=256000,
            partial_rotary_factor=0.5,
            hidden_act="relu2",
            tie_word_embeddings=False,
            max_position_embeddings=4096,
        ),
    ),
    "gpt-j-6b-6l": ("GPTJConfig", dict(n_layer=6)),  # the defaults are gpt-j-6b's
    "codegen-350m-mono": (
        "CodeGenConfig",
        dict(
            vocab_size=51200,
            n_positions=2048,
            n_ctx=2048,
            n_embd=1024,
            n_layer=20,
            n_head=16,
            rotary_dim=32,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
    ),
    "command-r7b-4l": (
        "Cohere2Config",
        dict(
            hidden_size=4096,
            num_hidden_layers=4,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            vocab_size=256000,
            sliding_window=4096,
            max_position_embeddings=8192,
        ),
    ),
    "gpt-neo-1.3b": (
        "GPTNeoConfig",
        dict(
            vocab_size=50257,
            hidden_size=2048,
            num_layers=24,
            num_heads=16,
            attention_types=[[["global", "local"], 12]],
            window_size=256,
            max_position_embeddings=2048,
            embed_dropout=0.0,
            attention_dropout=0.0,
            resid_dropout=0.0,
            activation_function="gelu_new",
        ),
    ),
    # families in the table, sizes no development run measured
    "qwen2-1.5b": (
        "Qwen2Config",
        dict(
            hidden_size=1536,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            intermediate_size=8960,
            vocab_size=151936,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
        ),
    ),
    "llama-3.2-3b": (
        "LlamaConfig",
        dict(
            hidden_size=3072,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            intermediate_size=8192,
            vocab_size=128256,
            tie_word_embeddings=True,
            max_position_embeddings=131072,
            head_dim=128,
        ),
    ),
    "gemma-2-2b": (
        "Gemma2Config",
        dict(
            hidden_size=2304,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            intermediate_size=9216,
            vocab_size=256000,
        ),
    ),
    "phi-3-mini": (
        "Phi3Config",
        dict(
            hidden_size=3072,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            intermediate_size=8192,
            vocab_size=32064,
            max_position_embeddings=4096,
        ),
    ),
    "starcoder2-3b": (
        "Starcoder2Config",
        dict(
            hidden_size=3072,
            num_hidden_layers=30,
            num_attention_heads=24,
            num_key_value_heads=2,
            intermediate_size=12288,
            vocab_size=49152,
            max_position_embeddings=16384,
            bos_token_id=0,
            eos_token_id=0,
        ),
    ),
    # experts
    "olmoe-1b-7b": ("OlmoeConfig", {}),  # the defaults are OLMoE-1B-7B's
    "qwen3-30b-a3b-4l": (
        "Qwen3MoeConfig",
        dict(
            hidden_size=2048,
            num_hidden_layers=4,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=768,
            intermediate_size=6144,
            vocab_size=151936,
        ),
    ),
    "mixtral-8x7b-2l": ("MixtralConfig", dict(num_hidden_layers=2)),  # the defaults are Mixtral-8x7B's
    "qwen1.5-moe-a2.7b-4l": (
        "Qwen2MoeConfig",
        dict(
            hidden_size=2048,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=60,
            num_experts_per_tok=4,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            intermediate_size=5632,
            vocab_size=151936,
        ),
    ),
}


def main() -> int:
    for name, (class_name, kwargs) in HELD_OUT_50.items():
        config = getattr(transformers, class_name)(**kwargs)
        data = config.to_dict()
        data["architectures"] = [class_name.removesuffix("Config") + "ForCausalLM"]
        data.pop("transformers_version", None)
        directory = CONFIGS_DIR / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(name, data["model_type"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
