"""Tiny random causal LMs and a byte-level tokenizer, built in memory in well under a second.

Mechanism tests (label masking, prefix sharing, wave = sequential, tree verification) and the
notebooks' smoke runs need a causal LM with a real tokenizer but must not depend on downloaded
weights; this builds both from scratch, deterministically from a seed. `tiny_causal_lm` covers
every architecture the engine must support, with a larger initializer range than the default so
that logits are decisive (top-2 gaps far above fp32 noise) and a property test comparing tree
decoding with AR never trips on a numerical near-tie.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen3Config

from ooospec.models.surface import SurfaceFormat

ARCHITECTURES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}

TINY_EOS = "<|eos|>"
# ChatML-like, so prompt functions that go through apply_chat_template work on the tiny model too
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|eos|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

_CORPUS = [
    'Tools:\n[0] get_weather: Get the weather.\n  city* (string): City name\nDialogue:\nuser: weather in Paris?\n',
    'Q: function index\nA: 0\nQ: get_weather.city\nA: "Paris"\nQ: call\nA: {"name":"get_weather","arguments":{}}',
    "null true false 0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ {}[]:,.\"'*()|<>-_/?!",
    "system: user: assistant: integer number boolean array object one of",
]


def tiny_tokenizer(vocab_size: int = 320):
    """Byte-level BPE trained on a few prompt-shaped lines; every byte string stays encodable."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[TINY_EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=TINY_EOS, pad_token=TINY_EOS)
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 64, embed_scale: float = 4.0):
    """A randomly initialised 2-layer Llama (the SmolLM2 architecture, scaled down).

    The tied embedding is scaled up so next-token distributions are peaked, as in a trained LM;
    with the default 0.02 init every logit is near zero and a LoRA barely moves the loss.
    """
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(embed_scale)
    model.eval()
    return model


def tiny_model_and_tokenizer(seed: int = 0, layers: int = 2, hidden: int = 64):
    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer), seed=seed, layers=layers, hidden=hidden)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


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


def tiny_target(model: torch.nn.Module, tokenizer: Any = None, eos_token_ids: list[int] = (),
                surface: Any = None) -> Any:
    """A tiny model as the `TargetModel` the decode loop takes (tests pass their own context)."""
    from ooospec.models.target import TargetModel

    return TargetModel("tiny", model, tokenizer, surface, list(eos_token_ids))


# the call `tiny_tool_target` writes unless told otherwise
TINY_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


class ScriptedLlama(LlamaForCausalLM):
    """A tiny Llama whose greedy output is a fixed token script.

    A random tiny model never writes a tool call, so examples that show a parsed call (the public
    API's docstring, the README) need a target that does. This one runs the real Llama forward (so
    the KV cache, tree masks and cache commits are exercised as for any target) and then replaces
    its logits: the row at absolute position ``p`` predicts ``script[p - start + 1]``, where
    ``start`` is the prompt length, and EOS past the script's end. A prefill forward carries no
    ``position_ids`` (the verifier passes them only to verify forwards), which is how ``start`` is
    learnt, chunked prefills included. Every decoding method therefore writes the script, and a draft
    is accepted exactly where it matches it."""

    def __init__(self, config: LlamaConfig, script: list[int], eos_token_id: int):
        super().__init__(config)
        self.script, self.eos, self.start = list(script), int(eos_token_id), 0

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None,
                logits_to_keep: int = 0, **kwargs):
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            self.start = past + input_ids.shape[1]
            positions = torch.arange(past, past + input_ids.shape[1])
        else:
            positions = position_ids[0].cpu()
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              cache=cache, logits_to_keep=logits_to_keep, **kwargs)
        positions = positions[-out.logits.shape[1]:]
        logits = torch.zeros_like(out.logits)
        for row, position in enumerate(positions.tolist()):
            index = position - self.start + 1
            logits[0, row, self.script[index] if 0 <= index < len(self.script) else self.eos] = 10.0
        out.logits = logits
        return out


def scripted_llama(script: list[int], eos_token_id: int, vocab_size: int, seed: int = 0) -> ScriptedLlama:
    """A one-layer `ScriptedLlama` writing ``script`` then ``eos_token_id``."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    return ScriptedLlama(config, script, eos_token_id).eval()


def tiny_tool_target(call: dict[str, Any] | None = None, seed: int = 0) -> Any:
    """A tiny target that answers every request with one tool call (``call``, default `TINY_CALL`)
    in the Hermes ``<tool_call>`` surface, tools in a system message: a `TargetModel` for examples
    and tests that must show a call being written, parsed and drafted, in well under a second."""
    from ooospec.data.request import Call
    from ooospec.models.formats import get_surface
    from ooospec.models.target import TargetModel

    tokenizer = tiny_tokenizer()
    surface = get_surface("hermes_tool_call")
    text = surface.render([Call.from_dict(call or TINY_CALL)])
    script = tokenizer.encode(text, add_special_tokens=False)
    model = scripted_llama(script, tokenizer.eos_token_id, len(tokenizer), seed=seed)
    return TargetModel("tiny-tool", model, tokenizer, surface, [tokenizer.eos_token_id],
                       prompt_style="system_tools_json")


class FixedText(SurfaceFormat):
    """A surface format whose rendering of any call is one fixed text (for the hint tests: the AR
    output of a tiny model, so the hint is exactly what the target writes) and which parses nothing."""

    name = "fixed_text"

    def __init__(self, text: str):
        self.text = text

    def render(self, calls: Any) -> str:
        return self.text

    def parse(self, text: str) -> list:
        return []
