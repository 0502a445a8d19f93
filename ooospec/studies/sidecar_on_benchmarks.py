"""An adapter's hint against the target's own calls on the canonical run's benchmark requests.

The API-disjoint dev chooses every sidecar; this study only *reports*, for an adapter that is not
served (the size ablation), what its hint would have held on the requests the committed canonical
run decoded: per benchmark, on the requests where the target's (AR) output holds a call, whether
the wave names the target's first function and holds its whole call as written (what greedy
verification accepts; `ooospec.report.hint_check.agreement_row`). The served adapter is run the same
way on the same requests, so the two are paired request for request (a paired bootstrap interval of
the whole-call difference, as the dev's differences are read). Evaluation data chooses nothing
here: no constant, threshold or adapter is picked from it.

The waves are written to a stage keyed by the adapter, the canonical run's manifest and the machine,
one line per request, so an interrupted run resumes.
``python -m ooospec.studies.sidecar_on_benchmarks --adapter <frozen dir> [--commit]``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ooospec.data.request import Call, Request
from ooospec.models.adapters import read_frozen
from ooospec.paths import artifacts_dir, shown
from ooospec.progress import progress_bar
from ooospec.provenance import code_commit
from ooospec.report.canonical import CanonicalRun, load_canonical
from ooospec.report.hint_check import agreement_row
from ooospec.report.intervals import paired_share_difference
from ooospec.sidecar.predictor import SlotPredictor
from ooospec.stage import Stage, append_jsonl, read_jsonl, write_jsonl
from ooospec.training.sidecar import this_machine

if TYPE_CHECKING:
    import pandas as pd

STAGE_NAME = "sidecar-on-benchmarks"
COMMITTED = "sidecar-on-benchmarks"  # artifacts/committed/<this>/<adapter>.jsonl + .json
TARGET = "qwen2.5-coder-0.5b"  # the target whose traces trained every sidecar


@dataclass(frozen=True)
class BenchmarkRequest:
    """One canonical request whose AR output holds a call: the request and the target's first call."""

    benchmark: str
    request: Request
    target_call: Call


def requests_with_calls(run: CanonicalRun, target: str = TARGET, profile: str = "cpu") -> list[BenchmarkRequest]:
    """The canonical run's requests of ``target`` whose AR output holds a call, in the run's order
    (a hint cannot help prose, so the others are not scored)."""
    from ooospec.report.ar_accuracy import ar_first_calls

    return [BenchmarkRequest(record["benchmark"], request, call) for record, request, call
            in ar_first_calls([r for r in run.records if r["target"] == target], profile) if call is not None]


def scored_wave(wave: dict[str, Any], target_call: Call) -> dict[str, bool]:
    """A stored wave (``WaveResult.to_dict``) read as the bench reads a hint: its first call and every
    call of its payload, scored against the target's call (`agreement_row`)."""
    payload = json.loads(wave["payload"]) if wave.get("payload") else []
    calls = payload if isinstance(payload, list) else [payload]
    hint = {"call": wave.get("call"), "calls": calls, "ready_round": 0}
    row = agreement_row(hint, target_call)
    return {"function": bool(row["function"]), "whole": bool(row["whole"])}


def adapter_stage(record: dict[str, Any], run: CanonicalRun, profile: str) -> Stage:
    """Keyed by the adapter, the canonical run's files and the machine (wave times are its own)."""
    manifest = {name: entry["sha256"] for name, entry in
                json.loads((run.directory / "manifest.json").read_text())["files"].items()}
    return Stage(STAGE_NAME, {"adapter_sha256": record["sha256"], "profile": profile, "canonical": manifest,
                              "machine": this_machine()})


def committed_run() -> CanonicalRun:
    """The committed canonical run (its files checked once); a clear error where none is committed."""
    run = load_canonical()
    if run is None:
        raise FileNotFoundError("no canonical run is committed (artifacts/committed/canonical/manifest.json): "
                                "this study scores hints on its requests")
    return run


def score_adapter(adapter_dir: Path, profile: str = "cpu", limit: int | None = None,
                  run: CanonicalRun | None = None) -> list[dict[str, Any]]:
    """One wave per canonical request with a target call (as served: every slot filled), each
    scored; resumable by request. Returns the stored lines of the scored requests."""
    run = run or committed_run()
    record = read_frozen(Path(adapter_dir))
    todo_all = requests_with_calls(run, profile=profile)[:limit]
    out = adapter_stage(record, run, profile).path("waves.jsonl")
    done = {(w["benchmark"], w["request_id"]) for w in read_jsonl(out)} if out.exists() else set()
    todo = [q for q in todo_all if (q.benchmark, q.request.id) not in done]
    if todo:
        predictor = SlotPredictor.from_frozen(Path(adapter_dir), profile)
        for item in progress_bar(todo, desc=f"benchmarks {record['name']}", unit="req"):
            wave = predictor.predict_wave(item.request).to_dict()
            keep = {k: wave[k] for k in ("request_id", "call", "payload", "latency_s", "forwards", "reason")}
            append_jsonl(out, [{**keep, "benchmark": item.benchmark, "reference": item.target_call.to_dict(),
                                **scored_wave(wave, item.target_call)}])
    wanted = {(q.benchmark, q.request.id) for q in todo_all}
    return [w for w in read_jsonl(out) if (w["benchmark"], w["request_id"]) in wanted]


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / COMMITTED


def commit_scores(adapter_dir: Path, profile: str = "cpu") -> Path:
    """The scored waves (calls, not rows) and their provenance beside the other committed assets."""
    from ooospec.training.sidecar import _provenance

    record = read_frozen(Path(adapter_dir))
    run = committed_run()
    waves = score_adapter(adapter_dir, profile, run=run)
    out = committed_dir()
    write_jsonl(out / f"{record['name']}.jsonl", waves)  # atomic: a reader never sees half the scores
    provenance = {"adapter": record["name"], "adapter_sha256": record["sha256"], "profile": profile,
                  "target": TARGET, "canonical_code_commit": run.provenance["code_commit"],
                  "requests": len(waves), "code_commit": code_commit(),
                  "made_by": "ooospec.studies.sidecar_on_benchmarks", **_provenance()}
    (out / f"{record['name']}.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return out / f"{record['name']}.jsonl"


def _committed(name: str, directory: Path | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    path = (directory or committed_dir()) / f"{name}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{shown(path)}: no committed benchmark scores of adapter {name}")
    return {(w["benchmark"], w["request_id"]): w for w in read_jsonl(path)}


def agreement_table(reference: str, candidate: str, directory: Path | None = None) -> "pd.DataFrame":
    """Per benchmark, on the same ``n`` requests: function and whole call of the reference (``ref.``)
    and the candidate (``cand.``), the paired whole-call difference (candidate - reference) with its
    bootstrap 95% interval, and each one's median wave in seconds."""
    import statistics

    import pandas as pd

    ref, new = _committed(reference, directory), _committed(candidate, directory)
    if set(ref) != set(new):
        raise ValueError(f"{reference} and {candidate} were scored on different requests "
                         f"({len(set(ref) ^ set(new))} not in both)")
    rows = []
    for benchmark in sorted({b for b, _ in ref}):
        keys = sorted(k for k in ref if k[0] == benchmark)
        difference = paired_share_difference([ref[k]["whole"] for k in keys], [new[k]["whole"] for k in keys])
        rows.append({"benchmark": benchmark, "n": len(keys),
                     "function (ref.)": sum(ref[k]["function"] for k in keys) / len(keys),
                     "function (cand.)": sum(new[k]["function"] for k in keys) / len(keys),
                     "whole call (ref.)": sum(ref[k]["whole"] for k in keys) / len(keys),
                     "whole call (cand.)": sum(new[k]["whole"] for k in keys) / len(keys),
                     "difference [95% CI]": difference.cell,
                     "wave s (ref.)": statistics.median(ref[k]["latency_s"] for k in keys),
                     "wave s (cand.)": statistics.median(new[k]["latency_s"] for k in keys)})
    return pd.DataFrame(rows).set_index("benchmark")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Score an adapter's hint on the canonical run's benchmark requests.")
    parser.add_argument("--adapter", required=True, type=Path, help="a frozen adapter folder")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N requests (not with --commit)")
    parser.add_argument("--commit", action="store_true", help="copy the finished scores to artifacts/committed/")
    args = parser.parse_args(argv)
    if args.commit and args.limit is not None:  # committed scores cover every request with a call
        parser.error("--limit and --commit together: committed scores cover every request, so a limited run is not committed")
    waves = commit_scores(args.adapter, args.profile) if args.commit else None
    lines = list(read_jsonl(waves)) if waves else score_adapter(args.adapter, args.profile, args.limit)
    for benchmark in sorted({w["benchmark"] for w in lines}):
        part = [w for w in lines if w["benchmark"] == benchmark]
        print(f"{benchmark:12s} n={len(part)} function={sum(w['function'] for w in part) / len(part):.3f} "
              f"whole call={sum(w['whole'] for w in part) / len(part):.3f}")


if __name__ == "__main__":
    main()
