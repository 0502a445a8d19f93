"""The tree budget follows the machine: the rule, the committed acceptance it reads, and the run's
choice on a tiny model (costs measured, never asserted on: only which inputs chose what)."""

from __future__ import annotations

import json

import pytest
import torch

from ooospec.bench.tree_budget import (CANDIDATES, acceptance_dir, choose_budget, committed_acceptance,
                                       machine_budget)
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.tiny import tiny_causal_lm

torch.set_num_threads(1)


def test_the_rule_picks_the_least_cost_per_committed_token():
    mat = {4: 2.0, 8: 2.6, 16: 3.0, 32: 3.2}
    # a CPU where a wide forward is nearly free (bf16 kernels): the large tree wins
    assert choose_budget(mat, {4: 1.05, 8: 1.25, 16: 1.3, 32: 1.2}) == 32
    # a CPU where rows cost (fp32 on AVX2): a small tree wins
    assert choose_budget(mat, {4: 1.6, 8: 2.4, 16: 3.9, 32: 6.0}) == 4
    # a tie keeps the smaller tree; budgets without both inputs are not candidates
    assert choose_budget({4: 2.0, 8: 4.0}, {4: 1.0, 8: 2.0, 16: 0.1}) == 4
    with pytest.raises(ValueError, match="no budget"):
        choose_budget({4: 2.0}, {8: 1.0})


def test_budgets_that_cost_nearly_the_same_do_not_swap_with_noise():
    """Two budgets 1% apart per token, their costs measured again with 2% of noise either way: the
    least-cost rule alone picks 8 or 4 by the noise; the rule keeps 4. A clear saving still wins."""
    mat = {4: 2.10, 8: 2.62}
    picks = set()
    for noise4, noise8 in [(1.0, 1.0), (1.02, 0.98), (0.98, 1.02)]:
        cost = {4: 1.05 * noise4, 8: 1.30 * noise8}
        assert choose_budget(mat, cost) == 4
        picks.add(choose_budget(mat, cost, tolerance=0.0))
    assert picks == {4, 8}  # without the tolerance, the noise decides
    assert choose_budget(mat, {4: 1.05, 8: 1.15}) == 8  # 0.439 against 0.5 a token: 12% cheaper


def test_the_committed_acceptance_covers_both_targets_on_dev():
    path = acceptance_dir() / "acceptance.json"
    data = json.loads(path.read_text())
    assert data["split"] == "dev"  # never an evaluation file
    for target in ("qwen2.5-coder-0.5b", "smollm2-135m-tool"):
        mat, provenance = committed_acceptance(target)
        assert sorted(mat) == sorted(CANDIDATES) and all(v >= 1.0 for v in mat.values()), target
        assert provenance["arithmetic"] and provenance["code_commit"]


def test_a_run_measures_the_costs_and_records_its_inputs(tmp_path):
    model = tiny_causal_lm("llama", seed=1)
    verifier = TreeVerifier(model, eos_token_ids=[])
    prompt = [3, 17, 42, 5, 9, 33, 8, 21]
    acceptance = tmp_path / "acceptance.json"
    acceptance.write_text(json.dumps({"split": "dev", "arithmetic": "fp32", "targets": {
        "tiny": {"4": {"mat": 2.0}, "8": {"mat": 2.5}}}}))
    choice = machine_budget(verifier, prompt, "tiny", repeats=1, acceptance_path=acceptance)
    assert choice.chosen_by == "machine" and [r["nodes"] for r in choice.rows] == [4, 8]
    costs = {r["nodes"]: r["cost"] for r in choice.rows}
    assert choice.budget["max_nodes"] == choose_budget({4: 2.0, 8: 2.5}, costs) == choice.budget["max_depth"]
    assert choice.acceptance["arithmetic"] == "fp32" and choice.step_s > 0
    # a target the committed file does not name keeps the fixed default, and says why
    other = machine_budget(verifier, prompt, "no-such-target", acceptance_path=acceptance)
    assert other.chosen_by.startswith("fixed default") and not other.rows
