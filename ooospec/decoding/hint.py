"""The hint bank: the sidecar's semantic call as a draft source, polled without blocking.

At arrival (`begin`, before the target's prefill) the request is submitted to the sidecar. At
every candidate-construction boundary (`propose`) the bank makes one zero-timeout poll; from the
first boundary that sees a result, the payload is checked against the request's schemas
(`check_payload`) and every call in it (the sidecar's chosen function first, then the other
functions it filled) is rendered in every layout of the target's frozen surface. These texts are
documents the bank aligns the committed text against (text level, so it is robust to the target's
token boundaries), proposing what the hint says comes next, re-tokenized with the target's own
tokenizer. After a wrong value the committed text stops being a prefix of the hint; the bank
re-aligns on the longest committed suffix found in the hint, which lands on the next shared key
once the target has written it. The target stays the only verifier: the hint can only be accepted
where it equals the greedy output.

Three rules keep a hint from costing more than it can give. The bank follows the schema FSM over
the committed text (`ooospec.decoding.schema_fsm`): it proposes only at a call's opening or inside
a call, never in prose or after a finished call (``gate``), and once the target has written a
function name it aligns only to that function's call (``follow``). Its depth follows acceptance
(`DepthSchedule`): longer after a fully accepted hint, shorter after a rejection. The tree merge
bounds what a hint may take from ToolSpec's best draft (`ooospec.decoding.tree.TreeBudget.hint_share`).

A wave that cannot arrive in time still costs the target (the two processes share the memory
system), so a `WaveGate` may skip the submit while the run's recent waves all came too late
(`ooospec.decoding.wave_gate`). When the wave runs is the bank's ``schedule``: at arrival (the
paper's, ``prefill``), right after the target's prefill (``deferred``: the submit waits for the
prefill's first token, so the target prefills on both cores), or per request as a `WavePolicy`
chooses (`ooospec.decoding.wave_policy`); every request records its `WaveDecision`.

Invalid payloads and sidecar failures are recorded in the trace and the bank offers nothing:
decoding continues as plain ToolSpec. Invalid parts of a payload (a slot no parameter of its
function has, a value of the wrong JSON type) are dropped with their reason; the rest is used.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ooospec.data.request import Call, Request
from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.schema_fsm import SchemaCompileError, SchemaFSM, compile_schema
from ooospec.decoding.text_drafts import tokens_continuing
from ooospec.decoding.tree import shared_prefix
from ooospec.decoding.wave_gate import WaveGate
from ooospec.decoding.wave_policy import WaveDecision, WavePolicy
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


MAX_PAYLOAD_BYTES = 4096  # far above any call of the benchmarks (median ~85 B): a runaway answer

JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


@dataclass
class CheckedPayload:
    """What of a payload the bank may propose: calls (the sidecar's choice first), what was dropped
    and why, or why nothing is usable."""

    calls: list[Call] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    error: str | None = None


def value_fits(value: Any, schema: Any) -> bool:
    """The value's JSON type is one the parameter schema allows (no ``type``: any)."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    if kinds is None:
        return True
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    for kind in kinds:
        allowed = JSON_TYPES.get(kind)
        if allowed is None:
            return True  # a type name JSON Schema does not have: nothing to check against
        if isinstance(value, bool) and kind in ("integer", "number"):
            continue
        if isinstance(value, allowed):
            return True
    return False


def _check_call(item: Any, request: Request, dropped: list[str]) -> Call | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        dropped.append("a call has no function name")
        return None
    name = item["name"]
    tool = request.tool(name)
    if tool is None:
        dropped.append(f"unknown function {name!r}")
        return None
    arguments = item.get("arguments", {})
    if not isinstance(arguments, dict):
        dropped.append(f"{name}: arguments are not an object")
        return None
    params = tool.get("parameters") if isinstance(tool.get("parameters"), dict) else {}
    properties = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    kept: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in properties:
            dropped.append(f"{name}.{key}: no such parameter")
        elif not value_fits(value, properties[key]):
            expected = properties[key].get("type")
            dropped.append(f"{name}.{key}: a {type(value).__name__} where the schema says {expected}")
        else:
            kept[key] = value
    return Call(name, kept)


def check_payload(payload: str | None, request: Request, max_bytes: int = MAX_PAYLOAD_BYTES) -> CheckedPayload:
    """The usable calls of the sidecar's payload (one compact call, or a list of calls with the
    chosen one first), each slot checked against its function's schema."""
    if payload is None:
        return CheckedPayload(error="sidecar returned no call")
    size = len(payload.encode("utf-8"))
    if size > max_bytes:
        return CheckedPayload(error=f"payload of {size} bytes is over the {max_bytes}-byte limit")
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as err:
        return CheckedPayload(error=f"payload is not JSON ({err.msg} at {err.pos})")
    items = data if isinstance(data, list) else [data]
    checked = CheckedPayload()
    for item in items:
        call = _check_call(item, request, checked.dropped)
        if call is not None and all(call.name != c.name for c in checked.calls):
            checked.calls.append(call)
    if not checked.calls:
        checked.error = "payload has no usable call" + (f" ({checked.dropped[0]})" if checked.dropped else "")
    return checked


@dataclass
class DepthSchedule:
    """The hint's draft depth, following acceptance as transformers' ``"heuristic"`` schedule
    does for its assistant: ``grow`` after a fully accepted hint draft, ``shrink`` after one the
    target cut short, within [``floor``, ``cap``]."""

    start: int = 16
    grow: int = 2
    shrink: int = 4
    floor: int = 4
    cap: int = 32

    def __post_init__(self) -> None:
        self.depth = self.start

    def update(self, fully_accepted: bool) -> None:
        step = self.grow if fully_accepted else -self.shrink
        self.depth = max(self.floor, min(self.cap, self.depth + step))


@dataclass(frozen=True)
class HintText:
    """One call of the payload rendered in one layout of the target's surface."""

    function: str
    text: str


@dataclass
class HintStats:
    """What the bank did for one request (also emitted into the trace at the end)."""

    submitted: bool = True  # False: the wave gate or the wave policy left this request without a wave
    schedule: dict[str, Any] | None = None  # the `WaveDecision`: which schedule ran and why
    ready_round: int | None = None
    error: str | None = None
    payload_bytes: int = 0
    wave_s: float | None = None
    waited_s: float = 0.0  # a blocking bank's wait at its first boundary (`ooospec.report.latency_cost` leaves it out)
    hint_text: str | None = None
    call: dict[str, Any] | None = None  # the sidecar's chosen call (after the payload checks)
    proposals: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class HintBank(DraftSource):
    """Draft source backed by a `SidecarService`; ``blocking`` is the ablation that waits.

    ``gate``: propose only at a call's opening or inside a call (the schema FSM's reading of the
    committed text). ``follow``: use every function of the payload and, once the target has written
    a name, only that function's call. ``depth``: a `DepthSchedule`, or None for a fixed
    ``max_tokens``. ``wave_gate``: a `WaveGate` that skips the wave while the run's recent waves
    all came too late (None: every request's wave is submitted). ``schedule``: when the wave is
    submitted (`ooospec.decoding.wave_policy.SCHEDULES`), or ``policy``: a `WavePolicy` choosing per
    request. Where the request's schema does not compile, there is no FSM and the bank aligns as if
    ungated (recorded in the stats)."""

    name = "hint"

    def __init__(self, service: SidecarService, mode: str = "wave", blocking: bool = False,
                 max_tokens: int = 32, min_match: int = 3, gate: bool = True, follow: bool = True,
                 depth: DepthSchedule | None = None, wave_gate: WaveGate | None = None,
                 schedule: str = "prefill", policy: WavePolicy | None = None):
        self.service, self.mode, self.blocking = service, mode, blocking
        self.wave_gate = wave_gate
        WaveDecision.fixed(schedule)  # an unknown schedule fails here, naming it
        if blocking and (policy is not None or schedule != "prefill"):
            raise ValueError("a blocking bank waits for its hint at the first boundary: its wave runs at arrival")
        self.schedule, self.policy = schedule, policy
        self._submit_after_prefill = False
        self.max_tokens, self.min_match = max_tokens, min_match
        self.gate, self.follow, self.depth_settings = gate, follow, depth
        self.ticket: SidecarTicket | None = None
        self.stats = HintStats()
        self.hints: list[HintText] = []
        self.cursors: dict[HintText, int] = {}
        self.fsm: SchemaFSM | None = None

    def begin(self, ctx: DecodeContext) -> None:
        self.ctx = ctx
        self.stats = HintStats()
        self.hints = []  # every call in every layout the target may use: chosen call, expected layout first
        self.cursors = {}
        self.done_polling = False
        self._heard = False  # a result (a first delivery or the final one) was taken
        self.depth = replace(self.depth_settings) if self.depth_settings else None
        self._pending: list[int] = []
        self.fsm = None
        self.ticket = None
        self._submit_after_prefill = False
        if self.wave_gate is not None and not self.wave_gate.submit():
            self.stats.submitted, self.stats.error = False, self.wave_gate.why_closed
            ctx.trace.emit("sidecar_skipped", reason=self.stats.error)
            return
        decision = self._decide(ctx)
        if not decision.has_wave:
            self.stats.submitted, self.stats.error = False, f"no wave: {decision.why}"
            ctx.trace.emit("sidecar_skipped", reason=self.stats.error)
            return
        if (self.gate or self.follow) and ctx.surface is not None:
            try:
                self.fsm = SchemaFSM(compile_schema(ctx.request.tools, ctx.surface))
            except SchemaCompileError as err:
                self.stats.extra["hint_fsm"] = f"none ({err}): ungated"
        if decision.schedule == "deferred":
            self._submit_after_prefill = True  # `observe` submits once the prefill's token is in
            return
        self._submit()

    def _decide(self, ctx: DecodeContext) -> WaveDecision:
        """This request's schedule (the policy's choice, else the bank's fixed one), recorded."""
        if self.policy is None:
            decision = WaveDecision.fixed(self.schedule)
        else:
            decision = self.policy.choose(len(ctx.prompt_ids))
        self.stats.schedule = decision.to_dict()
        ctx.trace.emit("wave_schedule", **decision.to_dict())
        return decision

    def _submit(self) -> None:
        self._submit_after_prefill = False
        self.ticket = self.service.submit(self.ctx.request, self.mode)
        self.ctx.trace.emit("sidecar_submit", mode=self.mode, schedule=self.stats.schedule["schedule"])

    def _to_trace_time(self, monotonic_t: float) -> float:
        """Sidecar timestamps (shared monotonic clock) on the trace's clock."""
        return monotonic_t + (time.perf_counter() - time.monotonic()) - self.ctx.trace.t0

    def _take(self, result: SidecarResult, state: DecodeState) -> None:
        """A sidecar result becomes the bank's hints. A first delivery (``early``: a progressive
        wave's chosen call) is taken as any hint and polling goes on; the final result then adds
        the alternatives (cursors kept), and its failure leaves the first delivery's hints in place."""
        trace = self.ctx.trace
        self.done_polling = self.done_polling or not result.early
        self._heard = True
        self.stats.payload_bytes += result.payload_bytes  # both deliveries cross the boundary
        self.stats.extra["early" if result.early else "sidecar"] = result.detail  # e.g. why a slot was dropped
        if self.hints and not result.early:
            self.stats.extra["final_round"] = state.round_index
        if result.error is not None:
            return self._reject(state, result.error)
        self.stats.wave_s = result.wave_s
        trace.emit("sidecar_wave", start=self._to_trace_time(result.wave_start),
                   end=self._to_trace_time(result.wave_end), rows=result.rows,
                   received=self._to_trace_time(result.received_at), early=result.early)
        checked = check_payload(result.payload, self.ctx.request)
        if checked.dropped:
            self.stats.extra["payload_dropped"] = checked.dropped
            trace.emit("hint_payload_dropped", round=state.round_index, dropped=checked.dropped)
        if checked.error is not None:
            return self._reject(state, checked.error)
        if self.ctx.surface is None:
            return self._reject(state, "target has no surface format to render the hint")
        calls = checked.calls if self.follow else checked.calls[:1]
        layouts = self.ctx.surface.layouts(self.ctx.request)
        self.hints = list(dict.fromkeys(HintText(c.name, v.render([c])) for c in calls for v in layouts))
        self.cursors = {h: self.cursors.get(h, 0) for h in self.hints}
        if self.stats.ready_round is None:
            self.stats.ready_round, self.stats.call = state.round_index, calls[0].to_dict()
            self.stats.hint_text = self.hints[0].text
        self.stats.extra["calls"] = [c.to_dict() for c in calls]  # every function the hint can follow
        trace.emit("hint_ready", round=state.round_index, payload_bytes=result.payload_bytes,
                   hint_chars=len(self.hints[0].text), calls=len(calls), early=result.early)

    def _reject(self, state: DecodeState, why: str) -> None:
        """A result the bank cannot use; after a first delivery, its hints stay (the final failed)."""
        if self.hints:
            self.stats.extra["final_error"] = why
            self.ctx.trace.emit("hint_final_rejected", round=state.round_index, reason=why)
            return
        self.stats.error = why
        self.ctx.trace.emit("hint_rejected", round=state.round_index, reason=why)

    def _in_a_call(self, text: str) -> bool:
        """The committed text is at a call's opening or inside a call: nothing written yet, the FSM
        at a call opener or inside a call of the schema, or (a function the schema does not have:
        targets invent some, and the FSM loses them) a call opener of the surface written and not
        closed since."""
        if not text.strip() or self.fsm.position() not in ("before", "after"):
            return True
        for layout in self.fsm.layouts:
            sc = layout.scaffold
            opened = text.rfind(sc.call_open)
            if opened >= 0:
                rest = text[opened + len(sc.call_open):]
                if sc.args_close not in rest and sc.noargs_close not in rest:
                    return True
        return False

    def _candidates(self, state: DecodeState) -> list[HintText]:
        """The hint texts the committed text may continue: none in prose or after a call (gate);
        the written function's only, once a name is written (follow)."""
        if self.fsm is None:
            return self.hints
        self.fsm.sync(state.text)
        if self.gate and not self._in_a_call(state.text):
            return []
        written = self.fsm.call_functions() if self.follow else frozenset()
        if not written:
            return self.hints
        return [h for h in self.hints if h.function in written]

    def propose(self, state: DecodeState) -> list[Draft]:
        self._pending = []
        if not self.done_polling and self.ticket is not None:
            # blocking: wait for the first delivery only; after it, the final one is polled. Every
            # result already in is taken (a first delivery, then the final one)
            if self.blocking and not self._heard:
                start = time.perf_counter()
                result = self.ticket.wait()
                self.stats.waited_s += time.perf_counter() - start
            else:
                result = self.ticket.poll()
            while result is not None:
                self._take(result, state)
                result = None if self.done_polling else self.ticket.poll()
        if not self.hints:
            return []
        # align the committed text with each candidate; the longest match says which call and
        # layout the target is writing (ties go to the chosen call's expected layout)
        best, best_hint = None, None
        for hint in self._candidates(state):
            alignment = align_hint(state.text, hint.text, self.cursors[hint], self.min_match)
            if alignment is not None and (best is None or alignment.matched > best.matched):
                best, best_hint = alignment, hint
        if best is None or best_hint is None or not best.remainder:
            return []
        self.cursors[best_hint] = best.position
        tokens = tokens_continuing(self.ctx.tokenizer, state.output_ids, best.remainder)
        tokens = tokens[: self.depth.depth if self.depth else self.max_tokens]
        if not tokens:
            return []
        self.stats.proposals += 1
        self._pending = tokens
        return [Draft(tokens, "hint")]

    def observe(self, state: DecodeState, accepted: list[int]) -> None:
        """After the prefill: a deferred wave is submitted. After a round with a hint draft: did the
        target take all of it? (the depth schedule)"""
        if self._submit_after_prefill:
            self._submit()
        if self._pending and self.depth is not None:
            self.depth.update(shared_prefix(accepted, self._pending) >= len(self._pending))
        self._pending = []

    def end(self, state: DecodeState, result: Any) -> None:
        if self.wave_gate is not None and self.ticket is not None:
            self.wave_gate.record(in_time=self._heard)
        if not self.done_polling and self.ticket is not None:
            # the request finished before the (final) hint arrived: record whether it ever would have
            late = self.ticket.poll()
            self.stats.extra["arrived_after_finish"] = late is not None and late.error is None
            if not self._heard:
                self.stats.error = self.stats.error or "hint not ready before the request finished"
        self.ctx.trace.emit("hint_summary", submitted=self.stats.submitted, ready_round=self.stats.ready_round,
                            error=self.stats.error, payload_bytes=self.stats.payload_bytes,
                            proposals=self.stats.proposals)
