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
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from ooospec.data.request import Call, Request

FUNCTION_INDEX = "function_index"
ARGUMENT = "argument"
DIRECT_CALL = "direct_call"
ROW_KINDS = (FUNCTION_INDEX, ARGUMENT, DIRECT_CALL)

NULL = "null"


def compact_json(value: Any) -> str:
    """The one JSON spelling of a value used in targets and payloads."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


CONTENT_DIALOGUE = "content"
CALLS_DIALOGUE = "calls"
DIALOGUES = (CONTENT_DIALOGUE, CALLS_DIALOGUE)


@dataclass(frozen=True)
class SlotPromptConfig:
    """Character budgets of the compact sidecar prompt, and how it writes the dialogue.

    Prompt length is the sidecar's CPU cost, so descriptions are clipped; the numbers are part of
    the adapter's config (a different prompt needs a different adapter).

    ``dialogue`` says what a turn shows. ``"content"`` (every committed adapter): each turn's text,
    the last ``max_messages`` turns; an assistant turn that made calls shows as an empty line and
    the user's request can fall out of the window. ``"calls"``: earlier calls in the compact form
    the sidecar itself predicts, tool results clipped to ``max_tool_chars``, and the latest user turn
    always kept, whole (`render_dialogue`). ``dialogue`` and ``max_tool_chars`` stay out of
    `to_dict` under ``"content"``, so the committed adapters keep their config keys.
    """

    max_function_desc: int = 100
    max_param_desc: int = 60
    max_enum_values: int = 8
    max_system_chars: int = 300
    max_message_chars: int = 600
    max_messages: int = 6
    dialogue: str = CONTENT_DIALOGUE
    max_tool_chars: int = 200

    def __post_init__(self) -> None:
        if self.dialogue not in DIALOGUES:
            raise ValueError(f"SlotPromptConfig.dialogue must be one of {DIALOGUES}, got {self.dialogue!r}")
        if self.max_messages < 1:
            raise ValueError(f"SlotPromptConfig.max_messages must be at least 1, got {self.max_messages}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.dialogue == CONTENT_DIALOGUE:
            del out["dialogue"], out["max_tool_chars"]
        return out


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
    """The system text (it keeps task facts such as the current date), then the last few turns."""
    lines = [f"system: {_clip(m.get('content') or '', cfg.max_system_chars)}"
             for m in messages if m.get("role") == "system"][:1]
    turns = [m for m in messages if m.get("role") != "system"]
    if cfg.dialogue == CONTENT_DIALOGUE:
        lines += [_content_line(turns[i], cfg.max_message_chars) for i in shown_turns(turns, cfg)]
    else:
        request = latest_user_turn(turns)
        lines += [line for i in shown_turns(turns, cfg) for line in _turn_lines(turns[i], i == request, cfg)]
    return "\n".join(lines)


def _content_line(message: dict[str, Any], limit: int) -> str:
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = compact_json(content)
    return f"{message.get('role', 'user')}: {_clip(content, limit)}"


def latest_user_turn(turns: list[dict[str, Any]]) -> int | None:
    """Index of the last user turn: the request the next call answers."""
    return next((i for i in range(len(turns) - 1, -1, -1) if turns[i].get("role") == "user"), None)


def shown_turns(turns: list[dict[str, Any]], cfg: SlotPromptConfig) -> list[int]:
    """Indices of the (non-system) turns a prompt shows: the last ``max_messages``; under
    ``"calls"`` the latest user turn is always one of them (it takes the oldest place when the
    window has moved past it)."""
    window = list(range(max(len(turns) - cfg.max_messages, 0), len(turns)))
    user = latest_user_turn(turns)
    if cfg.dialogue == CONTENT_DIALOGUE or user is None or user in window:
        return window
    return [user] + window[1:]


def earlier_calls(message: dict[str, Any]) -> list[Call]:
    """The calls of an assistant ``tool_calls`` turn (arguments as given, a JSON string parsed)."""
    calls = []
    for tool_call in message.get("tool_calls") or []:
        function = tool_call.get("function", tool_call)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = {"_raw": arguments}
        calls.append(Call(str(function.get("name", "")), arguments if isinstance(arguments, dict) else {}))
    return calls


def _turn_lines(message: dict[str, Any], is_request: bool, cfg: SlotPromptConfig) -> list[str]:
    """One turn of a ``"calls"`` prompt: the request whole, tool results clipped hardest, every
    earlier call on its own line in the payload's compact form."""
    role = message.get("role", "user")
    if role == "tool":
        name = message.get("name")
        return [_content_line({**message, "role": f"tool {name}" if name else "tool"}, cfg.max_tool_chars)]
    if is_request:
        return [f"user: {' '.join(str(message.get('content') or '').split())}"]
    calls = earlier_calls(message) if role == "assistant" else []
    text = message.get("content") or ""
    lines = [_content_line(message, cfg.max_message_chars)] if text or not calls else []
    return lines + [f"{role} call: {call.compact()}" for call in calls]


@dataclass(frozen=True)
class DialogueCoverage:
    """What a prompt config shows of a set of requests' dialogues: how many requests hold earlier
    calls and how many of those show at least one in the prompt, and how many prompts leave out
    the latest user turn (the request itself)."""

    requests: int
    with_earlier_calls: int
    earlier_calls_shown: int
    request_turn_dropped: int


def dialogue_coverage(requests: Iterable[Request], cfg: SlotPromptConfig) -> DialogueCoverage:
    """Count, per `DialogueCoverage` field, over ``requests`` rendered with ``cfg``."""
    total = with_calls = shown = dropped = 0
    for request in requests:
        turns = [m for m in request.messages if m.get("role") != "system"]
        kept = shown_turns(turns, cfg)
        calls_at = [i for i, m in enumerate(turns) if m.get("role") == "assistant" and m.get("tool_calls")]
        user = latest_user_turn(turns)
        total += 1
        with_calls += bool(calls_at)
        shown += cfg.dialogue == CALLS_DIALOGUE and any(i in kept for i in calls_at)
        dropped += user is not None and user not in kept
    return DialogueCoverage(total, with_calls, shown, dropped)


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


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one prompt piece, without special tokens (pieces are concatenated as ids)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


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
