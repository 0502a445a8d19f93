"""The lossless-bf16 cost study (`ooospec.studies.logits_cost`) on a tiny bf16 model: every arm (as
served, fp32 logits on torch's kernels, bf16 head on torch's kernels) runs on the same cache, forward
for forward, every forward rolled back; the model is as loaded again afterwards; a target without fp32
logits is refused with one line naming its arithmetic. No assertion on time: only that each pair was
measured."""

from types import SimpleNamespace

import pytest
import torch

from ooospec.models.fp32_logits import use_fp32_logits, uses_fp32_logits
from ooospec.models.loading import bf16_supported_on_cpu
from ooospec.models.row_invariant import use_row_invariance, uses_row_invariance
from ooospec.models.tiny import tiny_causal_lm
from ooospec.studies import logits_cost

needs_bf16 = pytest.mark.skipif(not bf16_supported_on_cpu(), reason="row-invariant forwards need native bf16 kernels")


def tiny_target(fp32_logits: bool):
    model = tiny_causal_lm("qwen2", vocab_size=64, layers=2).to(torch.bfloat16)
    if fp32_logits:
        use_fp32_logits(model, "test")
        use_row_invariance(model)
    return SimpleNamespace(name="tiny", model=model, eos_token_ids=[], compiled=SimpleNamespace(mode=None),
                           prompt_ids=lambda request: list(range(3, 30)))


@needs_bf16
def test_every_arm_is_timed_in_pairs_over_one_cache():
    target = tiny_target(fp32_logits=True)
    times = logits_cost.paired_times(target, list(range(3, 30)), (0, 4), pairs=3)
    assert set(times) == {0, 4}
    assert all(len(times[n][arm]) == 3 and min(times[n][arm]) > 0 for n in times for arm in logits_cost.ARMS)
    # the loaded head and kernels are back after each control's forward
    assert uses_fp32_logits(target.model) and uses_row_invariance(target.model)


@needs_bf16
def test_each_arm_runs_what_it_names():
    model = tiny_target(fp32_logits=True).model
    seen = {}
    for arm in logits_cost.ARMS:
        with logits_cost.arm(model, arm):
            seen[arm] = (uses_fp32_logits(model), uses_row_invariance(model))
    assert seen == {"served": (True, True), "fp32 logits": (True, False), "bf16 head": (False, False)}


@needs_bf16
def test_the_study_gives_a_paired_cost_per_point(monkeypatch):
    target = tiny_target(fp32_logits=True)
    monkeypatch.setattr(logits_cost, "cached_target", _cache(target))
    monkeypatch.setattr(logits_cost, "load_split", lambda split: [SimpleNamespace(id="r1")])
    rows, arithmetic = logits_cost.measure(("tiny",), threads=(1,), pairs=5)
    assert [r.rows for r in rows] == [1 + n for n in logits_cost.NODES]
    assert all(r.low <= r.cost <= r.high and r.pairs == 5 and r.fp32_cost > 0 for r in rows)
    assert "logits in fp32" in arithmetic


def test_a_target_without_fp32_logits_is_refused(monkeypatch):
    monkeypatch.setattr(logits_cost, "cached_target", _cache(tiny_target(fp32_logits=False)))
    monkeypatch.setattr(logits_cost, "load_split", lambda split: [SimpleNamespace(id="r1")])
    with pytest.raises(ValueError, match="tiny runs in bf16 .*no fp32 logits"):
        logits_cost.measure(("tiny",), threads=(1,), pairs=2)


def _cache(target):
    def cached(name, profile):
        return target
    cached.cache_clear = lambda: None
    return cached
