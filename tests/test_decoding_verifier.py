"""Tree verifier on tiny random Llama / Qwen2 / Qwen3 models: tree logits and the committed KV cache
equal a from-scratch recomputation, speculative decoding equals AR (and `generate`), EOS inside an
accepted path and max_new_tokens cut correctly, and trees respect the budget."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache

from ooospec.data.request import Request
from ooospec.decoding.base import DecodeContext, Draft, DraftSource, EventTrace
from ooospec.decoding.loop import decode
from ooospec.models.tiny import tiny_causal_lm, tiny_target
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier

torch.set_num_threads(1)
ARCHS = ["llama", "qwen2", "qwen3"]
PROMPT = [3, 17, 42, 5, 9, 33, 8, 21, 60, 2, 11, 47]


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    return tiny_causal_lm(request.param, seed=1)


def greedy_reference(model, prompt, n):
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


def full_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_tree_logits_equal_recomputation_from_scratch(model):
    rng = random.Random(0)
    verifier = TreeVerifier(model, [])
    state, _ = verifier.prefill(PROMPT)
    drafts = [Draft([rng.randrange(64) for _ in range(rng.randrange(1, 5))], "pld") for _ in range(5)]
    tree = build_tree(drafts, TreeBudget(max_nodes=12, max_depth=4))
    prefix = state.cache_len
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([[state.root] + tree.tokens]),
            attention_mask=tree.attention_mask(prefix),
            position_ids=tree.position_ids(prefix),
            cache=state.cache,
            use_cache=True,
        ).logits[0]
    for node in range(tree.size):
        chain, walk = [], node
        while walk >= 0:
            chain.append(tree.tokens[walk])
            walk = tree.parents[walk]
        expected = full_logits(model, PROMPT + [state.root] + chain[::-1])[-1]
        torch.testing.assert_close(logits[node + 1], expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[0], full_logits(model, PROMPT + [state.root])[-1], rtol=1e-4, atol=1e-4)


def test_committed_kv_equals_recomputation(model):
    reference = greedy_reference(model, PROMPT, 12)
    verifier = TreeVerifier(model, [])
    state, _ = verifier.prefill(PROMPT)
    # a tree whose accepted path is not stored contiguously: a wrong branch comes first
    wrong = [(reference[1] + 1) % 64, 5, 6]
    tree = build_tree([Draft(wrong, "pld"), Draft(reference[1:6], "fsm")], TreeBudget())
    step = verifier.step(state, tree, 100)
    assert step.accepted_nodes == [3, 4, 5, 6, 7]
    assert step.new_tokens == reference[1:7]
    assert step.credits == ["fsm"] * 5 + ["bonus"]
    committed = PROMPT + reference[:1] + step.new_tokens
    assert state.root == committed[-1] and state.cache_len == len(committed) - 1
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([committed[:-1]]), cache=cache, use_cache=True)
    assert state.cache.get_seq_length() == len(committed) - 1
    for ours, theirs in zip(state.cache.layers, cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.values, theirs.values, rtol=1e-4, atol=1e-5)


class NoisyOracle(DraftSource):
    """Drafts that mix the true continuation with random tokens (a test-only source)."""

    name = "pld"

    def __init__(self, reference, seed):
        self.reference = reference
        self.rng = random.Random(seed)

    def propose(self, state):
        k = len(state.output_ids)
        good = self.reference[k : k + self.rng.randrange(0, 8)]
        drafts = []
        for _ in range(self.rng.randrange(0, 4)):
            cut = self.rng.randrange(0, len(good) + 1)
            noise = [self.rng.randrange(64) for _ in range(self.rng.randrange(0, 4))]
            drafts.append(Draft(list(good[:cut]) + noise, self.rng.choice(["pld", "fsm", "retrieval"])))
        self.rng.shuffle(drafts)
        return drafts


def context(prompt, eos=()):
    request = Request(id="tiny", benchmark="tiny", split="test", messages=[], tools=[], gold=None)
    return DecodeContext(request, _NullTokenizer(), None, list(prompt), list(eos), EventTrace())


class _NullTokenizer:
    def decode(self, ids, **kwargs):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("seed", range(4))
def test_speculative_decoding_equals_ar_and_generate(model, seed):
    n = 40
    reference = greedy_reference(model, PROMPT, n)
    ar = decode(tiny_target(model), [], context(PROMPT), n)
    assert ar.output_ids == reference
    assert ar.forwards == n - 1 and ar.mat == 1.0
    budget = TreeBudget(max_nodes=1 + 3 * seed, max_depth=2 + seed)
    spec = decode(tiny_target(model), [NoisyOracle(reference, seed)], context(PROMPT), n, budget)
    assert spec.output_ids == reference
    assert all(r.tree_size <= budget.max_nodes for r in spec.rounds)
    assert all(r.accepted <= budget.max_depth for r in spec.rounds)
    assert sum(spec.source_counts.values()) == n
    assert spec.finish == "length"


def test_eos_inside_an_accepted_path_ends_the_output(model):
    reference = greedy_reference(model, PROMPT, 30)
    eos_at = next(i for i in range(8, 30) if reference[i] not in reference[:i])
    eos = reference[eos_at]
    ar = decode(tiny_target(model), [], context(PROMPT, [eos]), 30)
    assert ar.output_ids == reference[: eos_at + 1] and ar.finish == "eos"

    class Oracle(DraftSource):  # always offers the whole rest of the reference, past the EOS
        def propose(self, state):
            return [Draft(reference[len(state.output_ids) :], "retrieval")]

    spec = decode(tiny_target(model), [Oracle()], context(PROMPT, [eos]), 30, TreeBudget(64, 64))
    assert spec.output_ids == ar.output_ids and spec.finish == "eos"
    assert spec.forwards == 1


def test_max_new_tokens_cuts_an_accepted_path(model):
    reference = greedy_reference(model, PROMPT, 20)

    class Oracle(DraftSource):
        def propose(self, state):
            return [Draft(reference[len(state.output_ids) :], "fsm")]

    for limit in (1, 2, 7):
        spec = decode(tiny_target(model), [Oracle()], context(PROMPT), limit, TreeBudget(64, 64))
        assert spec.output_ids == reference[:limit] and spec.finish == "length"
    with pytest.raises(ValueError):
        decode(tiny_target(model), [], context(PROMPT), 0)


def test_trace_records_prefill_and_rounds(model):
    result = decode(tiny_target(model), [], context(PROMPT), 5)
    kinds = [e["kind"] for e in result.trace.events]
    assert kinds == ["prefill_start", "prefill_end", "round", "round", "round", "round", "finish"]
    times = [e["t"] for e in result.trace.events]
    assert times == sorted(times)
    record = result.to_record()
    assert record["forwards"] == 4 and record["tokens"] == 5


class _CountingPlacement:
    """A placement that asks for a chunked prefill and counts its boundaries."""

    settled = False  # never settles: a boundary before every chunk

    def __init__(self, chunk):
        self.prefill_chunk, self.boundaries = chunk, 0

    def begin(self):
        pass

    def boundary(self):
        self.boundaries += 1

    def end(self):
        pass


@pytest.mark.parametrize("chunk", [1, 5, 12, 64])
def test_a_chunked_prefill_leaves_the_cache_and_first_token_of_one_forward(model, chunk):
    """A prefill in chunks of ``chunk`` tokens on one cache (a placement may switch between them)
    writes the same cache, up to fp32 rounding, and the same first token as one forward; decoding
    from it writes AR's output, and its placement sees one boundary before the prefill, one per chunk
    after the first and one per round."""
    verifier = TreeVerifier(model, [])
    whole, _ = verifier.prefill(PROMPT)
    calls = []
    chunked, _ = verifier.prefill(PROMPT, chunk, lambda: calls.append(1))
    assert chunked.root == whole.root and chunked.cache_len == whole.cache_len == len(PROMPT)
    assert len(calls) == -(-len(PROMPT) // chunk) - 1
    from ooospec.decoding.verifier import _cache_layers

    for a, b in zip(_cache_layers(whole.cache), _cache_layers(chunked.cache)):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
    placement = _CountingPlacement(chunk)
    out = decode(tiny_target(model), [], context(PROMPT), 10, placement=placement)
    assert out.output_ids == greedy_reference(model, PROMPT, 10)
    assert placement.boundaries == 1 + len(calls) + len(out.rounds)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        verifier.prefill(PROMPT, 0)


def test_a_chunked_prefill_runs_its_rest_in_one_forward_once_the_placement_settles(model):
    """Once ``between`` says the placement will not change again, the rest of the prompt runs in
    one forward (more chunks would only re-read the weights); the cache and first token stay
    those of one forward."""
    verifier = TreeVerifier(model, [])
    whole, _ = verifier.prefill(PROMPT)
    sizes, forward = [], verifier._forward
    verifier._forward = lambda ids, **kwargs: sizes.append(len(ids)) or forward(ids, **kwargs)
    calls = []
    chunked, _ = verifier.prefill(PROMPT, 3, lambda: calls.append(1) or len(calls) >= 2)
    assert sizes == [3, 3, len(PROMPT) - 6] and len(calls) == 2
    assert chunked.root == whole.root and chunked.cache_len == len(PROMPT)
    from ooospec.decoding.verifier import _cache_layers

    for a, b in zip(_cache_layers(whole.cache), _cache_layers(chunked.cache)):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)
