"""The data card: what each source contributed, what was dropped and why, next to the paper.

Per source: ``raw`` candidate records, ``kept`` (split into train/dev for training sources),
``dropped`` by reason, gold calls kept but unparsed, gold calls that violate their tool schema,
gold calls that name a function outside the request's tools (evaluation sets keep such requests;
training sources drop them), evaluation requests whose prompt repeats an earlier one (kept), and
requests whose tool schemas break the JSON Schema metaschema (kept, with the warnings in
``meta["schema_warnings"]``; a few are listed here). ``raw == kept + sum(dropped)`` is checked when
the card is built.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ooospec.data.loading import SCHEMA_ISSUE, SCHEMA_WARNINGS, SourceLoad
from ooospec.data.splits import PAPER_DEV, PAPER_TRAIN

PAPER = {
    "apibank_train": 3462, "apibank_dev": 194,
    "all_train": PAPER_TRAIN, "all_dev": PAPER_DEV,
    "train_rows": 75567, "dev_rows": 3239,
}
MAX_LISTED_IDS = 50


def source_entry(load: SourceLoad) -> dict[str, Any]:
    kept = len(load.requests)
    dropped = load.drop_counts()
    entry = {
        "source": load.source,
        "split": load.split,
        "files": load.files,
        "raw": load.raw,
        "kept": kept,
        "kept_train": sum(r.split == "train" for r in load.requests) if load.split == "train" else 0,
        "kept_dev": sum(r.split == "dev" for r in load.requests) if load.split == "train" else 0,
        "dropped": dropped,
        "gold_unparsed": len(load.issues.get("gold_unparsed", [])),
        "gold_schema_violation": len(load.issues.get("gold_schema_violation", [])),
        "gold_not_in_tools": len(load.issues.get("gold_not_in_tools", [])),
        "repeated_prompt": len(load.issues.get("repeated_prompt", [])),
        "tool_schema_warnings": len(load.issues.get(SCHEMA_ISSUE, [])),
        "schema_warning_examples": [f"{r.id}: {w}" for r in load.requests for w in r.meta.get(SCHEMA_WARNINGS, [])][:10],
        "gold_calls": sum(len(r.gold or []) for r in load.requests),
        "issue_ids": {k: v[:MAX_LISTED_IDS] for k, v in load.issues.items()},
        "drop_examples": [d.to_dict() for d in load.drops[:10]],
        "notes": load.notes,
    }
    if entry["raw"] != kept + sum(dropped.values()):
        raise AssertionError(f"{load.source}: raw {entry['raw']} != kept {kept} + dropped {sum(dropped.values())}")
    return entry


def build_card(eval_loads: list[SourceLoad], train_loads: list[SourceLoad], config: dict[str, Any],
               outputs: dict[str, int]) -> dict[str, Any]:
    sources = [source_entry(load) for load in eval_loads + train_loads]
    train_entries = [s for s in sources if s["split"] == "train"]
    apibank = [s for s in train_entries if s["source"].startswith("apibank")]
    ours = {
        "apibank_train": sum(s["kept_train"] for s in apibank),
        "apibank_dev": sum(s["kept_dev"] for s in apibank),
        "all_train": sum(s["kept_train"] for s in train_entries),
        "all_dev": sum(s["kept_dev"] for s in train_entries),
    }
    absent = [s["source"] for s in train_entries if s["notes"].get("absent")]
    return {
        "config": config,
        "sources": sources,
        "totals": ours,
        "paper": PAPER,
        "absent_training_files": absent,
        "outputs": outputs,
    }


def card_table(card: dict[str, Any]) -> pd.DataFrame:
    """One row per source and split, with the paper's totals as extra rows for comparison."""
    rows = []
    for s in card["sources"]:
        rows.append({
            "source": s["source"], "split": s["split"], "raw": s["raw"], "kept": s["kept"],
            "train": s["kept_train"], "dev": s["kept_dev"],
            "dropped": sum(s["dropped"].values()),
            "drop reasons": ", ".join(f"{k}={v}" for k, v in sorted(s["dropped"].items())) or "",
            "gold unparsed": s["gold_unparsed"], "gold schema violations": s["gold_schema_violation"],
            "gold not in tools": s["gold_not_in_tools"], "repeated prompts": s["repeated_prompt"],
            "tool schema warnings": s.get("tool_schema_warnings", 0),
        })
    totals, paper = card["totals"], card["paper"]
    for label, train_key, dev_key in (("API-Bank training", "apibank_train", "apibank_dev"),
                                      ("all training", "all_train", "all_dev")):
        rows.append({"source": f"{label} (ours)", "split": "train+dev", "train": totals[train_key], "dev": totals[dev_key]})
        rows.append({"source": f"{label} (paper)", "split": "train+dev", "train": paper[train_key], "dev": paper[dev_key]})
    table = pd.DataFrame(rows)
    count_cols = ["raw", "kept", "train", "dev", "dropped", "gold unparsed", "gold schema violations",
                  "gold not in tools", "repeated prompts", "tool schema warnings"]
    table[count_cols] = table[count_cols].astype("Int64")
    return table.fillna({"drop reasons": ""})


def kept_figure(card: dict[str, Any]):
    """Requests kept per source as horizontal bars, evaluation sets and training pool coloured apart."""
    import matplotlib.pyplot as plt

    kept = pd.DataFrame([(s["source"], s["split"], s["kept"]) for s in card["sources"] if s["kept"]],
                        columns=["source", "split", "kept"])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.barh(kept.source, kept.kept, color=kept.split.map({"eval": "tab:blue", "train": "tab:orange"}))
    ax.invert_yaxis()
    ax.set_xlabel("requests kept")
    ax.set_title("Requests per source (blue: evaluation, orange: training pool)")
    for y, value in enumerate(kept.kept):
        ax.text(value, y, f" {value}", va="center", fontsize=8)
    fig.tight_layout()
    return fig
