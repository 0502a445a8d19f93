"""What is being accelerated: AR's outputs parsed in the target's frozen surface and scored against
gold (every method writes AR's output), and what the outputs that hold no call are."""

from __future__ import annotations

import json
from typing import Any, Iterable

import pandas as pd

from ooospec.stage import read_jsonl


def ar_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu") -> list[tuple[dict[str, Any], Any, Any]]:
    """Each AR record with its request (from its benchmark file) and its target's frozen surface,
    loaded once per benchmark and target. Every method writes AR's output (lossless), so AR's record
    per request stands for all; a record whose request is not in the file is left out."""
    from ooospec.bench.sampling import load_benchmark
    from ooospec.models.formats import get_surface
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    ar = [r for r in records if r["method"] == "ar"]
    requests = {b: {q.id: q for q in load_benchmark(b)} for b in dict.fromkeys(r["benchmark"] for r in ar)}
    surfaces = {t: get_surface(prof.target(t).surface or "") for t in dict.fromkeys(r["target"] for r in ar)}
    return [(r, requests[r["benchmark"]][r["request_id"]], surfaces[r["target"]])
            for r in ar if r["request_id"] in requests[r["benchmark"]]]


def scored_ar_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu") -> list[tuple[dict[str, Any], Any]]:
    """Each AR record (`ar_outputs`) with its output scored against gold (`ooospec.report.accuracy.score_text`)
    in its target's frozen surface."""
    from ooospec.report.accuracy import score_text

    return [(r, score_text(request, r["text"], surface, target=r["target"]))
            for r, request, surface in ar_outputs(records, profile)]


def ar_first_calls(records: Iterable[dict[str, Any]], profile: str = "cpu") -> list[tuple[dict[str, Any], Any, Any]]:
    """Each AR record (`ar_outputs`) with its request and the target's first call as parsed in its
    frozen surface (a `Call`), or None where the output holds no call: what a hint is scored against."""
    from ooospec.report.accuracy import parse_calls

    out = []
    for r, request, surface in ar_outputs(records, profile):
        calls, _ = parse_calls(request, r["text"], surface)
        out.append((r, request, calls[0] if calls else None))
    return out


def output_accuracy(records: Iterable[dict[str, Any]], profile: str = "cpu") -> pd.DataFrame:
    """What is being accelerated: parse rate, name match, exact match (API-Bank, ToolAlpaca) or
    BFCL's own checker, per target x benchmark (`scored_ar_outputs`)."""
    from ooospec.report.accuracy import accuracy_table

    return accuracy_table([score for _, score in scored_ar_outputs(records, profile)], by=("target", "benchmark"))


def output_kind(text: str) -> str:
    """A coarse label for an output that does not parse as a call in the target's surface."""
    body = text.strip()
    if "API-Request" in body:
        return "API-Bank's own API-Request: syntax"
    if body.startswith(("{", "[", "```", "<tool_call>")):
        return "call-like, not valid in its surface"
    return "prose (no call)"


def unparsed_outputs(records: Iterable[dict[str, Any]], profile: str = "cpu", chars: int = 200) -> pd.DataFrame:
    """AR outputs that do not parse as a call in the target's frozen surface, with what they are
    (`output_kind`) and their first ``chars`` characters: where no schema FSM or hint can help."""
    rows = []
    for r, score in scored_ar_outputs(records, profile):
        if score.parsed:
            continue
        text = " ".join(r["text"].split())
        rows.append({"target": r["target"], "benchmark": r["benchmark"], "request_id": r["request_id"],
                     "kind": output_kind(r["text"]), "output": text[:chars] + ("..." if len(text) > chars else "")})
    return pd.DataFrame(rows, columns=["target", "benchmark", "request_id", "kind", "output"])


def open_final_turn_probe() -> tuple[pd.DataFrame, dict[str, Any]]:
    """The committed probe of an open last assistant turn (`tools/probe_open_final_turn.py`): on
    API-Bank requests that end with the AI's own words, does the Qwen target write a call when a
    new assistant turn is opened (the committed prompt) or when that last turn is left open for it
    to complete? One row per rendering (requests, outputs that parse as a call, and how many were
    empty), and the probe's provenance; empty when the probe is absent."""
    from ooospec.paths import artifacts_dir

    folder = artifacts_dir() / "committed" / "probes" / "apibank-open-final-turn"
    if not (folder / "outputs.jsonl").exists():
        return pd.DataFrame(), {}
    rows = pd.DataFrame(list(read_jsonl(folder / "outputs.jsonl")))
    rows["empty"] = rows.output.str.strip() == ""
    table = rows.groupby("rendering", sort=False).agg(requests=("request_id", "size"), parse_as_call=("parsed", "sum"),
                                                      empty_output=("empty", "sum"))
    return table, json.loads((folder / "provenance.json").read_text())
