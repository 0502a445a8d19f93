"""What every loader returns: the kept requests plus an account of everything it did not keep.

A loader never skips silently. Each upstream record it reads either becomes a `Request` or a
`Drop` with a reason and the file and record it came from, so the data card can reconcile
``raw = kept + sum(dropped)`` per source. Gold calls that are kept but could not be parsed (or
that break their schema) are counted in ``issues`` rather than dropped, because evaluation sets
must keep their published sizes. Tool schemas that break the JSON Schema metaschema are
warnings on the request (``meta["schema_warnings"]``, counted in ``issues``), not drops.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ooospec.data.request import Call, DuplicateToolName, Request, check_tool_names
from ooospec.data.schema import DataError, schema_violations, tool_schema_warnings


@dataclass
class Drop:
    source: str
    file: str
    record: str
    reason: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "file": self.file, "record": self.record,
                "reason": self.reason, "detail": self.detail}


@dataclass
class SourceLoad:
    """One source's output: ``raw`` candidate records, the kept ones, and the dropped ones."""

    source: str
    split: str  # "eval" | "train" (before the train/dev split)
    files: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    drops: list[Drop] = field(default_factory=list)
    issues: dict[str, list[str]] = field(default_factory=dict)  # issue -> request ids
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def raw(self) -> int:
        return len(self.requests) + len(self.drops)

    def drop(self, file: str, record: str, reason: str, detail: str = "") -> None:
        self.drops.append(Drop(self.source, file, record, reason, detail))

    def flag(self, issue: str, request_id: str) -> None:
        self.issues.setdefault(issue, []).append(request_id)

    def drop_counts(self) -> dict[str, int]:
        return dict(Counter(d.reason for d in self.drops))


def read_json(path: Path) -> Any:
    """``json.load`` whose error names the file (a truncated download shows up here)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON at line {err.lineno} column {err.colno} ({err.msg})") from err


def read_json_lines(path: Path) -> list[Any]:
    """JSON Lines (BFCL's ``.json`` files are JSONL too); the error names file and line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
    return records


def require(record: Any, keys: tuple[str, ...], where: str) -> None:
    """A record missing a field is an error that names the file, record and field."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: record is {type(record).__name__}, expected an object")
    missing = [k for k in keys if k not in record]
    if missing:
        raise DataError(f"{where}: record is missing field(s) {missing}")


def check_gold(load: SourceLoad, request: Request, file: str, record: str, strict: bool) -> bool:
    """A request's tools must have unique names; gold calls must name tools of the request, and
    should satisfy their schemas. Every loader calls this on every request it builds.

    A tool name listed twice is a drop (``strict``: training sources) or a `DuplicateToolName`
    error naming the file, record and name (an evaluation set keeps its size or fails). A call
    naming a function that is not in the request's tools is a drop (``strict``) or a flagged issue
    (evaluation sets keep their size). Schema violations are flagged either way. Returns whether
    the request is kept.
    """
    try:
        check_tool_names(request, f"{file} record {record}")
    except DuplicateToolName as err:
        if not strict:
            raise
        load.drop(file, record, "duplicate_tool_name", str(err))
        return False
    if not request.gold:
        return True
    names = {t["name"] for t in request.tools}
    unknown = [c.name for c in request.gold if c.name not in names]
    if unknown:
        if strict:
            load.drop(file, record, "gold_not_in_tools", ", ".join(unknown))
            return False
        load.flag("gold_not_in_tools", request.id)
    for call in request.gold:
        tool = request.tool(call.name)
        if tool is not None and schema_violations(call.arguments, tool):
            load.flag("gold_schema_violation", request.id)
            break
    return True


SCHEMA_WARNINGS = "schema_warnings"  # request.meta key
SCHEMA_ISSUE = "tool_schema_warning"  # SourceLoad issue key (request ids)


def check_tool_schemas(request: Request) -> list[str]:
    """Validate every tool schema of ``request`` against the JSON Schema metaschema and record the
    problems on the request (``meta["schema_warnings"]``, absent when there are none).

    A warning, not a drop: an evaluation set keeps its size, and a target can still be prompted
    with the tool; but nobody downstream should meet a ``"strnig"`` type unannounced. Idempotent.
    """
    warnings = tool_schema_warnings(request.tools)
    if warnings:
        request.meta[SCHEMA_WARNINGS] = warnings
    else:
        request.meta.pop(SCHEMA_WARNINGS, None)
    return warnings


def flag_schema_warnings(load: SourceLoad) -> int:
    """`check_tool_schemas` on every kept request of a source, flagged per request for the card.
    Returns the number of requests with warnings."""
    flagged = 0
    for request in load.requests:
        if check_tool_schemas(request):
            if request.id not in load.issues.get(SCHEMA_ISSUE, []):
                load.flag(SCHEMA_ISSUE, request.id)
            flagged += 1
    return flagged


def gold_violations(request: Request) -> list[str]:
    """Every schema problem of every gold call (for the card's examples and for tests)."""
    out = []
    for call in request.gold or []:
        tool = request.tool(call.name)
        if tool is None:
            out.append(f"{call.name}: not among the request's tools")
        else:
            out.extend(f"{call.name}.{p}" for p in schema_violations(call.arguments, tool))
    return out


__all__ = ["Call", "DataError", "Drop", "DuplicateToolName", "SourceLoad", "check_gold", "check_tool_names",
           "check_tool_schemas", "flag_schema_warnings", "gold_violations", "read_json", "read_json_lines", "require"]
