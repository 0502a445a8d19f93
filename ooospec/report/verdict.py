"""The results chapter's verdict, written from the run's own same-work numbers, and the table that
sets the trained sidecar beside the oracle first-call hint.

Two claims, each on its own hardware:

* **the paper's comparison**: OoO-Spec in the paper's placement (``ooospec:static``: the target on
  one core, the sidecar on the other, whose core stays its own) against ToolSpec on one core;
* **equal hardware**: OoO-Spec as this artifact runs it by default (``ooospec``, elastic: the target
  borrows the sidecar's core whenever the sidecar is idle) against ToolSpec with its target on both
  cores (``toolspec:both_cores``).

Elastic over static says what lending the idle core gains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from ooospec.bench.methods import PAPER_PLACEMENT
from ooospec.report.speedups import PHASE_LABELS, speedup_intervals
from ooospec.report.wave_share import wave_share_table

ELASTIC = "ooospec"
BOTH_CORES_CONTROL = "toolspec:both_cores"
# the oracle first-call hint, in the placement of the trained method it is set beside
CEILING_METHOD = "ooospec:oracle:static"
POLICY = "ooospec:wave=policy"  # elastic OoO-Spec choosing per request when (whether) its wave runs
# (method, reference, what the ratio is called)
CLAIMS = {
    "paper": (PAPER_PLACEMENT, "toolspec", "OoO-Spec (static) / ToolSpec"),
    "equal_hardware": (ELASTIC, BOTH_CORES_CONTROL, "OoO-Spec (elastic) / ToolSpec on both cores"),
    "elastic_gain": (ELASTIC, PAPER_PLACEMENT, "OoO-Spec elastic / static"),
    "policy": (POLICY, BOTH_CORES_CONTROL, "OoO-Spec (wave policy) / ToolSpec on both cores"),
}


@dataclass
class Claims:
    """The same-work intervals the verdict reads (`speedup_intervals`); a claim whose methods did
    not run has no rows."""

    over_ar: pd.DataFrame  # every method over AR
    paper: pd.DataFrame  # the paper's placement (and the oracle hint in it) over ToolSpec on one core
    equal_hardware: pd.DataFrame  # elastic OoO-Spec over ToolSpec on both cores
    elastic_gain: pd.DataFrame  # elastic over static OoO-Spec
    policy: pd.DataFrame  # elastic OoO-Spec with its wave policy over ToolSpec on both cores
    waves: pd.DataFrame  # per cell and method: the share of requests whose wave ran (`wave_share_table`)

    @classmethod
    def measure(cls, records: Iterable[dict[str, Any]], phases: tuple[str, ...] = ("decode", "total")) -> "Claims":
        records = list(records)
        paper, equal, gain, policy = (CLAIMS[k] for k in ("paper", "equal_hardware", "elastic_gain", "policy"))
        return cls(speedup_intervals(records, phases=phases),
                   speedup_intervals(records, reference=paper[1], methods=[paper[0], CEILING_METHOD], phases=phases),
                   speedup_intervals(records, reference=equal[1], methods=[equal[0]], phases=phases),
                   speedup_intervals(records, reference=gain[1], methods=[gain[0]], phases=phases),
                   speedup_intervals(records, reference=policy[1], methods=[policy[0]], phases=phases),
                   wave_share_table(records, reference=policy[1]))

    def pivot(self, phase: str = "decode") -> pd.DataFrame:
        """One row per target x benchmark, one column per claim: ``1.18x [1.07, 1.27] (n = 28)``."""
        columns = []
        for name, (method, _, label) in CLAIMS.items():
            rows = getattr(self, name)
            rows = rows[(rows.phase == PHASE_LABELS.get(phase, phase)) & (rows.method == method)]
            if name == "policy" and rows.empty:  # an optional method: no column where it did not run
                continue
            columns.append(pd.Series({(r.target, r.benchmark): same_work(r, short=True) for r in rows.itertuples()},
                                     name=label, dtype=object))
        table = pd.concat(columns, axis=1)
        if not table.empty:
            table.index.names = ["target", "benchmark"]
        return table


def ceiling_table(paper: pd.DataFrame, agreement: pd.DataFrame, aim: float = 1.35,
                  phase: str = "decode") -> pd.DataFrame:
    """OoO-Spec with its trained sidecar next to the oracle first-call hint, both in the paper's
    placement, per target x benchmark: both over ToolSpec on one core in ``phase`` (`speedup [95%
    interval]` on the same work, `Claims.paper`), the share of AR outputs that hold a call
    (`hint_agreement`), and what the oracle hint says of ``aim``.

    The oracle first-call hint (`CEILING_METHOD`) is the target's own first call, re-rendered,
    ready at once and merged through the same path as the trained sidecar's: what a perfect
    first-call prediction at no latency gives. It is not an upper bound on every possible hint: one
    that also followed later calls or changed the merge could do better. Where even its interval
    lies below ``aim``, a better-trained first-call sidecar is not expected to reach the aim on this
    target and hardware."""
    cells = paper[paper.phase == PHASE_LABELS.get(phase, phase)]
    rows = []
    for (target, benchmark), group in cells.groupby(["target", "benchmark"], sort=False):
        by_method = group.set_index("method")
        if not {PAPER_PLACEMENT, CEILING_METHOD} <= set(by_method.index):
            continue
        trained, oracle = by_method.loc[PAPER_PLACEMENT], by_method.loc[CEILING_METHOD]
        wrote = (agreement.loc[(target, benchmark), "target wrote a call"]
                 if (target, benchmark) in agreement.index else float("nan"))
        if oracle.ci_high < aim:
            reach = f"out of reach: even the oracle first-call hint is below {aim:.2f}x"
        elif oracle.speedup >= aim:
            reach = f"within reach: the oracle first-call hint reaches {aim:.2f}x"
        else:
            reach = f"not shown: the oracle first-call hint's interval holds {aim:.2f}x"
        rows.append({"target": target, "benchmark": benchmark, "n": int(trained.n),
                     "OoO-Spec / ToolSpec": f"{trained.speedup:.2f}x [{trained.ci_low:.2f}, {trained.ci_high:.2f}]",
                     "oracle hint / ToolSpec": f"{oracle.speedup:.2f}x [{oracle.ci_low:.2f}, {oracle.ci_high:.2f}]",
                     "share of the oracle hint's gain": ((trained.speedup - 1) / (oracle.speedup - 1)
                                                         if oracle.speedup > 1 else float("nan")),
                     "target wrote a call": wrote, f"aim {aim:.2f}x": reach})
    return pd.DataFrame(rows).set_index(["target", "benchmark"]) if rows else pd.DataFrame()


def same_work(row: Any, short: bool = False) -> str:
    """``1.28x [1.13, 1.50], n = 28 of 30 with the same output``: a row of `speedup_intervals` as a
    phrase that says which requests the ratio is over (``short``: ``1.28x [1.13, 1.50] (n = 28)``)."""
    n_all = int(getattr(row, "n_all", row.n))
    if not row.n:
        return f"no request of {n_all} with the same output"
    if short:
        return f"{row.speedup:.2f}x [{row.ci_low:.2f}, {row.ci_high:.2f}] (n = {int(row.n)})"
    return f"{row.speedup:.2f}x [{row.ci_low:.2f}, {row.ci_high:.2f}], n = {int(row.n)} of {n_all} with the same output"


_WORDS = {"faster": "faster than", "slower": "slower than", "no difference shown": "not distinguishable from"}


def _compared(rows: pd.DataFrame, subject: str, reference: str, over_ar: pd.DataFrame) -> list[str]:
    """One line per cell: ``subject`` is faster / slower / not distinguishable from ``reference``."""
    from ooospec.report.intervals import MIN_REQUESTS, TOO_FEW

    def over(row: Any, method: str) -> str:
        cell = over_ar[(over_ar.target == row.target) & (over_ar.benchmark == row.benchmark) & (over_ar.method == method)]
        return "n/a" if cell.empty else same_work(cell.iloc[0])

    lines = []
    for row in rows.itertuples():
        word = _WORDS.get(row.verdict, f"not judged (n < {MIN_REQUESTS}) against" if row.verdict == TOO_FEW else row.verdict)
        lines.append(f"* {row.target} / {row.benchmark}: {subject} is {word} {reference}, {same_work(row)} "
                     f"(over AR: {subject} {over(row, row.method)}; {reference} {over(row, row.vs)}).")
    return lines


def _wave_share(waves: pd.DataFrame, row: Any) -> str:
    """``a wave on 21 of 30 requests (prefill 12, deferred 9, none 9)`` for the cell of ``row``."""
    cell = waves[(waves.target == row.target) & (waves.benchmark == row.benchmark) & (waves.method == row.method)]
    if cell.empty:
        return "its waves not recorded"
    found = cell.iloc[0]
    return f"a wave on {int(found.with_wave)} of {int(found.requests)} requests ({found.schedules})"


def verdict(claims: Claims, phase: str = "decode", machine: str | None = None) -> str:
    """The results in a few sentences, written from the run's own numbers (markdown).

    Per target x benchmark and claim (module docstring): the ratio of total times over the same work
    (the requests whose output equals the reference's) with its 95% interval and n; "faster" only
    where the interval excludes 1. ``machine`` (e.g. "fp32 on a 2-core AVX2 CPU") opens the text,
    since every time in it belongs to that hardware."""
    label = "decode phase" if phase == "decode" else "end to end"
    shown = PHASE_LABELS.get(phase, phase)

    def rows(table: pd.DataFrame, method: str) -> pd.DataFrame:
        return table[(table.phase == shown) & (table.method == method)]

    over_ar = claims.over_ar[claims.over_ar.phase == shown]
    lines = [f"Measured in {machine}.", ""] if machine else []
    lines.append(f"**Verdict ({label}; speedup = ratio of total times over the same work, i.e. the requests whose "
                 "output equals the reference's, [95% paired bootstrap interval], n of the paired requests).**")
    paper, equal = rows(claims.paper, PAPER_PLACEMENT), rows(claims.equal_hardware, ELASTIC)
    if len(paper):
        lines.append("\nThe paper's comparison: OoO-Spec in the paper's placement (target on one core, the sidecar on "
                     "the other, its core its own: `ooospec:static`) against ToolSpec on one core:")
        lines += _compared(paper, "OoO-Spec (static)", "ToolSpec", over_ar)
    if len(equal):
        lines.append("\nEqual hardware: OoO-Spec as run by default (`ooospec`, elastic: the target borrows the "
                     "sidecar's core whenever the sidecar is idle) against ToolSpec with its target on both cores:")
        lines += _compared(equal, "OoO-Spec (elastic)", "ToolSpec on both cores", over_ar)
    gain = rows(claims.elastic_gain, ELASTIC)
    if len(gain):
        lines.append("\nWhat lending the idle core gains, OoO-Spec elastic over static:")
        lines += [f"* {row.target} / {row.benchmark}: {same_work(row)} ({row.verdict})." for row in gain.itertuples()]
    policy = rows(claims.policy, POLICY)
    if len(policy):
        lines.append("\nWith its wave policy (`ooospec:wave=policy`: per request, the wave inside the prefill, after "
                     "it, or none, whichever this machine's measured costs model as least end to end), against "
                     "ToolSpec on both cores; a policy that never ran its wave would pass any bar, so each cell says "
                     "how many requests had one:")
        lines += [line[:-2] + f"; {_wave_share(claims.waves, row)})." for line, row in
                  zip(_compared(policy, "OoO-Spec (wave policy)", "ToolSpec on both cores", over_ar), policy.itertuples())]
    oracle = rows(claims.paper, CEILING_METHOD)
    if len(oracle):
        lines.append("\nThe oracle first-call hint (`ooospec:oracle:static`: the target's own first call, re-rendered, "
                     "ready at once and merged through the same path; not an upper bound on every possible hint, since "
                     "one that also followed later calls or changed the merge could do better), over ToolSpec on one core:")
        lines += [f"* {row.target} / {row.benchmark}: {same_work(row)} ({row.verdict})." for row in oracle.itertuples()]
    counts = [f"{int((table.verdict == 'faster').sum())} of {len(table)} cells {name}"
              for table, name in ((paper, "in the paper's comparison"), (equal, "on equal hardware")) if len(table)]
    if counts:
        lines.append(f"\nOoO-Spec beats ToolSpec on the same work with an interval above 1 in {' and '.join(counts)} "
                     "here. The paper claims it in all 21 of its cells (GPUs, 4B-32B targets, a sidecar trained on "
                     "~9,700 teacher-traced requests, its own device); the differences chapter says what differs.")
    return "\n".join(lines)


def headline_verdict(claims: Claims, phase: str = "decode", machine: str | None = None) -> str:
    """The verdict a reader scans (markdown): one table, targets x benchmarks, with the paper's
    comparison, the equal-hardware one and the share of the oracle first-call hint's gain, each with
    its interval and n, then at most three sentences. `verdict` keeps every detail for the chapter."""
    shown = PHASE_LABELS.get(phase, phase)

    def cells(table: pd.DataFrame, method: str) -> dict[tuple[str, str], Any]:
        rows = table[(table.phase == shown) & (table.method == method)]
        return {(r.target, r.benchmark): r for r in rows.itertuples()}

    paper, equal = cells(claims.paper, PAPER_PLACEMENT), cells(claims.equal_hardware, ELASTIC)
    oracle = cells(claims.paper, CEILING_METHOD)
    keys = sorted(set(paper) | set(equal))
    if not keys:
        return "No OoO-Spec cell beside its ToolSpec reference ran in this build."
    header = ["target", "benchmark", "OoO-Spec (static) / ToolSpec", "OoO-Spec (elastic) / ToolSpec on both cores"]
    with_oracle = bool(oracle)
    if with_oracle:
        header.append("share of the oracle hint's gain")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in keys:
        row = [*key, *(same_work(table[key], short=True) if key in table else "not run" for table in (paper, equal))]
        if with_oracle:
            row.append(_share_of_gain(paper.get(key), oracle.get(key)))
        lines.append("| " + " | ".join(row) + " |")
    faster = [f"{sum(r.verdict == 'faster' for r in table.values())} of {len(table)} cells {name}"
              for table, name in ((paper, "of the paper's comparison"), (equal, "on equal hardware")) if table]
    label = "decode phase" if phase == "decode" else "end to end"
    opening = f"Measured in {machine}; " if machine else ""
    sentences = [
        f"{opening}{label}, ratio of total times over the same work (the requests where both wrote the same "
        "output) with its paired bootstrap 95% interval and n.",
        f"OoO-Spec beats ToolSpec with an interval above 1 in {' and '.join(faster)}; the paper claims it in all 21 "
        "of its cells (GPUs, 4B-32B targets).",
        "The results chapter states every cell in words, end to end as well, with the oracle hint and the "
        "differences that explain the gap.",
    ]
    return "\n".join(lines) + "\n\n" + " ".join(sentences)


def _share_of_gain(trained: Any, oracle: Any) -> str:
    """``42% (1.14x of 1.37x)``: how much of the oracle hint's gain over ToolSpec the trained hint takes."""
    if trained is None or oracle is None or not trained.n or not oracle.n:
        return "n/a"
    if oracle.speedup <= 1:
        return f"no gain to share (oracle {oracle.speedup:.2f}x)"
    return f"{(trained.speedup - 1) / (oracle.speedup - 1):.0%} ({trained.speedup:.2f}x of {oracle.speedup:.2f}x)"
