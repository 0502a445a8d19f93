"""The lossless audit: PLD and ToolSpec against AR in one arithmetic on evaluation requests, every
first difference listed with AR's top-2 logit gap there (a near-tie, or a bug).

Committed per target and arithmetic under ``artifacts/committed/lossless-audit/`` because it costs
~25 minutes of one core: ``python -m ooospec.studies.lossless_audit --commit`` re-derives it in the
profile's arithmetic on this machine (a bf16 CPU: bf16 with the head's output in fp32 and row-invariant
forwards, `ooospec.models.row_invariant`) and writes it
beside the sets already there, which it never replaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ooospec.bench.sampling import sample_requests
from ooospec.models.arithmetic import Arithmetic, arithmetic_of, running_arithmetic, short_name
from ooospec.models.row_invariant import ROW_INVARIANT_KERNELS
from ooospec.models.registry import resolve_profile
from ooospec.paths import artifacts_dir, shown
from ooospec.provenance import bytes_sha256, code_commit
from ooospec.studies.target_cache import STUDY_CODE, _split_name, cached_target, torch_threads
from ooospec.data import load_split
from ooospec.stage import Stage, code_fingerprint, read_jsonl

# the bench loop the audit decodes with (`decode_requests`)
AUDIT_CODE = ("studies/lossless_audit.py", "bench/runner.py", "bench/records.py", "bench/sampling.py", "bench/plan.py",
              "bench/sidecars.py", "sidecar")


AUDITED_METHODS = ("pld", "toolspec")
DROPPED_FIELDS = ("output_ids", "rounds")
ROWS_SUFFIX = {"invariant": "-rowinvariant", "lean": "-lean"}  # a set's name per `rows_of`  # what a committed set leaves out (its outputs are compared in the run)


def lossless_audit(target_name: str, *, profile: str = "cpu", per_benchmark: int = 20, seed: int = 7,
                   max_new_tokens: int = 96, methods: tuple[str, ...] = AUDITED_METHODS,
                   progress: bool = True) -> list[dict[str, Any]]:
    """``methods`` against AR in the profile's own arithmetic on ``per_benchmark`` evaluation
    requests of each benchmark, through the bench's loop (`ooospec.bench.runner.decode_requests`);
    a record that differs from AR carries AR's top-2 gap at the first difference."""
    from ooospec.bench.runner import StudySettings, decode_requests

    config = {"code": code_fingerprint(*STUDY_CODE, *AUDIT_CODE), "profile": profile, "target": target_name,
              "per_benchmark": per_benchmark, "seed": seed, "max_new_tokens": max_new_tokens, "methods": list(methods)}
    stage = Stage("lossless_audit", config)
    path = stage.path("records.jsonl")
    if stage.done:
        return list(read_jsonl(path))
    target = cached_target(target_name, profile)
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    requests = [r for b in ("apibank", "toolalpaca", "bfcl")
                for r in sample_requests(load_split(_split_name(b)), per_benchmark, seed, b)]
    with torch_threads(1):
        records = decode_requests(target, requests, methods,
                                  StudySettings(max_new_tokens=max_new_tokens, seed=seed, progress=progress))
    arithmetic = running_arithmetic(target.model)
    for record in records:
        record.update(profile=profile, dtype=dtype, logits=arithmetic.logits or dtype, rows=rows_of(arithmetic),
                      near_tie_gap=arithmetic.near_tie_gap)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    stage.mark_done(records=len(records))
    return records


def rows_of(arithmetic: Arithmetic) -> str:
    """``lean`` where the target decoded on the lean decoder (`ooospec.models.lean_decoder`, its rows
    invariant by construction), ``invariant`` where on transformers' row-invariant forward
    (`ooospec.models.row_invariant`), else ``plain``."""
    from ooospec.models.lean_decoder import LEAN_KERNELS

    if LEAN_KERNELS in (arithmetic.kernels or ""):
        return "lean"
    return "invariant" if arithmetic.kernels == ROW_INVARIANT_KERNELS else "plain"


def audit_row(record: dict[str, Any]) -> dict[str, Any]:
    """One audited decode in one shape, whichever harness wrote it: the committed bf16 audit was made
    before the studies ran through the bench's loop and names its first difference ``mismatch_at`` /
    ``ar_gap_at_mismatch`` (request id in ``id``); the bench's records keep it in ``mismatch``."""
    mismatch = record.get("mismatch") or {}
    return {"target": record["target"], "dtype": record["dtype"], "logits": record.get("logits", record["dtype"]),
            "rows": record.get("rows", "plain"), "method": record["method"],
            "benchmark": record["benchmark"], "request_id": record["request_id"] if "request_id" in record else record["id"],
            "identical_to_ar": bool(record["identical_to_ar"]), "near_tie": bool(record.get("near_tie")),
            "mismatch_at": record.get("mismatch_at", mismatch.get("position")),
            "ar_gap_at_mismatch": record.get("ar_gap_at_mismatch", mismatch.get("ar_margin"))}


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / "lossless-audit"


def set_name(target: str, dtype: str, logits: str | None, rows: str = "plain") -> str:
    """A committed set's file: target, arithmetic and, where they differ from it, the head's output
    precision and the forward's rows (row-invariant, or the lean decoder)."""
    head = "" if logits in (None, dtype) else f"-{short_name(logits)}logits"
    return f"{target}-{short_name(dtype)}{head}{ROWS_SUFFIX.get(rows, '')}.jsonl"


def commit_audit(target_names: tuple[str, ...], profile: str = "cpu", folder: Path | None = None) -> list[Path]:
    """Audit each target in ``profile``'s arithmetic on this machine (`lossless_audit`, resumable) and
    write it beside the committed sets with its provenance; a set of the same name is refused, not
    replaced (a frozen asset is re-derived on purpose: remove it first)."""
    folder = folder or committed_dir()
    provenance_path = folder / "provenance.json"
    provenance = json.loads(provenance_path.read_text()) if provenance_path.exists() else {"sets": {}}
    written = []
    for name in target_names:
        settings = {"per_benchmark": 20, "seed": 7, "max_new_tokens": 96, "methods": list(AUDITED_METHODS)}
        arithmetic = arithmetic_of(resolve_profile(profile).model(name))
        out = folder / set_name(name, arithmetic.dtype, arithmetic.logits, rows_of(arithmetic))
        if out.exists():
            raise FileExistsError(f"{shown(out)}: already committed; remove it to re-derive it")
        records = lossless_audit(name, profile=profile, **{**settings, "methods": AUDITED_METHODS})
        if set_name(name, records[0]["dtype"], records[0]["logits"], records[0].get("rows", "plain")) != out.name:
            raise RuntimeError(f"{name}: ran in {records[0]['dtype']} (logits {records[0]['logits']}, rows "
                               f"{records[0].get('rows', 'plain')}), "
                               f"not the {out.name} the profile planned")
        kept = [{k: v for k, v in r.items() if k not in DROPPED_FIELDS} for r in records]
        data = "".join(json.dumps(r) + "\n" for r in kept).encode()
        folder.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        checked = [r for r in kept if r["method"] != "ar"]
        gaps = [audit_row(r)["ar_gap_at_mismatch"] for r in checked if not r["identical_to_ar"]]
        provenance["sets"][out.name] = {
            "target": name, "sha256": bytes_sha256(data), "made_by": f"python -m ooospec.studies.lossless_audit "
            f"--commit --profile {profile}", "code_commit": code_commit(), "arithmetic": arithmetic.sentence(),
            "config": {**settings, "profile": profile, "target": name},
            "near_tie_gap": records[0]["near_tie_gap"], "requests": len({audit_row(r)["request_id"] for r in kept}),
            "decodes_checked": len(checked), "mismatches": len(gaps),
            "max_gap_at_mismatch": max((g for g in gaps if g is not None), default=None)}
        provenance.setdefault("fields_dropped", list(DROPPED_FIELDS))
        provenance_path.write_text(json.dumps(provenance, indent=1))
        written.append(out)
        print(f"{shown(out)}: {len(checked)} decodes checked, {len(gaps)} differ from AR")
    return written


def committed_audit(folder: Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The committed lossless audits (`lossless_audit`, 60 evaluation requests per target, PLD and
    ToolSpec against AR), one set per target and arithmetic: a summary per target x arithmetic x
    method and every mismatch with AR's top-2 logit gap there."""
    folder = folder or committed_dir()
    records = [r for path in sorted(folder.glob("*.jsonl")) for r in read_jsonl(path)]
    checked = pd.DataFrame([audit_row(r) for r in records if r["method"] != "ar"])
    if checked.empty:
        return pd.DataFrame(), pd.DataFrame()
    summary = checked.groupby(["target", "dtype", "logits", "rows", "method"]).agg(
        decodes=("request_id", "size"), identical=("identical_to_ar", "sum"), near_ties=("near_tie", "sum"),
        largest_gap_at_mismatch=("ar_gap_at_mismatch", "max")).reset_index()
    checked["head"] = checked.logits.map(short_name)  # the head's output precision, short enough for the page
    mismatches = checked[~checked.identical_to_ar][["target", "head", "method", "benchmark", "request_id", "mismatch_at",
                                                    "ar_gap_at_mismatch", "near_tie"]]
    return summary, mismatches.reset_index(drop=True)


def main(argv: list[str] | None = None) -> None:
    """CLI: ``--commit`` audits each target in the profile's arithmetic on this machine and commits it."""
    import argparse

    from ooospec.bench.config import DEFAULT_TARGETS

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--commit", action="store_true", required=True)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    args = parser.parse_args(argv)
    commit_audit(tuple(args.targets), args.profile)


if __name__ == "__main__":
    main()
