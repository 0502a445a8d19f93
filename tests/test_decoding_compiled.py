"""The compile option (`ooospec.decoding.compiled`): a compiled tiny model decodes exactly as its
eager self with every method's trees, compilation happens at the run's entry point (not in a
decode), a target loaded by `ooospec.models` stays eager until then, and a compiler failure falls
back to the eager model with one line saying why."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from ooospec.decoding.base import Draft
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier
from ooospec.decoding.compiled import compile_for_decoding, compile_target, compiled_graphs
from ooospec.models.tiny import tiny_causal_lm

torch.set_num_threads(1)
PROMPT = [3, 17, 42, 5, 9, 33, 8, 21, 60, 2, 11, 47]


def _greedy_with_trees(model, steps: int, seed: int, dense_cache: bool = False) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding through random trees of varying size: the committed ids and every forward's logits."""
    rng = random.Random(seed)
    verifier = TreeVerifier(model, [], dense_cache=dense_cache)
    state, _ = verifier.prefill(PROMPT)
    out, logits = [state.root], []
    while len(out) < steps:
        nodes = rng.choice([0, 1, 3, 6, 10])
        drafts = [Draft([rng.randrange(64) for _ in range(nodes)], "pld")] if nodes else []
        tree = build_tree(drafts, TreeBudget(max(nodes, 1), max(nodes, 1)))
        logits.append(verifier.forward_tree(state.clone(), tree).float())
        out += verifier.step(state, tree, steps - len(out)).new_tokens
    return out, logits


def test_compiled_models_decode_as_eager_and_compile_only_at_load():
    # two models of one architecture in one process: with freezing the weights are constants of
    # the compiled graph, so the second must get graphs of its own, never the first one's weights
    for seed in (3, 4):
        eager = tiny_causal_lm("qwen2", seed=seed)
        compiled = copy.deepcopy(eager)
        report = compile_for_decoding(compiled, "inductor", "tiny")
        assert report.mode == "inductor" and report.fallback is None and report.graphs >= 1
        expected, eager_logits = _greedy_with_trees(eager, 24, seed=5)
        got, compiled_logits = _greedy_with_trees(compiled, 24, seed=5, dense_cache=True)
        assert got == expected
        for a, b in zip(eager_logits, compiled_logits):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # fp32: only the summation order differs
        assert compiled_graphs() == report.graphs  # nothing compiled inside the decode: the warm-up covered it


def test_compile_failure_falls_back_to_eager_with_one_line(capsys):
    model = tiny_causal_lm("llama", seed=1)
    reference, _ = _greedy_with_trees(model, 10, seed=2)

    def broken_compile(*args, **kwargs):
        raise RuntimeError("no C++ compiler found\nsecond line")

    model.compile = broken_compile
    report = compile_for_decoding(model, "inductor", "tiny-llama")
    assert report.mode is None and report.fallback == "RuntimeError: no C++ compiler found"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tiny-llama: torch.compile (inductor) unavailable, running eager" in err
    assert _greedy_with_trees(model, 10, seed=2)[0] == reference


def test_unknown_compile_mode_is_refused():
    with pytest.raises(ValueError, match="unknown compile mode 'tensorrt'"):
        compile_for_decoding(tiny_causal_lm("llama"), "tensorrt", "tiny")
    assert compile_for_decoding(tiny_causal_lm("llama"), None).mode is None


def test_a_target_is_compiled_at_the_entry_point_and_its_verifier_is_told(monkeypatch):
    from ooospec.decoding import compiled as compiled_module
    from ooospec.models.tiny import tiny_model_and_tokenizer, tiny_target

    model, tokenizer = tiny_model_and_tokenizer()
    target = tiny_target(model, tokenizer)
    assert target.compiled.mode is None and not TreeVerifier.for_target(target).dense_cache  # eager as loaded
    asked = []
    monkeypatch.setattr(compiled_module, "compile_for_decoding",
                        lambda m, mode, name: asked.append((m, mode, name)) or compiled_module.CompileReport(mode, 1.0))
    target.compile_mode = "inductor"
    assert compile_target(target) is target and asked == [(model, "inductor", target.name)]
    assert TreeVerifier.for_target(target).dense_cache  # told, not guessed from torch's private attributes
