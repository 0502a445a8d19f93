"""``make canonical``: run the results chapter's bench at its defaults (n = 30 per benchmark) from
committed code and write it, with its provenance, as the canonical run (`ooospec.report.canonical`
says what that is, how it is checked and how a reader's run is set beside it)."""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path
from typing import Any

from ooospec.paths import REPO_ROOT, shown
from ooospec.report.canonical import CanonicalError, canonical_dir, load_canonical, tree_budgets, write_canonical


def _clean_code_commit() -> str:
    """The commit the package code is at; refuse uncommitted package changes (the canonical run
    must come from code a reader can check out)."""
    status = subprocess.run(["git", "status", "--porcelain", "--", "ooospec", "notebooks", "configs"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()
    if status:
        raise CanonicalError(f"uncommitted changes in the package: {status.splitlines()[0]} ...; commit them first")
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def provenance_of(records: Any, config: Any, code_commit: str) -> dict[str, Any]:
    """The manifest's provenance for a finished bench run (`BenchRecords`) of ``config``."""
    from ooospec.models.adapters import read_frozen

    adapter = records.plan.adapter
    sidecar = records.plan.sidecar
    if adapter is not None:
        frozen = read_frozen(adapter)
        sidecar = f"{frozen.get('name', Path(adapter).name)} (sha256 {frozen.get('sha256', '?')[:12]})"
    arithmetic = next((r["arithmetic"] for r in records if r.get("arithmetic")), {})
    return {"code_commit": code_commit, "machine": {k: arithmetic.get(k) for k in ("cpu", "cpu_capability", "bf16_flag", "cores")},
            "arithmetic": records.arithmetic(), "tree_budgets": tree_budgets(records.budget_choices()),
            "seed": config.seed, "requests": config.requests, "warmup": config.warmup, "methods": list(config.methods),
            "max_new_tokens": config.max_new_tokens, "sidecar_adapter": sidecar,
            "sidecar_runtime": config.sidecar_runtime,
            "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "made_by": "make canonical"}


def run_canonical(profile: str = "cpu", requests: int = 30) -> Path:
    """Run the results chapter's bench at its defaults with ``requests`` per benchmark and commit-ready
    write it as the canonical run (resumable: finished slices are reused)."""
    from ooospec.bench.config import BenchConfig, notebook_parameters
    from ooospec.bench.runner import run_bench

    code_commit = _clean_code_commit()
    params = notebook_parameters("05_bench")
    cfg = BenchConfig(profile=profile, targets=params["targets"], benchmarks=params["benchmarks"],
                      methods=params["methods"], requests=requests, seed=params["seed"], warmup=params["warmup"],
                      max_new_tokens=params["max_new_tokens"], sidecar=params["sidecar"], threads=params["threads"],
                      sidecar_runtime=params["sidecar_runtime"])
    records = run_bench(cfg)
    return write_canonical(list(records), provenance_of(records, cfg, code_commit))


def main(argv: list[str] | None = None) -> int:
    """CLI: ``run`` makes the canonical run (hours); ``check`` reads it and prints what it is."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("action", choices=("run", "check"))
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args(argv)
    if args.action == "run":
        print(f"canonical run written: {shown(run_canonical(args.profile, args.requests))}")
    found = load_canonical()
    print(found.summary() if found is not None else f"no canonical run in {shown(canonical_dir())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
