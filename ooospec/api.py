"""Decode one request with any method: the package's public entry point.

``decode(target, messages, tools, method)`` is to this artifact what ``generate(...,
assistant_model=...)`` is to transformers: one call, a loaded target, a chat and its tool schemas in,
the greedy output and how it was drafted out. The method is named as the bench names it
(`ooospec.bench.methods`: ``"ar"``, ``"pld"``, ``"toolspec"``, ``"ooospec"`` and their options), and
the decode runs the bench's own lossless loop (`ooospec.decoding.loop.decode`) with the method's own
draft sources and tree budget, so every method returns AR's greedy output token for token.

Example, on a tiny target that answers every request with one call (`ooospec.models.tiny`) and a
sidecar that answers with a known call (for the trained one: ``slot_sidecar(adapter_dir)``)::

    >>> from ooospec.api import decode
    >>> from ooospec.models.tiny import tiny_tool_target
    >>> from ooospec.sidecar.service import SidecarService
    >>> from ooospec.sidecar.specs import oracle_sidecar
    >>> target = tiny_tool_target()  # real targets: ooospec.models.target.load_target("qwen2.5-coder-0.5b")
    >>> messages = [{"role": "user", "content": "Weather in Paris?"}]
    >>> tools = [{"name": "get_weather", "description": "Current weather.", "parameters": {
    ...     "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    >>> hint = {"r1": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    >>> with SidecarService(oracle_sidecar(hint), placement="thread") as sidecar:
    ...     out = decode(target, messages, tools, "ooospec", sidecar=sidecar, request_id="r1")
    >>> out.call
    Call(name='get_weather', arguments={'city': 'Paris'})
    >>> out.output_ids == decode(target, messages, tools, "ar").output_ids
    True
    >>> out.target_forwards < decode(target, messages, tools, "ar").target_forwards
    True

What the API leaves to the bench: where the target and the sidecar run. The bench pins them to
cores, lends the sidecar's idle core to the target (elastic OoO-Spec) and runs controls on both
cores; here the decode runs on the caller's threads, so the placement options (``static``,
``both_cores``, ``shared_core``, ``in_process``, ``prefill_chunk=``) change nothing and are accepted
only because they change no output. Retrieval of earlier calls starts empty per call: a run of
requests that shares that memory is `ooospec.bench.runner.decode_requests`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ooospec.bench.methods import BASES, MethodSpec, method_budget, method_sources
from ooospec.data.request import Call, Request
from ooospec.decoding.loop import DecodeResult, RoundRecord
from ooospec.decoding.loop import decode as decode_loop
from ooospec.decoding.tree import TreeBudget

__all__ = ["Decoded", "decode"]


@dataclass
class Decoded:
    """One decoded request: what the target wrote, the call in it, and how each round went.

    ``rounds`` is the per-verify-round record (tree size, accepted draft tokens, the source credited
    for each new token); ``result`` keeps everything else the loop measured (timings, event trace)."""

    method: str  # the canonical method name (`MethodSpec.name`)
    request_id: str
    text: str
    output_ids: list[int]
    call: Call | None  # the first call the target wrote, parsed in its surface format (None: no call)
    calls: list[Call]
    finish: str  # "eos" | "length"
    rounds: list[RoundRecord]
    result: DecodeResult

    @property
    def target_forwards(self) -> int:
        """Target forwards, the prefill included (AR: one per output token)."""
        return self.result.target_forwards

    @property
    def mat(self) -> float:
        """Tokens committed per verify forward (1.0 for AR)."""
        return self.result.mat


def decode(target: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]], method: str = "ooospec", *,
           sidecar: Any = None, max_new_tokens: int = 256, budget: TreeBudget | None = None,
           request_id: str | None = None) -> Decoded:
    """Greedy decode of one chat (``messages``, ``tools``) on a loaded ``target`` with ``method``.

    ``target``: a `ooospec.models.target.TargetModel` (`load_target`, or a tiny one for tests).
    ``tools``: function schemas ``{"name", "description", "parameters"}``, or the OpenAI
    ``{"type": "function", "function": {...}}`` wrapping of them. ``method``: a bench method name;
    an unknown one is refused naming the known bases. ``sidecar``: what answers the OoO-Spec wave, a
    started `ooospec.sidecar.service.SidecarService` (or anything with its ``submit``); required by
    ``ooospec`` methods, refused by the others (it would be silently unused). ``budget``: the draft
    tree (None: the target's default, resized by the method's ``budget=``/``depth=`` options).
    ``request_id``: the id the sidecar and the record see (None: derived from the prompt's hash)."""
    spec = _parse(method)
    if spec.uses_sidecar and sidecar is None:
        raise ValueError(f"method {spec.name!r} drafts from a sidecar: pass sidecar=, a started "
                         "ooospec.sidecar.service.SidecarService (the trained one: ooospec.sidecar.specs.slot_sidecar)")
    if sidecar is not None and not spec.uses_sidecar:
        raise ValueError(f"method {spec.name!r} uses no sidecar; drop sidecar= or use an 'ooospec' method")
    if spec.delay_s or spec.sidecar is not None:
        raise ValueError(f"method {spec.name!r}: delay= and the sidecar kinds (slot, base_only, oracle, gold) are "
                         "how the bench builds its sidecar; here pass the sidecar itself (sidecar=)")
    request = _request(messages, tools, request_id)
    sources = method_sources(spec, sidecar)
    if sidecar is not None and hasattr(sidecar, "wait_idle"):
        sidecar.wait_idle()  # as in the bench: the request finds its sidecar free (batch 1)
    result = decode_loop(target, sources, request, max_new_tokens, method_budget(spec, target.name, budget))
    calls = _parse_calls(target, request, result.text)
    return Decoded(method=spec.name, request_id=request.id, text=result.text, output_ids=result.output_ids,
                   call=calls[0] if calls else None, calls=calls, finish=result.finish, rounds=result.rounds,
                   result=result)


def _parse(method: str) -> MethodSpec:
    """The method's spec; every refusal names the method and what is known (`MethodSpec.parse`)."""
    try:
        return MethodSpec.parse(method)
    except ValueError as err:
        raise ValueError(f"ooospec.api.decode: {err} (methods: {', '.join(BASES)}, with options as in "
                         "ooospec.bench.methods, e.g. 'toolspec:budget=8')") from None


def _request(messages: list[dict[str, Any]], tools: list[dict[str, Any]], request_id: str | None) -> Request:
    tools = [t["function"] if t.get("type") == "function" and "function" in t else t for t in tools]
    if request_id is None:
        digest = hashlib.sha256(json.dumps([messages, tools], sort_keys=True, default=str).encode()).hexdigest()
        request_id = f"api-{digest[:12]}"
    return Request(id=request_id, benchmark="api", split="api", messages=list(messages), tools=tools, gold=None)


def _parse_calls(target: Any, request: Request, text: str) -> list[Call]:
    """The calls in ``text`` as the target's surface format reads them; text that holds no
    well-formed call is prose, not an error."""
    try:
        return list(target.surface_for(request).parse(text))
    except ValueError:
        return []
