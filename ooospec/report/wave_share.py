"""How often a method's wave ran, which schedule each request got, and the speedup on each part.

A wave policy (`ooospec.decoding.wave_policy`) that never ran the wave would pass any end-to-end
bar, so the share of requests with a wave is shown beside every speedup of such a method, and the
speedup over the reference is split into the requests that had a wave and those that had none
(each over the same work, with its n and paired 95% interval)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

import pandas as pd

from ooospec.report.intervals import TOO_FEW, paired_speedup

WAVE_COLUMNS = ["target", "benchmark", "method", "vs", "requests", "with_wave", "wave_share", "schedules",
                "n_wave", "speedup_wave", "ci_wave", "n_no_wave", "speedup_no_wave", "ci_no_wave"]


def schedule_of(record: dict[str, Any]) -> str | None:
    """The wave schedule a record ran (None: no hint bank, e.g. AR or ToolSpec)."""
    hint = record.get("hint")
    if not hint:
        return None
    chosen = (hint.get("schedule") or {}).get("schedule")
    if chosen is None:  # records from before schedules: the wave ran at arrival when submitted
        chosen = "prefill"
    return chosen if hint.get("submitted", True) else "none"


def _part(pairs: list[tuple[float, float]]) -> tuple[int, float, str]:
    if not pairs:
        return 0, float("nan"), TOO_FEW
    found = paired_speedup([b for b, _ in pairs], [m for _, m in pairs])
    return found.n, found.point, f"[{found.low:.2f}, {found.high:.2f}]"


def wave_share_table(records: Iterable[dict[str, Any]], reference: str = "toolspec:both_cores",
                     phase: str = "total") -> pd.DataFrame:
    """Per target x benchmark x method with a hint bank: the share of requests whose wave ran, the
    schedules chosen, and the ``phase`` speedup over ``reference`` on the requests with a wave and
    on those without (same work: both wrote the same output)."""
    records = list(records)
    ref = {(r["target"], r["benchmark"], r["request_id"]): r for r in records if r["method"] == reference}
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in records:
        if r["method"] != reference and schedule_of(r) is not None:
            groups.setdefault((r["target"], r["benchmark"], r["method"]), []).append(r)
    rows = []
    for (target, benchmark, method), group in groups.items():
        schedules = Counter(schedule_of(r) for r in group)
        wave, no_wave = [], []
        for r in group:
            other = ref.get((target, benchmark, r["request_id"]))
            if other is None or r.get("output_ids") != other.get("output_ids"):
                continue
            (no_wave if schedule_of(r) == "none" else wave).append((other[f"{phase}_s"], r[f"{phase}_s"]))
        n_wave, s_wave, ci_wave = _part(wave)
        n_none, s_none, ci_none = _part(no_wave)
        with_wave = len(group) - schedules.get("none", 0)
        rows.append({"target": target, "benchmark": benchmark, "method": method, "vs": reference,
                     "requests": len(group), "with_wave": with_wave, "wave_share": with_wave / len(group),
                     "schedules": ", ".join(f"{k} {v}" for k, v in sorted(schedules.items())),
                     "n_wave": n_wave, "speedup_wave": s_wave, "ci_wave": ci_wave,
                     "n_no_wave": n_none, "speedup_no_wave": s_none, "ci_no_wave": ci_none})
    return pd.DataFrame(rows, columns=WAVE_COLUMNS)


def wave_share_compact(table: pd.DataFrame) -> pd.DataFrame:
    """The table as a reader scans it (it fits the page): per cell and method (``ooospec:`` left out
    of its options), the requests whose wave ran and the end-to-end speedups over the control with
    and without a wave, ``1.02x [0.96, 1.08] (n 6)``; the schedules stay in the full table."""
    def speed(n: int, point: float, interval: str) -> str:
        return "none" if not n else f"{point:.2f}x {interval} (n {n})"

    rows = {(r.target.split("-")[0], r.benchmark, r.method.removeprefix("ooospec:")): {
        "wave ran": f"{r.with_wave} of {r.requests}",
        "with a wave": speed(r.n_wave, r.speedup_wave, r.ci_wave),
        "without": speed(r.n_no_wave, r.speedup_no_wave, r.ci_no_wave)} for r in table.itertuples()}
    compact = pd.DataFrame.from_dict(rows, orient="index")
    if not compact.empty:
        compact.index.names = ["target", "benchmark", "method"]
    return compact
