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

# Chosen by measurement (notebooks/03_toolspec.ipynb), 1 torch thread, fp32, on this machine's
# CPU. Qwen target, 252-token prompt, one-token step 151 ms; a verify forward over 1 + n rows costs
# 2.1x a step at n = 1, 3.0x at n = 2, 2.1x at 4, 2.4x at 8, 3.1x at 16, 4.2x at 32, 6.7x at 64
# (any n > 0 turns every matrix-vector product into a matrix-matrix one). ToolSpec at 8 / 16 / 32
# nodes on 6 BFCL requests: MAT 4.9 / 5.8 / 6.3, decode speedup 2.45 / 2.70 / 2.23x; on
# ToolAlpaca and API-Bank 8 and 16 were within noise of each other. SmolLM2 (tool LoRA merged),
# 4 BFCL requests: 4 / 8 / 16 / 32 nodes gave MAT 2.8 / 3.3 / 4.0 / 4.3 and a flat decode speedup
# of 1.9 / 2.0 / 2.0 / 2.05x, so it keeps 16 as well.
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
