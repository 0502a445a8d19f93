"""OoO-Spec as a method: ToolSpec's sources plus the hint bank, and the sidecar it polls.

The hint bank comes first in the source list, so its drafts come first in the merged candidate
list. Its budget is ToolSpec's plus room that only the hint chain may fill (`TreeBudget.hint_nodes`):
a right hint is worth a deep path, and ToolSpec's drafts keep exactly the nodes they would have
alone, so OoO-Spec without a hint is ToolSpec node for node.
"""

from __future__ import annotations

from typing import Any

from ooospec.decoding.base import DraftSource
from ooospec.decoding.hint import HintBank
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.sidecar.service import SidecarService

DEFAULT_HINT_TOKENS = 32


def ooospec_sources(service: SidecarService, *, mode: str = "wave", blocking: bool = False,
                    hint_tokens: int = DEFAULT_HINT_TOKENS, **toolspec_options: Any) -> list[DraftSource]:
    """Fresh sources for one run of OoO-Spec (the service outlives them: one model load per run)."""
    return [HintBank(service, mode=mode, blocking=blocking, max_tokens=hint_tokens), ToolSpec(**toolspec_options)]


def ooospec_budget(toolspec_budget: TreeBudget, hint_tokens: int = DEFAULT_HINT_TOKENS) -> TreeBudget:
    return TreeBudget(max_nodes=toolspec_budget.max_nodes, max_depth=toolspec_budget.max_depth,
                      hint_nodes=hint_tokens, hint_depth=hint_tokens)
