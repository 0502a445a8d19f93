"""Multi-row products on oneDNN-packed weights (`ooospec.models.packed_linear`): where they apply,
that they keep the arithmetic (one row bit for bit, several rows to fp32 rounding, same greedy
tokens), and that the records name them."""

from __future__ import annotations

import pytest
import torch

from ooospec.models.arithmetic import Arithmetic, running_arithmetic
from ooospec.models.packed_linear import PACKED_KERNELS, PackedLinear, pack_linears, uses_packed_linears
from ooospec.models.tiny import tiny_causal_lm

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


@needs_onednn
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_model_keeps_one_row_exact_and_several_rows_to_rounding(arch):
    model = tiny_causal_lm(arch)
    ids = [3, 17, 5, 9, 30, 2, 11, 40, 8]
    before_one, before_many = _logits(model, ids[:1]), _logits(model, ids)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    report = pack_linears(model)
    assert report.packed == linears > 0 and report.skipped is None and uses_packed_linears(model)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert torch.equal(_logits(model, ids[:1]), before_one)  # one row: the plain weight, the same kernel
    after = _logits(model, ids)
    assert torch.allclose(after, before_many, atol=1e-4, rtol=1e-4)
    assert torch.equal(after.argmax(-1), before_many.argmax(-1))


@needs_onednn
def test_training_and_other_arithmetics_keep_the_plain_weights():
    model = tiny_causal_lm("llama")
    half = tiny_causal_lm("llama").to(torch.bfloat16)
    assert pack_linears(half).packed == 0 and "bfloat16" in pack_linears(half).skipped
    pack_linears(model)
    layer = next(m for m in model.modules() if isinstance(m, PackedLinear))
    x = torch.randn(4, layer.in_features, requires_grad=True)
    layer(x).sum().backward()  # with gradients on, the plain weight is used, so they reach it
    assert x.grad is not None and layer.weight.grad is not None


@needs_onednn
def test_the_records_name_the_packed_kernels():
    model = tiny_causal_lm("llama")
    assert running_arithmetic(model).kernels is None
    pack_linears(model)
    arithmetic = running_arithmetic(model)
    assert arithmetic.kernels == PACKED_KERNELS and PACKED_KERNELS in arithmetic.sentence()
    old = {k: v for k, v in arithmetic.to_dict().items() if k != "kernels"}  # a record written before
    assert Arithmetic.from_dict(old).kernels is None


def test_the_decoding_entry_point_packs_an_eager_fp32_model_only(monkeypatch):
    from ooospec.decoding import compiled as compiled_module
    from ooospec.decoding.compiled import compile_target
    from ooospec.models.tiny import tiny_target

    eager = tiny_target(tiny_causal_lm("llama"))
    compile_target(eager)
    assert uses_packed_linears(eager.model) == torch.backends.mkldnn.is_available()
    monkeypatch.setattr(compiled_module, "compile_for_decoding",
                        lambda m, mode, name: compiled_module.CompileReport(mode, 1.0))
    compiled = tiny_target(tiny_causal_lm("llama"))
    compiled.compile_mode = "inductor"
    compile_target(compiled)
    assert not uses_packed_linears(compiled.model)  # the inductor prepacks its own weights


@needs_onednn
def test_unpacking_restores_plain_layers_on_the_same_weights():
    from ooospec.models.packed_linear import unpack_linears

    model = tiny_causal_lm("qwen2")
    ids = [3, 17, 5, 9, 30]
    before = _logits(model, ids)
    weights = {name: p.data_ptr() for name, p in model.named_parameters()}
    packed = pack_linears(model).packed
    assert unpack_linears(model) == packed and not uses_packed_linears(model)
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == weights  # no copy, same parameters
    assert torch.equal(_logits(model, ids), before)
