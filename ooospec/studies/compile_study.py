"""Is the compiled arithmetic worth its compile time? Before/after on the same requests, committed.

`torch.compile` (profile ``cpu-compiled``: bf16 + the CPU inductor with weight freezing, see
`ooospec.decoding.compiled`) is measured here against the ``cpu`` default (bf16, eager):

* the arithmetic study of both options in one process (`arithmetic_study` with `COMPILED_OPTIONS`):
  one-row step, prefill, verify cost per row count, compile seconds, both targets, 1 and 2 threads;
* the results chapter's bench on the same requests in both profiles (before = eager, after =
  compiled): each method's decode speedup over AR *in its own run* with its interval, MAT, AR's
  time per token, and whether compiled AR wrote exactly eager AR's tokens (a compiled forward sums
  in another order; the bench itself fails on any method that differs from AR in its own
  arithmetic beyond a near-tie).

It is committed (``artifacts/committed/compiled/``) rather than re-run by ``make reproduce``:
compiling costs minutes per process and the bench twice would not fit the reproduce budget. The
profile stays an option until its compile time is paid back over a run (see the ToolSpec chapter).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ooospec.report.speedups import speedup_intervals
from ooospec.report.tables import method_table
from ooospec.models.arithmetic import first_difference
from ooospec.provenance import code_commit
from ooospec.stage import read_jsonl

COMPILED_OPTIONS = (("cpu", "sdpa"), ("cpu-compiled", "sdpa"))  # eager bf16 beside compiled bf16, one process
KEPT_FIELDS = ("target", "benchmark", "request_id", "method", "method_base", "sidecar", "identical_to_ar", "near_tie",
               "mismatch", "tokens", "prefill_s", "decode_s", "total_s", "forwards", "target_forwards",
               "mean_tree_size", "source_counts", "hint", "output_ids", "position", "run_order")


def committed_dir() -> Path:
    from ooospec.paths import artifacts_dir

    return artifacts_dir() / "committed" / "compiled"


def slim(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bench records without traces, rounds and text (what the tables below read, output ids kept)."""
    return [{k: r.get(k) for k in KEPT_FIELDS} for r in records]


def before_after(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> pd.DataFrame:
    """Per target x benchmark x method on the same requests: the decode speedup over AR in the eager
    run and in the compiled run (each over its own AR: the ratio a reader of the results chapter
    sees, over the requests where the method wrote its AR's output), the compiled method against the same method eager (decode seconds,
    paired 95% interval; two runs made at different times on the same idle machine) over the ``n``
    requests whose AR outputs are identical in both runs, and MAT in both runs (all requests)."""
    from ooospec.report.intervals import paired_speedup

    def by_key(records):
        return {(r["target"], r["benchmark"], r["method"], r["request_id"]): r for r in records}

    eager_x_ar = speedup_intervals(before, phases=("decode",)).set_index(["target", "benchmark", "method"]).speedup
    compiled_x_ar = speedup_intervals(after, phases=("decode",)).set_index(["target", "benchmark", "method"]).speedup
    mat_eager = method_table(before).set_index(["target", "benchmark", "method"]).mat
    mat_compiled = method_table(after).set_index(["target", "benchmark", "method"]).mat
    eager, compiled = by_key(before), by_key(after)
    rows = []
    for cell in dict.fromkeys(k[:3] for k in compiled):
        # the same work only: requests where compiled AR wrote exactly eager AR's tokens (elsewhere a
        # near-tie flipped and the two runs decode different outputs, e.g. 46 against 160 tokens)
        keys = [k for k in compiled if k[:3] == cell and k in eager
                and eager.get(k[:2] + ("ar", k[3]), {}).get("output_ids") == compiled.get(k[:2] + ("ar", k[3]), {}).get("output_ids")]
        if not keys:
            continue
        gain = paired_speedup([eager[k]["decode_s"] for k in keys], [compiled[k]["decode_s"] for k in keys])
        rows.append({"target": cell[0], "benchmark": cell[1], "method": cell[2], "n": len(keys),
                     "x AR, eager": eager_x_ar.get(cell, 1.0), "x AR, compiled": compiled_x_ar.get(cell, 1.0),
                     "compiled x eager": gain.cell,
                     "MAT eager": mat_eager.get(cell), "MAT compiled": mat_compiled.get(cell)})
    return pd.DataFrame(rows).set_index(["target", "benchmark", "method"]).round(2) if rows else pd.DataFrame()


def ar_comparison(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> pd.DataFrame:
    """AR eager against AR compiled on the same requests: the step time (decode seconds per decoded
    token, summed over requests), the compiled speedup with its paired interval, and how many
    compiled AR outputs equal the eager ones token for token (first difference where not)."""
    from ooospec.report.intervals import paired_speedup

    def ar(records):
        return {(r["target"], r["benchmark"], r["request_id"]): r for r in records if r["method"] == "ar"}

    eager, compiled = ar(before), ar(after)
    rows = []
    for (target, benchmark) in sorted({k[:2] for k in eager}):
        keys = [k for k in eager if k[:2] == (target, benchmark) and k in compiled]
        if not keys:
            continue
        differ = [first_difference(eager[k]["output_ids"], compiled[k]["output_ids"]) for k in keys]
        tokens = sum(max(eager[k]["tokens"] - 1, 0) for k in keys)
        tokens_c = sum(max(compiled[k]["tokens"] - 1, 0) for k in keys)
        speed = paired_speedup([eager[k]["decode_s"] for k in keys], [compiled[k]["decode_s"] for k in keys])
        rows.append({"target": target, "benchmark": benchmark, "n": len(keys),
                     "eager ms/token": round(1000 * sum(eager[k]["decode_s"] for k in keys) / max(tokens, 1)),
                     "compiled ms/token": round(1000 * sum(compiled[k]["decode_s"] for k in keys) / max(tokens_c, 1)),
                     "AR decode, compiled x eager": speed.cell,
                     "same output": sum(d is None for d in differ),
                     "first differences at": [d for d in differ if d is not None]})
    return pd.DataFrame(rows)


def load_committed(folder: Path | None = None) -> dict[str, Any] | None:
    """The committed study (points, before/after records, provenance), or None where absent."""
    folder = folder or committed_dir()
    if not (folder / "provenance.json").exists():
        return None

    return {"points": json.loads((folder / "points.json").read_text()),
            "before": list(read_jsonl(folder / "before.jsonl")), "after": list(read_jsonl(folder / "after.jsonl")),
            "provenance": json.loads((folder / "provenance.json").read_text())}


def measure(out: Path, *, targets: tuple[str, ...] = ("qwen2.5-coder-0.5b", "smollm2-135m-tool"),
            bench_targets: tuple[str, ...] = ("qwen2.5-coder-0.5b",), before_records: Path | None = None,
            bench_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the study and write it to ``out`` (points.json, before.jsonl, after.jsonl, provenance.json).

    ``before_records``: the eager bench run's records.jsonl when it already exists (e.g. from
    ``make reproduce``); otherwise it is run here with the same config in the ``cpu`` profile."""
    from ooospec.bench.runner import run_bench
    from ooospec.studies.forward_cost import arithmetic_study
    from ooospec.bench.config import notebook_config

    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    points = arithmetic_study(targets, options=COMPILED_OPTIONS)
    (out / "points.json").write_text(json.dumps(points, indent=1))
    study_s = time.time() - started
    overrides = {"targets": list(bench_targets), **(bench_overrides or {})}
    after_cfg = notebook_config("05_bench", {"profile": "cpu-compiled", **overrides})
    bench_start = time.time()
    after = run_bench(after_cfg)
    bench_s = time.time() - bench_start
    if before_records is not None:
        before = [r for r in read_jsonl(before_records) if r["target"] in bench_targets]
    else:
        before = list(run_bench(replace(after_cfg, profile="cpu")))
    for name, records in (("before.jsonl", before), ("after.jsonl", list(after))):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in slim(records)))
    compile_reports = {p.stem.removeprefix("compile-"): json.loads(p.read_text())
                       for p in after.stage.dir.glob("compile-*.json")}
    provenance = {
        "what": "torch.compile (inductor, freezing, dynamic shapes; profile cpu-compiled) against eager bf16 (cpu)",
        "made_by": "ooospec.studies.compile_study.measure", "code_commit": code_commit(short=True),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "arithmetic_study": {"targets": list(targets), "options": [list(o) for o in COMPILED_OPTIONS],
                             "seconds": round(study_s)},
        "bench": {"targets": list(bench_targets), "requests": after_cfg.requests, "methods": after_cfg.methods,
                  "after_seconds": round(bench_s), "compile": compile_reports,
                  "before": str(before_records) if before_records else "run here, profile cpu"},
    }
    (out / "provenance.json").write_text(json.dumps(provenance, indent=1))
    return provenance
