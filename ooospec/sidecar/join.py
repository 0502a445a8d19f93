"""Join a wave's row answers into one semantic call.

The function-index answer picks the function; its argument rows are read in schema order.
``null`` answers are dropped (the slot is unused), and an answer that is not one JSON value is
dropped with its reason, so a half-right wave still yields a useful partial hint rather than none.

The wave answers every candidate function's slots anyway, so the other functions' calls (those
with at least one non-null slot) ride along as *alternatives*: when the target writes another
function than the chosen one, the hint bank follows it with that function's values. The payload
is the chosen call's compact JSON, or, with alternatives, a JSON list of calls, chosen first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ooospec.data.request import Call, Request
from ooospec.sidecar.slots import ARGUMENT, FUNCTION_INDEX, RowKey, tool_parameters


@dataclass
class DroppedSlot:
    parameter: str
    text: str
    reason: str


@dataclass
class JoinResult:
    call: Call | None
    dropped: list[DroppedSlot] = field(default_factory=list)
    reason: str | None = None  # why there is no call at all
    alternatives: list[Call] = field(default_factory=list)  # other functions' calls, tool order

    @property
    def payload(self) -> str | None:
        if self.call is None:
            return None
        if not self.alternatives:
            return self.call.compact()
        return "[" + ",".join(c.compact() for c in [self.call, *self.alternatives]) + "]"


def parse_function_index(text: str, n_functions: int) -> tuple[int | None, str | None]:
    answer = text.strip()
    if not answer.isdigit():
        return None, f"function index {answer!r} is not a number"
    index = int(answer)
    if index >= n_functions:
        return None, f"function index {index} out of range (0..{n_functions - 1})"
    return index, None


def parse_value(text: str) -> tuple[Any, str | None]:
    """One JSON value, or the reason it is not one (``None`` value + None reason means ``null``)."""
    answer = text.strip()
    if not answer:
        return None, "empty answer"
    try:
        return json.loads(answer), None
    except json.JSONDecodeError as err:
        return None, f"invalid JSON ({err.msg})"


def join_rows(request: Request, answers: dict[RowKey, str], truncated: frozenset[RowKey] = frozenset(),
              with_alternatives: bool = False) -> JoinResult:
    """The semantic call from row answers keyed by `RowKey` (missing argument rows count as null),
    with the other functions' calls as `JoinResult.alternatives` when ``with_alternatives``.

    ``truncated`` rows stopped at the token limit without an end token; their text may still
    parse (a cut-off number), so they are dropped rather than trusted.
    """
    index_text = answers.get(RowKey(FUNCTION_INDEX))
    if index_text is None:
        return JoinResult(None, reason="no function-index answer")
    if RowKey(FUNCTION_INDEX) in truncated:
        return JoinResult(None, reason="function index truncated (no end token)")
    index, why = parse_function_index(index_text, len(request.tools))
    if index is None:
        return JoinResult(None, reason=why)
    call, dropped = _join_function(request.tools[index], answers, truncated)
    alternatives = []
    if with_alternatives:
        for other_index, tool in enumerate(request.tools):
            other, _ = _join_function(tool, answers, truncated)
            if other_index != index and other.arguments:
                alternatives.append(other)
    return JoinResult(call, dropped, alternatives=alternatives)


def _join_function(tool: dict[str, Any], answers: dict[RowKey, str],
                   truncated: frozenset[RowKey]) -> tuple[Call, list[DroppedSlot]]:
    """One function's call from its argument rows (schema order), and the slots dropped."""
    arguments: dict[str, Any] = {}
    dropped: list[DroppedSlot] = []
    for parameter in tool_parameters(tool):
        key = RowKey(ARGUMENT, tool["name"], parameter)
        text = answers.get(key)
        if text is None:
            continue
        if key in truncated:
            dropped.append(DroppedSlot(parameter, text, "truncated (no end token)"))
            continue
        value, why = parse_value(text)
        if why is not None:
            dropped.append(DroppedSlot(parameter, text, why))
        elif value is not None:
            arguments[parameter] = value
    return Call(tool["name"], arguments), dropped
