"""API-Bank -> `Request`: level-1/2 evaluation samples and the instruction-style training files.

Choices (each is a place where upstream is ambiguous):

* **Messages.** ``input`` is a ``User:`` / ``AI:`` transcript. ``User:`` lines become user turns,
  ``AI:`` lines assistant turns. An earlier ``API-Request: [F(k='v')]->RESULT`` line becomes
  structured history: an assistant message with ``tool_calls`` (the call typed by the tool's
  schema, like the gold) and a ``tool`` message holding RESULT verbatim, so each target's chat
  template shows earlier calls in the form that target was trained on (Qwen's template renders
  ``<tool_call>`` / ``<tool_response>``; the SmolLM2 prompt renders them in its own JSON call form).
  Left as API-Bank's verbatim text, earlier calls taught the targets to answer in that syntax
  or in prose. A call string that does not parse stays verbatim assistant text (counted in
  ``meta["history_unparsed"]``); the raw transcript turns are kept in ``meta["raw_messages"]``,
  and the train/dev split hashes the raw form (``meta["split_hash"]``) so the split does not move
  with the rendering. Lines that do not start a turn continue the previous message. The trailing
  ``Generate API Request:`` is dropped.
* **System message.** The upstream instruction minus its output-format clause (``in the format
  of [ApiName(...)]``, the expected-output example) and minus the tool list: e.g. ``Generate an
  API request based on the previous dialogue context.\\nThe current year is 2023.``. In training
  files the ``{{time}}`` placeholder is filled from the ``TIME: ...`` suffix of the user turn,
  which is removed from the user text.
* **Tools.** Level-1: the JSON schemas listed after ``API descriptions:``. Level-2: upstream
  lists only ``ToolSearcher``; we add every API the sample's source dialogue
  (``lv1-lv2-samples/level-2-toolsearcher/<file>``) calls, with schemas from the 50-API table, so
  the request is answerable and the tool list is fixed per dialogue rather than per sample.
  Level-3-style training: the ``apiCode`` schema lines that open ``input`` plus every schema a
  ``ToolSearcher`` result in the dialogue returned.
* **Types.** Every upstream value is ``str()``-quoted. When the schema says integer / number /
  boolean / array / object and the quoted text is a clean literal of that type, it is converted
  (``'1'`` -> 1, ``'False'`` -> false, ``'['John']'`` -> ["John"]); otherwise it stays a string.
  Upstream declares no required parameters; every listed input parameter is treated as required
  (the API classes read them all).
* ``meta["raw_gold"]`` keeps the upstream ``API-Request: [...]`` string.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, read_json_lines, require
from ooospec.data.pycall import CallParseError, coerce_to_schema, literal_or_text, scan_arguments, split_call
from ooospec.data.raw import optional_raw_file, raw_file
from ooospec.data.request import Call, Request, prompt_hash
from ooospec.data.schema import DataError, function_spec, object_schema

TEST_FILES = {1: "api-bank/test-data/level-1-api.json", 2: "api-bank/test-data/level-2-api.json"}
DIALOGUE_DIRS = {1: "api-bank/lv1-lv2-samples/level-1-given-desc", 2: "api-bank/lv1-lv2-samples/level-2-toolsearcher"}
LV3_TRAIN = "api-bank/training-data/lv3-api-train.json"
LV12_TRAIN = ("api-bank/training-data/lv1-api-train.json", "api-bank/training-data/lv2-api-train.json")
PROTOCOL_TOOLS = ("ToolSearcher",)  # API-Bank's retrieval step, part of the harness, not an eval API

_BARE_TYPE = re.compile(r"(['\"]type['\"]\s*:\s*)(str|int|float|bool|list|dict)\b(?!['\"])")
_TURN = re.compile(r"^(User|AI|API-Request):\s?(.*)$")
API_REQUEST_MARK = "_api_request"  # an assistant turn that is an API-Request line (internal to this module)
_TIME = re.compile(r"\s*TIME:\s*(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2})?)\s*$")


# ----------------------------------------------------------------------------- call strings
def split_request_calls(text: str) -> list[str]:
    """``API-Request: [A(...), B(...)]`` (brackets optional) -> ``["A(...)", "B(...)"]``."""
    body = text.strip()
    body = re.sub(r"^API-Request:\s*", "", body)
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    body = body.strip()
    if not body:
        raise CallParseError("empty API request")
    return [p for p in re.split(r"(?<=\))\s*,\s*(?=[A-Za-z_][\w.]*\()", body) if p.strip()]


def parse_api_request(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Names and raw arguments of every call in an ``API-Request`` string.

    Quoted values come back as the quoted text (a ``str``); unquoted values (some lv3 training
    outputs write ``location=New York``) as a literal when they read as one, else the bare text.
    """
    calls = []
    for piece in split_request_calls(text):
        name, args_text = split_call(piece)
        args = {k: (v.text if v.quoted else literal_or_text(v.text)) for k, v in scan_arguments(args_text).items()}
        calls.append((name, args))
    return calls


def typed_call(name: str, args: dict[str, Any], tool: dict[str, Any] | None) -> Call:
    """Convert quoted strings to the schema's type where they are clean literals."""
    if tool is None:
        return Call(name, args)
    props = tool["parameters"].get("properties", {})
    out = {}
    for key, value in args.items():
        if isinstance(value, str) and key in props:
            value, _ = coerce_to_schema(value, props[key])
        elif key in props and props[key].get("type") == "string" and isinstance(value, int | float):
            value = str(value)  # an unquoted lv3 value (patient_id=12345) for a string parameter
        out[key] = value
    return Call(name, out)


# ----------------------------------------------------------------------------- schemas
def api_spec(record: dict[str, Any], where: str) -> dict[str, Any]:
    """An API-Bank schema in either dialect (``name``/``input_parameters`` or ``apiCode``/``parameters``)."""
    name = record.get("name") or record.get("apiCode")
    if not name:
        raise DataError(f"{where}: API schema without name/apiCode: {str(record)[:80]}")
    params = record.get("input_parameters", record.get("parameters")) or {}
    if isinstance(params, (set, list, tuple)) and all(isinstance(p, str) for p in params):
        # a few lv3 schemas list bare parameter names ({'none'} meaning no parameters)
        params = {p: {} for p in sorted(params) if p.lower() != "none"}
    schema = object_schema(params, where=f"{where} API {name}", all_required=True)
    return function_spec(str(name), str(record.get("description", "")), schema, where)


def instruction_specs(instruction: str, where: str) -> list[dict[str, Any]]:
    """The JSON schema lines after ``API descriptions:`` in an instruction."""
    _, _, listing = instruction.partition("API descriptions:")
    specs = []
    for lineno, line in enumerate(listing.splitlines(), 1):
        if line.strip().startswith("{"):
            try:
                specs.append(api_spec(json.loads(line), f"{where} API line {lineno}"))
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: API description line {lineno} is not JSON ({err.msg})") from err
    return specs


def retrieved_specs(result_text: str, where: str) -> list[dict[str, Any]]:
    """Schemas a ``ToolSearcher`` result (a Python repr of a dict or list of dicts) returned."""
    text = result_text.strip()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        # some lv3 results write a bare Python type ('type': str); quote it and retry
        try:
            value = ast.literal_eval(_BARE_TYPE.sub(r"\1'\2'", text))
        except (ValueError, SyntaxError):
            return []
    items = value if isinstance(value, list) else [value]
    if isinstance(value, dict) and isinstance(value.get("output"), (dict, list)):
        items = value["output"] if isinstance(value["output"], list) else [value["output"]]
    specs = []
    for item in items:
        if isinstance(item, dict) and (item.get("name") or item.get("apiCode")) and (
            "input_parameters" in item or "parameters" in item
        ):
            specs.append(api_spec(item, where))
    return specs


def merge_tools(*groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Concatenate tool lists keeping the first schema of each name."""
    seen: dict[str, dict[str, Any]] = {}
    for group in groups:
        for spec in group:
            seen.setdefault(spec["name"], spec)
    return list(seen.values())


# ----------------------------------------------------------------------------- dialogue
def task_text(instruction: str, time: str | None = None) -> str:
    """The instruction's task sentence(s) without the output-format clause and tool list."""
    head = instruction.split("Input:")[0]
    head = re.sub(r"\s+in the format of \[.*?\]", "", head)
    lines = [ln.strip() for ln in head.strip().splitlines() if ln.strip()]
    if time:
        lines = [ln.replace("{{time}}", time) for ln in lines]
    else:
        lines = [ln for ln in lines if "{{time}}" not in ln]
    return "\n".join(lines)


def dialogue(input_text: str) -> tuple[list[dict[str, str]], list[str], list[str], str | None]:
    """Transcript -> (messages without system, leading schema lines, ToolSearcher results, TIME)."""
    messages: list[dict[str, str]] = []
    schema_lines: list[str] = []
    searcher_results: list[str] = []
    time: str | None = None
    for line in input_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Generate API Request") or stripped.startswith("Generate AI Response"):
            break
        match = _TURN.match(stripped)
        if not messages and not match:
            if stripped.startswith("{"):
                schema_lines.append(stripped)
            continue
        if match is None:
            messages[-1]["content"] += "\n" + line
            continue
        kind, text = match.groups()
        if kind == "User":
            found = _TIME.search(text)
            if found:
                time, text = found.group(1), text[: found.start()]
            messages.append({"role": "user", "content": text.strip()})
            continue
        if kind == "API-Request":
            text = "API-Request: " + text
            call, arrow, result = text.partition("->")
            if arrow and "ToolSearcher" in call:
                searcher_results.append(result)
            # a marker turn: `structured_history` turns it into tool_calls + tool once the schemas are known
            messages.append({"role": "assistant", "content": text.strip(), API_REQUEST_MARK: True})
            continue
        if messages and messages[-1]["role"] == "assistant" and not messages[-1].get(API_REQUEST_MARK):
            messages[-1]["content"] += "\n" + text.strip()
        else:
            messages.append({"role": "assistant", "content": text.strip()})
    return messages, schema_lines, searcher_results, time


def _raw_messages(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The transcript as before structuring: API-Request lines merged into assistant text."""
    raw: list[dict[str, str]] = []
    for message in messages:
        if message["role"] == "assistant" and raw and raw[-1]["role"] == "assistant":
            raw[-1]["content"] += "\n" + message["content"]
        else:
            raw.append({"role": message["role"], "content": message["content"]})
    return raw


def structured_history(messages: list[dict[str, Any]], by_name: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """API-Request marker turns -> assistant ``tool_calls`` + ``tool`` result messages.

    An ``AI:`` text just before a call in the same assistant turn becomes that message's content.
    Returns the messages and how many call strings did not parse (kept as verbatim text)."""
    out: list[dict[str, Any]] = []
    unparsed = 0
    for message in messages:
        if not message.get(API_REQUEST_MARK):
            if message["role"] == "assistant" and out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
                out[-1]["content"] += "\n" + message["content"]
            else:
                out.append(dict(message))
            continue
        call_text, arrow, result = message["content"].partition("->")
        try:
            calls = [typed_call(n, a, by_name.get(n)) for n, a in parse_api_request(call_text)]
        except CallParseError:
            calls = []
        if not calls:
            unparsed += 1
            if out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
                out[-1]["content"] += "\n" + message["content"]
            else:
                out.append({"role": "assistant", "content": message["content"]})
            continue
        tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        if out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]:
            out[-1]["tool_calls"] = tool_calls  # "AI: let me check." + the call: one assistant turn
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        for call in calls:
            out.append({"role": "tool", "name": call.name, "content": result.strip() if arrow else ""})
    return out, unparsed


def build_request(
    *, rid: str, split: str, source: str, instruction: str, input_text: str, output: str,
    where: str, extra_tools: list[dict[str, Any]] | None = None, known: dict[str, dict[str, Any]] | None = None,
    meta: dict[str, Any] | None = None,
) -> tuple[Request, str | None]:
    """One API-Bank instruction record -> (Request, parse error or None).

    ``known`` (name -> schema) adds the schema of every API the transcript or the gold names that
    is otherwise missing (level-2-style records whose instruction lists only ToolSearcher).
    """
    messages, schema_lines, results, time = dialogue(input_text)
    tools = instruction_specs(instruction, where)
    tools += [api_spec(json.loads(s), where) for s in schema_lines]
    for result in results:
        tools += retrieved_specs(result, where)
    tools = merge_tools(tools, extra_tools or [])
    error = None
    raw_calls: list[tuple[str, dict[str, Any]]] = []
    try:
        raw_calls = parse_api_request(output)
    except CallParseError as err:
        error = str(err)
    if known:
        named = [n for n, _ in raw_calls] + re.findall(r"API-Request: \[?([A-Za-z_]\w*)\(", input_text)
        tools = merge_tools(tools, [known[n] for n in named if n in known])
    by_name = {t["name"]: t for t in tools}
    gold = [typed_call(name, args, by_name.get(name)) for name, args in raw_calls] if error is None else []
    system = task_text(instruction, time)
    head = [{"role": "system", "content": system}] if system else []
    structured, unparsed = structured_history(messages, by_name)
    raw = head + _raw_messages(messages)
    extra: dict[str, Any] = {"raw_messages": raw, "split_hash": prompt_hash(raw, tools)}
    if unparsed:
        extra["history_unparsed"] = unparsed
    request = Request(
        id=rid, benchmark="apibank", split=split, messages=head + structured, tools=tools, gold=gold,
        source=source, meta={"raw_gold": output.strip(), **extra, **(meta or {})},
    )
    if error is not None:
        request.meta["gold_unparsed"] = error
    return request, error


# ----------------------------------------------------------------------------- evaluation
def known_apis(root: Path | None = None) -> dict[str, dict[str, Any]]:
    """The 50 level-1/2 API schemas (49 from level-1 instructions + ToolSearcher)."""
    known: dict[str, dict[str, Any]] = {}
    for level, rel in TEST_FILES.items():
        path = raw_file(rel, root=root)
        for i, record in enumerate(read_json(path)):
            for spec in instruction_specs(record["instruction"], f"{rel} record {i}"):
                known.setdefault(spec["name"], spec)
    return known


def dialogue_apis(path: Path) -> list[str]:
    """API names a source dialogue calls, in order of first call."""
    names: list[str] = []
    for turn in read_json_lines(path):
        if turn.get("role") == "API" and turn.get("api_name") not in names:
            names.append(turn["api_name"])
    return names


def dialogue_param_dicts(path: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(t["api_name"], t.get("param_dict") or {}) for t in read_json_lines(path) if t.get("role") == "API"]


def _same_args(a: dict[str, Any], b: dict[str, Any]) -> bool:
    norm = lambda d: {k: str(v).strip() for k, v in d.items()}  # noqa: E731 (param_dict is mixed)
    return norm(a) == norm(b) or a == b


def load_eval(level: int, root: Path | None = None) -> SourceLoad:
    """API-Bank level-1 (399) or level-2 (135) API-call samples."""
    rel = TEST_FILES[level]
    path = raw_file(rel, root=root)
    load = SourceLoad(source=f"apibank-level{level}", split="eval", files=[rel])
    known = known_apis(root)
    agree = checked = 0
    for i, record in enumerate(read_json(path)):
        where = f"{rel} record {i}"
        require(record, ("file", "id", "instruction", "input", "expected_output"), where)
        dialog_rel = f"{DIALOGUE_DIRS[level]}/{record['file']}"
        dialog_path = raw_file(dialog_rel, root=root)
        extra = []
        if level == 2:
            extra = [known["ToolSearcher"]] + [known[n] for n in dialogue_apis(dialog_path) if n in known]
        rid = f"apibank-l{level}-{Path(record['file']).stem}-{record['id']}"
        request, error = build_request(
            rid=rid, split="eval", source=load.source, instruction=record["instruction"],
            input_text=record["input"], output=record["expected_output"], where=where, extra_tools=extra,
            meta={"file": record["file"], "sample_id": record["id"], "level": level},
        )
        if error is not None:
            load.flag("gold_unparsed", rid)
        else:
            candidates = [p for n, p in dialogue_param_dicts(dialog_path) if n == request.gold[0].name]
            if candidates:
                checked += 1
                agree += any(_same_args(request.gold[0].arguments, p) for p in candidates)
        check_gold(load, request, rel, str(i), strict=False)
        load.requests.append(request)
    load.notes["param_dict_checked"] = checked
    load.notes["param_dict_agree"] = agree
    return load


# ----------------------------------------------------------------------------- training
def load_instruction_train(rel: str, source: str, path: Path | None, known: dict[str, dict[str, Any]]) -> SourceLoad:
    """An ``{instruction, input, output}`` training file (lv3, and lv1/lv2 when present)."""
    load = SourceLoad(source=source, split="train", files=[rel])
    if path is None:
        load.notes["absent"] = True
        return load
    records = read_json(path)
    if not isinstance(records, list):
        raise DataError(f"{path}: expected a JSON array of records")
    for i, record in enumerate(records):
        where = f"{rel} record {i}"
        try:
            require(record, ("instruction", "input", "output"), where)
            if not str(record["output"]).strip().startswith("API-Request"):
                load.drop(rel, str(i), "not_an_api_call", str(record["output"])[:60])
                continue
            level2_style = "API descriptions:" in record["instruction"] and "ToolSearcher" in record["instruction"]
            request, error = build_request(
                rid=f"{source}-{i}", split="train", source=source, instruction=record["instruction"],
                input_text=record["input"], output=record["output"], where=where,
                known=known if level2_style else None, meta={"record": i},
            )
        except DataError as err:
            load.drop(rel, str(i), "malformed_record", str(err))
            continue
        if error is not None:
            load.drop(rel, str(i), "gold_unparsed", error)
            continue
        if check_gold(load, request, rel, str(i), strict=True):
            load.requests.append(request)
    return load


def load_train(root: Path | None = None) -> list[SourceLoad]:
    """lv3 API-call training file, plus lv1/lv2 training files when present."""
    known = known_apis(root)
    loads = [load_instruction_train(LV3_TRAIN, "apibank-lv3-train", raw_file(LV3_TRAIN, root=root), known)]
    for rel in LV12_TRAIN:
        level = "lv1" if "lv1" in rel else "lv2"
        loads.append(load_instruction_train(rel, f"apibank-{level}-train", optional_raw_file(rel, root=root), known))
    return loads
