"""The two records every stage speaks: `Request` (one tool-call prompt) and `Call`.

Three benchmarks and six training sources have three call syntaxes and three schema dialects;
everything downstream (teacher, slot rows, decoding, bench) sees only these records, so the
upstream pitfalls are handled once, in the loaders.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ooospec.data.schema import DataError
from ooospec.stage import canonical_json, read_jsonl, write_jsonl


@dataclass
class Call:
    """A semantic call: function name and argument map (JSON values)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}

    def compact(self) -> str:
        """Compact JSON in emission order (the sidecar's payload form)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Call":
        return cls(name=data["name"], arguments=dict(data.get("arguments") or {}))


def prompt_hash(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON of messages + tools: the split and dedup key."""
    return hashlib.sha256(canonical_json({"messages": messages, "tools": tools}).encode()).hexdigest()


@dataclass
class Request:
    """One tool-call request.

    ``tools`` are OpenAI-style function specs ``{"name", "description", "parameters"}`` whose
    ``parameters`` is a JSON Schema object. ``gold`` is the list of gold calls (``None`` when the
    right answer is no call, e.g. BFCL irrelevance). ``meta`` keeps source-specific extras such as
    BFCL's acceptable-value sets or the raw upstream call string.
    """

    id: str
    benchmark: str
    split: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    gold: list[Call] | None
    prompt_hash: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prompt_hash:
            self.prompt_hash = prompt_hash(self.messages, self.tools)
        if self.gold is not None:
            self.gold = [g if isinstance(g, Call) else Call.from_dict(g) for g in self.gold]

    @property
    def split_key(self) -> str:
        """The hash that assigns a training request to train or dev: the prompt hash, or the hash
        of the upstream form where a loader restructured the dialogue (so the split stays put)."""
        return str(self.meta.get("split_hash") or self.prompt_hash)

    def tool(self, name: str) -> dict[str, Any] | None:
        return next((t for t in self.tools if t["name"] == name), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gold"] = None if self.gold is None else [g.to_dict() for g in self.gold]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Request":
        return cls(**data)


def duplicate_tool_names(tools: list[Any]) -> list[str]:
    """Tool names a request lists more than once, in order of first listing."""
    counts = Counter(t["name"] for t in tools if isinstance(t, dict) and "name" in t)
    return [name for name, n in counts.items() if n > 1]


class DuplicateToolName(DataError):
    """A request listing one tool name twice: a call to it would have two schemas (`Request.tool`
    returns the first, so the schema FSM and the hint could follow different ones)."""


def check_tool_names(request: Request, where: str) -> None:
    """Refuse a request that lists a tool name twice; ``where`` names the file and record."""
    names = duplicate_tool_names(request.tools)
    if names:
        raise DuplicateToolName(f"{where}: request {request.id} lists tool {names[0]!r} more than once"
                                + (f" (also {', '.join(map(repr, names[1:]))})" if names[1:] else "")
                                + "; each tool name of a request must be unique")


def write_requests(path: Path, requests: Iterable[Request]) -> int:
    return write_jsonl(path, (request.to_dict() for request in requests))


def read_requests(path: Path) -> Iterator[Request]:
    for lineno, record in enumerate(read_jsonl(path), 1):
        try:
            request = Request.from_dict(record)
        except TypeError as err:
            raise ValueError(f"{path}: record {lineno}: not a Request ({err})") from err
        check_tool_names(request, f"{path}: record {lineno}")
        yield request
