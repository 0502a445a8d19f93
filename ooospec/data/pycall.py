"""Tolerant readers for Python-call-looking strings: ``Name(k='v', ...)``.

API-Bank writes every argument through ``str()`` inside single quotes without escaping, so a
list argument reads ``attendees='['John', 'Mary']'`` and ``ast`` rejects the whole call (41 of
the 534 level-1/2 test calls). OpenFunctions-v1 answers are real Python calls but sometimes have
bare words as values (``loc=Berkeley``). One scanner serves both: a value that opens with a quote
ends at the same quote *followed by* ``, <identifier>=`` or the closing parenthesis, so quotes
inside the value need no escaping; an unquoted value runs to the next ``, <identifier>=``.

Values come back as :class:`RawValue` (the text and whether it was quoted); turning them into
typed JSON is the caller's job because only the caller knows the schema (see
:func:`coerce_to_schema`).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any


class CallParseError(ValueError):
    """The text is not a call this module can read."""


@dataclass
class RawValue:
    text: str
    quoted: bool


_NAME = r"[A-Za-z_][\w.\-]*"
_ARG_START = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*")
_BOUNDARY = re.compile(r"\s*,\s*[A-Za-z_]\w*\s*=")


def split_call(text: str) -> tuple[str, str]:
    """``Name(args)`` -> (name, args text); surrounding whitespace allowed."""
    match = re.match(rf"^\s*({_NAME})\s*\((.*)\)\s*$", text, re.S)
    if not match:
        raise CallParseError(f"not a call expression: {text[:80]!r}")
    return match.group(1), match.group(2)


def scan_arguments(args_text: str) -> dict[str, RawValue]:
    """Keyword arguments of a call, tolerant of unescaped quotes inside quoted values."""
    args: dict[str, RawValue] = {}
    pos, end = 0, len(args_text)
    while pos < end:
        if not args_text[pos:].strip():
            break
        match = _ARG_START.match(args_text, pos)
        if not match:
            raise CallParseError(f"expected key=value at {args_text[pos:pos + 40]!r}")
        key, vstart = match.group(1), match.end()
        quote = args_text[vstart] if vstart < end and args_text[vstart] in "'\"" else ""
        if quote:
            value_end = _quoted_end(args_text, vstart, quote)
            args[key] = RawValue(args_text[vstart + 1:value_end], True)
            after = value_end + 1
        else:
            boundary = _BOUNDARY.search(args_text, vstart)
            after = boundary.start() if boundary else end
            args[key] = RawValue(args_text[vstart:after].strip(), False)
        rest = args_text[after:]
        comma = re.match(r"\s*,?", rest)
        pos = after + (comma.end() if comma else 0)
    return args


def _quoted_end(text: str, start: int, quote: str) -> int:
    """Index of the quote that closes the value opened at ``start``."""
    search = start + 1
    while True:
        index = text.find(quote, search)
        if index < 0:
            raise CallParseError(f"unterminated quoted value at {text[start:start + 40]!r}")
        rest = text[index + 1:]
        if not rest.strip() or _BOUNDARY.match(rest):
            return index
        search = index + 1


def parse_python_call(text: str) -> tuple[str, dict[str, Any], bool]:
    """A Python call string -> (name, JSON-able args, exact?).

    Tries ``ast`` first (``exact=True``); on failure falls back to the tolerant scanner, where a
    quoted value is a string and an unquoted one is a Python literal when it reads as one, else
    its bare text.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if isinstance(node, ast.Call) and not node.args:
            name = ast.unparse(node.func)
            values = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            if len(values) == len(node.keywords):
                return name, {k: _jsonable(v) for k, v in values.items()}, True
    except (SyntaxError, ValueError):
        pass
    name, args_text = split_call(text)
    out: dict[str, Any] = {}
    for key, raw in scan_arguments(args_text).items():
        out[key] = raw.text if raw.quoted else literal_or_text(raw.text)
    return name, out, False


def literal_or_text(text: str) -> Any:
    """A Python/JSON literal when the text is one, else the text itself."""
    try:
        return _jsonable(ast.literal_eval(text))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | set):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def coerce_to_schema(value: str, schema: dict[str, Any]) -> tuple[Any, bool]:
    """A ``str()``-quoted API-Bank value -> the schema's type when it is a clean literal.

    ``'1'`` with type integer -> 1; ``'False'``/``'false'`` with boolean -> False; ``'2.5'`` with
    number -> 2.5; ``'[...]'``/``'{...}'`` with array/object -> the Python literal. Anything else
    stays the string (the upstream form). Returns (value, converted?).
    """
    json_type = schema.get("type")
    text = value.strip()
    if json_type == "integer" and _INT.match(text):
        return int(text), True
    if json_type == "number" and _FLOAT.match(text):
        number = float(text)
        return (int(number) if _INT.match(text) else number), True
    if json_type == "boolean" and text.lower() in ("true", "false"):
        return text.lower() == "true", True
    if json_type in ("array", "object") and text[:1] in "[{(":
        parsed = literal_or_text(text)
        if isinstance(parsed, list if json_type == "array" else dict):
            return parsed, True
    return value, False
