"""Slices on disk: one file of records per (target, benchmark), written atomically when the slice
is complete, so a finished slice is never redone and an interrupted one is redone from its start."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ooospec.bench.config import BenchConfig
from ooospec.bench.plan import BenchPlan, plan_bench
from ooospec.stage import Stage


STAGE_NAME = "results"


def bench_stage(cfg: BenchConfig, plan: BenchPlan | None = None) -> Stage:
    plan = plan or plan_bench(cfg)
    return Stage(STAGE_NAME, plan.key_config(cfg))


def budget_path(slice_file: Path) -> Path:
    """The tree-budget choice (and its measured inputs) beside a slice."""
    return slice_file.with_name(slice_file.stem + ".budget.json")


def wave_costs_path(slice_file: Path) -> Path:
    """The wave-policy calibration a slice's ``wave=policy`` decodes used (`ooospec.bench.wave_costs`)."""
    return slice_file.with_name(slice_file.stem + ".wave_costs.json")


def slice_path(stage: Stage, target: str, fingerprint: str, benchmark: str) -> Path:
    return stage.dir / "slices" / f"{target}@{fingerprint}" / f"{benchmark}.jsonl"


def failed_path(slice_file: Path) -> Path:
    """Requests of a slice that could not be decoded, with the reason (not a ``*.jsonl``, so
    `assemble_records` reads only decoded records)."""
    return slice_file.with_suffix(".failed.json")


def write_slice(path: Path, records: list[dict[str, Any]]) -> None:
    """All of a slice's records at once (tmp file + rename): a slice file is always complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def assemble_records(stage: Stage) -> Path:
    """``records.jsonl``: every finished slice of the stage, in a stable order."""
    out = stage.path("records.jsonl")
    tmp = out.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for path in sorted((stage.dir / "slices").glob("*/*.jsonl")):
            handle.write(path.read_text(encoding="utf-8"))
    os.replace(tmp, out)
    return out
