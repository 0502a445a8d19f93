"""Token trees: merging, budget and depth limits, masks, positions, paths and the greedy walk."""

from __future__ import annotations

import random

import pytest
import torch

from ooospec.decoding.base import Draft
from ooospec.decoding.tree import TreeBudget, build_tree


def test_shared_prefixes_merge_and_keep_source_tags():
    tree = build_tree(
        [Draft([1, 2, 3], "fsm"), Draft([1, 2, 4], "retrieval"), Draft([5], "pld"), Draft([1, 2], "pld")],
        TreeBudget(max_nodes=10, max_depth=10),
    )
    assert tree.tokens == [1, 2, 3, 4, 5]
    assert tree.parents == [-1, 0, 1, 1, -1]
    assert tree.depths == [1, 2, 3, 3, 1]
    assert tree.sources[0] == ["fsm", "retrieval", "pld"]
    assert tree.sources[3] == ["retrieval"]
    assert sorted(tree.retrieve_paths()) == [[0, 1, 2], [0, 1, 3], [4]]


def test_budget_drops_the_later_drafts_first_and_depth_is_capped():
    drafts = [Draft([1, 2, 3, 4, 5, 6], "fsm"), Draft([7, 8, 9], "retrieval"), Draft([1, 2, 10], "pld")]
    tree = build_tree(drafts, TreeBudget(max_nodes=6, max_depth=4))
    assert tree.tokens == [1, 2, 3, 4, 7, 8]  # fsm cut at depth 4, retrieval cut by the node budget
    assert tree.truncated_drafts == 2
    assert build_tree(drafts, TreeBudget(max_nodes=0, max_depth=4)).size == 0
    with pytest.raises(ValueError):
        TreeBudget(max_nodes=-1)


def test_mask_and_positions_follow_the_ancestors():
    tree = build_tree([Draft([1, 2], "fsm"), Draft([3], "pld")], TreeBudget())
    mask = tree.attention_mask(prefix_len=4)
    assert mask.shape == (1, 1, 4, 8)
    allowed = (mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 1, 1, 0, 0, 0],  # root
        [1, 1, 1, 1, 1, 1, 0, 0],  # 1
        [1, 1, 1, 1, 1, 1, 1, 0],  # 1 -> 2
        [1, 1, 1, 1, 1, 0, 0, 1],  # 3
    ]
    assert tree.position_ids(4).tolist() == [[4, 5, 6, 5]]
    assert mask[0, 0, 0, 5].item() == torch.finfo(torch.float32).min


def test_walk_accepts_the_longest_matching_path():
    tree = build_tree([Draft([1, 2, 3], "fsm"), Draft([1, 4], "retrieval")], TreeBudget())
    # rows: 0 root, 1 ->1, 2 ->2, 3 ->3, 4 ->4
    assert tree.walk([1, 4, 0, 0, 9]) == [0, 3]
    assert tree.walk([1, 2, 3, 7, 0]) == [0, 1, 2]
    assert tree.walk([9, 0, 0, 0, 0]) == []


@pytest.mark.parametrize("seed", range(20))
def test_random_tries_are_prefix_closed_within_budget(seed):
    rng = random.Random(seed)
    drafts = [
        Draft([rng.randrange(4) for _ in range(rng.randrange(0, 7))], rng.choice(["fsm", "pld", "retrieval"]))
        for _ in range(rng.randrange(1, 8))
    ]
    budget = TreeBudget(max_nodes=rng.randrange(0, 12), max_depth=rng.randrange(1, 6))
    tree = build_tree(drafts, budget)
    assert tree.size <= budget.max_nodes
    assert all(d <= budget.max_depth for d in tree.depths)
    anc = tree.ancestor_matrix()
    sequences = {tuple(d.tokens[: budget.max_depth]) for d in drafts}
    for node in range(tree.size):
        parent = tree.parents[node]
        assert parent < node  # topological order
        assert tree.depths[node] == (1 if parent < 0 else tree.depths[parent] + 1)
        # the node's row sees exactly the root and its own ancestor chain
        chain, walk = {0}, node
        while walk >= 0:
            chain.add(walk + 1)
            walk = tree.parents[walk]
        assert set(torch.nonzero(anc[node + 1]).flatten().tolist()) == chain
    for path in tree.retrieve_paths():
        tokens = tuple(tree.tokens[i] for i in path)
        assert any(seq[: len(tokens)] == tokens for seq in sequences)
    if budget.max_nodes >= sum(len(s) for s in sequences):  # nothing dropped: every draft is a path
        for seq in sequences:
            row = 0
            for token in seq:
                row = tree.children[row][token] + 1


def test_hint_room_is_reserved_and_other_drafts_keep_their_own_budget():
    budget = TreeBudget(max_nodes=4, max_depth=4, hint_nodes=6, hint_depth=6)
    hint = Draft([1, 2, 3, 4, 5, 6, 7, 8], "hint")
    others = [Draft([1, 2, 9, 9, 9], "fsm"), Draft([5, 6, 7], "retrieval"), Draft([8, 8], "pld")]
    tree = build_tree([hint] + others, budget)
    by_source = [s[0] for s in tree.sources]
    assert by_source.count("hint") == 6  # the hint chain, cut to its own depth
    assert by_source.count("fsm") + by_source.count("retrieval") + by_source.count("pld") == 4
    assert max(d for d, s in zip(tree.depths, by_source) if s != "hint") <= 4
    assert tree.sources[0] == ["hint", "fsm"]  # a shared node costs the later draft nothing
    # without a hint the other drafts get exactly the tree they get under the plain budget
    plain = build_tree(others, TreeBudget(max_nodes=4, max_depth=4))
    alone = build_tree(others, budget)
    assert (alone.tokens, alone.parents) == (plain.tokens, plain.parents)
    # no reserved room: a hint draft competes for the main budget like any other source
    shared = build_tree([hint] + others, TreeBudget(max_nodes=4, max_depth=4))
    assert shared.size == 4 and all(s[0] == "hint" for s in shared.sources)


def test_a_node_several_sources_proposed_is_credited_as_shared():
    from ooospec.decoding.verifier import node_credit

    tree = build_tree([Draft([5, 6], "hint"), Draft([5, 7], "fsm"), Draft([9], "fsm")], TreeBudget(8, 8))
    credits = [node_credit(sources) for sources in tree.sources]
    assert credits == ["shared", "hint", "fsm", "fsm"]  # 5 (hint + fsm), 6, 7, 9


def test_a_wrong_hint_cannot_take_toolspecs_best_draft_share():
    """With ``hint_share`` a hint keeps the prefix it shares with the best other draft for free and
    at most its share of the budget past the first disagreement; without it, a wrong hint drawn
    first fills the whole tree (the eviction this option exists for)."""
    wrong = Draft(list(range(100, 132)), "hint")  # wrong from its first token, 32 tokens long
    best = Draft(list(range(1, 17)), "fsm")
    evicted = build_tree([wrong, best], TreeBudget(max_nodes=16, max_depth=16))
    assert all(s == ["hint"] for s in evicted.sources)  # today's merge: no ToolSpec node at all
    shared = build_tree([wrong, best], TreeBudget(max_nodes=16, max_depth=16, hint_share=0.5))
    tags = [s[0] for s in shared.sources]
    assert tags.count("hint") == 8 and tags.count("fsm") == 8  # ToolSpec's best draft keeps half
    # a hint that agrees with the best draft for 5 tokens takes those 5 free, then its share
    agreeing = Draft(list(range(1, 6)) + list(range(200, 230)), "hint")
    tree = build_tree([agreeing, best], TreeBudget(max_nodes=16, max_depth=16, hint_share=0.25))
    tags = [s[0] for s in tree.sources]
    assert tree.sources[:5] == [["hint", "fsm"]] * 5 and tags.count("hint") == 5 + 4
    assert tags.count("fsm") == 16 - 9  # the rest of the budget goes on along ToolSpec's draft
    # no other draft: nothing to protect, the hint is unchanged
    assert build_tree([wrong], TreeBudget(max_nodes=16, max_depth=16, hint_share=0.25)).size == 16
    with pytest.raises(ValueError):
        TreeBudget(hint_share=1.5)
