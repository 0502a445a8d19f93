"""The logit-ties study (`ooospec.studies.logit_ties`) on a tiny bf16 model: it compares AR's one-row
steps with forwards of several rows position by position, and reading the same rows one at a time
both ways shows no difference at all (the comparison itself adds none)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import torch

from ooospec.models.tiny import tiny_causal_lm
from ooospec.studies.logit_ties import Heads, NormInput, request_positions, summarize


def _study(chunk: int):
    model = tiny_causal_lm("qwen2", vocab_size=64, layers=2)
    target = SimpleNamespace(name="tiny", model=model, eos_token_ids=[], prompt_ids=lambda r: list(range(3, 40)))
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    return request_positions(target, bf16, Heads(bf16), NormInput(bf16), SimpleNamespace(id="r1"), chunk, max_tokens=20)


def test_one_row_both_ways_is_the_same_computation():
    positions = _study(chunk=1)
    assert len(positions) == 20
    assert all(p.hidden == 0.0 and not p.bf16.flip and not p.fp32.flip for p in positions)
    assert all(p.bf16.gap_shift == 0.0 and p.fp32.gap_shift == 0.0 for p in positions)


def test_forwards_of_several_rows_are_compared_position_by_position():
    positions = _study(chunk=9)
    assert [p.position for p in positions] == list(range(20))
    summary = {s.head: s for s in summarize(positions)}
    assert set(summary) == {"bf16", "fp32"} and all(s.positions == 20 for s in summary.values())
    # AR's fp32 top-2 gap is never exactly 0 where its bf16 one is (the fp32 head does not round to bf16 steps)
    assert summary["fp32"].exact_ties <= summary["bf16"].exact_ties


def test_a_target_loaded_with_fp32_logits_is_studied_with_both_heads(monkeypatch):
    """On a bf16 CPU the profile loads each target with fp32 logits already in place; the study
    still compares the model's own bf16 head with the fp32 one (it refused such a target before)."""
    from ooospec.data import api_disjoint
    from ooospec.models import target as target_module
    from ooospec.models.fp32_logits import use_fp32_logits, uses_fp32_logits
    from ooospec.studies import logit_ties

    model = tiny_causal_lm("qwen2", vocab_size=64, layers=2).to(torch.bfloat16)
    use_fp32_logits(model, "test")
    loaded = SimpleNamespace(name="tiny", model=model, eos_token_ids=[], prompt_ids=lambda r: list(range(3, 40)))
    monkeypatch.setattr(target_module, "load_target", lambda name, profile: loaded)
    monkeypatch.setattr(api_disjoint, "load_api_disjoint",
                        lambda: SimpleNamespace(dev=[SimpleNamespace(id="r1"), SimpleNamespace(id="r2")]))
    positions = logit_ties.run(("tiny",), requests=2, chunk=9)
    assert {p.request_id for p in positions} == {"r1", "r2"}
    assert uses_fp32_logits(model)  # the loaded target is left as the profile made it


def test_row_invariant_forwards_leave_nothing_to_flip():
    """As served on a bf16 CPU (`ooospec.models.row_invariant`): the residual stream of a 9-row forward is
    the step's, bit for bit, so neither head flips; torch's kernels are read in the same run, as the control."""
    import pytest

    from ooospec.models.fp32_logits import use_fp32_logits
    from ooospec.models.loading import bf16_supported_on_cpu
    from ooospec.models.row_invariant import plain_rows, use_row_invariance

    if not bf16_supported_on_cpu():
        pytest.skip("row-invariant forwards need native bf16 kernels")
    model = tiny_causal_lm("qwen2", vocab_size=64, layers=2, hidden=256)
    target = SimpleNamespace(name="tiny", model=model, eos_token_ids=[], prompt_ids=lambda r: list(range(3, 40)))
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    use_fp32_logits(bf16, "test")  # as the profile loads it; the study reads its own heads (`run`)
    use_row_invariance(bf16)
    bf16.model.norm, bf16.lm_head = bf16.model.norm.inner, bf16.lm_head.inner
    hook = NormInput(bf16)
    served = request_positions(target, bf16, Heads(bf16, invariant=True), hook, SimpleNamespace(id="r1"), 9,
                               max_tokens=20, arm="invariant")
    assert all(p.hidden == 0.0 and not p.bf16.flip and not p.fp32.flip and p.fp32.gap_shift == 0.0 for p in served)
    with plain_rows(bf16):
        plain = request_positions(target, bf16, Heads(bf16), hook, SimpleNamespace(id="r1"), 9, max_tokens=20)
    assert len(plain) == len(served) and {p.rows for p in plain} == {"plain"}
