"""Linear layers whose multi-row products run on oneDNN-packed weights (fp32 on CPU).

Why: on CPU, torch sends an fp32 ``nn.Linear`` to BLAS. With one row (a decode step) that is a
matrix-vector product, which streams the weights once at memory speed. With a few rows (a verify
tree of 5-17 rows) it is a matrix product, and on the AVX2 machine this project measures on (AMD
EPYC, torch 2.13's MKL) that product is 3-4x slower than the one-row one although it reads the same
weights: a 5-row product of the Qwen target's MLP matrix took 4.5-5.4 ms against 1.4-1.7 ms for one
row, its 5-row ``lm_head`` 216-234 ms against 52-62 ms. So an fp32 verify forward cost about three
one-row steps at any tree size, which is what made the tree budget small on that machine. oneDNN's
matrix product on the same weights, reordered once into its blocked layout, took 3.8 ms and 123 ms
there, and was at least as fast as MKL at every row count up to a 600-token prefill (MLP matrices:
79-82 ms against 93-117 ms). A one-row product stays with the plain weight (oneDNN's was slower).

Same arithmetic: fp32 throughout. Only the summation order differs from MKL's, as MKL's own
matrix product already differs from its matrix-vector product (logits within 3e-5 on the probe,
every argmax equal); the lossless tests and the bench's check against AR hold outputs to greedy
AR exactly as before. Cost: a second copy of every linear weight in memory (about 2 GB for the Qwen
target in fp32), made once at load.

Applied where a decoding model runs eager in fp32 on the CPU (`ooospec.decoding.compiled`), and to
the sidecar as served (`ooospec.sidecar.predictor.SlotPredictor.from_frozen`: its prefix and its
batched rows are multi-row products too; on 75 dev requests its wave took 3.30 -> 2.88 s median,
and on 42 of them all 346 rows came out identical to the plain products). Not to bf16 (torch
already routes bf16 products to oneDNN), not to a compiled model (the inductor prepacks its own
weights), never to a model being trained (the packed copy would not follow the
gradient). The records name it (`ooospec.models.arithmetic.Arithmetic.kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACKED_KERNELS = "oneDNN-packed multi-row products"


class PackedLinear(torch.nn.Module):
    """``linear``'s weight for one row, a oneDNN-packed copy of it for several (inference only)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows <= 1 or torch.is_grad_enabled():
            return torch.nn.functional.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)


@dataclass(frozen=True)
class PackReport:
    """What `pack_linears` did: how many layers it packed, or why it packed none."""

    packed: int
    skipped: str | None = None


def packing_unavailable(model: torch.nn.Module) -> str | None:
    """Why ``model``'s linears are left as they are (None: they can be packed)."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return "the model has no parameters"
    if parameter.device.type != "cpu" or parameter.dtype != torch.float32:
        return f"{parameter.dtype} on {parameter.device.type}: only fp32 on the CPU is packed"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "this torch build has no oneDNN linear"
    return None


def pack_linears(model: torch.nn.Module) -> PackReport:
    """Replace every ``nn.Linear`` of ``model`` by a `PackedLinear` (in place), where possible."""
    why = packing_unavailable(model)
    if why is not None:
        return PackReport(0, why)
    packed = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, PackedLinear(child))
                packed += 1
    return PackReport(packed)


def uses_packed_linears(model: torch.nn.Module | None) -> bool:
    return model is not None and any(isinstance(m, PackedLinear) for m in model.modules())


def unpack_linears(model: torch.nn.Module) -> int:
    """Put plain ``nn.Linear`` layers back (same weights), e.g. to measure against the packed ones."""
    restored = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, PackedLinear):
                plain = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None,
                                        device="meta")
                plain.weight, plain.bias = child.weight, child.bias
                setattr(module, name, plain)
                restored += 1
    return restored
