"""Bench records -> the tables of the results, ablation and timeline chapters.

Ratio conventions (every one is "AR time / method time", so larger is faster):

* ``*_speedup``: the mean over requests of the per-request ratio (the paper's convention);
* ``*_speedup_total``: the ratio of summed times (dominated by long requests);
* `speedup_intervals` (the verdict's numbers): the ratio of summed times over the same work, i.e.
  the requests where the method wrote exactly the reference's output, with its paired interval;
* ``decode``: the decode phase only (end of prefill to the last token); ``e2e``: end to end
  (per-request setup + prefill + decode). On CPU the prefill dominates end-to-end time, which is
  why both are reported.

MAT is pooled: committed tokens after the first (which no draft could cover) over verify forwards.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import replace
from typing import Any, Iterable

import pandas as pd

from ooospec.bench.methods import MethodSpec
from ooospec.bench.runner import HELD_OUT_BENCHMARKS
from ooospec.decoding.base import CREDITS, DRAFTED_CREDITS

KEYS = ["target", "benchmark", "request_id"]
ARRIVAL_BUCKETS = ("first boundary", "boundaries 1-3", "boundary 4+", "not before finish", "rejected")


def frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per record with the flat fields the tables need (traces and rounds left out)."""
    rows = []
    for r in records:
        hint = r.get("hint") or {}
        counts = r.get("source_counts") or {}
        rows.append({
            "target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"],
            "position": r.get("position", 0), "method": r["method"], "method_base": r["method_base"],
            "sidecar": r.get("sidecar"), "identical": bool(r["identical_to_ar"]),
            "near_tie": bool(r.get("near_tie", False)), "tokens": r["tokens"],
            "prefill_s": r["prefill_s"], "decode_s": r["decode_s"], "total_s": r["total_s"],
            "forwards": r["forwards"], "target_forwards": r["target_forwards"],
            "tree_size": r.get("mean_tree_size", 0.0),
            **{f"acc_{s}": counts.get(s, 0) for s in CREDITS},
            "hint_ready_round": hint.get("ready_round"), "hint_error": hint.get("error"),
            "payload_bytes": hint.get("payload_bytes") or None, "wave_s": hint.get("wave_s"),
            # None for stored records written before outputs were kept (see `same_output`)
            "output_ids": tuple(r["output_ids"]) if r.get("output_ids") is not None else None,
        })
    return pd.DataFrame(rows)


def with_reference(df: pd.DataFrame, reference: str = "ar") -> pd.DataFrame:
    """Adds the reference method's times of the same request (columns ``ref_*``)."""
    ref = df[df.method == reference][KEYS + ["decode_s", "total_s", "prefill_s"]]
    ref = ref.rename(columns={"decode_s": "ref_decode_s", "total_s": "ref_total_s", "prefill_s": "ref_prefill_s"})
    return df.merge(ref, on=KEYS, how="inner")


def _cell(group: pd.DataFrame) -> dict[str, Any]:
    decoded = (group.tokens - 1).clip(lower=0).sum()
    return {
        "requests": len(group),
        "decode_speedup": (group.ref_decode_s / group.decode_s).mean(),
        "e2e_speedup": (group.ref_total_s / group.total_s).mean(),
        "decode_speedup_total": group.ref_decode_s.sum() / group.decode_s.sum(),
        "e2e_speedup_total": group.ref_total_s.sum() / group.total_s.sum(),
        "mat": decoded / group.forwards.sum() if group.forwards.sum() else math.nan,
        "lossless": group.identical.mean(),  # bit-identical to AR
        "near_ties": int(group.near_tie.sum()),  # differ from AR only at a rounding tie of its logits
        "target_forwards": group.target_forwards.mean(),
        "tokens": group.tokens.mean(),
        "prefill_s": group.prefill_s.mean(),
        "decode_s": group.decode_s.mean(),
        "total_s": group.total_s.mean(),
    }


def method_table(records: Iterable[dict[str, Any]], by: tuple[str, ...] = ("target", "benchmark", "method")) -> pd.DataFrame:
    """Per group: speedups over AR (mean of ratios and ratio of totals), MAT, lossless rate."""
    df = with_reference(frame(records))
    if df.empty:
        return pd.DataFrame(columns=[*by, "requests"])
    rows = [{**dict(zip(by, key if isinstance(key, tuple) else (key,))), **_cell(group)}
            for key, group in df.groupby(list(by), sort=False)]
    return pd.DataFrame(rows)


def versus(records: Iterable[dict[str, Any]], reference: str, by: tuple[str, ...] = ("target", "benchmark", "method")) -> pd.DataFrame:
    """Per group: time of ``reference`` / time of the method (mean of per-request ratios)."""
    df = with_reference(frame(records), reference)
    if df.empty:
        return pd.DataFrame(columns=[*by])
    out = df.groupby(list(by), sort=False).apply(lambda g: pd.Series({
        f"decode_vs_{reference}": (g.ref_decode_s / g.decode_s).mean(),
        f"e2e_vs_{reference}": (g.ref_total_s / g.total_s).mean(),
        f"decode_vs_{reference}_total": g.ref_decode_s.sum() / g.decode_s.sum(),
    }), include_groups=False)
    return out.reset_index()


def main_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The paper-style table: per target x benchmark x method, plus OoO-Spec vs ToolSpec, and the
    requests of the cell that could not be decoded at all (`failed_requests`: part of n)."""
    failed = Counter((f["target"], f["benchmark"]) for f in getattr(records, "failed", []))
    records = list(records)
    table = method_table(records)
    if table.empty:
        return table
    methods = set(table.method)
    if "toolspec" in methods:
        table = table.merge(versus(records, "toolspec"), on=["target", "benchmark", "method"], how="left")
    table["held_out"] = table.benchmark.isin(HELD_OUT_BENCHMARKS)
    table["failed_requests"] = [failed.get((t, b), 0) for t, b in zip(table.target, table.benchmark)]
    return table


# what a reader needs at page width; the full tables stay one click away (collapsed in the book)
COMPACT = {
    "main": {"target": "target", "benchmark": "benchmark", "method": "method", "requests": "n",
             "decode_speedup_total": "decode x AR", "e2e_speedup_total": "e2e x AR",
             "decode_vs_toolspec_total": "decode x ToolSpec", "mat": "MAT", "lossless": "= AR",
             "near_ties": "near-ties", "failed_requests": "failed"},
    "hint": {"target": "target", "benchmark": "benchmark", "method": "method", "requests": "n",
             "median_ready_round": "ready at boundary", "hint_share_of_drafted": "hint share of drafted",
             "shared_share_of_drafted": "shared share", "payload_bytes": "payload B (median)", "max_payload_bytes": "payload B (max)",
             "median_wave_s": "wave s", "wave_over_ar_prefill": "wave / prefill"},
    "ablation": {"variant": "variant", "requests": "n", "decode_speedup_total": "decode x AR",
                 "decode_vs_toolspec_total": "decode x ToolSpec", "mat": "MAT", "lossless": "= AR",
                 "hint_share_of_drafted": "hint share", "compared_with": "compared with"},
}


def compact(table: pd.DataFrame, kind: str, digits: int = 2) -> pd.DataFrame:
    """The columns of ``COMPACT[kind]`` that ``table`` has, renamed for people and rounded (ratios
    of totals: the primary statistic; the full table keeps the means of ratios too)."""
    columns = {k: v for k, v in COMPACT[kind].items() if k in table.columns}
    out = table[list(columns)].rename(columns=columns).round(digits)
    keys = [c for c in ("target", "benchmark", "method", "variant") if c in out.columns]
    return out.set_index(keys) if keys else out


def headline(table: pd.DataFrame, metric: str = "e2e_speedup") -> pd.DataFrame:
    """Per method over the target x benchmark cells: unweighted mean, min and max of ``metric``
    (the paper's "2.46x-5.34x, mean 3.89x" is this over its 21 cells)."""
    if table.empty:
        return pd.DataFrame(columns=["method", "cells", "mean", "min", "max"])
    grouped = table.groupby("method", sort=False)[metric]
    return pd.DataFrame({"cells": grouped.size(), "mean": grouped.mean(), "min": grouped.min(),
                         "max": grouped.max()}).reset_index()


# ---------------------------------------------------------------- the hint


def arrival_bucket(ready_round: Any, error: Any) -> str:
    """Where the hint joined: the boundary index that first saw it, or why it never did."""
    if ready_round is None or (isinstance(ready_round, float) and math.isnan(ready_round)):
        if isinstance(error, str) and "not ready before" in error:
            return "not before finish"
        return "rejected"
    ready_round = int(ready_round)
    if ready_round == 0:
        return "first boundary"
    return "boundaries 1-3" if ready_round <= 3 else "boundary 4+"


def hint_table(records: Iterable[dict[str, Any]], by: tuple[str, ...] = ("target", "benchmark", "method")) -> pd.DataFrame:
    """Per group of hint-using records: arrival distribution, share of accepted tokens from the
    hint, payload bytes, wave time and the sidecar-wave / target-AR latency ratio."""
    df = with_reference(frame(records))
    df = df[df.method_base == "ooospec"]
    if df.empty:
        return pd.DataFrame(columns=[*by, "requests"])
    rows = []
    for key, g in df.groupby(list(by), sort=False):
        buckets = Counter(arrival_bucket(r, e) for r, e in zip(g.hint_ready_round, g.hint_error))
        accepted = sum(g[f"acc_{s}"].sum() for s in DRAFTED_CREDITS)
        ready = g.hint_ready_round.dropna()
        wave = g.wave_s.dropna()
        rows.append({
            **dict(zip(by, key if isinstance(key, tuple) else (key,))),
            "requests": len(g),
            "sidecar": ", ".join(sorted(set(g.sidecar.dropna()))),
            **{f"arrived: {b}": buckets.get(b, 0) for b in ARRIVAL_BUCKETS},
            "median_ready_round": ready.median() if len(ready) else math.nan,
            "hint_share_of_drafted": g.acc_hint.sum() / accepted if accepted else 0.0,
            "hint_share_of_output": g.acc_hint.sum() / g.tokens.sum() if g.tokens.sum() else 0.0,
            # tokens the hint proposed together with another source are not the hint's alone
            "shared_share_of_drafted": g.acc_shared.sum() / accepted if accepted else 0.0,
            "payload_bytes": g.payload_bytes.dropna().median(),
            "max_payload_bytes": g.payload_bytes.dropna().max(),
            "median_wave_s": wave.median() if len(wave) else math.nan,
            "wave_over_ar_total": (g.wave_s / g.ref_total_s).median() if len(wave) else math.nan,
            "wave_over_ar_prefill": (g.wave_s / g.ref_prefill_s).median() if len(wave) else math.nan,
            "errors": "; ".join(f"{n}x {e}" for e, n in Counter(_short(e) for e in g.hint_error.dropna()).most_common(3)),
        })
    return pd.DataFrame(rows)


def _short(error: str) -> str:
    return re.sub(r"'[^']*'", "'...'", str(error))[:60]


def arrival_rounds(records: Iterable[dict[str, Any]], method: str = "ooospec") -> pd.DataFrame:
    """One row per request of ``method``: the boundary the hint arrived at and its share of rounds."""
    rows = []
    for r in records:
        if r["method"] != method or r.get("hint") is None:
            continue
        hint = r["hint"]
        rows.append({"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"],
                     "ready_round": hint.get("ready_round"), "forwards": r["forwards"],
                     "bucket": arrival_bucket(hint.get("ready_round"), hint.get("error")),
                     "ready_fraction": (hint["ready_round"] / r["forwards"]) if hint.get("ready_round") is not None
                     and r["forwards"] else math.nan})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- ablations


# variant -> (the method it is compared with, what the comparison shows)
BASE_LABELS = {"ar": "autoregressive", "pld": "prompt lookup", "toolspec": "ToolSpec (= OoO-Spec, hint off)",
               "ooospec": "OoO-Spec (full)"}
ABLATIONS: dict[str, tuple[str, str]] = {
    "toolspec": ("ooospec", "hint off (= ToolSpec)"),
    "toolspec:no_fsm": ("toolspec", "ToolSpec, FSM off"),
    "toolspec:no_retrieval": ("toolspec", "ToolSpec, retrieval off"),
    "ooospec:no_fsm": ("ooospec", "OoO-Spec, FSM off"),
    "ooospec:no_retrieval": ("ooospec", "OoO-Spec, retrieval off"),
    "ooospec:blocking": ("ooospec", "blocking sidecar (wait for the hint)"),
    "ooospec:sequential": ("ooospec", "sequential slot decoding"),
    "ooospec:two_waves": ("ooospec", "two waves (function, then its arguments)"),
    "ooospec:no_prefix_share": ("ooospec", "one wave without a shared prefix cache"),
    "ooospec:base_only": ("ooospec", "sidecar base without the adapter"),
    "ooospec:nullable": ("ooospec", "sidecar may answer null for required slots"),
    "ooospec:plain_hint": ("ooospec", "hint used as before (no share bound, no gate, no follow)"),
    "ooospec:oracle": ("ooospec", "oracle first-call hint (the target's own first call)"),
    "ooospec:gold": ("ooospec", "gold call as the hint"),
    "ooospec:shared_core": ("ooospec", "sidecar on the target's core"),
    "ooospec:in_process": ("ooospec", "sidecar as a thread of the target's process"),
    "ooospec:elastic": ("ooospec", "target borrows the sidecar's idle core (elastic)"),
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
    table.insert(1, "variant", table.method.map(ablation_label))
    table["compared_with"] = table.method.map(lambda m: ABLATIONS.get(m, (_sweep_reference(m), ""))[0])
    return table


def _delayed(spec: MethodSpec) -> bool:
    """OoO-Spec with injected sidecar latency and nothing else changed (the delay sweep)."""
    return bool(spec.delay_s) and replace(spec, delay_s=0.0) == MethodSpec("ooospec")


def _sweep_reference(method: str) -> str | None:
    spec = MethodSpec.parse(method)
    if _delayed(spec):
        return "ooospec"
    if spec.budget is not None:
        return replace(spec, budget=None).name
    return None


def ablation_findings(table: pd.DataFrame, records: Iterable[dict[str, Any]] | None = None) -> list[str]:
    """One sentence per ablation row, computed from the run (decode phase is the main effect).

    With ``records``, each ratio is the ratio of total decode times on the requests both methods
    decoded, with its paired bootstrap 95% interval; an ablation is called faster or slower only
    when the interval excludes 1 (without records, no verdict is given)."""
    from ooospec.bench.intervals import paired_speedup

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
        lines.append(f"{row.variant}: {speed}, end to end {e2e:.2f}x; MAT {row.mat:.2f} vs {reference.mat:.2f}; "
                     f"bit-identical to AR {row.lossless:.0%} ({row.requests} requests).")
    return lines


def delay_sweep(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """OoO-Spec's speed over ToolSpec per injected sidecar latency (0 = the plain method)."""
    records = list(records)
    versus_ts = versus(records, "toolspec", by=("method",))
    rows = []
    for row in versus_ts.itertuples():
        spec = MethodSpec.parse(row.method)
        if spec != MethodSpec("ooospec") and not _delayed(spec):
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


def budget_sweep(records: Iterable[dict[str, Any]], default_nodes: int = 16) -> pd.DataFrame:
    """Speedup over AR per tree budget (ratio of total times), for each method base that was swept."""
    table = method_table(records, by=("method",))
    rows = []
    for row in table.itertuples():
        spec = MethodSpec.parse(row.method)
        if replace(spec, budget=None) != MethodSpec(spec.base):
            continue
        rows.append({"base": spec.base, "nodes": spec.budget or default_nodes, "method": row.method,
                     "decode_speedup": row.decode_speedup_total, "e2e_speedup": row.e2e_speedup_total,
                     "mat": row.mat, "requests": row.requests})
    out = pd.DataFrame(rows, columns=["base", "nodes", "method", "decode_speedup", "e2e_speedup", "mat", "requests"])
    swept = {b for b, m in zip(out.base, out.method) if MethodSpec.parse(m).budget is not None}
    return out[out.base.isin(swept)].sort_values(["base", "nodes"])


# ---------------------------------------------------------------- timelines


def pick_timelines(records: Iterable[dict[str, Any]], method: str = "ooospec") -> dict[str, dict[str, Any]]:
    """Representative requests of ``method``: the hint early (first boundary, and it supplied
    tokens), late (the latest arrival that still supplied tokens), wrong (arrived, supplied
    nothing or was rejected) and none (not ready before the request finished)."""
    candidates = [r for r in records if r["method"] == method and r.get("hint") is not None]
    picks: dict[str, dict[str, Any]] = {}

    def supplied(r: dict[str, Any]) -> int:
        return (r.get("source_counts") or {}).get("hint", 0)

    arrived = [r for r in candidates if r["hint"].get("ready_round") is not None]
    early = [r for r in arrived if r["hint"]["ready_round"] == 0 and supplied(r) > 0]
    if early:
        picks["early"] = max(early, key=supplied)
    late = [r for r in arrived if r["hint"]["ready_round"] > 0 and supplied(r) > 0]
    if late:
        picks["late"] = max(late, key=lambda r: r["hint"]["ready_round"])
    wrong = [r for r in arrived if supplied(r) == 0] + \
            [r for r in candidates if r["hint"].get("ready_round") is None and "not ready" not in (r["hint"].get("error") or "")]
    if wrong:
        picks["wrong"] = wrong[0]
    none = [r for r in candidates if "not ready" in (r["hint"].get("error") or "")]
    if none:
        picks["none"] = none[0]
    return picks


def reference_record(records: Iterable[dict[str, Any]], record: dict[str, Any], method: str = "ar") -> dict[str, Any] | None:
    """The record of ``method`` on the same target and request."""
    return next((r for r in records if r["method"] == method and r["target"] == record["target"]
                 and r["request_id"] == record["request_id"]), None)


# ---------------------------------------------------------------- prose lines


NAMES = {"ar": "AR", "pld": "PLD", "toolspec": "ToolSpec", "ooospec": "OoO-Spec"}


def headline_lines(table: pd.DataFrame) -> list[str]:
    """The main table in a few sentences (every number computed here, none typed in)."""
    lines = []
    for method in [m for m in dict.fromkeys(table.method) if m != "ar"]:
        sub = table[table.method == method]
        name = NAMES.get(method, method)
        lines.append(
            f"{name}: end-to-end speedup over AR {sub.e2e_speedup.mean():.2f}x on average over {len(sub)} cells "
            f"({sub.e2e_speedup.min():.2f}x-{sub.e2e_speedup.max():.2f}x); decode phase {sub.decode_speedup.mean():.2f}x "
            f"({sub.decode_speedup.min():.2f}x-{sub.decode_speedup.max():.2f}x); MAT {sub.mat.min():.2f}-{sub.mat.max():.2f}; "
            f"lossless {sub.lossless.mean():.0%}.")
    if {"ooospec", "toolspec"} <= set(table.method) and "decode_vs_toolspec" in table:
        sub = table[table.method == "ooospec"]
        lines.append(f"OoO-Spec vs ToolSpec: decode phase {sub.decode_vs_toolspec.mean():.2f}x "
                     f"({sub.decode_vs_toolspec.min():.2f}x-{sub.decode_vs_toolspec.max():.2f}x over cells), "
                     f"end to end {sub.e2e_vs_toolspec.mean():.2f}x.")
    return lines


def mismatches(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Records whose output differs from AR's: where, how close the target's top-2 logits were
    there, and whether that is a near-tie of the arithmetic (anything else fails the bench run)."""
    rows = [{"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"], "method": r["method"],
             "near_tie": bool(r.get("near_tie")), **(r.get("mismatch") or {})}
            for r in records if not r["identical_to_ar"]]
    return pd.DataFrame(rows, columns=["target", "benchmark", "request_id", "method", "near_tie", "position",
                                       "ar_token", "token", "ar_margin", "margin"])


def timeline_groups(records: Iterable[dict[str, Any]], method: str = "ooospec") -> dict[str, list[dict[str, Any]]]:
    """`pick_timelines` per target, each pick drawn next to AR on the same request:
    ``"<target>: <category>" -> [AR record, method record]``."""
    records = list(records)
    groups: dict[str, list[dict[str, Any]]] = {}
    for target in dict.fromkeys(r["target"] for r in records):
        own = [r for r in records if r["target"] == target]
        for category, record in pick_timelines(own, method).items():
            groups[f"{target}: {category}"] = [r for r in (reference_record(own, record), record) if r is not None]
    return groups


PHASE_LABELS = {"decode": "decode", "total": "end to end", "prefill": "prefill"}


INTERVAL_COLUMNS = ["target", "benchmark", "method", "vs", "phase", "n", "speedup", "ci_low", "ci_high",
                    "mean_of_ratios", "verdict", "n_all", "speedup_all", "speedup_per_token"]


def same_output(method: pd.DataFrame, ref: pd.DataFrame, reference: str) -> pd.Series:
    """Per paired request (rows of ``method`` and ``ref`` aligned on the same index): did the method
    write exactly the reference's tokens? Only then did both do the same work, so only then is a
    time ratio a speed ratio: a bf16 near-tie flip can change the output's length by a large factor.

    A pair where either record lacks ``output_ids`` (stored before outputs were kept) can only be
    judged against AR, through the method's ``identical_to_ar`` flag; against any other reference it
    counts as the same work."""
    known = method.output_ids.notna() & ref.output_ids.notna()
    compared = pd.Series([a == b for a, b in zip(method.output_ids, ref.output_ids)], index=method.index)
    fallback = method.identical if reference == "ar" else True
    return compared.where(known, fallback).astype(bool)


def _phase_speedups(base: pd.Series, new: pd.Series, base_tokens: pd.Series, new_tokens: pd.Series,
                    same: pd.Series, resamples: int) -> dict[str, Any]:
    """The interval columns of one phase: the same-work ratio of totals with its paired interval
    (the statistic the verdict reads), and, over all paired requests, the plain ratio of totals and
    the per-output-token ratio, which show how much the differing outputs move the cell."""
    from ooospec.bench.intervals import TOO_FEW, paired_speedup

    kept_base, kept_new = base[same].to_numpy(), new[same].to_numpy()
    if len(kept_base):
        pooled = paired_speedup(kept_base, kept_new, resamples=resamples)
        stats = {"n": pooled.n, "speedup": pooled.point, "ci_low": pooled.low, "ci_high": pooled.high,
                 "mean_of_ratios": float((kept_base / kept_new).mean()), "verdict": pooled.verdict}
    else:
        stats = {"n": 0, "speedup": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                 "mean_of_ratios": math.nan, "verdict": TOO_FEW}
    base_per_token = base.sum() / max(int(base_tokens.sum()), 1)
    new_per_token = new.sum() / max(int(new_tokens.sum()), 1)
    return {**stats, "n_all": len(base), "speedup_all": float(base.sum() / new.sum()),
            "speedup_per_token": float(base_per_token / new_per_token)}


def speedup_intervals(records: Iterable[dict[str, Any]], reference: str = "ar",
                      methods: Iterable[str] | None = None, phases: tuple[str, ...] = ("decode", "total"),
                      resamples: int = 2000) -> pd.DataFrame:
    """Per target x benchmark x method: the speedup over ``reference`` on the same work.

    ``n``, ``speedup``, ``ci_low``, ``ci_high``, ``mean_of_ratios`` and ``verdict`` are over the
    requests where the method wrote exactly the reference's output (`same_output`): the ratio of
    total times with its paired bootstrap 95% interval (requests resampled), the mean of
    per-request ratios beside it, and "faster" only when the interval excludes 1 (no request of the
    same work: n = 0, NaN, `intervals.TOO_FEW`). A request whose output differs at a rounding
    near-tie did different work, and one such request among 30 can move a ratio by 5-13%.

    Over all paired requests: ``n_all``, ``speedup_all`` (ratio of total times) and
    ``speedup_per_token`` (reference seconds per output token / method seconds per output token),
    so a reader sees what leaving the differing requests out changed.

    Records without ``output_ids`` (stored before outputs were kept) are judged by
    ``identical_to_ar`` when ``reference`` is ``"ar"`` and count as the same work otherwise.
    ``phases``: ``decode`` (after prefill), ``total`` (end to end, sidecar and IPC included) and
    ``prefill``."""
    df = frame(records)
    if df.empty:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    wanted = set(methods) if methods is not None else None
    ref = df[df.method == reference].set_index(KEYS)
    rows = []
    for (target, benchmark, method), group in df.groupby(["target", "benchmark", "method"], sort=False):
        if method == reference or (wanted is not None and method not in wanted):
            continue
        group = group.set_index(KEYS)
        both = group.index.intersection(ref.index)
        if not len(both):
            continue
        mine, theirs = group.loc[both], ref.loc[both]
        same = same_output(mine, theirs, reference)
        for phase in phases:
            column = f"{phase}_s"
            rows.append({"target": target, "benchmark": benchmark, "method": method, "vs": reference,
                         "phase": PHASE_LABELS[phase],
                         **_phase_speedups(theirs[column], mine[column], theirs.tokens, mine.tokens, same, resamples)})
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def prefill_ratios(records: Iterable[dict[str, Any]], methods: Iterable[str] = ("ooospec",)) -> pd.DataFrame:
    """OoO-Spec's own prefill against the shared one (AR's, which PLD and ToolSpec reuse), with its
    paired interval: below 1 when the sidecar's wave slows the target's prefill down, so a reader
    can tell an end-to-end difference that is prefill noise from one that the decode phase made."""
    table = speedup_intervals(records, reference="ar", methods=methods, phases=("prefill",))
    return table.rename(columns={"speedup": "shared / own prefill"})


def interval_pivot(intervals: pd.DataFrame, phase: str = "decode") -> pd.DataFrame:
    """One row per target x benchmark, one column per method: ``1.63x [1.41, 1.90]``, the same-work
    speedup of `speedup_intervals` (n in the index: the most same-work requests among the row's
    methods; a method with none shows ``no same output``)."""
    sub = intervals[intervals.phase == phase]
    if sub.empty:
        return pd.DataFrame()
    cells = sub.assign(cell=[f"{s:.2f}x [{lo:.2f}, {hi:.2f}]" if n else "no same output"
                             for s, lo, hi, n in zip(sub.speedup, sub.ci_low, sub.ci_high, sub.n)])
    n = cells.groupby(["target", "benchmark"]).n.max().rename("n")
    table = cells.pivot_table(index=["target", "benchmark"], columns="method", values="cell", aggfunc="first")
    return table.join(n).set_index("n", append=True)


def ar_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu") -> list[tuple[dict[str, Any], Any, Any]]:
    """Each AR record with its request (from its benchmark file) and its target's frozen surface,
    loaded once per benchmark and target. Every method writes AR's output (lossless), so AR's record
    per request stands for all; a record whose request is not in the file is left out."""
    from ooospec.bench.runner import load_benchmark
    from ooospec.models.formats import get_surface
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    ar = [r for r in records if r["method"] == "ar"]
    requests = {b: {q.id: q for q in load_benchmark(b)} for b in dict.fromkeys(r["benchmark"] for r in ar)}
    surfaces = {t: get_surface(prof.target(t).surface or "") for t in dict.fromkeys(r["target"] for r in ar)}
    return [(r, requests[r["benchmark"]][r["request_id"]], surfaces[r["target"]])
            for r in ar if r["request_id"] in requests[r["benchmark"]]]


def scored_ar_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu") -> list[tuple[dict[str, Any], Any]]:
    """Each AR record (`ar_outputs`) with its output scored against gold (`bench.accuracy.score_text`)
    in its target's frozen surface."""
    from ooospec.bench.accuracy import score_text

    return [(r, score_text(request, r["text"], surface, target=r["target"]))
            for r, request, surface in ar_outputs(records, profile)]


def output_accuracy(records: Iterable[dict[str, Any]], profile: str = "cpu") -> pd.DataFrame:
    """What is being accelerated: parse rate, name match, exact match (API-Bank, ToolAlpaca) or
    BFCL's own checker, per target x benchmark (`scored_ar_outputs`)."""
    from ooospec.bench.accuracy import accuracy_table

    return accuracy_table([score for _, score in scored_ar_outputs(records, profile)], by=("target", "benchmark"))


def output_kind(text: str) -> str:
    """A coarse label for an output that does not parse as a call in the target's surface."""
    body = text.strip()
    if "API-Request" in body:
        return "API-Bank's own API-Request: syntax"
    if body.startswith(("{", "[", "```", "<tool_call>")):
        return "call-like, not valid in its surface"
    return "prose (no call)"


def unparsed_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu", chars: int = 200) -> pd.DataFrame:
    """AR outputs that do not parse as a call in the target's frozen surface, with what they are
    (`output_kind`) and their first ``chars`` characters: where no schema FSM or hint can help."""
    rows = []
    for r, score in scored_ar_outputs(records, profile):
        if score.parsed:
            continue
        text = " ".join(r["text"].split())
        rows.append({"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"],
                     "kind": output_kind(r["text"]), "output": text[:chars] + ("..." if len(text) > chars else "")})
    return pd.DataFrame(rows, columns=["target", "benchmark", "request_id", "kind", "output"])


CEILING_METHOD = "ooospec:oracle"


def ceiling_table(head_to_head: pd.DataFrame, agreement: pd.DataFrame, aim: float = 1.35,
                  phase: str = "decode") -> pd.DataFrame:
    """OoO-Spec with its trained sidecar next to the oracle first-call hint, per target x benchmark:
    both over ToolSpec in ``phase`` (`speedup [95% interval]` on the same work, `speedup_intervals`),
    the share of AR outputs that hold a call (`hint_agreement`), and what the oracle hint says of
    ``aim``.

    The oracle first-call hint is ``ooospec:oracle``: the target's own first call, re-rendered,
    ready at once and merged through the same path as the trained sidecar's: what a perfect
    first-call prediction at no latency gives. It is not an upper bound on every possible hint: one
    that also followed later calls or changed the merge could do better. Where even its interval
    lies below ``aim``, a better-trained first-call sidecar is not expected to reach the aim on this
    target and hardware."""
    cells = head_to_head[head_to_head.phase == PHASE_LABELS.get(phase, phase)]
    rows = []
    for (target, benchmark), group in cells.groupby(["target", "benchmark"], sort=False):
        by_method = group.set_index("method")
        if not {"ooospec", CEILING_METHOD} <= set(by_method.index):
            continue
        trained, oracle = by_method.loc["ooospec"], by_method.loc[CEILING_METHOD]
        wrote = (agreement.loc[(target, benchmark), "target wrote a call"]
                 if (target, benchmark) in agreement.index else float("nan"))
        if oracle.ci_high < aim:
            reach = f"out of reach: even the oracle first-call hint is below {aim:.2f}x"
        elif oracle.speedup >= aim:
            reach = f"within reach: the oracle first-call hint reaches {aim:.2f}x"
        else:
            reach = f"not shown: the oracle first-call hint's interval holds {aim:.2f}x"
        rows.append({"target": target, "benchmark": benchmark, "n": int(trained.n),
                     "OoO-Spec / ToolSpec": f"{trained.speedup:.2f}x [{trained.ci_low:.2f}, {trained.ci_high:.2f}]",
                     "oracle hint / ToolSpec": f"{oracle.speedup:.2f}x [{oracle.ci_low:.2f}, {oracle.ci_high:.2f}]",
                     "share of the oracle hint's gain": ((trained.speedup - 1) / (oracle.speedup - 1)
                                                         if oracle.speedup > 1 else float("nan")),
                     "target wrote a call": wrote, f"aim {aim:.2f}x": reach})
    return pd.DataFrame(rows).set_index(["target", "benchmark"]) if rows else pd.DataFrame()


def same_work(row: pd.Series) -> str:
    """``1.28x [1.13, 1.50], n = 28 of 30 with the same output``: a row of `speedup_intervals` as a
    phrase that says which requests the ratio is over."""
    n_all = int(row.get("n_all", row.n))
    if not row.n:
        return f"no request of {n_all} with the same output"
    return f"{row.speedup:.2f}x [{row.ci_low:.2f}, {row.ci_high:.2f}], n = {int(row.n)} of {n_all} with the same output"


def verdict(intervals: pd.DataFrame, head_to_head: pd.DataFrame, phase: str = "decode",
            control: pd.DataFrame | None = None, machine: str | None = None) -> str:
    """The results in a few sentences, written from the run's own numbers (markdown).

    Per target x benchmark: OoO-Spec over ToolSpec and both over AR, each the ratio of total times
    over the same work (the requests whose output equals the reference's, `speedup_intervals`) with
    its 95% interval and n; "faster" only where the interval excludes 1. ``machine`` (e.g. "fp32 on
    a 2-core AVX2 CPU") opens the text, since every time in it belongs to that hardware."""
    from ooospec.bench.intervals import MIN_REQUESTS, TOO_FEW

    label = "decode phase" if phase == "decode" else "end to end"
    lines = [f"Measured in {machine}.", ""] if machine else []
    lines.append(f"**Verdict ({label}; speedup = ratio of total times over the same work, i.e. the requests whose "
                 "output equals the reference's, [95% paired bootstrap interval], n of the paired requests).**")
    h2h = head_to_head[(head_to_head.phase == phase) & (head_to_head.method == "ooospec")]
    ivs = intervals[intervals.phase == phase]
    for _, row in h2h.iterrows():
        def over_ar(method: str) -> str:
            cell = ivs[(ivs.target == row.target) & (ivs.benchmark == row.benchmark) & (ivs.method == method)]
            return "n/a" if cell.empty else same_work(cell.iloc[0])

        word = {"faster": "faster than", "slower": "slower than", "no difference shown": "not distinguishable from",
                TOO_FEW: f"not judged (n < {MIN_REQUESTS}) against"}[row.verdict]
        lines.append(f"* {row.target} / {row.benchmark}: OoO-Spec is {word} ToolSpec, {same_work(row)} "
                     f"(over AR: OoO-Spec {over_ar('ooospec')}; ToolSpec {over_ar('toolspec')}).")
    if control is not None and not control.empty:
        lines.append("\nEqual hardware (ToolSpec's target on both cores, two threads, against OoO-Spec's target on "
                     "one core and its sidecar on the other):")
        for _, row in control[(control.phase == phase) & (control.method == "ooospec")].iterrows():
            lines.append(f"* {row.target} / {row.benchmark}: OoO-Spec over ToolSpec on both cores "
                         f"{same_work(row)} ({row.verdict}).")
    oracle = head_to_head[(head_to_head.phase == phase) & (head_to_head.method == CEILING_METHOD)]
    if not oracle.empty:
        lines.append("\nThe oracle first-call hint (`ooospec:oracle`: the target's own first call, re-rendered, ready "
                     "at once and merged through the same path; not an upper bound on every possible hint, since one "
                     "that also followed later calls or changed the merge could do better), over ToolSpec:")
        for _, row in oracle.iterrows():
            lines.append(f"* {row.target} / {row.benchmark}: {same_work(row)} ({row.verdict}).")
    faster = int((h2h.verdict == "faster").sum())
    lines.append(f"\nOoO-Spec beats ToolSpec on the same work with an interval above 1 in {faster} of {len(h2h)} "
                 "target x benchmark cells here. The paper claims it in all 21 of its cells (GPUs, 4B-32B targets, a "
                 "sidecar trained on ~9,700 teacher-traced requests); the differences chapter says what differs.")
    return "\n".join(lines)
