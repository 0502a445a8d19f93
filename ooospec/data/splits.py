"""Training-pool hygiene and the deterministic train/dev split.

Order of the checks, applied to every training request of every source (each failure is a drop
recorded on the request's own source, so per-source counts still reconcile):

1. **Decontamination by name** (the paper's ToolAlpaca rule, applied to every source): drop the
   request when any of its tool names, gold call names or API name (ToolAlpaca ``meta["api"]``)
   appears in the evaluation manifest, i.e. the names of every tool offered by an evaluation
   request plus the ToolAlpaca evaluation API names. Names are compared after lower-casing and
   mapping ``.``, ``-`` and spaces to ``_`` (so ``math.factorial`` matches ``math_factorial``).
   Benchmark protocol tools (API-Bank ``ToolSearcher``, ToolAlpaca ``getDetails`` /
   ``retrievalDataFromFile``) are harness plumbing rather than evaluated APIs and are exempt;
   otherwise every API-Bank level-3-style training request would go.
2. **Prompt overlap**: drop a request whose prompt hash or id equals an evaluation request's.
3. **Deduplication**: keep the first request of each prompt hash (source order), drop the rest.
4. **Split**: a request goes to dev when the first 15 hex digits of its prompt hash, read as a
   fraction of 16**15, fall below ``dev_fraction`` (default 529 / (9,662 + 529), the paper's
   ratio). The same prompt always lands on the same side, across runs and machines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from ooospec.data.loading import SourceLoad
from ooospec.data.request import Request

PAPER_TRAIN, PAPER_DEV = 9662, 529
DEFAULT_DEV_FRACTION = PAPER_DEV / (PAPER_TRAIN + PAPER_DEV)
PROTOCOL_TOOLS = frozenset({"ToolSearcher", "getDetails", "retrievalDataFromFile"})


def normalize_name(name: str) -> str:
    return re.sub(r"[.\-\s/]+", "_", name.strip().lower())


def eval_manifest(eval_requests: Iterable[Request], extra_names: Iterable[str] = ()) -> set[str]:
    """Normalised names of every evaluated API/function (protocol tools excluded)."""
    names = set()
    for request in eval_requests:
        names.update(t["name"] for t in request.tools)
        names.update(c.name for c in request.gold or [])
    names.update(extra_names)
    return {normalize_name(n) for n in names if n not in PROTOCOL_TOOLS}


def request_names(request: Request) -> set[str]:
    names = {t["name"] for t in request.tools} | {c.name for c in request.gold or []}
    if request.meta.get("api"):
        names.add(str(request.meta["api"]))
    return {n for n in names if n not in PROTOCOL_TOOLS}


def is_dev(prompt_hash: str, dev_fraction: float) -> bool:
    return int(prompt_hash[:15], 16) / 16**15 < dev_fraction


@dataclass
class SplitResult:
    train: list[Request] = field(default_factory=list)
    dev: list[Request] = field(default_factory=list)


def split_training(
    loads: list[SourceLoad], eval_requests: list[Request], extra_eval_names: Iterable[str] = (),
    dev_fraction: float = DEFAULT_DEV_FRACTION, decontaminate: bool = True,
) -> SplitResult:
    """Apply the checks above to every load (mutating its requests/drops) and split the rest."""
    manifest = eval_manifest(eval_requests, extra_eval_names)
    eval_hashes = {r.prompt_hash for r in eval_requests}
    eval_ids = {r.id for r in eval_requests}
    seen: set[str] = set()
    result = SplitResult()
    for load in loads:
        kept = []
        for request in load.requests:
            record = request.id
            file = load.files[0] if load.files else load.source
            hits = sorted(n for n in request_names(request) if normalize_name(n) in manifest)
            if decontaminate and hits:
                load.drop(file, record, "eval_name_overlap", ", ".join(hits[:5]))
                continue
            if request.prompt_hash in eval_hashes or request.id in eval_ids:
                load.drop(file, record, "eval_prompt_overlap")
                continue
            if request.prompt_hash in seen:
                load.drop(file, record, "duplicate_prompt")
                continue
            seen.add(request.prompt_hash)
            request.split = "dev" if is_dev(request.split_key, dev_fraction) else "train"
            (result.dev if request.split == "dev" else result.train).append(request)
            kept.append(request)
        load.requests = kept
    return result
