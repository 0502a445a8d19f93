"""Sidecar choices compared with their uncertainty: two committed API-disjoint dev scores
(`ooospec.training.disjoint_dev`) paired request for request, the difference in whole-call agreement
with its paired bootstrap interval. The rules on the differences page say "higher"; this says by how
much, and whether the interval excludes 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ooospec.paths import shown
from ooospec.report.intervals import ShareDifference, paired_share_difference
from ooospec.stage import read_jsonl
from ooospec.training.disjoint_dev import committed_dir, machine_cell, same_machine

if TYPE_CHECKING:
    import pandas as pd


class UnpairedScores(ValueError):
    """Two committed scores that do not cover the same requests on one machine: never compared."""


def whole_call_difference(reference: str, candidate: str, directory: Path | None = None) -> ShareDifference:
    """Whole-call agreement of ``candidate`` minus ``reference`` (committed score names, e.g.
    ``sidecar-cpu-kall-pass2--served+fill--amx_bf16``), paired over their requests, with its bootstrap
    interval: the rules' "higher" read with its uncertainty. Refused (both names) when the two were
    scored on different machines or different requests."""
    directory = committed_dir() if directory is None else directory
    loaded = {}
    for name in (reference, candidate):
        path = directory / f"{name}.json"
        if not path.exists():
            raise FileNotFoundError(f"no committed dev scores {shown(path)}")
        info = json.loads(path.read_text())
        loaded[name] = (info["machine"], {w["request_id"]: w["score"]["call_exact"]
                                          for w in read_jsonl(path.with_suffix(".jsonl"))})
    (ref_machine, ref), (new_machine, new) = loaded[reference], loaded[candidate]
    if not same_machine(ref_machine, new_machine):
        raise UnpairedScores(f"{reference} ({machine_cell(ref_machine)}) and {candidate} "
                             f"({machine_cell(new_machine)}) were scored on different machines")
    if set(ref) != set(new):
        raise UnpairedScores(f"{reference} ({len(ref)} requests) and {candidate} ({len(new)}) "
                             f"differ in {len(set(ref) ^ set(new))} requests")
    ids = sorted(ref)
    return paired_share_difference([ref[i] for i in ids], [new[i] for i in ids])


def difference_table(reference: str, candidates: list[str]) -> "pd.DataFrame":
    """One row per candidate: its whole-call agreement minus the reference's, interval, verdict."""
    import pandas as pd

    rows = []
    for name in candidates:
        diff = whole_call_difference(reference, name)
        rows.append({"candidate": name, "against": reference, "requests": diff.n,
                     "whole call difference [95% CI]": diff.cell, "verdict": diff.verdict})
    return pd.DataFrame(rows)
