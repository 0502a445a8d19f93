"""fp32 deciding logits over a bf16 model (`ooospec.models.fp32_logits`): the argmax and the top-2
gap of the fp32 head, whatever the screen; nothing changes in fp32; a model it cannot serve is
refused at load naming the profile and model, and left as it was."""

from __future__ import annotations

import copy

import pytest
import torch

from ooospec.models.fp32_logits import WIDER, Fp32Logits, HeadUnsupported, own_head, use_fp32_logits, uses_fp32_logits
from ooospec.models.tiny import tiny_causal_lm


def _reference(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The fp32 head: fp32 norm over the bf16 residual stream, times the fp32-upcast head."""
    norm = model.model.norm
    h = hidden.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.parts.eps)
    return (norm.parts.weight.float() * h) @ model.lm_head.weight.float().T


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_are_the_fp32_heads_argmax_and_gap(arch):
    model = tiny_causal_lm(arch, vocab_size=64).to(torch.bfloat16)
    report = use_fp32_logits(model, "test profile: models.tiny")
    assert report.applied and uses_fp32_logits(model)
    seen = []
    model.model.norm.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    assert logits.dtype == torch.float32
    reference = _reference(model, seen[0][0])
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    top, ref = torch.topk(logits, 2).values, torch.topk(reference, 2).values
    assert torch.allclose(top[:, 0] - top[:, 1], ref[:, 0] - ref[:, 1], atol=1e-4)


def _flat_head(outputs: int) -> torch.nn.Linear:
    """Identical head rows but for a tiny nudge: every token inside the screen's bound."""
    head = torch.nn.Linear(16, outputs, bias=False)
    with torch.no_grad():
        row = torch.randn(16)
        head.weight.copy_(row + 1e-3 * torch.randn(outputs, 16))
    return head.to(torch.bfloat16)


@pytest.mark.parametrize("outputs, wider, full", [(100, 3, 0), (WIDER + 88, 3, 3)])
def test_a_screen_that_cannot_decide_refines_wider_then_falls_back_to_the_full_product(outputs, wider, full):
    """More tokens inside the screen's bound than the refined set: those positions are refined again
    with the wider set, which covers a head of 100 tokens; a larger one still needs the full fp32
    product. Either way the logits are the fp32 head's."""
    torch.manual_seed(0)
    head = _flat_head(outputs)
    fp32 = Fp32Logits(head, "test")
    hidden = torch.randn(3, 16)
    logits = fp32(hidden)
    assert (fp32.wider_refinements, fp32.full_products) == (wider, full)
    reference = hidden @ head.weight.float().T
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    assert torch.allclose(logits, reference, atol=1e-5)  # every token refined, or the full product


def test_random_heads_keep_the_fp32_argmax():
    torch.manual_seed(1)
    head = torch.nn.Linear(64, 500, bias=False).to(torch.bfloat16)
    fp32 = Fp32Logits(head, "test")
    hidden = 8 * torch.randn(200, 64)
    logits = fp32(hidden)
    assert fp32.full_products == 0  # the screen decided every position
    reference = hidden @ head.weight.float().T
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    top = torch.topk(reference, 2)
    chosen = logits.gather(-1, top.indices)
    assert torch.allclose(chosen, top.values, atol=1e-4)  # the two that decide are exact fp32


def test_an_fp32_model_is_left_alone():
    model = tiny_causal_lm("llama", vocab_size=64)
    before = copy.deepcopy(model.state_dict())
    report = use_fp32_logits(model, "test")
    assert not report.applied and not uses_fp32_logits(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_head_it_cannot_serve_is_refused_naming_the_model_and_left_as_it_was():
    model = tiny_causal_lm("llama", vocab_size=64).to(torch.bfloat16)
    model.lm_head = torch.nn.Linear(model.config.hidden_size, 64, bias=True).to(torch.bfloat16)
    norm = model.model.norm
    with pytest.raises(HeadUnsupported, match="configs/x.yaml: models.tiny: output head .* bias-free"):
        use_fp32_logits(model, "configs/x.yaml: models.tiny")
    assert model.model.norm is norm and not uses_fp32_logits(model)
    model = tiny_causal_lm("llama", vocab_size=64).to(torch.bfloat16)
    model.model.norm = torch.nn.LayerNorm(model.config.hidden_size).to(torch.bfloat16)
    with pytest.raises(HeadUnsupported, match="models.tiny: final norm LayerNorm is not an RMS norm"):
        use_fp32_logits(model, "configs/x.yaml: models.tiny")


def test_a_profile_may_ask_only_fp32_logits(tmp_path):
    from ooospec.models.registry import ProfileError, load_profile, profile_path

    text = profile_path("cpu").read_text().replace("    logits: float32", "    logits: float16", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ProfileError, match=r"bad.yaml: models.smollm2-135m-instruct.logits"):
        load_profile(bad)
    assert load_profile("cpu").model("qwen2.5-coder-0.5b").logits == "float32"


def test_records_and_the_near_tie_rule_follow_the_head():
    from ooospec.models.arithmetic import (FP32_LOGITS_GAPS, NEAR_TIE_GAPS, model_near_tie_gap,
                                           running_arithmetic)

    model = tiny_causal_lm("llama", vocab_size=64).to(torch.bfloat16)
    assert model_near_tie_gap(model) == NEAR_TIE_GAPS["bfloat16"]
    use_fp32_logits(model, "test")
    assert model_near_tie_gap(model) == FP32_LOGITS_GAPS["bfloat16"] < NEAR_TIE_GAPS["bfloat16"]
    arithmetic = running_arithmetic(model)
    assert arithmetic.logits == "float32" and "logits in fp32" in arithmetic.sentence()
    assert running_arithmetic(tiny_causal_lm("llama", vocab_size=64)).logits is None


def test_the_control_runs_the_models_own_head_and_gives_it_back():
    model = tiny_causal_lm("qwen2", vocab_size=64).to(torch.bfloat16)
    use_fp32_logits(model, "test")
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        with own_head(model):
            assert not uses_fp32_logits(model) and model(input_ids=ids).logits.dtype == torch.bfloat16
        assert uses_fp32_logits(model) and model(input_ids=ids).logits.dtype == torch.float32
