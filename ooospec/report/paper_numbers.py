"""The paper's published numbers, each with where it comes from, for side-by-side tables.

Sources are named exactly: ``paper`` is the OoO-Spec text (arXiv 2608.00814; the text
available to this artifact stops in section 4.2, so its
evaluation tables are not available and only the figures stated in the abstract, introduction
and section 4.1 can be quoted). Numbers that come from elsewhere say so and carry
``in_paper_text=False``. Nothing here is a measurement of this artifact.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PAPER = "OoO-Spec paper text (arXiv 2608.00814)"


@dataclass(frozen=True)
class PaperNumber:
    key: str
    value: float | tuple[float, ...]
    unit: str
    claim: str
    source: str
    in_paper_text: bool = True


NUMBERS: tuple[PaperNumber, ...] = (
    PaperNumber("cells", 21, "cells", "7 targets (Qwen2.5, Qwen3 4B/8B/14B/32B, Llama-3.1-8B) x 3 benchmarks "
                "(API-Bank, ToolAlpaca, BFCL); greedy, batch 1; OoO-Spec fastest in all 21",
                f"{PAPER}, abstract and section 1"),
    PaperNumber("ooospec_speedup_range", (2.46, 5.34), "x over AR", "OoO-Spec speedup over autoregressive decoding, "
                "min-max over the 21 cells", f"{PAPER}, abstract"),
    PaperNumber("ooospec_speedup_mean", 3.89, "x over AR", "OoO-Spec, unweighted mean over the 21 cells",
                f"{PAPER}, abstract"),
    PaperNumber("toolspec_speedup_mean", 2.95, "x over AR", "ToolSpec, unweighted mean over the same 21 cells",
                f"{PAPER}, abstract"),
    PaperNumber("gain_over_toolspec_qwen3_mean", 34.1, "% over ToolSpec",
                "same sidecar, mean per-target overall speedup over ToolSpec on Qwen3 4B/8B/14B/32B",
                f"{PAPER}, abstract and section 1"),
    PaperNumber("gain_over_toolspec_qwen3_per_target", (27.1, 31.0, 40.9, 37.3), "% over ToolSpec",
                "Qwen3-4B, 8B, 14B, 32B respectively", f"{PAPER}, section 1"),
    PaperNumber("payload_bytes", 85, "bytes per request", "compact semantic payload, protocol metadata excluded",
                f"{PAPER}, abstract"),
    PaperNumber("train_requests", (9662, 529), "requests (train, dev)", "sidecar training pool after the hash split",
                f"{PAPER}, section 4.1"),
    PaperNumber("train_rows", (75567, 3239), "slot rows (train, dev)", "function-index + argument-or-null + "
                "direct-call rows", f"{PAPER}, section 4.1"),
    PaperNumber("ooospec_mat_range", (6.81, 8.35), "tokens per target forward",
                "OoO-Spec mean accepted tokens per forward, range over cells",
                "reported for the paper's evaluation tables, which are not in the text available here; "
                "not verifiable from it", in_paper_text=False),
    PaperNumber("toolspec_paper_mat_range", (4.02, 5.49), "tokens per target forward",
                "ToolSpec's own paper, mean accepted tokens per forward, range over its cells",
                "ToolSpec (Xia et al. 2026, arXiv 2604.13519); not in the OoO-Spec text", in_paper_text=False),
)

def number(key: str) -> PaperNumber:
    for item in NUMBERS:
        if item.key == key:
            return item
    raise KeyError(f"no paper number {key!r}; known: {[n.key for n in NUMBERS]}")


def headline() -> dict[str, Any]:
    """The figures the headline plot needs."""
    return {"cells": number("cells").value, "ooospec_mean": number("ooospec_speedup_mean").value,
            "ooospec_range": number("ooospec_speedup_range").value,
            "toolspec_mean": number("toolspec_speedup_mean").value}


def table():
    """All numbers as a DataFrame (value, unit, claim, source, whether the paper text states it)."""
    import pandas as pd

    rows = []
    for item in NUMBERS:
        row = asdict(item)
        value = item.value
        if isinstance(value, tuple):
            row["value"] = ("–" if item.key.endswith("_range") else " / ").join(f"{v:g}" for v in value)
        else:
            row["value"] = f"{value:g}"
        rows.append(row)
    return pd.DataFrame(rows)[["key", "value", "unit", "claim", "source", "in_paper_text"]]
