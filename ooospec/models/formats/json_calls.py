"""Find JSON call objects inside free text: the parsing half every JSON-based surface format shares.

Models wrap calls in prose, code fences, tags or lists, and sometimes encode the argument map as a
JSON string. Scanning for every decodable JSON value (instead of a regex per format) keeps the
parsers tolerant in one place; each format only says which key carries the arguments.
"""

from __future__ import annotations

import json
from typing import Any

from ooospec.data.request import Call

_DECODER = json.JSONDecoder()


def json_values(text: str) -> list[Any]:
    """Every top-level JSON object or array in ``text``, left to right, non-overlapping."""
    values: list[Any] = []
    index = 0
    while index < len(text):
        starts = [i for i in (text.find("{", index), text.find("[", index)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        values.append(value)
        index = end
    return values


def call_from_object(obj: Any, argument_keys: tuple[str, ...]) -> Call | None:
    """``{"name": str, <argument key>: {...}}`` -> Call; None for anything else."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI style {"type": "function", "function": {...}}
        return call_from_object(obj["function"], argument_keys)
    for key in argument_keys:
        if key not in obj:
            continue
        arguments = obj[key]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if arguments is None:
            arguments = {}
        return Call(obj["name"], arguments) if isinstance(arguments, dict) else None
    return Call(obj["name"], {}) if set(obj) == {"name"} else None


def calls_in_text(text: str, argument_keys: tuple[str, ...]) -> list[Call]:
    """Every call object in ``text``, including the elements of JSON arrays of calls."""
    calls: list[Call] = []
    for value in json_values(text):
        for obj in value if isinstance(value, list) else [value]:
            call = call_from_object(obj, argument_keys)
            if call is not None:
                calls.append(call)
    return calls
