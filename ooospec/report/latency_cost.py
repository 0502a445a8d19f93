"""What the hint's latency costs: the oracle hint, the trained hint awaited, the trained hint as timed.

Three methods in the paper's placement, each against ToolSpec on one core (decode phase, same work):

* the **oracle** first-call hint (`ooospec:oracle:static`): the target's own first call, ready at once;
* the trained sidecar's hint **awaited** (`ooospec:blocking:static`): the bank waits for it at the first
  boundary, and the wait (`HintStats.waited_s`) is left out of its seconds: what the sidecar's answer
  is worth where it is never late;
* the trained hint **as timed** (`ooospec:static`): what the method delivers.

So oracle -> awaited is what the sidecar's accuracy costs, and awaited -> as timed what its latency
costs. Beside each ratio, the method's target forwards per request and MAT: counts that do not move
with the clock (the awaited hint's forwards are its own, the wait runs none).
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from ooospec.report.speedups import speedup_intervals
from ooospec.report.tables import frame
from ooospec.report.verdict import CEILING_METHOD, CLAIMS, PAPER_PLACEMENT, same_work

AWAITED = "ooospec:blocking:static"
AWAITED_LABEL = f"{AWAITED} (wait left out)"
STEPS = {"oracle": CEILING_METHOD, "awaited": AWAITED_LABEL, "as timed": PAPER_PLACEMENT}


def wait_left_out(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The awaited method's records under `AWAITED_LABEL`, its wait taken off its decode and
    end-to-end seconds (records without ``waited_s``, made before it was kept, are left out)."""
    out = []
    for r in records:
        waited = (r.get("hint") or {}).get("waited_s")
        if r["method"] == AWAITED and waited is not None:
            out.append({**r, "method": AWAITED_LABEL, "decode_s": r["decode_s"] - waited,
                        "total_s": r["total_s"] - waited})
    return out


def _counts(group: pd.DataFrame) -> str:
    forwards = group.forwards.sum()
    mat = (group.tokens - 1).clip(lower=0).sum() / forwards if forwards else math.nan
    return f"{group.target_forwards.mean():.1f} / {mat:.2f}"


def latency_table(records: Iterable[dict[str, Any]], phase: str = "decode") -> pd.DataFrame:
    """Per target x benchmark: each step over ToolSpec (`speedup [95% interval] (n = ...)`, same
    work), its target forwards per request and MAT, and the awaited method's median wait. Empty
    where the three methods did not all run."""
    records = list(records)
    derived = records + wait_left_out(records)
    reference = CLAIMS["paper"][1]
    intervals = speedup_intervals(derived, reference=reference, methods=list(STEPS.values()), phases=(phase,))
    df = frame(derived)
    rows = []
    for (target, benchmark), cell in intervals.groupby(["target", "benchmark"], sort=False):
        by_method = cell.set_index("method")
        if not set(STEPS.values()) <= set(by_method.index):
            continue
        row: dict[str, Any] = {"target": target, "benchmark": benchmark}
        for step, method in STEPS.items():
            row[f"{step} / ToolSpec"] = same_work(by_method.loc[method], short=True)
        mine = df[(df.target == target) & (df.benchmark == benchmark)]
        for step, method in STEPS.items():
            row[f"{step}: forwards / MAT"] = _counts(mine[mine.method == method])
        waited = [(r.get("hint") or {}).get("waited_s") for r in records
                  if (r["target"], r["benchmark"], r["method"]) == (target, benchmark, AWAITED)]
        row["median wait (s)"] = float(pd.Series(waited, dtype=float).median())
        rows.append(row)
    return pd.DataFrame(rows).set_index(["target", "benchmark"]) if rows else pd.DataFrame()
