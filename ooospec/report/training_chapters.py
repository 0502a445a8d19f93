"""The training chapters' tables and figures (01 teacher, 02 sidecar): what the book shows of the
training stages, kept out of the modules that train, so that training imports no plotting and a
figure can change without touching a stage's code (whose hash keys its artifacts)."""

from __future__ import annotations

import json
from typing import Any

from ooospec.training.lora import AdapterRun
from ooospec.training.teacher import committed_dir, validity_by_source


# ---------------------------------------------------------------- 01: the teacher


def validity_table(records: list[dict[str, Any]]):
    """`validity_by_source` as a DataFrame with a total row (for the notebook)."""
    import pandas as pd

    rows = [{"source": s, **{k: v for k, v in r.items() if k != "reasons"},
             **{f"invalid: {k}": n for k, n in r["reasons"].items()}}
            for s, r in validity_by_source(records).items()]
    frame = pd.DataFrame(rows).fillna(0)
    total = {"source": "all", **frame.drop(columns=["source", "valid_rate"]).sum(numeric_only=True).to_dict()}
    total["valid_rate"] = round(total["valid"] / max(total["requests"], 1), 4)
    frame = pd.concat([frame, pd.DataFrame([total])], ignore_index=True)
    counts = [c for c in frame.columns if c not in ("source", "valid_rate")]
    return frame.astype({c: int for c in counts})


def validity_figure(records: list[dict[str, Any]], title: str = "Teacher: first valid call per source"):
    """Bar chart of the valid-call rate per source, each bar labelled valid/requests."""
    import matplotlib.pyplot as plt

    table = validity_by_source(records)
    sources = list(table)
    rates = [table[s]["valid_rate"] * 100 for s in sources]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.barh(sources, rates, color="#4c72b0")
    for bar, source in zip(bars, sources):
        row = table[source]
        ax.text(bar.get_width() + 1, bar.get_y() + bar.get_height() / 2, f"{row['valid']}/{row['requests']}",
                va="center", fontsize=9)
    ax.set_xlim(0, 112)
    ax.set_xlabel("requests with a valid first call (%)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def committed_sets() -> list[dict[str, Any]]:
    """One row per committed trace set (chunk): its split, records, valid calls, measured seconds
    per request and the code commit that made it, from its `provenance.json`."""
    rows = []
    for folder in sorted(p.parent for p in committed_dir().glob("*/provenance.json")):
        provenance = json.loads((folder / "provenance.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        rows.append({"set": folder.name, "split": config.get("split"), "records": provenance.get("records"),
                     "valid": provenance.get("valid"),
                     "s/request": provenance.get("throughput", {}).get("seconds_per_request"),
                     "decoder": config.get("generation", {}).get("decoder"),
                     "arithmetic": config.get("generation", {}).get("dtype"),
                     "code commit": (provenance.get("code_commit") or "")[:10]})
    return rows


# ---------------------------------------------------------------- 02: the sidecar


def loss_curves_figure(runs: dict[str, AdapterRun]):
    """One panel per trained adapter: the loss of every optimizer step and its running mean."""
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.6), squeeze=False)
    for ax, (name, run) in zip(axes[0], runs.items()):
        log = pd.DataFrame(run.loss_log)
        ax.plot(log.step, log.loss, lw=0.8, alpha=0.5, label="step")
        ax.plot(log.step, log.loss.rolling(max(1, len(log) // 15), min_periods=1).mean(), lw=1.8, label="running mean")
        ax.set(title=f"{name}: LoRA training loss", xlabel="optimizer step", ylabel="completion NLL (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def layer_sweep_figure(sweep: dict[str, Any]):
    """The untrained cut base's slot-row NLL per kept-layer count (how far from calibrated a cut is)."""
    import matplotlib.pyplot as plt

    untrained = sweep["untrained"]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.bar([str(u["num_layers"]) for u in untrained], [u["untrained_completion_nll"] for u in untrained],
           color="tab:gray")
    ax.set(title="Cut SmolLM2 before training: slot-row NLL by kept layers", xlabel="decoder layers kept (k)",
           ylabel="completion NLL (nats/token)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
