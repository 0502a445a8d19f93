"""One decode loop for every method: boundary -> ask the sources -> build a tree -> verify -> commit.

AR is this loop with no sources (every tree is just the root, one token per forward). The
speculative methods differ only in their `DraftSource` list; the loop never knows which method it
serves. Timing brackets include all drafting work: ``decode_s`` runs from the end of prefill to the
last commit and contains every `propose`, tree build, forward and `observe`; ``total_s`` adds the
sources' per-request setup (`begin`) and the prefill. `end` (e.g. retrieval storing the call for
later requests) runs after the clock stops, as it is off the request's critical path.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ooospec.data.request import Request
from ooospec.decoding.base import DecodeContext, DecodeState, DraftSource, EventTrace
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier, VerifierState

CREDITS = ("fsm", "retrieval", "pld", "hint", "bonus")


@dataclass
class Prefill:
    """A finished prefill that several methods may start from (see `decode`'s ``prefill``)."""

    state: VerifierState
    seconds: float
    margin: float | None = None


@dataclass
class RoundRecord:
    index: int
    tree_size: int
    accepted: int  # draft tokens accepted (the bonus token not counted)
    new_tokens: int
    credits: list[str]  # source credited for each new token ("bonus" for the target's own)
    sources: list[str]  # sources that had at least one node in the tree
    draft_s: float  # propose + tree build
    forward_s: float
    round_s: float  # everything of the round, observe included


@dataclass
class DecodeResult:
    request_id: str
    output_ids: list[int]
    text: str
    finish: str  # "eos" | "length"
    setup_s: float
    prefill_s: float
    decode_s: float
    total_s: float
    rounds: list[RoundRecord]
    source_counts: dict[str, int]
    trace: EventTrace
    prompt_tokens: int
    margins: list[float] = field(default_factory=list)  # top-2 logit gap per output token, if tracked

    @property
    def forwards(self) -> int:
        """Target forwards in the decode phase (verify rounds); prefill is one more."""
        return len(self.rounds)

    @property
    def target_forwards(self) -> int:
        return self.forwards + 1

    @property
    def mat(self) -> float:
        """Mean tokens committed per verify forward, bonus included (1.0 for AR). The prefill's
        token is left out because no draft could ever cover it."""
        decoded = len(self.output_ids) - 1
        return decoded / self.forwards if self.forwards else float("nan")

    @property
    def mean_tree_size(self) -> float:
        return sum(r.tree_size for r in self.rounds) / self.forwards if self.forwards else 0.0

    def to_record(self) -> dict[str, Any]:
        """A JSON-able summary (per-round details and the event trace included)."""
        return {
            "id": self.request_id,
            "output_ids": self.output_ids,
            "text": self.text,
            "finish": self.finish,
            "tokens": len(self.output_ids),
            "prompt_tokens": self.prompt_tokens,
            "setup_s": self.setup_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "total_s": self.total_s,
            "forwards": self.forwards,
            "target_forwards": self.target_forwards,
            "mat": self.mat,
            "mean_tree_size": self.mean_tree_size,
            "source_counts": self.source_counts,
            "rounds": [vars(r) for r in self.rounds],
            "trace": self.trace.to_list(),
        }


def make_context(target: Any, request: Request, trace: EventTrace | None = None) -> DecodeContext:
    """Context for ``request`` on a loaded target (`ooospec.models.target.TargetModel`)."""
    return DecodeContext(
        request=request,
        tokenizer=target.tokenizer,
        # the frozen rendering may depend on the request (Qwen writes one-line JSON on API-Bank)
        surface=target.surface_for(request) if hasattr(target, "surface_for") else target.surface,
        prompt_ids=list(target.prompt_ids(request)),
        eos_token_ids=list(target.eos_token_ids),
        trace=trace or EventTrace(),
    )


def _unwrap(target_model: Any) -> torch.nn.Module:
    return target_model if isinstance(target_model, torch.nn.Module) else target_model.model


@torch.no_grad()
def decode(
    target_model: Any,
    tokenizer: Any,
    sources: list[DraftSource],
    request_or_ctx: Request | DecodeContext,
    max_new_tokens: int = 256,
    budget: TreeBudget = TreeBudget(),
    *,
    prefill: Prefill | None = None,
    verifier: TreeVerifier | None = None,
    track_margins: bool = False,
) -> DecodeResult:
    """Greedy decoding of one request with drafts from ``sources`` (none: AR).

    ``target_model`` is an HF causal LM or a `TargetModel`; a bare `Request` needs the latter (it
    supplies the prompt ids, surface format and EOS ids). ``prefill`` starts from a copy of an
    earlier prefill of the same prompt (lossless checks run several methods on one prefill; the
    reported prefill time is then that prefill's).
    """
    start = time.perf_counter()
    if isinstance(request_or_ctx, DecodeContext):
        ctx = request_or_ctx
    else:
        ctx = make_context(target_model, request_or_ctx, EventTrace(start))
    tokenizer = tokenizer or ctx.tokenizer
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    verifier = verifier or TreeVerifier(_unwrap(target_model), ctx.eos_token_ids, track_margins)
    trace = ctx.trace

    for source in sources:
        source.begin(ctx)
    setup_end = time.perf_counter()

    trace.emit("prefill_start", prompt_tokens=len(ctx.prompt_ids))
    if prefill is None:
        vstate, margin = verifier.prefill(ctx.prompt_ids)
        prefill_s = time.perf_counter() - setup_end
    else:
        if prefill.state.tokens[: prefill.state.prompt_len] != list(ctx.prompt_ids):
            raise ValueError(f"request {ctx.request.id}: the shared prefill is of another prompt")
        vstate, margin, prefill_s = prefill.state.clone(), prefill.margin, prefill.seconds
    trace.emit("prefill_end", first_token=vstate.tokens[-1])
    prefill_end = time.perf_counter()

    state = DecodeState(ctx)
    first = vstate.tokens[-1]
    state.commit([first])
    margins = [margin] if margin is not None else []
    counts: Counter[str] = Counter({"bonus": 1})
    finish = "eos" if first in verifier.eos else ("length" if max_new_tokens == 1 else "")
    for source in sources:
        source.observe(state, [first])

    rounds: list[RoundRecord] = []
    while not finish:
        round_start = time.perf_counter()
        drafts = [draft for source in sources for draft in source.propose(state)]
        tree = build_tree(drafts, budget)
        draft_s = time.perf_counter() - round_start
        step = verifier.step(vstate, tree, max_new_tokens - len(state.output_ids))
        state.commit(step.new_tokens)
        state.round_index += 1
        for source in sources:
            source.observe(state, step.new_tokens)
        counts.update(step.credits)
        margins.extend(step.margins)
        record = RoundRecord(
            index=len(rounds),
            tree_size=tree.size,
            accepted=len(step.accepted_nodes),
            new_tokens=len(step.new_tokens),
            credits=step.credits,
            sources=sorted({tag for tags in tree.sources for tag in tags}),
            draft_s=draft_s,
            forward_s=step.forward_s,
            round_s=time.perf_counter() - round_start,
        )
        rounds.append(record)
        trace.emit(
            "round",
            index=record.index,
            tree_size=record.tree_size,
            accepted=record.accepted,
            new_tokens=record.new_tokens,
            sources=record.sources,
            credits=record.credits,
        )
        finish = step.finish or ""
    end = time.perf_counter()
    state.finished = True
    trace.emit("finish", reason=finish, tokens=len(state.output_ids))

    result = DecodeResult(
        request_id=ctx.request.id,
        output_ids=list(state.output_ids),
        text=tokenizer.decode(state.output_ids, skip_special_tokens=True),
        finish=finish,
        setup_s=setup_end - start,
        prefill_s=prefill_s,
        decode_s=end - prefill_end,
        total_s=(setup_end - start) + prefill_s + (end - prefill_end),
        rounds=rounds,
        source_counts={name: counts.get(name, 0) for name in CREDITS},
        trace=trace,
        prompt_tokens=len(ctx.prompt_ids),
        margins=margins,
    )
    for source in sources:
        source.end(state, result)
    return result
