"""Logits that decide greedy tokens in fp32, over a model that runs in bf16.

Why: in bf16 the head's output is rounded to bf16, whose step is 0.125 for a logit in [16, 32) and
0.25 in [32, 64). Two candidate tokens then often share one logit exactly, and a tree forward, which
sums and rounds differently from AR's one-row step, breaks such a tie the other way: on a 2-core
avx512_bf16 EPYC 121 of 1,080 speculative decodes differed from AR, 56 of them at top-2 logits
that were exactly equal. Greedy decoding only needs the largest logit (and the verifier, the gap to
the second), so those need fp32; the other 150k need not.

What runs, per position:

1. The final RMS norm in fp32: the normalised hidden state times the norm's weight, both in fp32
   (the bf16 norm rounds that product to bf16 before the head reads it).
2. A **screen**: the head's product in the model's own arithmetic (bf16 weights, the fast kernel),
   on the normalised state rounded to bf16.
3. A **bound** on how far each screened logit can be from the fp32 product of the fp32 state with
   the same weights: the input's rounding (``|h_bf16 - h| * max_v |W_v|``, Cauchy-Schwarz), the
   output's rounding (half a bf16 ulp, taken as ``2**-7 * |logit|``) and fp32 summation
   (``d * 2**-23 * |h| * max_v |W_v|``), summed, twice over for safety.
4. The **refinement**: the ``REFINED`` best-screened tokens get their logit recomputed in fp32 (their
   head rows upcast, one small product). Every other token's screened value is at least two bounds
   below the best one, so it can be neither the fp32 argmax nor within a bound of it; where that
   does not hold for some position (more than ``REFINED`` tokens inside the bound), the same is done
   with its ``WIDER`` best; where even that does not hold, that position's logits are the full fp32
   product, computed from an fp32 copy of the head made once, on demand.

So the returned logits are fp32, their argmax is the fp32 head's argmax, and the top-2 gap is the
fp32 gap wherever it is small enough to matter. The weights stay bf16 (no 0.5 GB fp32 copy of
Qwen's head unless a position needs it; `Fp32Logits.full_products` counts those). AR and every
verify forward run the same head, so AR remains the reference. Applied where a model decodes
greedily as a target or the teacher (`ooospec.models.target`), when a profile's model says
``logits: float32`` and it runs in a lower precision; in fp32 nothing changes.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

REFINED = 32  # tokens per position whose logit is recomputed in fp32 (the screen's best)
# where those do not cover a position, its best this many are recomputed before the full product (a
# flat position in a verify tree, after a draft the target would not write: the full product reads
# the whole fp32 head, 113 MB for SmolLM2's, and made its 17-row verify 24% dearer)
WIDER = 512
SAFETY = 2.0  # the bound is taken twice over


class HeadUnsupported(ValueError):
    """A model whose final norm or head is not the plain RMS norm and linear head this module knows."""


@dataclass(frozen=True)
class NormParts:
    """What an RMS norm computes with: its weight and epsilon."""

    weight: torch.Tensor
    eps: float


def _norm_parts(norm: torch.nn.Module, where: str) -> NormParts:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or eps is None or "RMSNorm" not in type(norm).__name__:
        raise HeadUnsupported(f"{where}: final norm {type(norm).__name__} is not an RMS norm with a weight "
                              "and an epsilon; fp32 logits cannot be given for this model")
    return NormParts(weight, float(eps))


class Fp32Norm(torch.nn.Module):
    """The model's final RMS norm, returning fp32 (step 1 of the module docstring)."""

    def __init__(self, norm: torch.nn.Module, where: str):
        super().__init__()
        self.inner = norm
        self.parts = _norm_parts(norm, where)
        self.weight = norm.weight  # so that code reading ``model.norm.weight`` still finds it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.parts.weight.to(torch.float32) * (hidden * torch.rsqrt(variance + self.parts.eps))


class Fp32Logits(torch.nn.Module):
    """The head: a bf16 screen, an error bound, the best tokens refined in fp32 (module docstring)."""

    def __init__(self, head: torch.nn.Linear, where: str):
        super().__init__()
        if not isinstance(head, torch.nn.Linear) or head.bias is not None:
            raise HeadUnsupported(f"{where}: output head {type(head).__name__} is not a bias-free linear layer; "
                                  "fp32 logits cannot be given for this model")
        self.inner = head
        self.weight = head.weight  # tied to the input embeddings where the model ties them
        self.in_features, self.out_features = head.in_features, head.out_features
        self.refined = min(REFINED, head.out_features)
        self.wider = min(WIDER, head.out_features)
        self.max_row_norm = float(head.weight.detach().float().norm(dim=1).max())
        self._full: torch.Tensor | None = None
        # the screen's product (None: the plain one over ``weight``) and the full fp32 product;
        # `ooospec.models.row_invariant` sets products whose rows do not depend on how many run together
        self.screen_product: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.full_product: Callable[..., torch.Tensor] = torch.nn.functional.linear
        self.wider_refinements = 0  # positions that needed the wider refinement (counted, for studies)
        self.full_products = 0  # positions that needed the full fp32 product (counted, for studies)

    def _full_weight(self) -> torch.Tensor:
        if self._full is None:
            self._full = self.weight.detach().to(torch.float32)
        return self._full

    def bound(self, hidden: torch.Tensor, rounded: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """Per position: how far a screened logit at or below the best may be from its fp32 value
        (step 3), taken `SAFETY` times. ``top``: the screen's best and worst refined values; the
        output's rounding is largest in magnitude at one of them (``s + 2**-8 |s|`` grows with s)."""
        norm_h = hidden.norm(dim=-1)
        inputs = (rounded.to(torch.float32) - hidden).norm(dim=-1) * self.max_row_norm
        summation = self.in_features * 2.0 ** -23 * norm_h * self.max_row_norm
        output = 2.0 ** -7 * top.abs().amax(dim=-1)
        return SAFETY * (inputs + summation + output)

    @torch.compiler.disable  # data-dependent fallback; the head is one product and a few small ops
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat_h = hidden.reshape(-1, self.in_features).to(torch.float32)
        rounded = flat_h.to(self.weight.dtype)
        screen = (torch.nn.functional.linear(rounded, self.weight) if self.screen_product is None  # the model's arithmetic,
                  else self.screen_product(rounded))  # one pass over the head
        top = torch.topk(screen, self.refined, dim=-1)
        values = top.values.to(torch.float32)
        bound = self.bound(flat_h, rounded, values[:, [0, -1]])
        rows = self.weight.detach()[top.indices].to(torch.float32)  # (positions, refined, d)
        logits = screen.to(torch.float32).scatter_(-1, top.indices, torch.einsum("pd,pkd->pk", flat_h, rows))
        # a token outside the refined set that is within two bounds of the best: the screen cannot
        # rule it out, so that position gets the full fp32 product
        uncovered = values[:, -1] >= values[:, 0] - 2 * bound
        if self.refined < self.out_features and bool(uncovered.any()):
            index = uncovered.nonzero().flatten()
            index = self._refine_wider(logits, screen, flat_h, bound, index)
            if index.numel():
                logits[index] = self.full_product(flat_h[index], self._full_weight())
                self.full_products += int(index.numel())
        return logits.reshape(*hidden.shape[:-1], self.out_features)

    def _refine_wider(self, logits: torch.Tensor, screen: torch.Tensor, flat_h: torch.Tensor, bound: torch.Tensor,
                      index: torch.Tensor) -> torch.Tensor:
        """Step 4 again with the `WIDER` best-screened tokens, for the positions ``index`` the first
        refinement did not cover (a flat distribution, e.g. after a draft the target would not write);
        returns those still uncovered, which get the full product. The same argument holds: every
        token outside the wider set is screened at least two bounds below the best."""
        if self.wider <= self.refined:
            return index
        top = torch.topk(screen[index], self.wider, dim=-1)
        values = top.values.to(torch.float32)
        rows = self.weight.detach()[top.indices].to(torch.float32)
        part = logits[index]
        part.scatter_(-1, top.indices, torch.einsum("pd,pkd->pk", flat_h[index], rows))
        logits[index] = part
        self.wider_refinements += int(index.numel())
        if self.wider == self.out_features:  # every token refined: nothing left to the full product
            return index[:0]
        return index[values[:, -1] >= values[:, 0] - 2 * bound[index]]


@dataclass(frozen=True)
class LogitsReport:
    """What `use_fp32_logits` did to a model."""

    applied: bool
    reason: str


def final_norm(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """The decoder's final norm module and the attribute path it lives at (Llama / Qwen layout)."""
    body = getattr(model, "model", None)
    norm = getattr(body, "norm", None)
    if norm is None:
        raise HeadUnsupported(f"{type(model).__name__}: no final norm at model.norm; fp32 logits cannot be given "
                              "for this model")
    return norm, "model.norm"


def use_fp32_logits(model: torch.nn.Module, where: str) -> LogitsReport:
    """Give ``model`` fp32 deciding logits (module docstring); a no-op for a model already in fp32.
    ``where`` names the profile and model in the one-line refusal of a model this cannot serve."""
    dtype = next(model.parameters()).dtype
    if dtype == torch.float32:
        return LogitsReport(False, "the model runs in fp32: its logits already are")
    head = model.get_output_embeddings()
    norm, _ = final_norm(model)
    if isinstance(head, Fp32Logits):
        return LogitsReport(True, "already applied")
    new_norm, new_head = Fp32Norm(norm, where), Fp32Logits(head, where)  # both checked before either is set
    model.model.norm, model.lm_head = new_norm, new_head
    return LogitsReport(True, f"final norm and deciding logits in fp32 over {str(dtype).removeprefix('torch.')} weights")


def uses_fp32_logits(model: torch.nn.Module) -> bool:
    """Whether `use_fp32_logits` applied to this model (records say so)."""
    return isinstance(getattr(model, "lm_head", None), Fp32Logits)


@contextmanager
def own_head(model: torch.nn.Module) -> Iterator[None]:
    """Inside: the model's own norm and head again (the arithmetic study's control); a model without
    fp32 logits is left as it is."""
    if not uses_fp32_logits(model):
        yield
        return
    norm, head = model.model.norm, model.lm_head
    model.model.norm, model.lm_head = norm.inner, head.inner
    try:
        yield
    finally:
        model.model.norm, model.lm_head = norm, head
