"""Figures of the ToolSpec chapter (notebook 03): the verify-cost curve and per-method bars."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

METHOD_COLORS = {"ar": "#969696", "pld": "#8172b3", "toolspec": "#4c72b0"}


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


def method_bars(summary: pd.DataFrame, metrics: tuple[str, ...] = ("MAT", "decode speedup (mean)",
                                                                   "e2e speedup (mean)")) -> Figure:
    """One panel per metric: bars per benchmark and method, a group per target."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.8), squeeze=False)
    summary = summary.assign(group=summary["target"].str.split("-").str[0] + "\n" + summary["benchmark"]
                             .str.replace("eval_", "", regex=False))
    groups = list(dict.fromkeys(summary["group"]))
    methods = list(dict.fromkeys(summary["method"]))
    width = 0.8 / len(methods)
    for ax, metric in zip(axes[0], metrics):
        for i, method in enumerate(methods):
            values = [summary[(summary.group == g) & (summary.method == method)][metric].mean() for g in groups]
            x = np.arange(len(groups)) + (i - (len(methods) - 1) / 2) * width
            bars = ax.bar(x, values, width, label=method, color=METHOD_COLORS.get(method, f"C{i}"))
            ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_xticks(np.arange(len(groups)))
        ax.set_xticklabels(groups, fontsize=7)
        ax.set_ylabel(metric + (" (tokens / forward)" if metric == "MAT" else " (x over AR)"))
        ax.set_xlabel("target / benchmark")
        ax.set_title(metric)
    axes[0][0].legend(title="method", fontsize=7)
    fig.tight_layout()
    return fig


def budget_figure(sweep: pd.DataFrame) -> Figure:
    """ToolSpec's MAT and decode speedup against its node budget."""
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for i, (name, sub) in enumerate(sweep.groupby(["target", "benchmark"], sort=False)):
        label = " / ".join(name).replace("eval_", "")
        ax.plot(sub["budget"], sub["decode speedup (mean)"], "o-", color=f"C{i}", label=f"{label}: decode speedup")
        ax.plot(sub["budget"], sub["MAT"], "s--", color=f"C{i}", alpha=0.6, label=f"{label}: MAT")
    ax.axhline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xlabel("tree budget (draft nodes = depth limit)")
    ax.set_ylabel("x over AR / tokens per forward")
    ax.set_title("ToolSpec: acceptance grows with the budget, speed does not")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
