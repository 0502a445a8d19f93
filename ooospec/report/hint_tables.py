"""The hint in bench records: where it joined decoding, what share of the tokens it supplied, its
payload and the sidecar's wave time."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Iterable

import pandas as pd

from ooospec.report.tables import frame, with_reference
from ooospec.decoding.base import DRAFTED_CREDITS


ARRIVAL_BUCKETS = ("first boundary", "boundaries 1-3", "boundary 4+", "not before finish", "wave skipped", "rejected")


def arrival_bucket(ready_round: Any, error: Any) -> str:
    """Where the hint joined: the boundary index that first saw it, or why it never did (its wave
    still out at the finish, its wave skipped by the wave gate, or its payload rejected)."""
    if ready_round is None or (isinstance(ready_round, float) and math.isnan(ready_round)):
        if isinstance(error, str) and "not ready before" in error:
            return "not before finish"
        if isinstance(error, str) and error.startswith("wave skipped"):
            return "wave skipped"
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
