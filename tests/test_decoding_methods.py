"""Methods end to end on a tiny random model with a real byte-level tokenizer: every method's
output equals AR's, with good and with uncompilable schemas (the FSM then falls back to nothing,
logs why, and the output does not change), and sources persist across the requests of a run."""

from __future__ import annotations

import pytest
import torch

from ooospec.data.request import Request
from ooospec.decoding.base import DecodeContext, EventTrace
from ooospec.decoding.loop import decode
from ooospec.bench.methods import MethodSpec, default_budget, method_sources
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.models.formats import get_surface
from ooospec.models.tiny import tiny_model_and_tokenizer, tiny_target

torch.set_num_threads(1)
GOOD = [{"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
BAD = [{"name": "get_weather", "description": "Weather.", "parameters": {"anyOf": [{"type": "object"}]}}]


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer(seed=3)


def ctx_for(tokenizer, tools, rid, prompt):
    request = Request(id=rid, benchmark="tiny", split="test", messages=[{"role": "user", "content": prompt}],
                      tools=tools, gold=None)
    ids = tokenizer.encode(f"Tools: {tools[0]['name']}\nuser: {prompt}\nassistant: ", add_special_tokens=False)
    return DecodeContext(request, tokenizer, get_surface("qwen_fenced_json"), ids, [tokenizer.eos_token_id],
                         EventTrace())


@pytest.mark.parametrize("method", ["pld", "toolspec"])
def test_methods_reproduce_ar_across_a_run(tiny, method):
    model, tokenizer = tiny
    sources = method_sources(MethodSpec.parse(method))  # one run: the same sources for every request
    prompts = ["weather in Paris?", "weather in Oslo?", "and in Paris again?", "Paris or Oslo?"]
    for i, prompt in enumerate(prompts):
        tools = BAD if i == 2 else GOOD
        ar = decode(tiny_target(model, tokenizer), [], ctx_for(tokenizer, tools, f"r{i}", prompt), 40)
        ctx = ctx_for(tokenizer, tools, f"r{i}", prompt)
        result = decode(tiny_target(model, tokenizer), sources, ctx, 40, TreeBudget(12, 12))
        assert result.output_ids == ar.output_ids
        fallbacks = ctx.trace.of_kind("fsm_fallback")
        if method == "toolspec":
            assert len(fallbacks) == (1 if tools is BAD else 0)
            if fallbacks:
                assert "anyOf" in fallbacks[0]["reason"]
    if method == "toolspec":
        assert len(sources[0].retrieval.memory) == len(prompts)


def test_method_names_reject_unknown_methods_and_options():
    assert method_sources(MethodSpec.parse("ar")) == []
    with pytest.raises(ValueError, match="unknown base"):
        MethodSpec.parse("eagle")
    with pytest.raises(ValueError, match="applies only to"):
        MethodSpec.parse("ar:budget=3")
    with pytest.raises(ValueError, match="pld_mode"):
        ToolSpec(pld_mode="sometimes")
    assert default_budget("no-such-target") == TreeBudget()
