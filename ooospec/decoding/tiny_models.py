"""Tiny random causal LMs of the architectures the engine must support (tests and smoke runs).

A larger initializer range than the default makes logits decisive (top-2 gaps far above fp32
noise), so a property test comparing tree decoding with AR never trips on a numerical near-tie.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

ARCHITECTURES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def tiny_causal_lm(arch: str, seed: int = 0, vocab_size: int = 64, layers: int = 2, hidden: int = 64,
                   initializer_range: float = 0.2) -> torch.nn.Module:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {arch!r} (expected one of {sorted(ARCHITECTURES)})")
    config = ARCHITECTURES[arch](
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=initializer_range,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()
