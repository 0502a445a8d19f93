"""ToolSpec's acceptance per tree budget on dev requests: the committed input of the bench's budget rule.

MAT(b), tokens committed per target forward with b draft nodes, is a count, not a time, so it is
measured once here (dev requests only, never an evaluation file) and committed under
``artifacts/committed/tree-budget/``; `ooospec.bench.tree_budget` reads it at the start of every
run and pairs it with this machine's verify costs. It decodes through the bench's own loop
(`ooospec.bench.runner.decode_requests`), which is why it cannot live beside the rule it feeds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ooospec.bench.runner import StudySettings, decode_requests
from ooospec.bench.sampling import sample_requests
from ooospec.bench.tree_budget import ACCEPTANCE_FILE, CANDIDATES, acceptance_dir
from ooospec.data import load_split
from ooospec.models.arithmetic import profile_arithmetic
from ooospec.provenance import code_commit
from ooospec.studies.target_cache import cached_target


def measure_acceptance(targets: tuple[str, ...], *, profile: str = "cpu", requests: int = 20, seed: int = 0,
                       max_new_tokens: int = 160, budgets: tuple[int, ...] = CANDIDATES) -> dict[str, Any]:
    """ToolSpec's MAT per node budget on dev requests, per target (the committed input of the rule).

    Decodes the dev split through the bench's loop (`ooospec.bench.runner.decode_requests`, ToolSpec
    at every budget with its depth limit equal to the budget); MAT is committed tokens after the
    first (which the prefill writes) over target forwards, pooled over requests."""
    out: dict[str, Any] = {"made_by": "python -m ooospec.studies.tree_budget_acceptance", "split": "dev", "requests": requests,
                           "seed": seed, "max_new_tokens": max_new_tokens, "budgets": list(budgets),
                           "arithmetic": profile_arithmetic(profile).sentence(), "code_commit": code_commit(),
                           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "targets": {}}
    for target in targets:
        methods = {b: f"toolspec:budget={b}:depth={b}" for b in budgets}
        records = decode_requests(cached_target(target, profile), sample_requests(load_split("dev"), requests, seed, "dev"),
                                  list(methods.values()),
                                  StudySettings(max_new_tokens=max_new_tokens, seed=seed, slice_name="dev"))
        per_budget: dict[str, Any] = {}
        for b in budgets:
            own = [r for r in records if r["method"] == methods[b]]
            decoded = sum(max(r["tokens"] - 1, 0) for r in own)
            forwards = sum(r["forwards"] for r in own)
            per_budget[str(b)] = {"mat": round(decoded / forwards, 4) if forwards else 0.0, "requests": len(own),
                                  "tokens": decoded, "forwards": forwards,
                                  "identical_to_ar": sum(bool(r.get("identical_to_ar")) for r in own)}
        out["targets"][target] = per_budget
    return out


def main(argv: list[str] | None = None) -> None:
    """CLI: measure the dev acceptance of every candidate budget and commit it."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--targets", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m-tool"])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="default: the committed acceptance file")
    args = parser.parse_args(argv)
    data = measure_acceptance(tuple(args.targets), profile=args.profile, requests=args.requests)
    path = args.out or acceptance_dir() / ACCEPTANCE_FILE
    if path.exists() and args.out is None:  # one target per process: merge into what is there
        old = json.loads(path.read_text())
        data["targets"] = {**old.get("targets", {}), **data["targets"]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data["targets"], indent=1))


if __name__ == "__main__":
    main()
