"""Which requests the timelines chapter draws: one per way the hint can go (early, late, wrong,
none), each beside AR's decode of the same request."""

from __future__ import annotations

from typing import Any, Iterable


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
