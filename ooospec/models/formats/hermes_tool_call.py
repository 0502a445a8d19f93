"""Hermes-style ``<tool_call>`` tags: how the Qwen2.5/Qwen3 chat templates write an assistant call.

The rendering is copied from those templates (``<tool_call>\\n{"name": "f", "arguments": {...}}\\n
</tool_call>``, ``tojson`` with default separators, calls joined by a newline), not observed from
the models here: the paper profile's targets cannot run on this machine. Re-derive it from the
targets' own outputs before a paper-profile run.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ooospec.data.request import Call
from ooospec.models.formats.json_calls import calls_in_text
from ooospec.models.surface import SurfaceFormat

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesToolCall(SurfaceFormat):
    name = "hermes_tool_call"

    def render(self, calls: list[Call]) -> str:
        return "\n".join(
            '<tool_call>\n{"name": ' + json.dumps(c.name, ensure_ascii=False) + ', "arguments": '
            + json.dumps(c.arguments, ensure_ascii=False) + "}\n</tool_call>"
            for c in calls
        )

    def parse(self, text: str) -> list[Call]:
        tagged = _TAGGED.findall(text)
        if tagged:
            return [call for chunk in tagged for call in calls_in_text(chunk, ("arguments", "parameters"))]
        return calls_in_text(text, ("arguments", "parameters"))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "open": "<tool_call>\n", "close": "\n</tool_call>", "call_separator": "\n",
                "separators": [", ", ": "], "ensure_ascii": False, "derived_from": "chat template (not observed)"}
