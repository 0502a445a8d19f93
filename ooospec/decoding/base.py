"""The seams of the decoding engine: drafts, draft sources, per-request context and state, traces.

Every speculative method is the same loop (`ooospec.decoding.loop.decode`) with a different list
of `DraftSource` objects. A source only ever proposes token sequences (`Draft`); the target model
alone verifies and commits, so no source can change the output, only the speed. Sources live for a
whole run (several requests) because some of them learn across requests (call retrieval keeps the
calls produced so far, as ToolSpec's memory does); per-request setup happens in `begin`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ooospec.data.request import Request

if TYPE_CHECKING:
    from ooospec.decoding.loop import DecodeResult
    from ooospec.models.surface import SurfaceFormat

DRAFT_SOURCES = ("fsm", "retrieval", "pld", "hint")
# what a committed token is credited to: the one draft source that proposed its node, "shared" when
# several sources proposed the same node (no single source can claim it: a token both the FSM and
# the hint proposed is not evidence for the hint), or "bonus" (the target's own token at the end of
# an accepted path, and the prefill's first token). Every table and figure uses this order.
SHARED = "shared"
CREDITS = DRAFT_SOURCES + (SHARED, "bonus")
DRAFTED_CREDITS = DRAFT_SOURCES + (SHARED,)  # tokens some draft proposed


@dataclass
class Draft:
    """A candidate continuation of the committed output, in target token ids.

    ``tokens`` continue right after the last committed token. ``source`` names who proposed it
    (one of `DRAFT_SOURCES`); it is kept per tree node so that every accepted token can be credited.
    ``guess``: a bet rather than a reading (the FSM's bet that an open value ends here), which a
    composite source merges after every other draft.
    """

    tokens: list[int]
    source: str
    guess: bool = False

    def __post_init__(self) -> None:
        if self.source not in DRAFT_SOURCES:
            raise ValueError(f"unknown draft source {self.source!r} (expected one of {DRAFT_SOURCES})")


class EventTrace:
    """Timestamped events of one request, relative to its arrival (when the trace is created).

    The loop records prefill and one event per verify round; sources may add their own (a schema
    the FSM could not compile, a sidecar hint becoming ready). The timeline figures read these.
    """

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.events: list[dict[str, Any]] = []

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"t": self.now(), "kind": kind, **fields}
        self.events.append(event)
        return event

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    def to_list(self) -> list[dict[str, Any]]:
        return list(self.events)


@dataclass
class DecodeContext:
    """Everything about one request that sources may read; fixed for the whole request."""

    request: Request
    tokenizer: Any
    surface: "SurfaceFormat | None"
    prompt_ids: list[int]
    eos_token_ids: list[int]
    trace: EventTrace = field(default_factory=EventTrace)


@dataclass
class DecodeState:
    """The committed output so far, as token ids and as decoded text: the one copy of the
    committed tokens (the verifier keeps only the KV cache and the pending root).

    ``text`` is decoded once per commit, when a source first reads it (one decode of the committed
    ids, cheap next to a forward), so sources that work on text do not each decode again and a
    state nobody reads as text (a lookahead for retrieval) costs no decode.
    """

    ctx: DecodeContext
    output_ids: list[int] = field(default_factory=list)
    round_index: int = 0
    _text: str | None = field(default="", repr=False)

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.ctx.tokenizer.decode(
                self.output_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        return self._text

    def commit(self, new_ids: list[int]) -> None:
        self.output_ids.extend(new_ids)
        self._text = None

    def ahead(self, tokens: list[int]) -> "DecodeState":
        """A copy with ``tokens`` committed too: asked to `propose` on it, a source says what would
        follow them (ToolSpec continues the FSM's scaffold with retrieval this way). This state is
        left as it is."""
        return DecodeState(self.ctx, self.output_ids + list(tokens), self.round_index, None)


class DraftSource(ABC):
    """One producer of drafts. `propose` runs at every candidate-construction boundary (every
    verify round) inside the timed decode phase, so it must be cheap."""

    name: str = "abstract"

    def begin(self, ctx: DecodeContext) -> None:
        """A new request arrives (compile per-request structures here)."""

    @abstractmethod
    def propose(self, state: DecodeState) -> list[Draft]:
        """Drafts continuing the committed output, best first."""

    def observe(self, state: DecodeState, accepted: list[int]) -> None:
        """``accepted`` tokens were just committed (already in ``state``)."""

    def end(self, state: DecodeState, result: "DecodeResult") -> None:
        """The request finished (e.g. remember its output for later requests)."""


class CorePlacement:
    """Where the target computes, decided at the seams of one request: `begin` on arrival (before
    any source begins, so before a sidecar job is submitted), `boundary` once the sources have begun
    (before the prefill) and before every verify round, `end` once the request is done (always, also after an error). This base keeps the placement the
    caller set (the static one); `ooospec.bench.placement.ElasticCores` lends the target the
    sidecar's core while the sidecar has nothing to compute."""

    # prefill in forwards of this many tokens, `boundary` before each but the first, so a placement
    # can change inside the prefill; None: one forward (a placement that never changes gains nothing)
    prefill_chunk: int | None = None

    def begin(self) -> None:
        """A request arrives."""

    def boundary(self) -> None:
        """The prefill, a verify round, or the next chunk of a chunked prefill is about to run."""

    @property
    def settled(self) -> bool:
        """Whether the placement can no longer change before `end` (a chunked prefill then runs its
        rest in one forward). This base never changes."""
        return True

    def end(self) -> None:
        """The request is done: leave the placement as `begin` found it."""

