"""Methods side by side on the same requests: losslessness against AR, MAT, forwards and speedups.

Used by the lossless test and by ``notebooks/03_toolspec.ipynb``. Per request, AR runs first and
every other method is compared with it token by token; a mismatch is reported with the top-1 minus
top-2 logit gap of AR at the first differing position, so a numerical near-tie (fp32 sums in a
different order in a 17-row forward than in a 1-row one) is told apart from a bug.

The prefill is shared by default: it is the same computation for every method here (no method
changes the prompt), so it runs once per request and its measured time is attributed to each
method. That removes prefill noise from the end-to-end ratios and saves two thirds of the
prefill work; ``share_prefill=False`` runs it per method.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterable

from ooospec.bench.methods import MethodSpec, method_sources
from ooospec.data.request import Request
from ooospec.decoding.base import DraftSource
from ooospec.models.context import fit_budget, model_context
from ooospec.decoding.loop import DecodeResult, Prefill, decode
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import NEAR_TIE_GAPS, near_tie_gap  # noqa: F401 (the bench reads them here)
from ooospec.models.arithmetic import first_difference
from ooospec.progress import progress_bar

NEAR_TIE_GAP = NEAR_TIE_GAPS["float32"]  # logit gap under which fp32 summation order can flip a greedy choice


@dataclass
class MethodRun:
    """One method of a comparison: its label, the method, and a tree budget that overrides the
    method's own (the budget sweep sets the depth limit to the node budget)."""

    label: str
    spec: MethodSpec
    budget: TreeBudget | None = None


def select_slice(requests: list[Request], n: int, seed: int = 0) -> list[Request]:
    """A fixed, seeded sample of ``n`` requests (all of them when n >= len)."""
    if n >= len(requests):
        return list(requests)
    picked = sorted(random.Random(seed).sample(range(len(requests)), n))
    return [requests[i] for i in picked]


def _record(result: DecodeResult, request: Request, label: str, target: str, ar: DecodeResult | None,
            tie_gap: float = NEAR_TIE_GAP) -> dict:
    record = result.to_record()
    del record["trace"], record["text"]
    record.update(method=label, target=target, benchmark=request.benchmark)
    if ar is not None:
        at = first_difference(ar.output_ids, result.output_ids)
        record["identical_to_ar"] = at is None
        record["mismatch_at"] = at
        gap = ar.margins[at] if at is not None and at < len(ar.margins) else None
        record["ar_gap_at_mismatch"] = gap
        record["near_tie"] = gap is not None and gap < tie_gap
    return record


def compare_methods(
    target: Any,
    requests: Iterable[Request],
    runs: list[MethodRun],
    max_new_tokens: int = 128,
    budget: TreeBudget = TreeBudget(),
    share_prefill: bool = True,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run AR and every method of ``runs`` on each request; one record per request x method.

    Sources are built once per method and kept across the requests (call retrieval learns from
    the calls produced earlier in the same run). Records of non-AR methods carry
    ``identical_to_ar``, ``mismatch_at``, ``ar_gap_at_mismatch`` and ``near_tie``. A prompt that
    does not fit the target's context raises `PromptTooLong` before the shared prefill.
    """
    verifier = TreeVerifier.for_target(target, track_margins=True)
    sources: dict[str, list[DraftSource]] = {run.label: method_sources(run.spec) for run in runs}
    records: list[dict[str, Any]] = []
    requests = list(requests)
    for request in progress_bar(requests, desc=f"{target.name}", disable=not progress):
        prefill = None
        if share_prefill:
            prompt = target.prompt_ids(request)
            fit_budget(len(prompt), max_new_tokens, model_context(target.model), request.id)
            prefill = Prefill.measure(verifier, prompt)
        ar = decode(target, [], request, max_new_tokens, budget, prefill=prefill, verifier=verifier)
        records.append(_record(ar, request, "ar", target.name, None))
        for run in runs:
            if run.spec.base == "ar":
                continue
            result = decode(target, sources[run.label], request, max_new_tokens, run.budget or budget,
                            prefill=prefill, verifier=verifier)
            records.append(_record(result, request, run.label, target.name, ar, near_tie_gap(verifier.dtype)))
    return records


def summarize(records: list[dict[str, Any]]):
    """Per target x benchmark x method: requests, identical share, MAT, forwards per call, and
    decode-phase / end-to-end speedups over AR (mean of per-request ratios, and total-time ratio)."""
    import pandas as pd

    frame = pd.DataFrame(records)
    ar = frame[frame["method"] == "ar"].set_index(["target", "id"])
    rows = []
    for (target, benchmark, method), group in frame.groupby(["target", "benchmark", "method"], sort=False):
        base = ar.loc[[(target, i) for i in group["id"]]]
        decoded = (group["tokens"] - 1).sum()
        rows.append({
            "target": target,
            "benchmark": benchmark,
            "method": method,
            "requests": len(group),
            "identical": 1.0 if method == "ar" else float(group["identical_to_ar"].mean()),
            "near_ties": 0 if method == "ar" else int(group["near_tie"].sum()),
            "MAT": decoded / group["forwards"].sum() if group["forwards"].sum() else float("nan"),
            "forwards/call": group["target_forwards"].mean(),
            "tree nodes": group["mean_tree_size"].mean(),
            "decode speedup (mean)": (base["decode_s"].values / group["decode_s"].values).mean(),
            "decode speedup (total)": base["decode_s"].sum() / group["decode_s"].sum(),
            "e2e speedup (mean)": (base["total_s"].values / group["total_s"].values).mean(),
            "e2e speedup (total)": base["total_s"].sum() / group["total_s"].sum(),
            "decode s/call": group["decode_s"].mean(),
            "prefill s/call": group["prefill_s"].mean(),
        })
    return pd.DataFrame(rows)
