"""Looser renderings of a JSON call format that the schema FSM follows besides the frozen one.

A target does not always write its calls exactly as its frozen rendering: Qwen2.5-Coder answers
most BFCL and ToolAlpaca requests with its ```json fenced, indented block, but on API-Bank
dialogues it often writes the bare call object on one line (``{"name": "f", "arguments": {...}}``).
ToolSpec's FSM likewise accepts several call openers. The layout here is derived from the
frozen rendering itself (the same call object, same keys, without the wrapper text and with
``json.dumps`` default spacing), so it still needs nothing hard-coded about any format.
"""

from __future__ import annotations

import json
from typing import Any

from ooospec.data.request import Call
from ooospec.models.surface import SurfaceFormat


def _call_object(text: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the rendering")
    return json.loads(text[start : end + 1])


class BareJsonCall(SurfaceFormat):
    """The call object of ``primary``'s rendering, alone and on one line."""

    def __init__(self, primary: SurfaceFormat):
        self.primary = primary
        self.name = f"{primary.name}+bare"

    def render(self, calls: list[Call]) -> str:
        return "\n".join(
            json.dumps(_call_object(self.primary.render([call])), ensure_ascii=False) for call in calls
        )

    def parse(self, text: str) -> list[Call]:
        return self.primary.parse(text)


def json_layouts(surface: SurfaceFormat) -> list[SurfaceFormat]:
    """Layouts worth following for ``surface`` (none when its rendering already is the bare form
    or holds no JSON object)."""
    probe = [Call("f", {"a": 1, "b": "x"})]
    try:
        bare = BareJsonCall(surface)
        if bare.render(probe) == surface.render(probe):
            return []
    except ValueError:
        return []
    return [bare]
