"""The tree budget follows the machine: Sequoia's hardware-aware rule at the granularity of node budgets.

A tree of b draft nodes is verified by one forward over 1 + b rows. Whether b pays off depends on two
things that do not travel together:

* **acceptance**, MAT(b): tokens committed per target forward by ToolSpec with b nodes (depth limit
  b) on dev requests. It is a count, not a time, so it is the same on any machine up to rounding
  near-ties; it is measured once (`ooospec.studies.tree_budget_acceptance`, dev requests only, never an evaluation file)
  and committed (``artifacts/committed/tree-budget/``).
* **cost**, C(b): a verify forward over 1 + b rows relative to a one-row step, measured on this
  machine at the start of a run (a few forwards, seconds): 1.3x for 17 rows on the avx512_bf16 CPU
  in bf16, 3.9x on the AVX2 one in fp32, so the best budget differs between them.

The chosen budget minimises C(b) / MAT(b), the expected cost of one committed token in one-row
steps, up to `TOLERANCE`: the smallest budget within it of the least cost wins. Two budgets that cost
nearly the same per token (SmolLM2's 4 and 8 nodes on the avx512_bf16 EPYC, 3% apart) otherwise swap
with the clock's noise from run to run, and a fresh run's forwards could not be compared with the
canonical run's. ToolSpec and OoO-Spec get the same budget, chosen from ToolSpec's acceptance (the
baseline's), so the choice cannot favour the new method. An explicit ``budget=`` option on a method
still wins; a target without committed acceptance (a test model) keeps its fixed default.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ooospec.bench.methods import default_budget
from ooospec.decoding.tree import TreeBudget
from ooospec.paths import artifacts_dir

CANDIDATES = (4, 8, 16, 24, 32)  # node budgets; the depth limit equals the budget, as in the sweeps
TOLERANCE = 0.05  # a larger budget must save more than this share of a token's cost to be chosen
ACCEPTANCE_FILE = "acceptance.json"


def acceptance_dir() -> Path:
    return artifacts_dir() / "committed" / "tree-budget"


@dataclass
class BudgetChoice:
    """A target's tree budget on this machine and the numbers that chose it (run provenance)."""

    target: str
    budget: dict[str, int]  # max_nodes, max_depth
    chosen_by: str  # "machine" (this rule) or why the fixed default was kept
    rows: list[dict[str, float]] = field(default_factory=list)  # nodes, mat, cost, steps_per_token
    step_s: float | None = None  # the one-row step measured with the costs
    measure_s: float = 0.0
    acceptance: dict[str, Any] = field(default_factory=dict)  # where MAT(b) came from

    @property
    def tree_budget(self) -> TreeBudget:
        return TreeBudget(**self.budget)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_budget(mat: dict[int, float], cost: dict[int, float], tolerance: float = TOLERANCE) -> int:
    """The smallest node budget whose verify cost per committed token, C(b) / MAT(b), is within
    ``tolerance`` of the least: a larger tree must pay for itself by more than the clock's noise."""
    common = sorted(set(mat) & set(cost))
    if not common:
        raise ValueError(f"no budget with both an acceptance and a cost: {sorted(mat)} vs {sorted(cost)}")
    per_token = {b: cost[b] / mat[b] for b in common}
    least = min(per_token.values())
    return min(b for b in common if per_token[b] <= least * (1 + tolerance))


def committed_acceptance(target: str, path: Path | None = None) -> tuple[dict[int, float], dict[str, Any]] | None:
    """MAT per node budget of ``target`` from the committed dev measurement, with its provenance."""
    path = path or acceptance_dir() / ACCEPTANCE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    per_target = data.get("targets", {}).get(target)
    if not per_target:
        return None
    mat = {int(b): float(v["mat"]) for b, v in per_target.items()}
    return mat, {k: v for k, v in data.items() if k != "targets"}


def machine_budget(verifier: Any, prompt_ids: list[int], target: str, repeats: int = 3,
                   acceptance_path: Path | None = None) -> BudgetChoice:
    """Measure C(b) for the candidate budgets on one real prompt, read MAT(b), choose."""
    from ooospec.bench.verify_cost import verify_cost_curve

    fixed = default_budget(target)
    found = committed_acceptance(target, acceptance_path)
    if found is None:
        return BudgetChoice(target, {"max_nodes": fixed.max_nodes, "max_depth": fixed.max_depth},
                            "fixed default: no committed dev acceptance for this target")
    mat, provenance = found
    started = time.perf_counter()
    points = verify_cost_curve(verifier, prompt_ids, (0, *sorted(mat)), repeats)
    cost = {p.nodes: p.min_ratio for p in points if p.nodes}  # the minimum: robust to a busy neighbour
    best = choose_budget(mat, cost)
    rows = [{"nodes": b, "mat": round(mat[b], 3), "cost": round(cost[b], 3),
             "steps_per_token": round(cost[b] / mat[b], 3)} for b in sorted(cost)]
    step = next(p.min_s for p in points if p.nodes == 0)
    return BudgetChoice(target, {"max_nodes": best, "max_depth": best}, "machine", rows, round(step, 4),
                        round(time.perf_counter() - started, 1), provenance)
