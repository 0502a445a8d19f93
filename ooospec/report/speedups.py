"""Speedups over the same work: the ratio of total times over the requests where both methods wrote
the same output, with n and its paired bootstrap 95% interval (`ooospec.report.intervals`), beside
the all-requests and per-output-token ratios."""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from ooospec.report.tables import KEYS, frame


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
    from ooospec.report.intervals import TOO_FEW, paired_speedup

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


def interval_cell(row: Any) -> str:
    """One row of `speedup_intervals` as a table cell: ``1.63x [1.41, 1.90]``, or ``no same output``
    where no request of the same work was left (n = 0)."""
    return f"{row.speedup:.2f}x [{row.ci_low:.2f}, {row.ci_high:.2f}]" if row.n else "no same output"


def interval_pivot(intervals: pd.DataFrame, phase: str = "decode") -> pd.DataFrame:
    """One row per target x benchmark, one column per method: ``1.63x [1.41, 1.90]``, the same-work
    speedup of `speedup_intervals` (n in the index: the most same-work requests among the row's
    methods; a method with none shows ``no same output``)."""
    sub = intervals[intervals.phase == phase]
    if sub.empty:
        return pd.DataFrame()
    cells = sub.assign(cell=[interval_cell(row) for row in sub.itertuples()])
    n = cells.groupby(["target", "benchmark"]).n.max().rename("n")
    table = cells.pivot_table(index=["target", "benchmark"], columns="method", values="cell", aggfunc="first")
    return table.join(n).set_index("n", append=True)
