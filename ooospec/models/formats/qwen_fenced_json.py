"""Qwen2.5-Coder's observed tool-call surface: a ```json fenced, 2-space-indented call object.

Its chat template asks for ``<tool_call>`` tags, but the model answers with a Markdown code block
instead (BFCL, ToolAlpaca), and with a one-line JSON object in API-Bank's dialogue context, whose
earlier assistant turns are plain text. The exact form of each layout (fence text, indent,
array layout, unicode escaping) and which benchmark gets which layout is the *frozen
rendering*: observed once from the model's own greedy outputs and stored with the evidence in
``configs/renderings/qwen_fenced_json.json``, which this module reads, so the rendering and its
evidence cannot drift apart.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from ooospec.data.request import Call, Request
from ooospec.models.formats.json_calls import calls_in_text
from ooospec.models.surface import SurfaceFormat
from ooospec.paths import configs_dir

RENDERING_FILE = "qwen_fenced_json.json"
_FENCED = re.compile(r"```[A-Za-z]*\n(.*?)(?:```|$)", re.DOTALL)
_REQUIRED = {"fence_open", "fence_close", "indent", "ensure_ascii", "scalar_arrays_inline", "multiple_calls",
             "call_separator"}


@lru_cache(maxsize=1)
def frozen_rendering() -> dict[str, Any]:
    """``{"variants": {name: layout}, "variant_by_benchmark": {benchmark|"*": name}}`` from the file."""
    path = configs_dir() / "renderings" / RENDERING_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    layouts = data.get("variants", {})
    for name, layout in layouts.items():
        missing = _REQUIRED - set(layout)
        if missing:
            raise ValueError(f"{path}: variants.{name} is missing {sorted(missing)}")
        if layout["multiple_calls"] not in ("one_block_each", "array_in_one_block"):
            raise ValueError(f"{path}: variants.{name}.multiple_calls must be one_block_each or array_in_one_block")
    by_benchmark = data.get("variant_by_benchmark", {})
    if "*" not in by_benchmark or any(v not in layouts for v in by_benchmark.values()):
        raise ValueError(f"{path}: variant_by_benchmark needs a '*' entry and may name only {sorted(layouts)}")
    return {"variants": layouts, "variant_by_benchmark": by_benchmark}


class QwenFencedJson(SurfaceFormat):
    name = "qwen_fenced_json"

    def __init__(self, layout_name: str | None = None) -> None:
        rendering = frozen_rendering()
        self.layout_name = layout_name or rendering["variant_by_benchmark"]["*"]
        if self.layout_name not in rendering["variants"]:
            raise KeyError(f"unknown {self.name} layout {self.layout_name!r}; known: {sorted(rendering['variants'])}")
        self.layout = rendering["variants"][self.layout_name]

    def for_request(self, request: Request) -> "QwenFencedJson":
        by_benchmark = frozen_rendering()["variant_by_benchmark"]
        layout_name = by_benchmark.get(request.benchmark, by_benchmark["*"])
        return self if layout_name == self.layout_name else QwenFencedJson(layout_name)

    def layouts(self, request: Request) -> list["QwenFencedJson"]:
        primary = self.for_request(request)
        others = [QwenFencedJson(name) for name in frozen_rendering()["variants"] if name != primary.layout_name]
        return [primary, *others]

    def _dumps(self, value: Any, level: int = 0) -> str:
        """``json.dumps`` layout, except that with ``scalar_arrays_inline`` an indented dump keeps an
        array of scalars on one line (as observed)."""
        indent = self.layout["indent"]
        if indent is None:
            return json.dumps(value, ensure_ascii=self.layout["ensure_ascii"])
        pad, inner = " " * (indent * level), " " * (indent * (level + 1))
        if isinstance(value, dict) and value:
            items = [inner + self._scalar(str(k)) + ": " + self._dumps(v, level + 1) for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(value, list) and value:
            if self.layout["scalar_arrays_inline"] and not any(isinstance(v, (dict, list)) for v in value):
                return "[" + ", ".join(self._scalar(v) for v in value) + "]"
            return "[\n" + ",\n".join(inner + self._dumps(v, level + 1) for v in value) + "\n" + pad + "]"
        return self._scalar(value)

    def _scalar(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=self.layout["ensure_ascii"])

    def render(self, calls: list[Call]) -> str:
        layout = self.layout
        objects = [{"name": c.name, "arguments": c.arguments} for c in calls]
        if layout["multiple_calls"] == "array_in_one_block" and len(objects) > 1:
            return layout["fence_open"] + self._dumps(objects) + layout["fence_close"]
        return layout["call_separator"].join(layout["fence_open"] + self._dumps(o) + layout["fence_close"] for o in objects)

    def parse(self, text: str) -> list[Call]:
        """Calls in fenced blocks if there are any, else every JSON call object (either layout)."""
        blocks = _FENCED.findall(text)
        if blocks:
            return [call for block in blocks for call in calls_in_text(block, ("arguments", "parameters"))]
        return calls_in_text(text, ("arguments", "parameters"))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "variant": self.layout_name, **self.layout}
