"""Derive and check a target's frozen rendering from its own greedy outputs.

The surface format must render a call byte for byte as the target writes it, or hints and
retrieved calls never line up with the target's tokens. So the rendering is not guessed: the
target answers a few requests greedily, each answer is parsed and re-rendered, and the re-rendered
text must equal what the target wrote (up to EOS). The answers are stored as evidence next to the
rendering parameters (``configs/renderings/<format>.json``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ooospec.data.request import Request
from ooospec.models.target import TargetModel
from ooospec.progress import progress_bar
from ooospec.sequences import first_difference


@dataclass
class RenderingObservation:
    """One greedy answer and whether the surface format reproduces it exactly."""

    request_id: str
    benchmark: str
    variant: dict[str, Any]
    raw_text: str
    stopped_on_eos: bool
    calls: list[dict[str, Any]]
    rerendered: str
    exact: bool
    mismatch_at: int | None
    ascii_only_arguments: bool


def greedy_text(target: TargetModel, request: Request, max_new_tokens: int) -> tuple[str, bool]:
    """The target's greedy answer (special tokens dropped) and whether it ended with an EOS token."""
    ids = torch.tensor([target.prompt_ids(request)])
    with torch.no_grad():
        out = target.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=target.eos_token_ids, pad_token_id=target.tokenizer.pad_token_id,
        )
    new = out[0, ids.shape[1]:].tolist()
    stopped = bool(new) and new[-1] in target.eos_token_ids
    if stopped:
        new = new[:-1]
    return target.tokenizer.decode(new, skip_special_tokens=False), stopped


def observe(target: TargetModel, requests: list[Request], max_new_tokens: int = 200) -> list[RenderingObservation]:
    """Greedy answers of ``target`` on ``requests``, each checked against parse -> render."""
    observations = []
    for request in progress_bar(requests, desc=f"rendering evidence {target.name}"):
        raw, stopped = greedy_text(target, request, max_new_tokens)
        surface = target.surface_for(request)
        calls = surface.parse(raw)
        rerendered = surface.render(calls) if calls else ""
        observations.append(RenderingObservation(
            request_id=request.id, benchmark=request.benchmark, variant=surface.describe(), raw_text=raw, stopped_on_eos=stopped, calls=[c.to_dict() for c in calls],
            rerendered=rerendered, exact=rerendered == raw, mismatch_at=first_difference(rerendered, raw),
            ascii_only_arguments=all(ch.isascii() for c in calls for ch in c.compact()),
        ))
    return observations


def evidence_record(target: TargetModel, observations: list[RenderingObservation], note: str) -> dict[str, Any]:
    """The JSON stored under configs/renderings/: parameters + every observation."""
    return {
        "format": target.surface.name,
        "target": target.name,
        "observed_at": time.strftime("%Y-%m-%d"),
        "note": note,
        "exact_matches": sum(o.exact for o in observations),
        "observations": [asdict(o) for o in observations],
    }
