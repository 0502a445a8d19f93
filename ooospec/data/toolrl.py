"""ToolRL ``rlla_sft.json`` (substitute training data) -> `Request`.

* The ``instruction`` is a system prompt that embeds the tool list (``N. Name: ...\\nDescription:
  ...\\nParameters: {json}``) and output-format rules; the tools are parsed out of it and the
  rest is replaced by a short task sentence (tools travel separately in ``tools``).
* Parameter types mix JSON Schema (``string``, ``array``) and Python typing (``List[int]``,
  ``Tuple[float, float]``, ``str, optional``); :func:`schema.python_type_schema` maps both. A
  parameter is required unless its type says ``optional`` or it has a ``default``.
* ``input`` is the dialogue history: ``<user>`` segments become user turns; earlier
  ``<tool_call>``, ``<obs>`` and ``<response>`` segments stay verbatim as assistant-turn text
  (as for API-Bank); the placeholder ``<think>`` segments of the history are left out.
* Gold = every JSON line inside ``<tool_call>...</tool_call>`` **after** ``</think>`` (the thought
  text sometimes mentions ``<tool_call>``). Gold calls use the key ``parameters``, not
  ``arguments``. Rows that answer with ``<response>`` only are dropped (``no_gold_call``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, require
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, normalize_schema, python_type_schema

SFT_FILE = "train-extra/toolrl-rlla/dataset/rlla_4k_raw/rlla_sft.json"
SYSTEM = "You are a helpful multi-turn dialogue assistant. Use the available tools when the user's request needs them."

_TOOL = re.compile(r"(?m)^\d+\.\s*Name:\s*(.*?)\s*\nDescription:\s*(.*?)\s*\nParameters:\s*(.*?)\s*$")


def parameters_schema(params: Any, where: str) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise DataError(f"{where}: Parameters is a {type(params).__name__}, expected an object")
    if params.get("type") == "object" and isinstance(params.get("properties"), dict):
        return normalize_schema(params, where)  # already JSON Schema
    properties, required = {}, []
    for name, spec in params.items():
        if not isinstance(spec, dict):
            raise DataError(f"{where}: parameter {name!r} is a {type(spec).__name__}, expected an object")
        schema, optional = python_type_schema(spec.get("type", ""), f"{where} parameter {name!r}")
        if spec.get("description"):
            schema["description"] = str(spec["description"])
        if "default" in spec:
            schema["default"] = spec["default"]
        properties[name] = schema
        if not optional and "default" not in spec:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def tools_from_instruction(instruction: str, where: str) -> list[dict[str, Any]]:
    tools = []
    for match in _TOOL.finditer(instruction):
        name, description, params_text = match.groups()
        try:
            params = json.loads(params_text)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: tool {name!r} Parameters are not JSON ({err.msg})") from err
        tools.append(function_spec(name, description, parameters_schema(params, f"{where} tool {name!r}"), where))
    return tools


def history_messages(text: str) -> list[dict[str, str]]:
    body = text.split("**Dialogue Records History**", 1)[-1]
    messages: list[dict[str, str]] = []
    for match in re.finditer(r"<(user|tool_call|obs|response|think)>(.*?)</\1>", body, re.S):
        tag, content = match.group(1), match.group(2).strip()
        if tag == "think":
            continue
        if tag == "user":
            messages.append({"role": "user", "content": content})
            continue
        piece = f"<{tag}>\n{content}\n</{tag}>" if tag == "tool_call" else f"<{tag}> {content} </{tag}>"
        if messages and messages[-1]["role"] == "assistant":
            messages[-1]["content"] += "\n" + piece
        else:
            messages.append({"role": "assistant", "content": piece})
    return messages


def gold_calls(output: str, where: str) -> list[Call]:
    """Calls in the ``<tool_call>`` block after ``</think>``; [] when the row only responds."""
    answer = output.split("</think>", 1)[1] if "</think>" in output else output
    block = re.search(r"<tool_call>(.*?)</tool_call>", answer, re.S)
    if not block:
        return []
    calls = []
    for k, line in enumerate(ln for ln in block.group(1).splitlines() if ln.strip()):
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: tool_call line {k} is not JSON ({err.msg})") from err
        if not isinstance(data, dict) or "name" not in data:
            raise DataError(f"{where}: tool_call line {k} has no name")
        calls.append(Call(data["name"], dict(data.get("parameters", data.get("arguments")) or {})))
    return calls


def load(root: Path | None = None) -> SourceLoad:
    out = SourceLoad(source="toolrl", split="train", files=[SFT_FILE])
    rows = read_json(raw_file(SFT_FILE, root=root))
    for i, row in enumerate(rows):
        where = f"{SFT_FILE} record {i}"
        try:
            require(row, ("instruction", "input", "output"), where)
            tools = tools_from_instruction(row["instruction"], where)
            gold = gold_calls(row["output"], where)
        except DataError as err:
            out.drop(SFT_FILE, str(i), "malformed_record", str(err))
            continue
        if not gold:
            out.drop(SFT_FILE, str(i), "no_gold_call")
            continue
        messages = [{"role": "system", "content": SYSTEM}] + history_messages(row["input"])
        request = Request(id=f"toolrl-sft-{i}", benchmark="toolrl", split="train", messages=messages,
                          tools=tools, gold=gold, source=out.source,
                          meta={"raw_gold": row["output"].split("</think>", 1)[-1].strip(), "record": i})
        if check_gold(out, request, SFT_FILE, str(i), strict=True):
            out.requests.append(request)
    return out
