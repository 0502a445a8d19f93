"""Why a hint paid off or not: the sidecar's call against the call the target itself wrote.

Greedy verification accepts a hint token only where the target would have written it, so a hint
helps exactly as far as it agrees with the target's *own* call (not with gold). Per cell, on the
same requests: how often the target wrote a call at all (a hint cannot help prose), how often the
hint was ready before the request finished, whether it named the target's function, which share
of the target's argument values it had exactly, whether the whole call matched, and whether the
hint's call *for the function the target wrote* matched (the hint follows that function: the
sidecar ships every function's slots). Beside the
decode-phase ratio over ToolSpec this says where OoO-Spec falls short and why; the timelines
chapter shows the per-token provenance of single requests.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

COLUMNS = ["n", "target wrote a call", "hint in time", "same function", "same values", "same call",
           "same call for the target's function"]


def _mean(values: list[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


def agreement_row(hint: dict[str, Any] | None, target_call: Any) -> dict[str, Any]:
    """One request: the hint (a bench record's ``hint``) against the target's first call (or None)."""
    hint = hint or {}
    call = hint.get("call") if not hint.get("error") else None
    ready = hint.get("ready_round") is not None and call is not None
    row: dict[str, Any] = {"wrote_call": target_call is not None, "ready": ready,
                           "function": None, "values": [], "whole": None, "followed": None}
    if target_call is None or call is None:
        return row
    arguments = call.get("arguments") or {}
    row["function"] = call.get("name") == target_call.name
    row["values"] = [k in arguments and arguments[k] == v for k, v in (target_call.arguments or {}).items()]
    row["whole"] = bool(row["function"]) and arguments == (target_call.arguments or {})
    calls = hint.get("calls") or [call]
    followed = next((c for c in calls if c.get("name") == target_call.name), None)
    row["followed"] = followed is not None and (followed.get("arguments") or {}) == (target_call.arguments or {})
    return row


def hint_agreement(records: Iterable[dict[str, Any]], profile: str = "cpu", method: str = "ooospec") -> pd.DataFrame:
    """Per target x benchmark over the requests decoded by AR and by ``method``: the share whose AR
    output holds a call, the share with a hint ready before the request finished, and, where both
    exist, the hint's function, argument values (share of the target's values) and whole call
    equal to the target's first call."""
    from ooospec.report.ar_accuracy import ar_first_calls

    def key(r: dict[str, Any]) -> tuple[str, str, str]:
        return r["target"], r["benchmark"], r["request_id"]

    records = list(records)
    hints = {key(r): r.get("hint") for r in records if r["method"] == method}
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r, _, call in ar_first_calls([r for r in records if r["method"] == "ar" and key(r) in hints], profile):
        cells.setdefault(key(r)[:2], []).append(agreement_row(hints[key(r)], call))
    rows = []
    for (target, benchmark), group in cells.items():
        both = [g for g in group if g["function"] is not None]
        rows.append({"target": target, "benchmark": benchmark, "n": len(group),
                     "target wrote a call": _mean([g["wrote_call"] for g in group]),
                     "hint in time": _mean([g["ready"] for g in group]),
                     "same function": _mean([g["function"] for g in both]),
                     "same values": _mean([v for g in both for v in g["values"]]),
                     "same call": _mean([g["whole"] for g in both]),
                     "same call for the target's function": _mean([g["followed"] for g in both])})
    return pd.DataFrame(rows, columns=["target", "benchmark", *COLUMNS]).set_index(["target", "benchmark"])
