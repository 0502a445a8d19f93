"""Drafts -> one token tree that a single target forward can verify.

Drafts from every source are merged into a trie (equal prefixes share nodes, and each node keeps
the tags of every source that proposed it), cut to a node budget and a depth limit, and flattened
in insertion order. Insertion order is topological (a parent is always inserted before its
children), which the verifier relies on when it gathers the accepted path's KV entries.

Priority is the order of the drafts: the loop passes drafts best first, so when the budget runs
out the nodes that are dropped are those of the later drafts (deterministic, and the tree stays
prefix-closed because a node is only ever added after its parent).

Row 0 of every tensor built here is the *root*: the last committed token, whose KV entry is not in
the cache yet and whose logits predict the first tree level. Node ``i`` is row ``i + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ooospec.decoding.base import Draft


@dataclass(frozen=True)
class TreeBudget:
    """Size limits of one verify tree: draft nodes (the root is not counted) and depth.

    ``hint_nodes`` / ``hint_depth`` reserve extra room that only hint drafts may fill (OoO-Spec
    = ToolSpec's tree + one hint chain). The other drafts still get exactly ``max_nodes`` nodes of
    their own, so when no hint is there OoO-Spec's tree is ToolSpec's, node for node, and a gain
    over ToolSpec cannot come from a bigger tree. With ``hint_nodes == 0`` hint drafts share the
    main budget like any other source.

    ``hint_share`` (main budget only) bounds what a hint draft may take where it *disagrees* with
    the best other draft: the prefix they share is free (those nodes serve both), and past the
    first disagreement the hint keeps at most ``hint_share * max_nodes`` nodes, so a wrong hint can
    no longer take the whole tree from ToolSpec's best draft. None: the hint competes like any
    draft (being first, it may fill the whole budget).
    """

    max_nodes: int = 16
    max_depth: int = 16
    hint_nodes: int = 0
    hint_depth: int = 0
    hint_share: float | None = None

    def __post_init__(self) -> None:
        if min(self.max_nodes, self.max_depth, self.hint_nodes, self.hint_depth) < 0:
            raise ValueError(f"tree budget must be non-negative, got {self}")
        if self.hint_share is not None and not 0.0 <= self.hint_share <= 1.0:
            raise ValueError(f"hint_share must be within [0, 1], got {self.hint_share}")

    @property
    def total_nodes(self) -> int:
        return self.max_nodes + self.hint_nodes

    def limits(self, source: str) -> tuple[str, int, int]:
        """(pool, node limit, depth limit) that a draft from ``source`` draws on."""
        if source == "hint" and self.hint_nodes > 0:
            return "hint", self.hint_nodes, self.hint_depth
        return "main", self.max_nodes, self.max_depth


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # -1 is the root
    depths: list[int] = field(default_factory=list)  # children of the root have depth 1
    sources: list[list[str]] = field(default_factory=list)  # first tag is credited on acceptance
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])  # row -> {token: node}
    truncated_drafts: int = 0  # drafts cut short by the node budget

    @property
    def size(self) -> int:
        return len(self.tokens)

    def ancestor_matrix(self) -> torch.Tensor:
        """``[1+n, 1+n]`` bool: row r may attend to column c (c is r or an ancestor of r)."""
        n = self.size
        anc = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        anc[:, 0] = True
        anc[0, 0] = True
        for i, parent in enumerate(self.parents):
            row = i + 1
            anc[row] = anc[parent + 1]
            anc[row, row] = True
        return anc

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        """``[1, 1+n]``: the root sits right after the cached prefix, a node at prefix + depth."""
        return torch.tensor([[prefix_len] + [prefix_len + d for d in self.depths]], dtype=torch.long)

    def attention_mask(self, prefix_len: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[1, 1, 1+n, prefix_len+1+n]`` additive mask: 0 where attention is allowed, the dtype's
        minimum elsewhere. Every row sees the whole cached prefix, itself and its ancestors."""
        anc = self.ancestor_matrix()
        n1 = anc.shape[0]
        mask = torch.zeros(n1, prefix_len + n1, dtype=dtype)
        mask[:, prefix_len:].masked_fill_(~anc, torch.finfo(dtype).min)
        return mask.view(1, 1, n1, prefix_len + n1)

    def retrieve_paths(self) -> list[list[int]]:
        """Every root-to-leaf path as node indices (the candidate sequences after merging)."""
        paths: list[list[int]] = []

        def visit(row: int, path: list[int]) -> None:
            kids = self.children[row]
            if not kids and path:
                paths.append(path)
            for node in kids.values():
                visit(node + 1, path + [node])

        visit(0, [])
        return paths

    def walk(self, predicted: list[int]) -> list[int]:
        """Greedy acceptance: from the root, follow the child whose token equals the target's argmax
        at its parent, as long as one exists. ``predicted[r]`` is the argmax at row ``r``.
        Returns the accepted node indices (the bonus token is ``predicted`` at the last row)."""
        accepted: list[int] = []
        row = 0
        while True:
            node = self.children[row].get(predicted[row])
            if node is None:
                return accepted
            accepted.append(node)
            row = node + 1


def shared_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cap_hint_drafts(drafts: list[Draft], budget: TreeBudget) -> list[Draft]:
    """``drafts`` with every hint draft cut to its shared prefix with the best other draft plus
    ``hint_share * max_nodes`` tokens (`TreeBudget.hint_share`); unchanged without a share, with a
    hint pool of its own, or with no other draft to protect."""
    if budget.hint_share is None or budget.hint_nodes > 0:
        return drafts
    best = next((d for d in drafts if d.source != "hint"), None)
    if best is None:
        return drafts
    room = int(budget.hint_share * budget.max_nodes)
    return [Draft(d.tokens[: shared_prefix(d.tokens, best.tokens) + room], d.source, d.guess)
            if d.source == "hint" else d for d in drafts]


def build_tree(drafts: list[Draft], budget: TreeBudget) -> DraftTree:
    """Merge drafts (best first) into a trie under ``budget``.

    A node counts against the pool of the draft that created it; a later draft that shares the
    node (any source) costs nothing there. Hint drafts are first cut as `cap_hint_drafts` says.
    """
    tree = DraftTree()
    created = {"main": 0, "hint": 0}
    for draft in cap_hint_drafts(drafts, budget):
        pool, max_nodes, max_depth = budget.limits(draft.source)
        row = 0
        for depth, token in enumerate(draft.tokens[:max_depth], start=1):
            node = tree.children[row].get(token)
            if node is None:
                if created[pool] >= max_nodes:
                    tree.truncated_drafts += 1
                    break
                created[pool] += 1
                node = tree.size
                tree.tokens.append(token)
                tree.parents.append(row - 1)
                tree.depths.append(depth)
                tree.sources.append([draft.source])
                tree.children.append({})
                tree.children[row][token] = node
            elif draft.source not in tree.sources[node]:
                tree.sources[node].append(draft.source)
            row = node + 1
    return tree
