"""An incremental scanner that finds where a JSON value ends, one character at a time.

The schema FSM treats every argument value as a hole of free text; it only needs to know when the
hole is over, so that the scaffold after it (separator, next key, closers) can be proposed. This
scanner does not validate JSON; it tracks just enough (strings with escapes, bracket depth,
number and literal characters) to say whether the text so far is a complete value and whether a
new character still belongs to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NUMBER_CHARS = frozenset("0123456789+-.eE")
LITERALS = ("true", "false", "null")
WHITESPACE = frozenset(" \t\r\n")


@dataclass
class JsonValueScanner:
    """State of a partially read JSON value. ``feed`` says what a character does:
    ``"value"`` (part of the value), ``"end"`` (not part of it; the value was complete before it)
    or ``"error"`` (cannot continue a JSON value)."""

    kind: str = ""  # "", "string", "number", "literal", "container"
    text: str = ""
    in_string: bool = False
    escaped: bool = False
    stack: list[str] = field(default_factory=list)
    closed: bool = False  # a string / literal / container has been closed

    def copy(self) -> "JsonValueScanner":
        return JsonValueScanner(self.kind, self.text, self.in_string, self.escaped, list(self.stack), self.closed)

    @property
    def complete(self) -> bool:
        """The text read so far is a whole value (a number may still grow)."""
        if self.kind == "number":
            return bool(self.text) and self.text[-1].isdigit()
        return self.closed

    @property
    def started(self) -> bool:
        return bool(self.kind)

    def feed(self, ch: str) -> str:
        if self.closed:
            return "end"
        if not self.kind:
            if ch in WHITESPACE:
                return "value"
            if ch == '"':
                self.kind, self.in_string = "string", True
            elif ch in "{[":
                self.kind = "container"
                self.stack.append("}" if ch == "{" else "]")
            elif ch in NUMBER_CHARS:
                self.kind = "number"
            elif any(lit.startswith(ch) for lit in LITERALS):
                self.kind = "literal"
            else:
                return "error"
            self.text = ch
            return "value"
        if self.kind == "number":
            if ch in NUMBER_CHARS:
                self.text += ch
                return "value"
            return "end" if self.complete else "error"
        if self.kind == "literal":
            candidate = self.text + ch
            if any(lit.startswith(candidate) for lit in LITERALS):
                self.text = candidate
                self.closed = candidate in LITERALS
                return "value"
            return "error"
        self.text += ch
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if self.kind == "string":
                    self.closed = True
            return "value"
        # inside a container, outside any string
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not self.stack or self.stack.pop() != ch:
                return "error"
            if not self.stack:
                self.closed = True
        return "value"
