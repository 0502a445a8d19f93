"""Figures of the results, ablation and timeline chapters, drawn from bench records and tables.

Every function returns a matplotlib Figure with a title, axis labels with units and a legend, so
a notebook cell is one call. Timelines are computed first as plain `Segment` lists
(`timeline_segments`), which the tests check without drawing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ooospec.bench.methods import MethodSpec
from ooospec.bench.config import HELD_OUT_BENCHMARKS
from ooospec.decoding.base import CREDITS

# one colour and one label per credit (`CREDITS` order), used by every figure and by the
# token attribution of `ooospec.report.attribution`
SOURCE_COLORS = {"fsm": "#4c72b0", "retrieval": "#dd8452", "pld": "#8172b3", "hint": "#2ca02c", "shared": "#e7ba52",
                 "bonus": "#bdbdbd"}
SOURCE_LABELS = {"fsm": "schema FSM", "retrieval": "call retrieval", "pld": "prompt lookup", "hint": "sidecar hint",
                 "shared": "several sources (shared)", "bonus": "target's own token (no draft)"}
assert tuple(SOURCE_COLORS) == tuple(SOURCE_LABELS) == CREDITS
PHASE_COLORS = {"prefill": "#525252", "queue": "#fdd0a2", "wave": "#e6550d", "transfer": "#fdae6b"}
METHOD_COLORS = {"ar": "#969696", "pld": "#8172b3", "toolspec": "#4c72b0", "ooospec": "#2ca02c"}


def _method_color(method: str, index: int) -> str:
    return METHOD_COLORS.get(method, plt.get_cmap("tab20")(index % 20))


# ---------------------------------------------------------------- speedups


def speedup_bars(table: pd.DataFrame, metric: str = "e2e_speedup", methods: list[str] | None = None,
                 title: str | None = None) -> Figure:
    """Speedup over AR per benchmark and method, one panel per target (AR = 1 is drawn as a line)."""
    methods = methods or [m for m in dict.fromkeys(table.method) if m != "ar"]
    targets = list(dict.fromkeys(table.target))
    what = "end to end" if metric.startswith("e2e") else "decode phase"
    fig, axes = plt.subplots(1, max(len(targets), 1), figsize=(4.8 * max(len(targets), 1), 3.8), squeeze=False)
    for ax, target in zip(axes[0], targets):
        sub = table[table.target == target]
        benchmarks = list(dict.fromkeys(sub.benchmark))
        width = 0.8 / max(len(methods), 1)
        for i, method in enumerate(methods):
            values = [sub[(sub.benchmark == b) & (sub.method == method)][metric].mean() for b in benchmarks]
            x = np.arange(len(benchmarks)) + (i - (len(methods) - 1) / 2) * width
            bars = ax.bar(x, values, width, label=method, color=_method_color(method, i))
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(benchmarks)))
        ax.set_xticklabels([f"{b}\n(held out)" if b in HELD_OUT_BENCHMARKS else b for b in benchmarks])
        ax.set_title(target)
        ax.set_ylabel(f"speedup over AR, {what} (x)")
        ax.set_xlabel("benchmark")
    axes[0][0].legend(title="method", fontsize=8)
    fig.suptitle(title or f"Speedup over autoregressive decoding ({what}; mean of per-request ratios)")
    fig.tight_layout()
    return fig


def headline_figure(ours: pd.DataFrame, paper: dict[str, Any], ours_label: str = "ours (CPU, 2 cores)") -> Figure:
    """The paper's headline next to ours. ``ours`` is `ooospec.report.tables.headline` output for the
    decode phase and end to end (columns method, mean, min, max, metric); ``paper`` is
    `paper_numbers.headline()`."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    names = ["ToolSpec", "OoO-Spec"]
    means = [paper["toolspec_mean"], paper["ooospec_mean"]]
    bars = left.bar(names, means, color=[METHOD_COLORS["toolspec"], METHOD_COLORS["ooospec"]])
    left.bar_label(bars, fmt="%.2f", fontsize=8)
    lo, hi = paper["ooospec_range"]
    left.errorbar([1], [paper["ooospec_mean"]], yerr=[[paper["ooospec_mean"] - lo], [hi - paper["ooospec_mean"]]],
                  color="black", capsize=6, label=f"OoO-Spec range over {paper['cells']} cells")
    left.set_title(f"paper (GPUs): {paper['cells']} target x benchmark cells")
    left.set_ylabel("speedup over AR (x)")
    left.set_xlabel("method")
    left.axhline(1.0, color="black", lw=0.8, ls="--")
    left.legend(fontsize=8, loc="upper left")

    metrics = list(dict.fromkeys(ours.metric)) if not ours.empty else []
    methods = [m for m in ("toolspec", "ooospec") if m in set(ours.method)] if not ours.empty else []
    width = 0.8 / max(len(metrics), 1)
    for j, metric in enumerate(metrics):
        sub = ours[ours.metric == metric].set_index("method")
        x = np.arange(len(methods)) + (j - (len(metrics) - 1) / 2) * width
        values = [sub.loc[m, "mean"] for m in methods]
        bars = right.bar(x, values, width, color=[METHOD_COLORS.get(m, "gray") for m in methods],
                         hatch="" if metric.startswith("e2e") else "//", edgecolor="white",
                         label="end to end" if metric.startswith("e2e") else "decode phase")
        right.bar_label(bars, fmt="%.2f", fontsize=8)
        right.errorbar(x, values, yerr=[[v - sub.loc[m, "min"] for m, v in zip(methods, values)],
                                        [sub.loc[m, "max"] - v for m, v in zip(methods, values)]],
                       fmt="none", color="black", capsize=4)
    cells = int(ours.cells.max()) if not ours.empty else 0
    right.set_xticks(np.arange(len(methods)))
    right.set_xticklabels(["ToolSpec" if m == "toolspec" else "OoO-Spec" for m in methods])
    right.set_title(f"{ours_label}: {cells} cells")
    right.set_xlabel("method")
    right.set_ylabel("speedup over AR (x)")
    right.yaxis.set_tick_params(labelleft=True)
    right.axhline(1.0, color="black", lw=0.8, ls="--")
    right.legend(fontsize=8, loc="upper left", title="bar: mean; whiskers: min-max", title_fontsize=7)
    fig.suptitle("Headline: the paper's GPU numbers (left) vs this artifact's CPU run (right)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- timelines


@dataclass
class Segment:
    lane: str
    start: float
    end: float
    kind: str  # prefill | a draft source | bonus | queue | wave | transfer
    threads: int = 1  # torch threads the target's forward ran with (elastic placement: 2 on both cores)


@dataclass
class Mark:
    lane: str
    t: float
    label: str


def _events(record: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in record.get("trace", []) if e["kind"] == kind]


def timeline_segments(record: dict[str, Any], lane: str | None = None) -> tuple[list[Segment], list[Mark]]:
    """Bars and marks of one decode on the request's clock (arrival = 0).

    Each verify round spans from the previous round's end to its own end and is split by the
    sources of the tokens it committed. A shared prefill (AR/PLD/ToolSpec start from one measured
    prefill) is drawn with its measured length and the rounds shifted after it.
    """
    lane = lane or f"target: {record['method']}"
    starts, ends = _events(record, "prefill_start"), _events(record, "prefill_end")
    if not starts or not ends:
        raise ValueError(f"record {record.get('id')}: the trace has no prefill events")
    t0 = starts[0]["t"]
    shift = record["prefill_s"] - (ends[0]["t"] - t0) if record.get("shared_prefill") else 0.0
    segments = [Segment(lane, t0, ends[0]["t"] + shift, "prefill")]
    previous = ends[0]["t"] + shift
    for event in _events(record, "round"):
        end = event["t"] + shift
        credits = event.get("credits") or ["bonus"]
        span = (end - previous) / len(credits)
        cursor = previous
        for source, count in _runs(credits):
            segments.append(Segment(lane, cursor, cursor + span * count, source, event.get("threads", 1)))
            cursor += span * count
        previous = end
    marks: list[Mark] = []
    hint = record.get("hint") or {}
    submits = _events(record, "sidecar_submit")
    if hint.get("wave_start_t") is not None:
        sidecar = "sidecar"
        if submits:
            segments.append(Segment(sidecar, submits[0]["t"], hint["wave_start_t"], "queue"))
        segments.append(Segment(sidecar, hint["wave_start_t"], hint["wave_end_t"], "wave"))
        if hint.get("received_t") is not None and hint["received_t"] > hint["wave_end_t"]:
            segments.append(Segment(sidecar, hint["wave_end_t"], hint["received_t"], "transfer"))
    for event in _events(record, "hint_ready"):
        marks.append(Mark(lane, event["t"] + shift, f"hint joins at boundary {event['round']}"))
    for event in _events(record, "hint_rejected"):
        marks.append(Mark(lane, event["t"] + shift, f"hint rejected: {str(event.get('reason'))[:40]}"))
    return segments, marks


def _runs(items: list[str]) -> list[tuple[str, int]]:
    runs: list[tuple[str, int]] = []
    for item in items:
        if runs and runs[-1][0] == item:
            runs[-1] = (item, runs[-1][1] + 1)
        else:
            runs.append((item, 1))
    return runs


def draw_timeline(ax: plt.Axes, records: list[dict[str, Any]], title: str = "") -> None:
    """Gantt lanes for one request: each record's target lane, plus the sidecar lane if any."""
    segments, marks = [], []
    for record in records:
        s, m = timeline_segments(record)
        segments += s
        marks += m
    lanes = list(dict.fromkeys(s.lane for s in segments))
    y = {lane: i for i, lane in enumerate(lanes)}
    for s in segments:
        color = SOURCE_COLORS.get(s.kind) or PHASE_COLORS.get(s.kind, "black")
        both = s.threads > 1  # hatched: the round ran on both cores (the elastic target borrowed the sidecar's)
        ax.barh(y[s.lane], max(s.end - s.start, 1e-4), left=s.start, height=0.6, color=color,
                edgecolor="white" if both else "none", hatch="////" if both else None, linewidth=0)
    for mark in marks:
        ax.axvline(mark.t, color="#d62728", lw=1.2, ls=":")
        ax.annotate(mark.label, (mark.t, y[mark.lane] + 0.38), fontsize=9, color="#d62728",
                    xytext=(3, 0), textcoords="offset points")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=10)
    ax.invert_yaxis()
    ax.set_xlabel("time since request arrival (s)")
    ax.set_title(title, fontsize=10)


def timeline_legend(fig: Figure) -> None:
    handles = [Patch(color=PHASE_COLORS["prefill"], label="target prefill")]
    handles += [Patch(color=SOURCE_COLORS[s], label=f"round: {SOURCE_LABELS[s]}") for s in SOURCE_COLORS]
    handles += [Patch(color=PHASE_COLORS["queue"], label="sidecar: submitted, not started"),
                Patch(color=PHASE_COLORS["wave"], label="sidecar: slot wave"),
                Patch(color=PHASE_COLORS["transfer"], label="sidecar: done, until a boundary polls (incl. injected delay)"),
                Patch(facecolor="#bbbbbb", edgecolor="white", hatch="////",
                      label="hatched round: the target on both cores (elastic)")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False)


def timelines_figure(picks: dict[str, list[dict[str, Any]]], title: str = "Per-request timelines") -> Figure:
    """One Gantt panel per pick (label -> the records of one request to draw, e.g. AR and OoO-Spec)."""
    n = max(len(picks), 1)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.9 * n + 1.2), squeeze=False)
    for ax, (label, records) in zip(axes[:, 0], picks.items()):
        first = records[0]
        draw_timeline(ax, records, f"{label}: {first['benchmark']} / {first['request_id']}")
    if not picks:
        axes[0, 0].text(0.5, 0.5, "no records to draw", ha="center", va="center")
        axes[0, 0].set_xlabel("time since request arrival (s)")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, min(0.4, 0.85 / fig.get_figheight()), 1, 1))  # room for a 3-row legend
    timeline_legend(fig)
    return fig


def arrival_figure(arrivals: pd.DataFrame, title: str = "Where the hint joined decoding") -> Figure:
    """Left: the boundary index that first saw the hint (histogram stacked over target x benchmark,
    so a bar's height counts every request); right: every request's outcome, per target and benchmark."""
    from ooospec.report.hint_tables import ARRIVAL_BUCKETS

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.1]})
    def label(df: pd.DataFrame) -> pd.Series:
        return df.target.str.split("-").str[0] + " / " + df.benchmark

    ready = arrivals.dropna(subset=["ready_round"]) if not arrivals.empty else arrivals
    if not ready.empty:
        groups = [(name, sub.ready_round.astype(int)) for name, sub in ready.groupby(label(ready), sort=True)]
        top = int(ready.ready_round.max())
        left.hist([values for _, values in groups], bins=np.arange(-0.5, max(top, 1) + 1.5, 1), stacked=True,
                  label=[name for name, _ in groups], color=[plt.get_cmap("tab10")(i) for i in range(len(groups))])
        left.legend(fontsize=8, title="target / benchmark", title_fontsize=8)
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("boundary (verify round) that first saw the hint")
    left.set_ylabel("requests (stacked)")
    left.set_title("arrival boundary (0 = first boundary after prefill)")
    if not arrivals.empty:
        counts = arrivals.assign(group=label(arrivals)).groupby(["group", "bucket"]).size().unstack(fill_value=0)
        counts = counts.reindex(columns=[b for b in ARRIVAL_BUCKETS if b in counts.columns])
        counts.sort_index(ascending=False).plot.barh(stacked=True, ax=right, colormap="viridis")
        right.legend(fontsize=8, title="outcome", title_fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel("requests")
    right.set_ylabel("")
    right.set_title("hint outcome per request")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- ablations


def ablation_bars(table: pd.DataFrame, metric: str = "decode_speedup", title: str | None = None) -> Figure:
    """One horizontal bar per method (pooled over the ablation slice)."""
    what = "decode phase" if "decode" in metric else "end to end"
    rows = table.dropna(subset=[metric])
    fig, ax = plt.subplots(figsize=(8, 0.38 * len(rows) + 1.5))
    colors = [_method_color(MethodSpec.parse(m).base, i) for i, m in enumerate(rows.method)]
    bars = ax.barh([f"{m}  ({v})" for m, v in zip(rows.method, rows.ablation)], rows[metric], color=colors)
    ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=2)
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    ax.invert_yaxis()
    reference = "AR" if "speedup" in metric else metric.rsplit("_vs_", 1)[-1].removesuffix("_total")
    ax.set_xlabel(f"speedup over {reference}, {what} (x)")
    ax.set_title(title or f"Ablations: speedup over {reference} ({what})")
    bases = dict.fromkeys(MethodSpec.parse(m).base for m in rows.method)
    ax.legend(handles=[Patch(color=_method_color(b, i), label=b) for i, b in enumerate(bases)], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), title="method base")
    fig.tight_layout()
    return fig


def delay_sweep_figure(sweep: pd.DataFrame, crossing: float | None) -> Figure:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(sweep.delay_s, sweep.decode_vs_toolspec, "o-", color=METHOD_COLORS["ooospec"], label="decode phase")
    ax.plot(sweep.delay_s, sweep.e2e_vs_toolspec, "s--", color="#31a354", label="end to end")
    ax.axhline(1.0, color=METHOD_COLORS["toolspec"], lw=1, ls="--", label="ToolSpec")
    if crossing is not None:
        ax.axvline(crossing, color="#d62728", ls=":", label=f"crossover {crossing:.2f} s")
    ax.set_xlabel("injected sidecar latency per request (s)")
    ax.set_ylabel("OoO-Spec speed / ToolSpec speed (x)")
    ax.set_title("Latency sweep: when does the hint stop paying?")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def budget_sweep_figure(sweep: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (base, sub) in enumerate(sweep.groupby("base", sort=False)):
        ax.plot(sub.nodes, sub.decode_speedup, "o-", color=_method_color(base, i), label=f"{base}: decode phase")
        ax.plot(sub.nodes, sub.e2e_speedup, "s--", color=_method_color(base, i), alpha=0.6, label=f"{base}: end to end")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft nodes per verify tree (ToolSpec budget; OoO-Spec adds its hint chain)")
    ax.set_ylabel("speedup over AR (x)")
    ax.set_title("Tree budget sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def source_shares_figure(records: Iterable[dict[str, Any]], title: str = "Who supplied the committed tokens") -> Figure:
    """Stacked share of committed tokens per draft source, per method (pooled)."""
    totals: dict[str, Counter] = {}
    for r in records:
        totals.setdefault(r["method"], Counter()).update(r.get("source_counts") or {})
    methods = list(totals)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(methods) + 1.6))
    left = np.zeros(len(methods))
    for source in SOURCE_COLORS:
        shares = np.array([totals[m][source] / max(sum(totals[m].values()), 1) for m in methods])
        ax.barh(methods, shares, left=left, color=SOURCE_COLORS[source], label=SOURCE_LABELS[source])
        left += shares
    ax.invert_yaxis()
    ax.set_xlabel("share of committed tokens")
    ax.set_xlim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- the ToolSpec study (notebook 03)


def cost_curve_figure(curve: pd.DataFrame, chosen: dict[str, int] | None = None) -> Figure:
    """Forward time over one-token-step time against tree size, one line per target; the chosen
    default budget of each target is marked."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (target, sub) in enumerate(curve.groupby("target", sort=False)):
        color = plt.get_cmap("tab10")(i)
        ax.plot(sub["nodes"], sub["min_ratio"], "o-", color=color, label=f"{target} (min of repeats)")
        ax.plot(sub["nodes"], sub["ratio"], "o--", color=color, alpha=0.45, label=f"{target} (median)")
        if chosen and target in chosen:
            ax.axvline(chosen[target], color=color, lw=0.8, ls=":")
    ax.plot([0, curve["nodes"].max()], [1, 1 + curve["nodes"].max()], color="black", lw=0.6, ls=":",
            label="one step per node (sequential)")
    ax.set_ylim(0, max(curve["ratio"].max(), curve["min_ratio"].max()) * 1.15)
    ax.set_xlabel("draft nodes in the tree (forward rows = nodes + 1)")
    ax.set_ylabel("verify forward time / one-token step (x)")
    ax.set_title("Verify cost on CPU (fp32): what a tree node costs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def arithmetic_figure(points: list[dict[str, Any]]):
    """Verify cost against rows per forward, one panel per target, one line per arithmetic option
    and thread count; the legend gives the one-row step in ms (what the ratios are relative to)."""
    import pandas as pd

    frame = pd.DataFrame(points)
    targets = list(dict.fromkeys(frame.target))
    fig, axes = plt.subplots(1, len(targets), figsize=(6.2 * len(targets), 3.9), squeeze=False)
    for ax, target in zip(axes[0], targets):
        for p in frame[frame.target == target].to_dict("records"):  # dicts: a row's `.dtype` is the Series' own
            rows = sorted(int(r) for r in p["ratios"])
            kernels = f" {p['kernels']}" if p.get("kernels") else ""  # fp32: packed or plain linears; bf16: fp32 logits or its own head
            label = f"{p['dtype']}{kernels}, {p['attention']}, {p['threads']} thr (step {p['step_ms']:.0f} ms)"
            ax.plot(rows, [p["ratios"][str(r)] if str(r) in p["ratios"] else p["ratios"][r] for r in rows], marker="o",
                    ms=3, lw=1.6 if p["attention"] == "sdpa" else 1.0, ls="-" if p["dtype"] == "bfloat16" else "--",
                    label=label)
        ax.axhline(1.0, color="black", lw=0.6)
        ax.axvline(17, color="#999999", lw=0.8, ls=":")
        ax.set(title=target, xlabel="rows in one forward (root + tree nodes)", ylabel="time / one-row step",
               xscale="log", xticks=[1, 2, 4, 8, 17, 32, 64])
        ax.set_xticklabels(["1", "2", "4", "8", "17", "32", "64"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def per_request_scatter(records: Iterable[dict[str, Any]], baseline: str = "toolspec", method: str = "ooospec",
                        phase: str = "decode") -> Figure:
    """Per request, the baseline's time against the method's (one panel per target, one colour per
    benchmark, log axes): points under the diagonal are requests the method finished sooner. The
    spread behind a pooled ratio, which one number hides."""
    column = f"{phase}_s"
    rows = pd.DataFrame([{"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"],
                          "method": r["method"], "seconds": r[column]} for r in records
                         if r["method"] in (baseline, method)])
    targets = list(dict.fromkeys(rows.target)) if not rows.empty else []
    fig, axes = plt.subplots(1, max(len(targets), 1), figsize=(5.0 * max(len(targets), 1), 4.4), squeeze=False)
    for ax, target in zip(axes[0], targets):
        sub = rows[rows.target == target].pivot_table(index=["benchmark", "request_id"], columns="method",
                                                      values="seconds", aggfunc="first").dropna()
        for i, (benchmark, group) in enumerate(sub.groupby(level="benchmark", sort=False)):
            ax.scatter(group[baseline], group[method], s=16, alpha=0.8, color=f"C{i}", label=f"{benchmark} (n={len(group)})")
        if len(sub):
            lo, hi = sub.min().min() * 0.8, sub.max().max() * 1.25
            ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls="--")
            ax.set(xlim=(lo, hi), ylim=(lo, hi))
        ax.set(xscale="log", yscale="log", title=f"{target}: n = {len(sub)} requests",
               xlabel=f"{baseline} {phase} time (s)", ylabel=f"{method} {phase} time (s)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Per request: {method} vs {baseline}, {phase} phase (below the diagonal: {method} faster)", fontsize=10)
    fig.tight_layout()
    return fig
