"""Slot rows: one kept call -> the sidecar's training and query rows.

The sidecar never writes a whole call. It answers small independent questions about one request,
all at once: which candidate function (*function-index* row), and for every parameter of every
candidate function, its value or ``null`` (*argument* rows). Because the rows are independent, the
whole set is one batched generation (a "slot wave"), and because they all share one request
prefix, that prefix is computed once. A third, auxiliary *direct-call* row (the whole compact
call) is trained but never queried online, as in the paper.

Prompts are split into a shared ``prefix`` (request dialogue + a compact view of the candidate
tools) and a short per-row ``question``; targets are tokenized separately, so training and the
prefix-sharing predictor see exactly the same token ids (see :func:`encode_row`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ooospec.data.request import Call, Request
from ooospec.stage import read_jsonl

FUNCTION_INDEX = "function_index"
ARGUMENT = "argument"
DIRECT_CALL = "direct_call"
ROW_KINDS = (FUNCTION_INDEX, ARGUMENT, DIRECT_CALL)

# the paper's slot-row totals (section 3), reported next to ours
PAPER_ROW_COUNTS = {"train": 75_567, "dev": 3_239}
PAPER_REQUEST_COUNTS = {"train": 9_662, "dev": 529}

NULL = "null"


def compact_json(value: Any) -> str:
    """The one JSON spelling of a value used in targets and payloads."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class SlotPromptConfig:
    """Character budgets of the compact sidecar prompt.

    Prompt length is the sidecar's CPU cost, so descriptions are clipped; the numbers are part of
    the adapter's config (a different prompt needs a different adapter).
    """

    max_function_desc: int = 100
    max_param_desc: int = 60
    max_enum_values: int = 8
    max_system_chars: int = 300
    max_message_chars: int = 600
    max_messages: int = 6

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SlotRow:
    """One sidecar question about one request, with its training target.

    ``function`` is None for the function-index and direct-call rows; ``parameter`` is set only for
    argument rows. ``target`` is the completion text (no EOS): the local function index, a compact
    JSON value or ``null``, or the compact call.
    """

    request_id: str
    kind: str
    function: str | None
    parameter: str | None
    prefix: str
    question: str
    target: str

    @property
    def prompt(self) -> str:
        return self.prefix + self.question

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SlotRow":
        return cls(**data)


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


class ToolSchemaError(ValueError):
    """A tool whose parameter schema the sidecar cannot read; the message names tool and field."""


def tool_properties(tool: dict[str, Any]) -> dict[str, Any]:
    """``parameters.properties`` of a tool, refusing anything but a mapping with the tool named
    (a list of properties otherwise surfaces as "'list' object has no attribute 'items'")."""
    params = tool.get("parameters") or {}
    if not isinstance(params, dict):
        raise ToolSchemaError(f"tool {tool.get('name')!r}: parameters must be a JSON Schema object, "
                              f"got {type(params).__name__}")
    properties = params.get("properties") or {}
    if not isinstance(properties, dict):
        raise ToolSchemaError(f"tool {tool.get('name')!r}: parameters.properties must map parameter names to "
                              f"schemas, got a {type(properties).__name__}")
    return properties


def tool_parameters(tool: dict[str, Any]) -> list[str]:
    """Parameter names of one tool in schema order (the order a target tends to emit them)."""
    return list(tool_properties(tool))


def tool_required(tool: dict[str, Any]) -> set[str]:
    """Parameter names the tool's schema marks required."""
    return set((tool.get("parameters") or {}).get("required") or [])


def _type_name(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = "|".join(str(k) for k in kind)
    if kind == "array" and isinstance(schema.get("items"), dict) and "type" in schema["items"]:
        kind = f"array<{schema['items']['type']}>"
    return str(kind)


def render_tools(tools: list[dict[str, Any]], cfg: SlotPromptConfig) -> str:
    """Numbered compact view of the candidate functions: the index rows answer with."""
    lines = []
    for index, tool in enumerate(tools):
        lines.append(f"[{index}] {tool['name']}: {_clip(tool.get('description', ''), cfg.max_function_desc)}")
        required = tool_required(tool)
        for name, schema in tool_properties(tool).items():
            schema = schema if isinstance(schema, dict) else {}
            mark = "*" if name in required else ""
            line = f"  {name}{mark} ({_type_name(schema)})"
            if schema.get("enum"):
                values = [compact_json(v) for v in schema["enum"][: cfg.max_enum_values]]
                line += " one of " + "|".join(values)
            desc = _clip(schema.get("description", ""), cfg.max_param_desc)
            if desc:
                line += ": " + desc
            lines.append(line)
    return "\n".join(lines)


def render_dialogue(messages: list[dict[str, Any]], cfg: SlotPromptConfig) -> str:
    """The last few turns, clipped; the system text keeps task facts such as the current date."""
    lines = []
    system = [m for m in messages if m.get("role") == "system"]
    turns = [m for m in messages if m.get("role") != "system"][-cfg.max_messages :]
    for message in system[:1]:
        lines.append(f"system: {_clip(message.get('content') or '', cfg.max_system_chars)}")
    for message in turns:
        content = message.get("content") or ""
        if not isinstance(content, str):
            content = compact_json(content)
        lines.append(f"{message.get('role', 'user')}: {_clip(content, cfg.max_message_chars)}")
    return "\n".join(lines)


def request_prefix(request: Request, cfg: SlotPromptConfig = SlotPromptConfig()) -> str:
    """The text every row of one request shares (its KV is computed once per wave)."""
    return f"Tools:\n{render_tools(request.tools, cfg)}\nDialogue:\n{render_dialogue(request.messages, cfg)}\n"


def function_index_question() -> str:
    return "Q: function index\nA:"


def argument_question(function: str, parameter: str) -> str:
    return f"Q: {function}.{parameter}\nA:"


def direct_call_question() -> str:
    return "Q: call\nA:"


def target_text(answer: str) -> str:
    """Completions start with a space so the question's ``A:`` ends on a stable token."""
    return " " + answer


@dataclass(frozen=True)
class RowKey:
    """Identity of one online row inside a wave (what a prediction answers)."""

    kind: str
    function: str | None = None
    parameter: str | None = None


def online_questions(request: Request, functions: Iterable[str] | None = None) -> list[tuple[RowKey, str]]:
    """The online rows of a wave: function index + argument rows of ``functions`` (default all).

    The one-wave predictor asks all of them; the two-wave ablation asks the first row alone, then
    the argument rows of the function it chose (``functions=[name]``, first row skipped).
    """
    chosen = None if functions is None else set(functions)
    rows: list[tuple[RowKey, str]] = [(RowKey(FUNCTION_INDEX), function_index_question())]
    for tool in request.tools:
        if chosen is not None and tool["name"] not in chosen:
            continue
        for parameter in tool_parameters(tool):
            rows.append((RowKey(ARGUMENT, tool["name"], parameter), argument_question(tool["name"], parameter)))
    return rows


def expand_call(request: Request, call: Call, cfg: SlotPromptConfig = SlotPromptConfig()) -> list[SlotRow]:
    """All rows of one kept call: 1 function index, one per (candidate function, parameter), 1 direct.

    Arguments the call uses that are not in the chosen function's schema are not slots and are
    not asked about; the caller has already dropped calls naming an unknown function.
    """
    names = [tool["name"] for tool in request.tools]
    if call.name not in names:
        raise ValueError(f"request {request.id}: call names {call.name!r}, not one of its tools {names}")
    prefix = request_prefix(request, cfg)
    rows = [
        SlotRow(request.id, FUNCTION_INDEX, None, None, prefix, function_index_question(),
                target_text(str(names.index(call.name))))
    ]
    for key, question in online_questions(request)[1:]:
        used = key.function == call.name and key.parameter in call.arguments
        answer = compact_json(call.arguments[key.parameter]) if used else NULL
        rows.append(SlotRow(request.id, ARGUMENT, key.function, key.parameter, prefix, question, target_text(answer)))
    rows.append(SlotRow(request.id, DIRECT_CALL, None, None, prefix, direct_call_question(),
                        target_text(reference_call(request, call).compact())))
    return rows


def reference_call(request: Request, call: Call) -> Call:
    """The call as the sidecar can express it: schema parameters only, in schema order."""
    tool = request.tool(call.name) or {}
    order = tool_parameters(tool)
    return Call(call.name, {p: call.arguments[p] for p in order if p in call.arguments})


@dataclass
class KeptCall:
    """The call a request's rows come from, and where it came from (teacher or gold)."""

    request_id: str
    call: Call
    origin: str


@dataclass
class CallSelection:
    """Kept calls of one split plus every drop with its reason (counts must reconcile)."""

    kept: list[KeptCall] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def calls_from_gold(requests: Iterable[Request]) -> CallSelection:
    """First gold call of each request: the stand-in for teacher traces while none exist."""
    selection = CallSelection()
    for request in requests:
        if not request.gold:
            selection.dropped["no gold call"] += 1
            continue
        call = request.gold[0]
        if request.tool(call.name) is None:
            selection.dropped["gold names a function not in tools"] += 1
            continue
        selection.kept.append(KeptCall(request.id, call, "gold"))
    return selection


def calls_from_traces(requests: Iterable[Request], traces: Iterable[dict[str, Any]], source: str) -> CallSelection:
    """Teacher calls (records ``{"id", "call": {"name","arguments"} | null, "reason"}``) per request.

    ``source`` names the trace file in error messages. A request without a trace is dropped as
    "not traced" (a teacher run on a subset), never silently.
    """
    by_id: dict[str, dict[str, Any]] = {}
    for lineno, record in enumerate(traces, 1):
        if "id" not in record or "call" not in record:
            raise ValueError(f"{source}: record {lineno}: a teacher trace needs 'id' and 'call'")
        by_id[record["id"]] = record
    selection = CallSelection()
    for request in requests:
        record = by_id.get(request.id)
        if record is None:
            selection.dropped["not traced"] += 1
        elif record["call"] is None:  # reasons read "kind: detail"; the kind is what is counted
            reason = str(record.get("reason") or "no valid call").split(":")[0]
            selection.dropped[f"teacher: {reason}"] += 1
        else:
            call = Call.from_dict(record["call"])
            if request.tool(call.name) is None:
                selection.dropped["teacher names a function not in tools"] += 1
            else:
                selection.kept.append(KeptCall(request.id, call, "teacher"))
    return selection


def build_rows(requests: list[Request], selection: CallSelection,
               cfg: SlotPromptConfig = SlotPromptConfig()) -> list[SlotRow]:
    by_id = {request.id: request for request in requests}
    rows: list[SlotRow] = []
    for kept in selection.kept:
        rows.extend(expand_call(by_id[kept.request_id], kept.call, cfg))
    return rows


def row_counts(rows: Iterable[SlotRow]) -> dict[str, int]:
    rows = list(rows)
    counts = Counter(row.kind for row in rows)
    out = {kind: counts.get(kind, 0) for kind in ROW_KINDS}
    out["total"] = sum(out.values())
    out["requests"] = len({row.request_id for row in rows})
    return out


def row_count_table(counts: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Our counts per split next to the paper's totals (a list of plain records for a DataFrame)."""
    table = []
    for split, c in counts.items():
        table.append({
            "split": split, "requests": c.get("requests"), **{k: c.get(k, 0) for k in ROW_KINDS},
            "total rows": c.get("total", 0), "rows / request": round(c["total"] / c["requests"], 2) if c.get("requests") else None,
            "paper requests": PAPER_REQUEST_COUNTS.get(split), "paper rows": PAPER_ROW_COUNTS.get(split),
            "paper rows / request": round(PAPER_ROW_COUNTS[split] / PAPER_REQUEST_COUNTS[split], 2) if split in PAPER_ROW_COUNTS else None,
        })
    return table


def write_rows(path: Path, rows: Iterable[SlotRow]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count


def read_rows(path: Path) -> Iterator[SlotRow]:
    for lineno, record in enumerate(read_jsonl(path), 1):
        try:
            row = SlotRow.from_dict(record)
        except TypeError as err:
            raise ValueError(f"{path}: record {lineno}: not a SlotRow ({err})") from err
        if row.kind not in ROW_KINDS:
            raise ValueError(f"{path}: record {lineno}: unknown row kind {row.kind!r}")
        yield row
