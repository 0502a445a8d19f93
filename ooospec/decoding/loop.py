"""One decode loop for every method: boundary -> ask the sources -> build a tree -> verify -> commit.

AR is this loop with no sources (every tree is just the root, one token per forward). The
speculative methods differ only in their `DraftSource` list; the loop never knows which method it
serves. Timing brackets include all drafting work: ``decode_s`` runs from the end of prefill to the
last commit and contains every `propose`, tree build, forward and `observe`; ``total_s`` adds the
sources' per-request setup (`begin`) and the prefill. `end` (e.g. retrieval storing the call for
later requests) runs after the clock stops, as it is off the request's critical path.

Context: before anything else (no source sees the request, no prefill runs, a shared prefill is not
used) the prompt is checked against the target's context (`ooospec.models.context.fit_budget`):
a prompt that leaves no room raises `PromptTooLong`; one that leaves less than ``max_new_tokens``
is decoded with the budget capped to the room (recorded: ``max_new_tokens``, ``capped_from`` and a
``budget_capped`` trace event). Near the end of the context a round's tree is cut to the depth
that still fits, which never changes a committed token (a node that deep could not be committed
within the budget anyway).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ooospec.data.request import Request
from ooospec.decoding.base import CREDITS, CorePlacement, DecodeContext, DecodeState, DraftSource, EventTrace
from ooospec.models.context import fit_budget, model_context, positions_left
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier, VerifierState
from ooospec.models.target import TargetModel

# the fields of a `RoundRecord` that its trace event carries (timings stay in the record)
ROUND_EVENT_FIELDS = ("index", "tree_size", "accepted", "new_tokens", "sources", "credits", "threads")


@dataclass
class Prefill:
    """A finished prefill that several methods may start from (see `decode`'s ``prefill``)."""

    state: VerifierState
    seconds: float
    margin: float | None
    prompt_ids: list[int]

    @classmethod
    def measure(cls, verifier: TreeVerifier, prompt_ids: list[int],
                placement: CorePlacement | None = None) -> "Prefill":
        """Time one prefill; in chunks where ``placement`` asks for them (`CorePlacement.prefill_chunk`)."""
        start = time.perf_counter()
        if placement is not None and placement.prefill_chunk:
            def between() -> bool:
                placement.boundary()
                return placement.settled

            state, margin = verifier.prefill(prompt_ids, placement.prefill_chunk, between)
        else:
            state, margin = verifier.prefill(prompt_ids)
        return cls(state, time.perf_counter() - start, margin, list(prompt_ids))


@dataclass
class RoundRecord:
    """One verify round as the loop saw it; its trace event is `event_fields` of it."""

    index: int
    tree_size: int
    accepted: int  # draft tokens accepted (the bonus token not counted)
    new_tokens: int
    credits: list[str]  # source credited for each new token ("bonus" for the target's own)
    sources: list[str]  # sources that had at least one node in the tree
    draft_s: float  # propose + tree build
    forward_s: float
    round_s: float  # everything of the round, observe included
    threads: int = 1  # torch threads the round's forward ran with (elastic placement changes it)

    def event_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ROUND_EVENT_FIELDS}


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
    max_new_tokens: int = 0  # the budget decoded with (the context's room where that was less than asked)
    capped_from: int | None = None  # the budget asked for, where the context capped it; else None

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
            "max_new_tokens": self.max_new_tokens,
            "capped_from": self.capped_from,
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


def make_context(target: TargetModel, request: Request, trace: EventTrace | None = None) -> DecodeContext:
    """Context for ``request`` on a loaded target."""
    return DecodeContext(
        request=request,
        tokenizer=target.tokenizer,
        # the frozen rendering may depend on the request (Qwen writes one-line JSON on API-Bank)
        surface=target.surface_for(request),
        prompt_ids=list(target.prompt_ids(request)),
        eos_token_ids=list(target.eos_token_ids),
        trace=trace or EventTrace(),
    )


@torch.no_grad()
def decode(
    target: TargetModel,
    sources: list[DraftSource],
    request: Request | DecodeContext,
    max_new_tokens: int = 256,
    budget: TreeBudget = TreeBudget(),
    *,
    prefill: Prefill | None = None,
    verifier: TreeVerifier | None = None,
    placement: CorePlacement | None = None,
) -> DecodeResult:
    """Greedy decoding of one request with drafts from ``sources`` (none: AR).

    A bare `Request` gets its context (prompt ids, surface, EOS ids) from ``target``. ``prefill``
    starts from a copy of an earlier prefill of the same prompt (lossless checks run several
    methods on one prefill; the reported prefill time is then that prefill's). ``verifier``
    reuses one verifier across requests; margins are tracked when it tracks them. ``placement``
    is told when the request arrives, once its sources have begun, before every verify round and
    when it ends (the elastic placement lends the target the sidecar's idle core). A prompt that does not fit the target's
    context raises `PromptTooLong` before any of that (see the module doc).
    """
    placement = placement or CorePlacement()
    try:
        return _decode(target, sources, request, max_new_tokens, budget, prefill, verifier, placement)
    finally:
        placement.end()


def _decode(target: TargetModel, sources: list[DraftSource], request: Request | DecodeContext, max_new_tokens: int,
            budget: TreeBudget, prefill: Prefill | None, verifier: TreeVerifier | None,
            placement: CorePlacement) -> DecodeResult:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    start = time.perf_counter()
    placement.begin()  # timed: a switch of cores is part of the method
    ctx = request if isinstance(request, DecodeContext) else make_context(target, request, EventTrace(start))
    context = model_context(target.model)
    asked, max_new_tokens = max_new_tokens, fit_budget(len(ctx.prompt_ids), max_new_tokens, context, ctx.request.id)
    if max_new_tokens < asked:
        ctx.trace.emit("budget_capped", max_new_tokens=max_new_tokens, asked=asked, context=context,
                       prompt_tokens=len(ctx.prompt_ids))
    verifier = verifier or TreeVerifier(target.model, ctx.eos_token_ids, dense_cache=target.compiled.mode is not None)
    for source in sources:
        source.begin(ctx)
    placement.boundary()  # once the sources have begun: a request with no sidecar job prefills wide
    setup_s = time.perf_counter() - start

    own = _prefill(verifier, ctx, prefill, placement)
    decode_start = time.perf_counter()
    state = DecodeState(ctx)
    state.commit([own.state.root])
    for source in sources:
        source.observe(state, [own.state.root])
    tally = _Tally(Counter({"bonus": 1}), [] if own.margin is None else [own.margin])
    finish = "eos" if own.state.root in verifier.eos else ("length" if max_new_tokens == 1 else "")
    rounds: list[RoundRecord] = []
    while not finish:
        tree_budget = _within_context(budget, context, own.state.cache_len)
        placement.boundary()
        record, finish = _round(verifier, own.state, state, sources, tree_budget, max_new_tokens, tally)
        rounds.append(record)
        ctx.trace.emit("round", **record.event_fields())
    decode_s = time.perf_counter() - decode_start
    ctx.trace.emit("finish", reason=finish, tokens=len(state.output_ids))

    result = DecodeResult(
        request_id=ctx.request.id, output_ids=list(state.output_ids),
        text=ctx.tokenizer.decode(state.output_ids, skip_special_tokens=True), finish=finish,
        setup_s=setup_s, prefill_s=own.seconds, decode_s=decode_s, total_s=setup_s + own.seconds + decode_s,
        rounds=rounds, source_counts={name: tally.credits.get(name, 0) for name in CREDITS},
        trace=ctx.trace, prompt_tokens=len(ctx.prompt_ids), margins=tally.margins,
        max_new_tokens=max_new_tokens, capped_from=asked if max_new_tokens < asked else None,
    )
    for source in sources:
        source.end(state, result)
    return result


@dataclass
class _Tally:
    """Per-request counts the rounds add to: tokens per credit, top-2 gap per token."""

    credits: Counter[str]
    margins: list[float]


def _within_context(budget: TreeBudget, context: int | None, root_position: int) -> TreeBudget:
    """``budget`` with its depths cut so that no tree node is fed at a position past ``context``
    (the same budget while there is room)."""
    depth = positions_left(context, root_position)
    if depth is None or depth >= max(budget.max_depth, budget.hint_depth):
        return budget
    return replace(budget, max_depth=min(budget.max_depth, depth), hint_depth=min(budget.hint_depth, depth))


def _prefill(verifier: TreeVerifier, ctx: DecodeContext, shared: Prefill | None, placement: CorePlacement) -> Prefill:
    """This request's own prefill (chunked where the placement asks), or a private copy of a shared
    one of the same prompt."""
    ctx.trace.emit("prefill_start", prompt_tokens=len(ctx.prompt_ids), chunk=placement.prefill_chunk)
    if shared is None:
        own = Prefill.measure(verifier, ctx.prompt_ids, placement)
    elif shared.prompt_ids != list(ctx.prompt_ids):
        raise ValueError(f"request {ctx.request.id}: the shared prefill is of another prompt")
    else:
        own = Prefill(shared.state.clone(), shared.seconds, shared.margin, shared.prompt_ids)
    ctx.trace.emit("prefill_end", first_token=own.state.root, threads=torch.get_num_threads())
    return own


def _round(verifier: TreeVerifier, kv: VerifierState, state: DecodeState, sources: list[DraftSource],
           budget: TreeBudget, max_new_tokens: int, tally: _Tally) -> tuple[RoundRecord, str]:
    """Ask the sources, build the tree, verify it in one forward, commit; the finish reason or ""."""
    start = time.perf_counter()
    tree = build_tree([draft for source in sources for draft in source.propose(state)], budget)
    draft_s = time.perf_counter() - start
    step = verifier.step(kv, tree, max_new_tokens - len(state.output_ids))
    state.commit(step.new_tokens)
    state.round_index += 1
    for source in sources:
        source.observe(state, step.new_tokens)
    tally.credits.update(step.credits)
    tally.margins.extend(step.margins)
    record = RoundRecord(
        index=state.round_index - 1, tree_size=tree.size, accepted=len(step.accepted_nodes),
        new_tokens=len(step.new_tokens), credits=step.credits,
        sources=sorted({tag for tags in tree.sources for tag in tags}), draft_s=draft_s,
        forward_s=step.forward_s, round_s=time.perf_counter() - start, threads=torch.get_num_threads(),
    )
    return record, step.finish or ""
