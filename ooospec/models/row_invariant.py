"""A bf16 forward whose every row comes out the same however many rows run beside it.

Why: greedy speculative decoding is lossless only if a verify forward of a tree (5-17 rows) gives
each row the logits AR's one-row step gives it. In bf16 on the CPU it did not: the residual stream
differed at every position of the logit-ties study (`ooospec.studies.logit_ties`), so fp32 logits
(`ooospec.models.fp32_logits`) could not remove the flips that were left (67 of 1,260 speculative
decodes of the canonical run on an avx512_bf16 EPYC, all at near-ties, clustered by request). Two
kinds of kernel made a row depend on its neighbours (torch 2.13's oneDNN bf16 kernels, avx512_bf16
EPYC, one and two threads):

* **Linear products.** A one-row product takes a matrix-vector kernel that sums a long reduction
  (the MLP's down projection) in another order than the matrix product. `RowInvariantLinear` runs
  every product on a oneDNN-packed copy of the weight, one row as two: each row then gets the same
  bits at any row count (2 to 1,200 measured), the same bits as torch's own multi-row product, and
  sooner than torch's product, which reorders the weight on every call.
* **Attention.** A one-query step takes another path than a masked multi-row forward (grouped heads
  folded into the query, no mask); and the CPU flash kernel cuts the keys into blocks of
  min(512, length) and sums each block's probabilities x values over that block's length, so two
  rows whose keys end in different places sum differently. `row_invariant_attention` always passes
  an explicit mask, at least `MIN_QUERY_ROWS` query rows (the last repeated) and at most
  `MAX_QUERY_ROWS` per call, and pads the keys with masked zeros to a multiple of `KEY_MULTIPLE`
  (512): every block is then full, and a block a row may not see adds exact zeros at a scale of
  exactly 1. Measured: AR's one-row steps and 3-, 9- and 17-row forwards over the same tokens gave
  the same hidden states and logits, bit for bit, at every one of 435 positions of 15 dev requests
  (both targets), where the plain kernels differed at nearly all of them.

Everything else in the decoder is elementwise or reduces within a row. Same arithmetic as before:
bf16 products with fp32 accumulation, the extra rows discarded. Applied where a profile's model
says ``rows: invariant`` and it runs eager in bf16 on the CPU (`ooospec.models.target.load_role`),
to AR and every method alike, prefill included (so a prefill in chunks, as elastic OoO-Spec runs
it, writes the cache a prefill in one piece writes). `plain_rows` puts torch's kernels back, for the
cost study (`ooospec.studies.logits_cost`). In fp32 nothing changes. Records name it
(`ooospec.models.arithmetic.Arithmetic.kernels`).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from ooospec.models.fp32_logits import Fp32Logits

ROW_INVARIANT_KERNELS = "row-invariant bf16 products"
ATTENTION = "ooospec_row_invariant"  # the attention implementation's registered name
MIN_QUERY_ROWS = 4  # with 2 query rows, 188 of 726 random trials differed from a tree forward's row
MAX_QUERY_ROWS = 32  # the flash kernel's smallest query block (a 40-row call differed in 3 trials)
KEY_MULTIPLE = 512  # the flash kernel's key block: every block full, so every product has one shape


class RowInvariantLinear(torch.nn.Module):
    """``linear`` on a oneDNN-packed copy of its weight, a one-row product run as two rows.

    The packed product gives every row the same bits at any row count from 2 (measured to 1,200,
    one and two threads) and the same bits as torch's own bf16 product for several rows; it is also
    faster than torch's product, which reorders the weight on every call (Qwen's MLP matrices: 0.16
    against 0.34 ms for one row, 0.40 against 0.64 ms for nine, one thread of the avx512_bf16 EPYC).
    Cost: a second, packed copy of every linear weight, made once at load (inference only).
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.product = RowInvariantProduct(linear.weight, linear.bias)
        self.invariant = True  # False: torch's own product (`plain_rows`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.invariant:
            return F.linear(x, self.weight, self.bias)
        if self.product.packed.dtype != self.weight.dtype:  # the model was cast (a study's ``.to``): pack again
            self.product = RowInvariantProduct(self.weight, self.bias)
        return self.product(x)


class RowInvariantProduct:
    """``x @ weight.T + bias`` on a packed copy of ``weight``, rows independent of one another."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.weight, self.bias = weight, bias  # kept to pack a copy (`__deepcopy__`)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self._bias = None if bias is None else bias.detach()

    def __deepcopy__(self, memo: dict) -> "RowInvariantProduct":
        # the packed weight is an opaque oneDNN tensor, which cannot be copied: pack the copied weight
        return RowInvariantProduct(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(_two_rows_if_one(flat), self.packed, self._bias, "none", [], "")
        return out[:flat.shape[0]].reshape(*x.shape[:-1], self.out_features)


def two_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, with a single row computed as the first of two equal rows (the fp32 head's rare
    full product, `ooospec.models.fp32_logits.Fp32Logits`)."""
    flat = x.reshape(-1, weight.shape[1])
    out = F.linear(_two_rows_if_one(flat), weight, bias)
    return out[:flat.shape[0]].reshape(*x.shape[:-1], weight.shape[0])


def _two_rows_if_one(flat: torch.Tensor) -> torch.Tensor:
    """A one-row product's input as two equal rows (the first is kept): it then sums as a matrix
    product does; several rows are left as they are."""
    return torch.cat([flat, flat]) if flat.shape[0] == 1 else flat


def _additive_mask(mask: torch.Tensor | None, q_len: int, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """The mask as ``[b, 1, q, kv]`` additive floats; None is causal, aligned to the last key."""
    low = torch.finfo(dtype).min
    if mask is None:
        allowed = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        return torch.zeros(q_len, kv_len, dtype=dtype).masked_fill_(~allowed, low).view(1, 1, q_len, kv_len)
    mask = mask[..., :kv_len]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, low)
    return mask.to(dtype)


def _keys_seen(mask: torch.Tensor) -> int:
    """The key blocks a slice of query rows may see, as a key count (a multiple of `KEY_MULTIPLE`): the
    blocks after its last visible key would add exact zeros, so a prefill's slice skips them."""
    visible = (mask > torch.finfo(mask.dtype).min).flatten(0, -2).any(0).nonzero()
    last = int(visible.max()) + 1 if visible.numel() else 1
    return -(-last // KEY_MULTIPLE) * KEY_MULTIPLE


def row_invariant_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention (transformers' attention-function protocol, inference only)
    computed the same way for every query row, whatever the query's length (module docstring)."""
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = _additive_mask(attention_mask, q_len, kv_len, query.dtype).to(query.device)
    padded = -(-kv_len // KEY_MULTIPLE) * KEY_MULTIPLE
    if padded > kv_len:
        key = F.pad(key, (0, 0, 0, padded - kv_len))
        value = F.pad(value, (0, 0, 0, padded - kv_len))
        mask = F.pad(mask, (0, padded - kv_len), value=torch.finfo(query.dtype).min)
    grouped = query.shape[1] != key.shape[1]
    parts = []
    for start in range(0, q_len, MAX_QUERY_ROWS):
        q, m = query[:, :, start:start + MAX_QUERY_ROWS], mask[:, :, start:start + MAX_QUERY_ROWS]
        rows = q.shape[2]
        keys = _keys_seen(m) if q_len > MAX_QUERY_ROWS else padded  # a long query's slice: its own blocks
        m = m[..., :keys]
        if rows < MIN_QUERY_ROWS:
            q = torch.cat([q] + [q[:, :, -1:]] * (MIN_QUERY_ROWS - rows), dim=2)
            m = torch.cat([m] + [m[:, :, -1:]] * (MIN_QUERY_ROWS - rows), dim=2)
        out = F.scaled_dot_product_attention(q, key[:, :, :keys], value[:, :, :keys], attn_mask=m, scale=scaling,
                                             enable_gqa=grouped)
        parts.append(out[:, :, :rows])
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, row_invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


@dataclass(frozen=True)
class RowsReport:
    """What `use_row_invariance` did to a model."""

    applied: bool
    reason: str


def pack_linear_layers(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a `RowInvariantLinear` (in place), except inside an
    fp32 head (`Fp32Logits` sets its own products; its ``inner`` is not run); returns how many."""
    replaced = 0
    for module in list(model.modules()):
        if isinstance(module, Fp32Logits):
            continue
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, RowInvariantLinear(child))
                replaced += 1
    return replaced


def use_row_invariance(model: torch.nn.Module) -> RowsReport:
    """Make ``model``'s forward row-invariant (module docstring), in place; a no-op in fp32."""
    parameter = next(model.parameters())
    if parameter.dtype == torch.float32:
        return RowsReport(False, "the model runs in fp32")
    if parameter.device.type != "cpu":
        return RowsReport(False, f"measured for the CPU's kernels only, not {parameter.device.type}")
    _register()
    linears = pack_linear_layers(model)
    head = model.get_output_embeddings()
    if isinstance(head, Fp32Logits):
        head.screen_product = RowInvariantProduct(head.weight)
        head.full_product = two_row_linear
    model.set_attn_implementation(ATTENTION)
    model.ooospec_rows = "invariant"  # `uses_row_invariance`; "plain" inside `plain_rows`
    return RowsReport(True, f"{linears} linear layers and attention row-invariant")


@contextmanager
def plain_rows(model: torch.nn.Module) -> Iterator[None]:
    """Inside: torch's own products and attention again (the control the arithmetic's cost study
    measures beside the row-invariant ones); a model without row invariance is left as it is."""
    if not uses_row_invariance(model):
        yield
        return
    linears = [m for m in model.modules() if isinstance(m, RowInvariantLinear)]
    head = model.get_output_embeddings()
    head_products = (head.screen_product, head.full_product) if isinstance(head, Fp32Logits) else None
    for module in linears:
        module.invariant = False
    if head_products is not None:
        head.screen_product, head.full_product = None, F.linear
    model.set_attn_implementation("sdpa")
    model.ooospec_rows = "plain"
    try:
        yield
    finally:
        model.ooospec_rows = "invariant"
        for module in linears:
            module.invariant = True
        if head_products is not None:
            head.screen_product, head.full_product = head_products
        model.set_attn_implementation(ATTENTION)


def uses_row_invariance(model: torch.nn.Module | None) -> bool:
    """Whether this model's forwards are row-invariant now (`use_row_invariance`, outside `plain_rows`);
    records say so."""
    return getattr(model, "ooospec_rows", None) == "invariant"
