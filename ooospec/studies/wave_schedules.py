"""When the wave runs, measured on this machine: the three schedules against ToolSpec on both cores.

Elastic OoO-Spec puts its sidecar's wave inside the target's prefill (``ooospec``), after it
(``ooospec:wave=deferred``) or where a per-request model of this machine's costs says
(``ooospec:wave=policy``, `ooospec.decoding.wave_policy`). This study runs the results bench's
harness with the three and their control, ToolSpec on both cores, side by side on a few requests
per benchmark, and prints per cell and schedule how many requests had a wave and the decode and
end-to-end speedups over the control (same work, paired 95% intervals), then each decision of the
policy with the seconds it modelled. The bench prints the calibration the policy used. It is a
probe (small n); the book's measured page quotes such runs with their machine::

    python -m ooospec.studies.wave_schedules --requests 4 --benchmarks apibank bfcl
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable

import pandas as pd

from ooospec.decoding.wave_policy import SCHEDULES
from ooospec.report.speedups import interval_cell, speedup_intervals
from ooospec.report.wave_share import wave_share_table

REFERENCE = "toolspec:both_cores"
METHODS = (REFERENCE, "ooospec", "ooospec:wave=deferred", "ooospec:wave=policy")
PHASES = ("decode", "total")  # end to end: sidecar and IPC included


def schedule_table(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Per target x benchmark x OoO-Spec method: the requests whose wave ran, and its decode and
    end-to-end speedup over ToolSpec on both cores over the same work (``n``: requests where both
    wrote the same output)."""
    records = list(records)
    methods = sorted({r["method"] for r in records if r["method"].startswith("ooospec")},
                     key=lambda m: (METHODS.index(m) if m in METHODS else len(METHODS), m))
    if not methods:
        return pd.DataFrame()
    speed = speedup_intervals(records, reference=REFERENCE, methods=methods, phases=PHASES)
    share = wave_share_table(records, reference=REFERENCE)
    rows = {}
    for r in share.itertuples():
        cells = speed[(speed.target == r.target) & (speed.benchmark == r.benchmark) & (speed.method == r.method)]
        row = {"wave ran": f"{r.with_wave} of {r.requests}", "schedules": r.schedules,
               "n": int(cells.n.max()) if len(cells) else 0}
        row.update({phase: interval_cell(c) for phase, c in zip(cells.phase, cells.itertuples())})
        rows[(r.target, r.benchmark, r.method)] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.names = ["target", "benchmark", "method"]
    order = {m: i for i, m in enumerate(methods)}
    return table.sort_index(key=lambda level: level.map(order) if level.name == "method" else level)


def policy_decisions(records: Iterable[dict[str, Any]], method: str = "ooospec:wave=policy") -> pd.DataFrame:
    """Each request's schedule as the policy chose it, with the end-to-end seconds it modelled for
    every schedule (why it chose it)."""
    rows = []
    for r in records:
        if r["method"] != method:
            continue
        decision = (r.get("hint") or {}).get("schedule") or {}
        expected = decision.get("expected_s", {})
        rows.append({"target": r["target"], "benchmark": r["benchmark"], "request": r["request_id"],
                     "prompt tokens": r.get("prompt_tokens"), "chose": decision.get("schedule"),
                     **{f"{s} (s)": expected.get(s) for s in SCHEDULES}})
    return pd.DataFrame(rows)


def run(target: str, benchmarks: list[str], requests: int, warmup: int = 1, seed: int = 0,
        profile: str = "cpu") -> Any:
    """The bench with the three schedules and their control (records resume by slice)."""
    from ooospec.bench.config import BenchConfig
    from ooospec.bench.runner import run_bench

    return run_bench(BenchConfig(profile=profile, targets=[target], benchmarks=benchmarks, methods=list(METHODS),
                                 requests=requests, seed=seed, warmup=warmup))


def main(argv: list[str] | None = None) -> int:
    """CLI: run the schedules on this machine and print the two tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--benchmarks", nargs="+", default=["apibank", "bfcl"])
    parser.add_argument("--requests", type=int, default=4, help="per benchmark")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    records = list(run(args.target, args.benchmarks, args.requests, args.warmup, args.seed, args.profile))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(schedule_table(records).to_string())
        print(policy_decisions(records).to_string(index=False))
    return 0


if __name__ == "__main__":  # the bench spawns the sidecar, which re-imports this module
    raise SystemExit(main())
