"""OoO-Spec as a method: ToolSpec's sources plus the hint bank, and the sidecar it polls.

The hint bank comes first in the source list, so its drafts come first in the merged candidate
list. By default it draws on ToolSpec's own budget, as in the paper (the hint bank enters ToolSpec's
candidate construction; "ToolSpec continues to control ... the candidate budget"): OoO-Spec's tree
is never bigger than ToolSpec's, and with no hint it is ToolSpec's node for node. Extra room that
only the hint chain may fill (`TreeBudget.hint_nodes`) is an ablation, ``ooospec:hint_room=N``,
shown next to a ToolSpec control with the same total nodes and depth.
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


def ooospec_budget(toolspec_budget: TreeBudget, hint_room: int = 0) -> TreeBudget:
    """ToolSpec's budget (the default), plus ``hint_room`` nodes and depth only the hint may use."""
    return TreeBudget(max_nodes=toolspec_budget.max_nodes, max_depth=toolspec_budget.max_depth,
                      hint_nodes=hint_room, hint_depth=hint_room)
