"""A decode forward near the CPU's bandwidth floor: a Llama / Qwen2 layer stack in one readable file.

Why: a one-row decode step must read every weight once, so its floor is the model's bytes over the
memory bandwidth. transformers' eager forward ran the Qwen target 1.7x and SmolLM2 3.4x above that
floor on one thread (AMD EPYC Zen 5, avx512_bf16): its one-row products do not stream the weight at
full speed, and every small operation of a layer pays Python and dispatch. Speculation amortises
exactly that waste, so every speedup over AR measured on it was flattered. This forward runs the same
weights as gpt-fast writes a decoder: fused QKV and gate/up products on weights packed once into the
product's tiles, a fused RMS norm, RoPE and SiLU, and an attention over the visible keys, each a C++
kernel (`ooospec.models.lean_kernels`).

Invariant (what keeps speculation lossless): every row of a forward is computed by the same operations
whatever rows run beside it, so a verify forward of a tree gives each row exactly AR's one-row step
(the kernels hold it by construction; `tests/test_lean_decoder.py` checks it bit for bit on real
requests). The prefill keeps transformers' forward (its many rows run fastest on oneDNN's products and
the flash attention, and it is the same for every method): `LeanDecoder` serves the decode and verify
forwards, which is how the verifier calls it (`ooospec.decoding.verifier`).

Arithmetic: the model's own dtype (bf16 or fp32), rounded where transformers' modules round; the fp32
deciding logits (`ooospec.models.fp32_logits`) screen with this forward's product. Its logits agree
with transformers' within the dtype's rounding (`check_against_transformers`: a test runs it on real
requests, the floor study on the requests it times).
A model of another architecture keeps transformers' forward (`use_lean_decoder` says why, in one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ooospec.models.fp32_logits import Fp32Logits

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
LEAN_KERNELS = "lean decoder (streamed products)"


class Product:
    """``x @ weight.T + bias`` for one or several linears over the same input (their outputs
    concatenated: fused QKV, gate/up), on a copy of their weights packed once into the kernel's tiles.
    A model cast to another dtype after packing (a study's ``.to``) is packed again at its next call."""

    def __init__(self, *linears: Any):
        self.linears = linears
        self.out_features = sum(lin.weight.shape[0] for lin in linears)
        self.pack()

    def pack(self) -> None:
        from ooospec.models.lean_kernels import lean_kernels

        weight = torch.cat([lin.weight.detach() for lin in self.linears])
        biases = [getattr(lin, "bias", None) for lin in self.linears]
        self.bias = None if all(b is None for b in biases) else torch.cat(  # fp32: the kernel adds it to fp32 sums
            [b.detach() if b is not None else torch.zeros(lin.weight.shape[0], dtype=weight.dtype)
             for b, lin in zip(biases, self.linears)]).float()
        self.packed = lean_kernels().pack(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from ooospec.models.lean_kernels import lean_kernels

        if self.packed.dtype != self.linears[0].weight.dtype:
            self.pack()
        return lean_kernels().linear(x, self.packed, self.out_features, self.bias)


@dataclass
class LeanLayer:
    """One decoder layer: its norms (read at each call, so a cast model's are current) and products."""

    input_norm: torch.nn.Module
    qkv: Product
    out: Product
    post_norm: torch.nn.Module
    gate_up: Product
    down: Product


class LeanDecoder:
    """The decode forward of a transformers Llama / Qwen2 model, over its own weights and cache."""

    def __init__(self, model: Any):
        config = model.config
        self.model, self.config = model, config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim ** -0.5
        self.q_width, self.kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.layers = [LeanLayer(
            input_norm=layer.input_layernorm,
            qkv=Product(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
            out=Product(layer.self_attn.o_proj),
            post_norm=layer.post_attention_layernorm,
            gate_up=Product(layer.mlp.gate_proj, layer.mlp.up_proj),
            down=Product(layer.mlp.down_proj),
        ) for layer in model.model.layers]
        head = model.get_output_embeddings()
        self.head_product = Product(head)
        self.fp32_logits = isinstance(head, Fp32Logits)
        if self.fp32_logits:  # the deciding logits screen with this forward's product
            head.screen_product = self.head_product

    def __call__(self, input_ids: torch.Tensor, cache: DynamicCache | None = None,
                 attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                 logits_to_keep: int = 0, **_: Any) -> CausalLMOutputWithPast:
        return self.forward(input_ids, cache, attention_mask, position_ids, logits_to_keep)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: DynamicCache | None = None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> CausalLMOutputWithPast:
        """Logits of every row (or the last ``logits_to_keep``); ``cache`` gains this forward's keys
        and values. ``attention_mask``: None (causal) or an additive ``[1, 1, rows, keys]`` mask (0 where
        a row may look, the dtype's minimum elsewhere), as the tree verifier passes it."""
        from ooospec.models.lean_kernels import lean_kernels

        kernels = lean_kernels()
        ids = input_ids.reshape(-1)
        rows = ids.numel()
        cache = cache if cache is not None else DynamicCache(config=self.config)
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + rows).view(1, rows)
        visible = self.visible(attention_mask, rows, past + rows)
        x = F.embedding(ids, self.model.model.embed_tokens.weight)
        cos, sin = self.model.model.rotary_emb(x, position_ids.view(1, rows))
        cos, sin = cos[0].contiguous(), sin[0].contiguous()
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(kernels.rms_norm(x, layer.input_norm.weight, self.eps))
            q = qkv[:, :self.q_width].reshape(rows, self.heads, self.head_dim).contiguous()
            k = qkv[:, self.q_width:self.q_width + self.kv_width].reshape(rows, self.kv_heads, self.head_dim).contiguous()
            v = qkv[:, self.q_width + self.kv_width:].reshape(rows, self.kv_heads, self.head_dim)
            kernels.rope_(q, cos, sin)
            kernels.rope_(k, cos, sin)
            keys, values = cache.update(k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), index)
            attended = kernels.attention(q, _last_dim_dense(keys), _last_dim_dense(values), visible, self.scale)
            x = x + layer.out(attended.view(rows, self.q_width))
            x = x + layer.down(kernels.silu_mul(layer.gate_up(kernels.rms_norm(x, layer.post_norm.weight, self.eps))))
        kept = x if not logits_to_keep else x[-logits_to_keep:]
        if self.fp32_logits:  # its fp32 norm and refinement reduce each row alone
            logits = self.model.lm_head(self.model.model.norm(kept))
        else:
            logits = self.head_product(kernels.rms_norm(kept.contiguous(), self.model.model.norm.weight, self.eps))
        return CausalLMOutputWithPast(logits=logits.unsqueeze(0), past_key_values=cache)

    @staticmethod
    def visible(mask: torch.Tensor | None, rows: int, keys: int) -> torch.Tensor:
        """``[rows, keys]`` booleans: which keys each row attends to (None: causal, the rows last)."""
        if mask is None:
            return torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
        if mask.dim() != 4 or mask.shape[0] != 1 or mask.shape[1] != 1:
            raise ValueError(f"the lean decoder takes a [1, 1, rows, keys] mask, got {tuple(mask.shape)}")
        mask = mask[0, 0, :, :keys]
        return mask.contiguous() if mask.dtype == torch.bool else (mask == 0).contiguous()


class LeanMismatch(ValueError):
    """The lean forward's logits are not transformers' within the arithmetic's rounding."""


# how far the lean forward's logits may be from transformers' on the same cache, as a share of the
# largest logit: bf16 rounds at 2**-8 relative per operation over a few hundred operations a layer
# (measured on real requests: Qwen 0.8%, SmolLM2 under 2%); fp32 at 2**-24
AGREEMENT = {torch.bfloat16: 0.05, torch.float32: 1e-4}


@torch.no_grad()
def check_against_transformers(model: Any, cache: DynamicCache, tokens: list[int], where: str) -> float:
    """Run ``tokens`` after ``cache`` (left as it was) through both forwards, one decode step at a time;
    return the largest difference as a share of the largest logit, or refuse one beyond `AGREEMENT`,
    naming ``where`` (the request) and the position. The argmax must agree wherever the top two
    logits are further apart than the allowance."""
    import copy

    lean = lean_decoder_of(model)
    if lean is None:
        raise ValueError(f"{where}: the model has no lean decoder to check")
    ours_cache, theirs_cache = copy.deepcopy(cache), copy.deepcopy(cache)
    start, worst = cache.get_seq_length(), 0.0
    allowed = AGREEMENT[next(model.parameters()).dtype]
    for i, token in enumerate(tokens):
        ids, positions = torch.tensor([[token]]), torch.tensor([[start + i]])
        ours = lean(ids, cache=ours_cache, position_ids=positions).logits[0, -1].float()
        theirs = model(input_ids=ids, cache=theirs_cache, position_ids=positions, use_cache=True).logits[0, -1].float()
        scale = float(theirs.abs().max())
        share = float((ours - theirs).abs().max()) / scale
        top = theirs.topk(2).values
        flipped = float(top[0] - top[1]) > 2 * allowed * scale and int(ours.argmax()) != int(theirs.argmax())
        if share > allowed or flipped:
            raise LeanMismatch(f"{where}: position {start + i}: the lean decoder's logits differ from transformers' "
                               f"by {share:.2%} of the largest (allowed {allowed:.2%})"
                               + ("; its argmax differs" if flipped else ""))
        worst = max(worst, share)
    return worst


def _last_dim_dense(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@dataclass(frozen=True)
class LeanReport:
    """What `use_lean_decoder` did to a model."""

    applied: bool
    reason: str


def lean_unavailable(model: Any) -> str | None:
    """Why ``model`` keeps transformers' decode forward (None: the lean decoder serves it)."""
    architectures = getattr(model.config, "architectures", None) or [type(model).__name__]
    if type(model).__name__ not in ARCHITECTURES:
        return f"{architectures[0]} is not one of the architectures it knows ({', '.join(ARCHITECTURES)})"
    parameter = next(model.parameters())
    if parameter.device.type != "cpu" or parameter.dtype not in (torch.bfloat16, torch.float32):
        return f"{parameter.dtype} on {parameter.device.type}: it runs bf16 or fp32 on the CPU"
    if getattr(model.config, "use_sliding_window", False):
        return "a sliding attention window"
    return None


def use_lean_decoder(model: Any, where: str) -> LeanReport:
    """Attach a `LeanDecoder` to ``model`` (``model.ooospec_lean``); the decode loop's verifier runs
    it (`lean_decoder_of`). ``where`` names the profile's model in the line a fallback prints."""
    why = lean_unavailable(model)
    if why is not None:
        print(f"{where}: transformers' forward decodes ({why}; no lean decoder)")
        return LeanReport(False, why)
    model.__dict__["ooospec_lean"] = LeanDecoder(model)  # not a submodule: its packed copies stay out of state_dict
    return LeanReport(True, f"{len(model.model.layers)} layers on the lean decoder")


def lean_decoder_of(model: Any) -> LeanDecoder | None:
    """The model's lean decoder, if `use_lean_decoder` attached one."""
    return getattr(model, "__dict__", {}).get("ooospec_lean")
