"""Which requests the timelines chapter draws: one per way the hint can go (early, late, wrong,
none), each beside AR's decode of the same request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # annotations only: pandas is imported where a frame is built
    import pandas as pd


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


def core_use(records: Iterable[dict[str, Any]]) -> "pd.DataFrame":
    """Per target x benchmark x OoO-Spec method: the share of verify rounds the target ran on both
    cores (an elastic target borrows the sidecar's core while the sidecar is idle; a static one never
    does), and the placement switches per request with their mean cost (the ``elastic_cores`` trace
    event)."""
    import pandas as pd

    rows = []
    for r in records:
        if r["method_base"] != "ooospec":
            continue
        threads = [e.get("threads", 1) for e in r.get("trace", []) if e["kind"] == "round"]
        switch = next((e for e in r.get("trace", []) if e["kind"] == "elastic_cores"), None)
        rows.append({"target": r["target"], "benchmark": r["benchmark"], "method": r["method"],
                     "rounds": len(threads), "on both cores": sum(t > 1 for t in threads),
                     "switches": switch["switches"] if switch else 0,
                     "switch_s": switch["switch_s"] if switch else 0.0})
    if not rows:
        return pd.DataFrame(columns=["target", "benchmark", "method", "requests", "share of rounds on both cores",
                                     "switches per request", "us per switch"])
    df = pd.DataFrame(rows)
    out = df.groupby(["target", "benchmark", "method"], sort=False).agg(
        requests=("rounds", "size"), rounds=("rounds", "sum"), both=("on both cores", "sum"),
        switches=("switches", "sum"), switch_s=("switch_s", "sum")).reset_index()
    out["share of rounds on both cores"] = out.both / out.rounds.clip(lower=1)
    out["switches per request"] = out.switches / out.requests
    out["us per switch"] = (out.switch_s / out.switches.clip(lower=1)) * 1e6
    return out[["target", "benchmark", "method", "requests", "share of rounds on both cores", "switches per request",
                "us per switch"]]
