"""Training prompts that look like evaluation: distractor tools from the training tool pool.

Training requests mostly offer one to five tools (31 of 3,435 offer more than five); ToolAlpaca
offers six to nine on 144 of its 214 requests, and the sidecar's function row never learned to
choose among many. Each training request therefore gets extra tools drawn from the *training*
split's own pool (never an evaluation tool: the training split is decontaminated by name, and
under the API-disjoint split it shares no name with dev), so that the number of tools per prompt
covers 1 to ``max_tools``; the order of all tools is shuffled. The label stays the teacher's call
(its function is still offered); the extra functions' argument rows answer null.

Seeded by the request id: the same request gets the same tools on every machine and run.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import replace
from typing import Callable, Iterable

from ooospec.data.api_disjoint import function_names, source_of
from ooospec.data.request import Request
from ooospec.data.splits import PROTOCOL_TOOLS, normalize_name

DEFAULT_MAX_TOOLS = 9


class NoToolPool(ValueError):
    """Distractors were asked for, but a training source offers no tool to draw them from."""


def tool_pool(requests: Iterable[Request]) -> list[dict]:
    """One tool per normalised name over ``requests`` (first seen wins), protocol tools aside."""
    pool: dict[str, dict] = {}
    sources: set[str] = set()
    with_tools: set[str] = set()
    for request in requests:
        sources.add(source_of(request))
        for tool in request.tools:
            if tool["name"] in PROTOCOL_TOOLS:
                continue
            with_tools.add(source_of(request))
            pool.setdefault(normalize_name(tool["name"]), tool)
    missing = sorted(sources - with_tools)
    if missing:
        raise NoToolPool(f"distractors: training source {missing[0]!r} has no tool to draw distractors from")
    return [pool[name] for name in sorted(pool)]


def _rng(request: Request, seed: int) -> random.Random:
    return random.Random(int(hashlib.sha256(f"{seed}:{request.id}".encode()).hexdigest()[:16], 16))


def with_distractors(request: Request, pool: list[dict], max_tools: int = DEFAULT_MAX_TOOLS, seed: int = 0,
                     fits: Callable[[Request], bool] | None = None) -> Request:
    """``request`` offering between its own number of tools and ``max_tools``, order shuffled.

    The id, dialogue, gold and prompt hash stay the request's own (it is the same request, and its
    teacher trace is looked up by them). ``fits``: a prompt-length check; distractors are taken
    away one at a time until the request fits (never its own tools)."""
    rng = _rng(request, seed)
    own = function_names(request)
    total = rng.randint(len(request.tools), max(max_tools, len(request.tools)))
    extra: list[dict] = []
    for tool in rng.sample(pool, min(len(pool), 4 * max_tools)):
        if len(request.tools) + len(extra) >= total:
            break
        name = normalize_name(tool["name"])
        if name not in own and all(normalize_name(t["name"]) != name for t in extra):
            extra.append(tool)
    order = rng.random()
    while True:
        tools = list(request.tools) + extra
        random.Random(order).shuffle(tools)
        candidate = replace(request, tools=tools, meta={**request.meta, "distractors": len(extra)})
        if not extra or fits is None or fits(candidate):
            return candidate
        extra.pop()
