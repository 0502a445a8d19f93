"""The ablations chapter's tables: each method next to the one it is compared with, the latency
sweep and its crossover with ToolSpec, and the tree-budget sweep."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any, Iterable

import pandas as pd

from ooospec.report.hint_tables import hint_table
from ooospec.bench.methods import PAPER_PLACEMENT, MethodSpec
from ooospec.report.tables import KEYS, frame, method_table, versus


# ablation -> (the method it is compared with, what the comparison shows)
BASE_LABELS = {"ar": "autoregressive", "pld": "prompt lookup", "toolspec": "ToolSpec (= OoO-Spec, hint off)",
               "ooospec": "OoO-Spec (full; elastic: the target borrows the sidecar's idle core)"}


ABLATIONS: dict[str, tuple[str, str]] = {
    "toolspec": (PAPER_PLACEMENT, "hint off (= ToolSpec)"),
    PAPER_PLACEMENT: ("ooospec", "the paper's placement: the sidecar's core idles after its wave (static)"),
    "toolspec:no_fsm": ("toolspec", "ToolSpec, FSM off"),
    "toolspec:no_retrieval": ("toolspec", "ToolSpec, retrieval off"),
    "ooospec:no_fsm": ("ooospec", "OoO-Spec, FSM off"),
    "ooospec:no_retrieval": ("ooospec", "OoO-Spec, retrieval off"),
    "ooospec:blocking": ("ooospec", "blocking sidecar (wait for the hint)"),
    "ooospec:sequential": ("ooospec", "sequential slot decoding"),
    "ooospec:two_waves": ("ooospec", "two waves (function, then its arguments)"),
    "ooospec:chosen_wave": ("ooospec", "one wave, other functions' rows stopped at the function's answer"),
    "ooospec:progressive": ("ooospec", "one wave, its chosen call sent before the alternatives"),
    "ooospec:no_prefix_share": ("ooospec", "one wave without a shared prefix cache"),
    "ooospec:base_only": ("ooospec", "sidecar base without the adapter"),
    "ooospec:nullable": ("ooospec", "sidecar may answer null for required slots"),
    "ooospec:plain_hint": ("ooospec", "hint used as before (no share bound, no gate, no follow)"),
    "ooospec:oracle": ("ooospec", "oracle first-call hint (the target's own first call)"),
    "ooospec:gold": ("ooospec", "gold call as the hint"),
    "ooospec:shared_core": (PAPER_PLACEMENT, "sidecar on the target's core"),
    "ooospec:in_process": (PAPER_PLACEMENT, "sidecar as a thread of the target's process"),
}


def ablation_label(method: str) -> str:
    if method in BASE_LABELS:
        return BASE_LABELS[method]
    if method in ABLATIONS:
        return ABLATIONS[method][1]
    spec = MethodSpec.parse(method)
    if _delayed(spec):
        return f"OoO-Spec, +{spec.delay_s:g} s sidecar latency"
    if spec.budget is not None:
        return f"{replace(spec, budget=None).name}, {spec.budget}-node trees"
    return method


def ablation_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Per method, pooled over targets and benchmarks: speedups over AR and over ToolSpec, MAT,
    lossless rate and the hint's share, each ablation next to the method it is compared with."""
    records = list(records)
    table = method_table(records, by=("method",))
    if table.empty:
        return table
    if "toolspec" in set(table.method):
        table = table.merge(versus(records, "toolspec", by=("method",)), on="method", how="left")
    hints = hint_table(records, by=("method",))
    if not hints.empty:
        table = table.merge(hints[["method", "hint_share_of_drafted", "median_ready_round"]], on="method", how="left")
    table.insert(1, "ablation", table.method.map(ablation_label))
    table["compared_with"] = table.method.map(lambda m: ABLATIONS.get(m, (_sweep_reference(m), ""))[0])
    return table


def _delayed(spec: MethodSpec) -> bool:
    """OoO-Spec in the paper's placement with injected sidecar latency and nothing else changed (the
    delay sweep: compared with ToolSpec on one core, it asks when the hint stops paying)."""
    return bool(spec.delay_s) and replace(spec, delay_s=0.0) == MethodSpec.parse(PAPER_PLACEMENT)


def _sweep_reference(method: str) -> str | None:
    spec = MethodSpec.parse(method)
    if _delayed(spec):
        return PAPER_PLACEMENT
    if spec.budget is not None:
        return replace(spec, budget=None).name
    return None


def ablation_findings(table: pd.DataFrame, records: Iterable[dict[str, Any]] | None = None) -> list[str]:
    """One sentence per ablation row, computed from the run (decode phase is the main effect).

    With ``records``, each ratio is the ratio of total decode times on the requests both methods
    decoded, with its paired bootstrap 95% interval; an ablation is called faster or slower only
    when the interval excludes 1 (without records, no verdict is given)."""
    from ooospec.report.intervals import paired_speedup

    df = frame(records).set_index(KEYS) if records is not None else None
    by_method = {row.method: row for row in table.itertuples()}
    lines = []
    for row in table.itertuples():
        reference = by_method.get(row.compared_with) if isinstance(row.compared_with, str) else None
        if reference is None or row.method == row.compared_with:
            continue
        e2e = reference.total_s / row.total_s if row.total_s else math.nan
        if df is not None:
            ours, theirs = df[df.method == row.method], df[df.method == row.compared_with]
            both = ours.index.intersection(theirs.index)
            decode = paired_speedup(theirs.loc[both, "decode_s"], ours.loc[both, "decode_s"])
            speed = f"decode phase {decode} the speed of {row.compared_with} ({decode.verdict})"
        else:
            ratio = reference.decode_s / row.decode_s if row.decode_s else math.nan
            speed = f"decode phase {ratio:.2f}x the speed of {row.compared_with} (no interval: no verdict)"
        lines.append(f"{row.ablation}: {speed}, end to end {e2e:.2f}x; MAT {row.mat:.2f} vs {reference.mat:.2f}; "
                     f"bit-identical to AR {row.lossless:.0%} ({row.requests} requests).")
    return lines


def delay_sweep(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """OoO-Spec's speed (paper's placement) over ToolSpec on one core per injected sidecar latency
    (0 = no injected latency)."""
    records = list(records)
    versus_ts = versus(records, "toolspec", by=("method",))
    rows = []
    for row in versus_ts.itertuples():
        spec = MethodSpec.parse(row.method)
        if spec != MethodSpec.parse(PAPER_PLACEMENT) and not _delayed(spec):
            continue
        delay = spec.delay_s
        rows.append({"delay_s": delay, "method": row.method, "decode_vs_toolspec": row.decode_vs_toolspec,
                     "e2e_vs_toolspec": row.e2e_vs_toolspec})
    return pd.DataFrame(rows, columns=["delay_s", "method", "decode_vs_toolspec", "e2e_vs_toolspec"]).sort_values("delay_s")


def crossover(sweep: pd.DataFrame, column: str = "decode_vs_toolspec") -> float | None:
    """The injected latency (s) where OoO-Spec stops beating ToolSpec: the first linear crossing
    of 1.0 in the sweep; None when it never crosses inside the swept range."""
    points = list(zip(sweep.delay_s, sweep[column]))
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if y0 > 1.0 >= y1:
            return x0 + (y0 - 1.0) * (x1 - x0) / (y0 - y1)
    if points and points[0][1] <= 1.0:
        return points[0][0]
    return None


def budget_sweep(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Speedup over AR per tree budget (ratio of total times), for each swept method (``base``: the
    method without its ``budget=`` option; the unswept method sits at the budget the run chose)."""
    records = list(records)
    table = method_table(records, by=("method",))
    nodes = {r["method"]: (r.get("tree_budget") or {}).get("max_nodes") for r in records}
    rows = []
    for row in table.itertuples():
        spec = MethodSpec.parse(row.method)
        base = replace(spec, budget=None)
        if base not in (MethodSpec(spec.base), MethodSpec.parse(PAPER_PLACEMENT)):
            continue
        rows.append({"base": base.name, "nodes": spec.budget or nodes.get(row.method), "method": row.method,
                     "decode_speedup": row.decode_speedup_total, "e2e_speedup": row.e2e_speedup_total,
                     "mat": row.mat, "requests": row.requests})
    out = pd.DataFrame(rows, columns=["base", "nodes", "method", "decode_speedup", "e2e_speedup", "mat", "requests"])
    swept = {b for b, m in zip(out.base, out.method) if MethodSpec.parse(m).budget is not None}
    return out[out.base.isin(swept)].sort_values(["base", "nodes"])


# (method, reference): the gate against its control, and each against the ToolSpec on its cores
WAVE_GATE_PAIRS = (("ooospec:static", "ooospec:static:every_wave"), ("ooospec", "ooospec:every_wave"),
                   ("ooospec:static", "toolspec"), ("ooospec:static:every_wave", "toolspec"),
                   ("ooospec", "toolspec:both_cores"), ("ooospec:every_wave", "toolspec:both_cores"))


def wave_gate_table(records: Iterable[dict[str, Any]], phase: str = "decode") -> pd.DataFrame:
    """What the wave gate changes (`ooospec.decoding.wave_gate`), per target and benchmark: each
    comparison of `WAVE_GATE_PAIRS` in ``phase`` on the same work (ratio of totals, paired bootstrap
    95% interval), and for the method, how many of its waves were submitted, skipped by the gate and
    in time (``submitted``, ``skipped``, ``in time``: the hint read before its request finished)."""
    from ooospec.report.speedups import PHASE_LABELS, speedup_intervals

    records = list(records)
    waves: dict[tuple[str, str, str], Counter] = {}
    for r in records:
        if r.get("hint") is not None:
            count = waves.setdefault((r["target"], r["benchmark"], r["method"]), Counter())
            count["submitted" if r["hint"].get("submitted", True) else "skipped"] += 1
            count["in time"] += r["hint"].get("ready_round") is not None
    columns = ["target", "benchmark", "method", "vs", "phase", "n", "speedup", "ci_low", "ci_high",
               "submitted", "skipped", "in time"]
    rows = []
    for method, reference in WAVE_GATE_PAIRS:
        found = speedup_intervals(records, reference=reference, methods=[method], phases=(phase,))
        for cell in found.itertuples():
            count = waves.get((cell.target, cell.benchmark, method), Counter())
            rows.append({"target": cell.target, "benchmark": cell.benchmark, "method": method, "vs": reference,
                         "phase": PHASE_LABELS[phase], "n": cell.n, "speedup": cell.speedup, "ci_low": cell.ci_low,
                         "ci_high": cell.ci_high, **{k: count.get(k, 0) for k in columns[-3:]}})
    return pd.DataFrame(rows, columns=columns)
