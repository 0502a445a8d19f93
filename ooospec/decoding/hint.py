"""The hint bank: the sidecar's semantic call as a draft source, polled without blocking.

At arrival (`begin`, before the target's prefill) the request is submitted to the sidecar. At
every candidate-construction boundary (`propose`) the bank makes one zero-timeout poll; from the
first boundary that sees a result, the call is rendered with the target's frozen surface
rendering and becomes a document the bank aligns the committed text against (text level, so it
is robust to the target's token boundaries), proposing what the hint says comes next,
re-tokenized with the target's own tokenizer. After a wrong value the committed text stops being
a prefix of the hint; the bank re-aligns on the longest committed suffix found in the hint, which
lands on the next shared key once the target has written it. The target stays the only verifier:
the hint can only be accepted where it equals the greedy output.

Invalid payloads (not JSON, no such function, arguments not an object) and sidecar failures are
recorded in the trace and the bank offers nothing: decoding continues as plain ToolSpec.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ooospec.data.request import Call, Request
from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.text_drafts import tokens_continuing
from ooospec.sidecar.service import SidecarResult, SidecarService, SidecarTicket


@dataclass
class HintAlignment:
    """Where the committed text stands in the hint, and what the hint says comes next."""

    position: int  # index in the hint text just after the matched committed suffix
    matched: int  # characters of committed text matched there
    remainder: str


def align_hint(committed: str, hint: str, cursor: int = 0, min_match: int = 3) -> HintAlignment | None:
    """Find the hint position that continues ``committed``.

    Fast path: the committed text is a prefix of the hint (the hint has been right so far).
    Otherwise take the longest suffix of the committed text that occurs in the hint, preferring an
    occurrence at or after ``cursor`` (the previous alignment), so repeated separators such as
    ``",\\n    "`` resolve to the *next* key. A match shorter than ``min_match`` characters is
    too ambiguous to propose from.
    """
    if not hint:
        return None
    if not committed:
        return HintAlignment(0, 0, hint)
    if hint.startswith(committed):
        rest = hint[len(committed):]
        return HintAlignment(len(committed), len(committed), rest) if rest else None
    for k in range(min(len(committed), len(hint)), min_match - 1, -1):
        suffix = committed[-k:]
        at = hint.find(suffix, max(0, cursor - k))
        if at < 0:
            at = hint.find(suffix)
        if at >= 0:
            end = at + k
            return HintAlignment(end, k, hint[end:]) if end < len(hint) else None
    return None


def validate_payload(payload: str | None, request: Request) -> tuple[Call | None, str | None]:
    """The sidecar's compact call as a `Call`, or the reason it cannot be used."""
    if payload is None:
        return None, "sidecar returned no call"
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as err:
        return None, f"payload is not JSON ({err.msg} at {err.pos})"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, "payload has no function name"
    if request.tool(data["name"]) is None:
        return None, f"payload names unknown function {data['name']!r}"
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        return None, "payload arguments are not an object"
    return Call(data["name"], arguments), None


@dataclass
class HintStats:
    """What the bank did for one request (also emitted into the trace at the end)."""

    ready_round: int | None = None
    error: str | None = None
    payload_bytes: int = 0
    wave_s: float | None = None
    hint_text: str | None = None
    call: dict[str, Any] | None = None
    proposals: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class HintBank(DraftSource):
    """Draft source backed by a `SidecarService`; ``blocking`` is the ablation that waits."""

    name = "hint"

    def __init__(self, service: SidecarService, mode: str = "wave", blocking: bool = False,
                 max_tokens: int = 32, min_match: int = 3):
        self.service, self.mode, self.blocking = service, mode, blocking
        self.max_tokens, self.min_match = max_tokens, min_match
        self.ticket: SidecarTicket | None = None
        self.stats = HintStats()

    def begin(self, ctx: DecodeContext) -> None:
        self.ctx = ctx
        self.stats = HintStats()
        self.hints: list[str] = []  # the call in every layout the target may use, expected first
        self.cursors: list[int] = []
        self.done_polling = False
        self.ticket = self.service.submit(ctx.request, self.mode)
        ctx.trace.emit("sidecar_submit", mode=self.mode)

    def _to_trace_time(self, monotonic_t: float) -> float:
        """Sidecar timestamps (shared monotonic clock) on the trace's clock."""
        return monotonic_t + (time.perf_counter() - time.monotonic()) - self.ctx.trace.t0

    def _take(self, result: SidecarResult, state: DecodeState) -> None:
        trace = self.ctx.trace
        self.done_polling = True
        self.stats.payload_bytes = result.payload_bytes
        self.stats.extra["sidecar"] = result.detail  # e.g. why the sidecar's own join dropped a slot
        if result.error is None:
            self.stats.wave_s = result.wave_s
            trace.emit("sidecar_wave", start=self._to_trace_time(result.wave_start),
                       end=self._to_trace_time(result.wave_end), rows=result.rows,
                       received=self._to_trace_time(result.received_at))
            call, why = validate_payload(result.payload, self.ctx.request)
        else:
            call, why = None, result.error
        if call is None:
            self.stats.error = why
            trace.emit("hint_rejected", round=state.round_index, reason=why)
            return
        if self.ctx.surface is None:
            self.stats.error = "target has no surface format to render the hint"
            trace.emit("hint_rejected", round=state.round_index, reason=self.stats.error)
            return
        self.hints = list(dict.fromkeys(v.render([call]) for v in self.ctx.surface.variants(self.ctx.request)))
        self.cursors = [0] * len(self.hints)
        self.stats.ready_round, self.stats.call = state.round_index, call.to_dict()
        self.stats.hint_text = self.hints[0]
        trace.emit("hint_ready", round=state.round_index, payload_bytes=result.payload_bytes,
                   hint_chars=len(self.hints[0]))

    def propose(self, state: DecodeState) -> list[Draft]:
        if not self.hints:
            if self.done_polling or self.ticket is None:
                return []
            result = self.ticket.wait() if self.blocking else self.ticket.poll()
            if result is None:
                return []
            self._take(result, state)
            if not self.hints:
                return []
        # align the committed text with each layout of the hint; the longest match says which
        # layout the target is writing (ties go to the expected layout)
        best, best_index = None, -1
        for index, (hint, cursor) in enumerate(zip(self.hints, self.cursors)):
            alignment = align_hint(state.text, hint, cursor, self.min_match)
            if alignment is not None and (best is None or alignment.matched > best.matched):
                best, best_index = alignment, index
        alignment = best
        if alignment is None or not alignment.remainder:
            return []
        self.cursors[best_index] = alignment.position
        tokens = tokens_continuing(self.ctx.tokenizer, state.output_ids, alignment.remainder)
        if not tokens:
            return []
        self.stats.proposals += 1
        return [Draft(tokens[: self.max_tokens], "hint")]

    def end(self, state: DecodeState, result: Any) -> None:
        if not self.done_polling and self.ticket is not None:
            # the request finished before the hint arrived: record whether it ever would have
            late = self.ticket.poll()
            self.stats.extra["arrived_after_finish"] = late is not None and late.error is None
            self.stats.error = self.stats.error or "hint not ready before the request finished"
        self.ctx.trace.emit("hint_summary", ready_round=self.stats.ready_round, error=self.stats.error,
                            payload_bytes=self.stats.payload_bytes, proposals=self.stats.proposals)
