"""Method name -> draft sources, and the per-target default tree budget.

Sources are built once per run (method x target x benchmark slice) and reused for every request
of that run, because call retrieval learns from the calls produced earlier in the same run.
"""

from __future__ import annotations

from typing import Any

from ooospec.decoding.base import DraftSource
from ooospec.decoding.pld import PromptLookup
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget

METHODS = ("ar", "pld", "toolspec")

# Chosen from the verify-cost curve (notebooks/03_toolspec.ipynb) on 2 CPU cores, fp32: a forward
# over 1 + n tree rows costs about 1 + n/8 one-token steps for the Qwen target, so trees stay small.
DEFAULT_BUDGETS: dict[str, TreeBudget] = {
    "qwen2.5-coder-0.5b": TreeBudget(max_nodes=16, max_depth=16),
    "smollm2-135m-tool": TreeBudget(max_nodes=16, max_depth=16),
}


def default_budget(target_name: str | None = None) -> TreeBudget:
    return DEFAULT_BUDGETS.get(target_name or "", TreeBudget())


def build_sources(method: str, **options: Any) -> list[DraftSource]:
    """Fresh sources for one run of ``method``; ``options`` go to the method's source."""
    if method == "ar":
        if options:
            raise ValueError(f"method 'ar' takes no options, got {sorted(options)}")
        return []
    if method == "pld":
        return [PromptLookup(**options)]
    if method == "toolspec":
        return [ToolSpec(**options)]
    raise ValueError(f"unknown method {method!r} (expected one of {METHODS})")
