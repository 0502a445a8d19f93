"""Tool-call surface formats: how a call appears in a target's output text.

A surface format owns both directions for one target family: `render` writes a call exactly as
that target emits it (the *frozen rendering*, so a hint or a retrieved call lines up with the
target's own tokens), and `parse` reads calls back out of free text. Everything that needs to
know the surface (the schema FSM, the hint bank, the teacher parser) goes through this class, so
a new target family is one new subclass.

The schema FSM does not hard-code scaffold strings: it asks `render` for calls whose values are
sentinels and splits the text around them (see `scaffold_pieces`), so scaffold text is always
exactly what `render` would produce.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ooospec.data.request import Call, Request


class SurfaceFormat(ABC):
    """Render/parse one target family's tool-call text."""

    name: str = "abstract"

    @abstractmethod
    def render(self, calls: list[Call]) -> str:
        """The exact assistant text the target emits for these calls (no EOS token)."""

    @abstractmethod
    def parse(self, text: str) -> list[Call]:
        """Every call found in ``text``; tolerant of surrounding prose; [] when none parse."""

    def for_request(self, request: Request) -> "SurfaceFormat":
        """The rendering this target uses for ``request``.

        Most formats have one rendering. A target whose observed layout depends on the prompt
        context (Qwen2.5-Coder answers API-Bank dialogues with one-line JSON but fences its calls
        elsewhere) returns the layout it was observed to use for this kind of request.
        """
        return self

    def layouts(self, request: Request) -> list["SurfaceFormat"]:
        """Every rendering this target may use for ``request``, the expected one first.

        A target whose layout is not fixed by the kind of request (Qwen2.5-Coder writes API-Bank
        calls on one line or in a fenced block) lets the hint follow whichever layout the
        committed text turns out to be in."""
        return [self.for_request(request)]

    def render_one(self, call: Call) -> str:
        return self.render([call])

    def describe(self) -> dict[str, Any]:
        """The frozen rendering's parameters, stored next to results for provenance."""
        return {"name": self.name}
