"""Bench records -> the per-cell tables of the results chapter: speed over AR, MAT, lossless rate.

Ratio conventions (every one is "AR time / method time", so larger is faster):

* ``*_speedup``: the mean over requests of the per-request ratio (the paper's convention);
* ``*_speedup_total``: the ratio of summed times (dominated by long requests);
* `ooospec.report.speedups.speedup_intervals` (the verdict's numbers): the ratio of summed times over
  the same work, i.e. the requests where the method wrote exactly the reference's output, with its
  paired interval;
* ``decode``: the decode phase only (end of prefill to the last token); ``e2e``: end to end
  (per-request setup + prefill + decode). On CPU the prefill dominates end-to-end time, which is
  why both are reported.

MAT is pooled: committed tokens after the first (which no draft could cover) over verify forwards.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable

import pandas as pd

from ooospec.bench.config import HELD_OUT_BENCHMARKS
from ooospec.bench.methods import MethodSpec
from ooospec.decoding.base import CREDITS


KEYS = ["target", "benchmark", "request_id"]


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
        f"e2e_vs_{reference}_total": g.ref_total_s.sum() / g.total_s.sum(),
    }), include_groups=False)
    return out.reset_index()


def toolspec_on_same_cores(method: str) -> str:
    """The ToolSpec a method is compared with on equal hardware: on both cores for a method whose
    target uses both (elastic OoO-Spec, a ``both_cores`` control), else on one core."""
    spec = MethodSpec.parse(method)
    return "toolspec:both_cores" if spec.elastic or spec.both_cores else "toolspec"


def main_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """The paper-style table: per target x benchmark x method, plus the method against ToolSpec on
    the same cores (`toolspec_on_same_cores`; NaN where that ToolSpec did not run), and the requests
    of the cell that could not be decoded at all (`failed_requests`: part of n)."""
    failed = Counter((f["target"], f["benchmark"]) for f in getattr(records, "failed", []))
    records = list(records)
    table = method_table(records)
    if table.empty:
        return table
    keys = ["target", "benchmark", "method"]
    references = {m: toolspec_on_same_cores(m) for m in set(table.method)}
    parts = []
    for reference in sorted(set(references.values()) & set(table.method)):
        against = versus(records, reference)
        against = against[against.method.map(references) == reference]
        parts.append(against.rename(columns=lambda c: c.replace(f"_vs_{reference}", "_vs_toolspec")))
    if parts:
        table = table.merge(pd.concat(parts), on=keys, how="left")
    table["toolspec_cores"] = table.method.map(lambda m: "both" if references[m] != "toolspec" else "one")
    table["held_out"] = table.benchmark.isin(HELD_OUT_BENCHMARKS)
    table["failed_requests"] = [failed.get((t, b), 0) for t, b in zip(table.target, table.benchmark)]
    return table


# what a reader needs at page width; the full tables stay one click away (collapsed in the book)
COMPACT = {
    "main": {"target": "target", "benchmark": "benchmark", "method": "method", "requests": "n",
             "decode_speedup_total": "decode x AR", "e2e_speedup_total": "e2e x AR",
             "decode_vs_toolspec_total": "decode x ToolSpec", "toolspec_cores": "ToolSpec cores", "mat": "MAT",
             "lossless": "= AR", "near_ties": "near-ties", "failed_requests": "failed"},
    "hint": {"target": "target", "benchmark": "benchmark", "method": "method", "requests": "n",
             "median_ready_round": "ready at boundary", "hint_share_of_drafted": "hint share of drafted",
             "shared_share_of_drafted": "shared share", "payload_bytes": "payload B (median)", "max_payload_bytes": "payload B (max)",
             "median_wave_s": "wave s", "wave_over_ar_prefill": "wave / prefill"},
    "ablation": {"ablation": "ablation", "requests": "n", "decode_speedup_total": "decode x AR",
                 "decode_vs_toolspec_total": "decode x ToolSpec (1 core)", "mat": "MAT", "lossless": "= AR",
                 "hint_share_of_drafted": "hint share", "compared_with": "compared with"},
    "mismatch": {"target": "target", "benchmark": "benchmark", "method": "method", "request_id": "request",
                 "position": "at token", "ar_margin": "AR top-2 gap", "near_tie": "near-tie"},
}


def compact(table: pd.DataFrame, kind: str, digits: int = 2) -> pd.DataFrame:
    """The columns of ``COMPACT[kind]`` that ``table`` has, renamed for people and rounded (ratios
    of totals: the primary statistic; the full table keeps the means of ratios too)."""
    columns = {k: v for k, v in COMPACT[kind].items() if k in table.columns}
    out = table[list(columns)].rename(columns=columns).round(digits)
    keys = [c for c in ("target", "benchmark", "method", "ablation") if c in out.columns]
    return out.set_index(keys) if keys else out


def headline(table: pd.DataFrame, metric: str = "e2e_speedup") -> pd.DataFrame:
    """Per method over the target x benchmark cells: unweighted mean, min and max of ``metric``
    (the paper's "2.46x-5.34x, mean 3.89x" is this over its 21 cells)."""
    if table.empty:
        return pd.DataFrame(columns=["method", "cells", "mean", "min", "max"])
    grouped = table.groupby("method", sort=False)[metric]
    return pd.DataFrame({"cells": grouped.size(), "mean": grouped.mean(), "min": grouped.min(),
                         "max": grouped.max()}).reset_index()


NAMES = {"ar": "AR", "pld": "PLD", "toolspec": "ToolSpec", "ooospec": "OoO-Spec (elastic)",
         "ooospec:static": "OoO-Spec (static, the paper's placement)", "toolspec:both_cores": "ToolSpec on both cores"}


def headline_lines(table: pd.DataFrame) -> list[str]:
    """The main table in a few sentences (every number computed here, none typed in): per method the
    ratio of total times over AR, its range over the cells, MAT and the lossless share; then
    OoO-Spec against ToolSpec on the same cores (the same-work intervals are the verdict's)."""
    lines = []
    for method in [m for m in dict.fromkeys(table.method) if m != "ar"]:
        sub = table[table.method == method]
        name = NAMES.get(method, method)
        lines.append(
            f"{name}: over AR end to end {sub.e2e_speedup_total.mean():.2f}x on average over {len(sub)} cells "
            f"({sub.e2e_speedup_total.min():.2f}x-{sub.e2e_speedup_total.max():.2f}x), decode phase "
            f"{sub.decode_speedup_total.mean():.2f}x ({sub.decode_speedup_total.min():.2f}x-"
            f"{sub.decode_speedup_total.max():.2f}x); MAT {sub.mat.min():.2f}-{sub.mat.max():.2f}; "
            f"lossless {sub.lossless.mean():.0%} (ratios of total times).")
    for method in [m for m in ("ooospec:static", "ooospec") if m in set(table.method)]:
        sub = (table[table.method == method].dropna(subset=["decode_vs_toolspec_total"])
               if "decode_vs_toolspec_total" in table else table.iloc[:0])
        if len(sub):
            cores = "one core" if sub.toolspec_cores.iloc[0] == "one" else "both cores"
            placement = "static" if method == "ooospec:static" else "elastic"
            lines.append(f"OoO-Spec ({placement}) vs ToolSpec on {cores}: decode phase "
                         f"{sub.decode_vs_toolspec_total.mean():.2f}x ({sub.decode_vs_toolspec_total.min():.2f}x-"
                         f"{sub.decode_vs_toolspec_total.max():.2f}x over cells), end to end "
                         f"{sub.e2e_vs_toolspec_total.mean():.2f}x (ratios of total times).")
    return lines


def mismatches(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Records whose output differs from AR's: where, how close the target's top-2 logits were
    there, and whether that is a near-tie of the arithmetic (anything else fails the bench run)."""
    rows = [{"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"], "method": r["method"],
             "near_tie": bool(r.get("near_tie")), **(r.get("mismatch") or {})}
            for r in records if not r["identical_to_ar"]]
    return pd.DataFrame(rows, columns=["target", "benchmark", "request_id", "method", "near_tie", "position",
                                       "ar_token", "token", "ar_margin", "margin"])
