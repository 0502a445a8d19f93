"""Our Llama-3.1-style JSON call format: the surface of the SmolLM2 tool target.

One call per line, ``{"name": "f", "parameters": {...}}`` with ``json.dumps`` default separators
(``", "``, ``": "``) and unicode kept as is, which is what the Llama-3.1 chat template writes for an
assistant tool call. SmolLM2 has no tool format of its own, so this one is ours: the tool LoRA is
trained on exactly `render`'s output, which makes it the frozen rendering by construction.
"""

from __future__ import annotations

import json
from typing import Any

from ooospec.data.request import Call
from ooospec.models.formats.json_calls import calls_in_text
from ooospec.models.surface import SurfaceFormat


class LlamaJson(SurfaceFormat):
    name = "llama_json"
    call_separator = "\n"

    def render(self, calls: list[Call]) -> str:
        return self.call_separator.join(
            json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls
        )

    def parse(self, text: str) -> list[Call]:
        return calls_in_text(text, ("parameters", "arguments"))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "arguments_key": "parameters", "separators": [", ", ": "],
                "ensure_ascii": False, "call_separator": self.call_separator}
