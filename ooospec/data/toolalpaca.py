"""ToolAlpaca -> `Request`: ``eval_simulated`` (100) + ``eval_real`` (114), and ``train_data.json``.

Choices:

* **One request per instruction**, gold = the **first** step of its golden answer (the paper's
  rule), user message = the instruction, a short system message saying to use the tools.
* **Tools** = every function of ``Function_Projection`` (in its order), then ToolAlpaca's built-in
  ``getDetails`` (ask the user for missing information; gold answers use it) and, where the API
  lists ``external_tools: ["retrieval"]`` (all of ``eval_real``), ``retrievalDataFromFile``.
  A function's description is the first part of ``Function_Description[fn]`` (before
  ``Parameters:``); the ``components`` output-structure text is left out (it describes outputs).
* **Parameter schemas** come from the OpenAPI ``Documentation`` string, located through
  ``Function_Projection[fn] = [path, method]`` (``operationId`` is missing in several real APIs):
  path/operation ``parameters`` plus the JSON ``requestBody`` properties, with ``$ref`` inlined.
  When the document has no such operation the prose ``Parameters: {...}`` of
  ``Function_Description`` is used (``"Required. integer. text"``).
* **Gold arguments** are ``json.loads(Action_Input)``. Placeholder inputs (``${start date}``) and
  malformed ones (``"symbols": "symbols": [...]``) are kept as *unparsed*: ``gold = []`` (a call
  is expected, its arguments are unknown) with ``meta["gold_unparsed"] = {name, raw, error}``;
  the card counts them. A literal ``[Optional]`` prefix on an action name is removed (recorded in
  ``meta["gold_name_fixed"]``).
* Gold actions that are not among the tools (AviationAPI's five unlisted endpoints) stay in the
  evaluation set and are flagged ``gold_not_in_tools``; in training data they are dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, require
from ooospec.data.raw import optional_raw_file, raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, normalize_schema, python_type_schema

EVAL_FILES = {"simulated": "toolalpaca/eval_simulated.json", "real": "toolalpaca/eval_real.json"}
TRAIN_FILE = "toolalpaca/train_data.json"
SYSTEM = "Answer the user's request. Use the available tools when they are needed."
PROTOCOL_TOOLS = ("getDetails", "retrievalDataFromFile")  # ToolAlpaca's built-ins, not eval APIs

GET_DETAILS = {
    "name": "getDetails",
    "description": "Ask the user for details that are needed to call a function but are missing from the request.",
    "parameters": {"type": "object", "properties": {"Question": {"type": "string", "description": "The question to ask the user."}}, "required": ["Question"]},
}
RETRIEVAL = {
    "name": "retrievalDataFromFile",
    "description": "Retrieve specified information from a file; only for use when a function's output was too long and was saved to a file.",
    "parameters": {
        "type": "object",
        "properties": {
            "file_path": {"type": "string", "description": "The path to the file from which information needs to be retrieved."},
            "query": {"type": "string", "description": "The specific information to be retrieved from the file."},
        },
        "required": ["file_path", "query"],
    },
}
TOOL_FIELDS = ("Name", "Documentation", "Function_Description", "Function_Projection", "Instructions")


# ----------------------------------------------------------------------------- OpenAPI
def _resolve(node: Any, doc: dict[str, Any], depth: int = 0) -> Any:
    """Inline ``$ref``s (cycles and very deep nesting end as a plain object)."""
    if isinstance(node, list):
        return [_resolve(n, doc, depth) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        if depth > 6:
            return {"type": "object"}
        target: Any = doc
        for part in str(node["$ref"]).lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return _resolve(target, doc, depth + 1)
    return {k: _resolve(v, doc, depth + 1 if k in ("properties", "items") else depth) for k, v in node.items()}


_OPENAPI_ONLY = ("xml", "example", "examples", "externalDocs", "deprecated", "readOnly", "writeOnly", "nullable", "discriminator")


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    out = {k: v for k, v in schema.items() if k not in _OPENAPI_ONLY}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _clean(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _clean(out["items"])
    if not isinstance(out.get("required", []), list):
        out.pop("required")
    return out


def openapi_parameters(doc: dict[str, Any], path: str, method: str, where: str) -> dict[str, Any] | None:
    """The JSON Schema of one operation's inputs, or ``None`` when the document lacks it."""
    item = (doc.get("paths") or {}).get(path)
    if not isinstance(item, dict) or not isinstance(item.get(method.lower()), dict):
        return None
    op = item[method.lower()]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in list(item.get("parameters") or []) + list(op.get("parameters") or []):
        param = _resolve(param, doc)
        if not isinstance(param, dict) or "name" not in param or param.get("in") in ("header", "cookie"):
            continue
        schema = _clean(_resolve(param.get("schema") or {"type": "string"}, doc))
        schema = normalize_schema(schema, f"{where} parameter {param['name']}")
        if param.get("description"):
            schema["description"] = str(param["description"]).strip()
        properties[param["name"]] = schema
        if param.get("required"):
            required.append(param["name"])
    body = _resolve(op.get("requestBody") or {}, doc)
    content = body.get("content") if isinstance(body, dict) else None
    if isinstance(content, dict) and content:
        media = content.get("application/json") or next(iter(content.values()))
        schema = _clean(_resolve((media or {}).get("schema") or {}, doc))
        if isinstance(schema.get("properties"), dict):
            normalized = normalize_schema(schema, f"{where} requestBody")
            properties.update(normalized.get("properties", {}))
            required += [r for r in normalized.get("required", []) if r not in required]
    return {"type": "object", "properties": properties, "required": required}


_PROSE = re.compile(r"^(?:Required\.\s*)?([A-Za-z]+)(?:\[[^\]]*\])?")


def prose_parameters(text: str, where: str) -> dict[str, Any]:
    """``Parameters: {"p": "Required. integer. The id"}`` -> JSON Schema (fallback path)."""
    match = re.search(r"(?:^|\n)Parameters:\s*(\{.*?\})\s*(?:\nOutput:|$)", text, re.S)
    if not match:
        return {"type": "object", "properties": {}, "required": []}
    try:
        params = json.loads(match.group(1))
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: prose Parameters are not JSON ({err.msg})") from err
    properties, required = {}, []
    for name, prose in params.items():
        prose = str(prose)
        word = _PROSE.match(prose.strip())
        schema, _ = python_type_schema(word.group(1) if word else "", f"{where} parameter {name}")
        enum = re.search(r"One of: \[(.*?)\]", prose)
        if enum:
            schema["enum"] = [v.strip() for v in enum.group(1).split(",")]
        schema["description"] = re.sub(r"^(Required\.\s*)?\S+\.\s*(One of: \[.*?\]\.\s*)?", "", prose.strip())
        properties[name] = schema
        if prose.strip().startswith("Required."):
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def api_tools(api: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The tool list one ToolAlpaca API offers (its functions + built-ins)."""
    try:
        doc = json.loads(api["Documentation"]) if isinstance(api["Documentation"], str) else api["Documentation"]
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: Documentation is not a JSON OpenAPI document ({err.msg})") from err
    descriptions = api.get("Function_Description") or {}
    tools = []
    for fn, projection in api["Function_Projection"].items():
        text = str(descriptions.get(fn, ""))
        description = text.split("\nParameters:")[0] if not text.startswith("Parameters:") else ""
        path, method = (projection + ["get"])[:2] if isinstance(projection, list) else (str(projection), "get")
        params = openapi_parameters(doc, path, method, f"{where} function {fn}")
        if params is None:
            params = prose_parameters(text, f"{where} function {fn}")
        tools.append(function_spec(fn, description.strip(), params, f"{where} function {fn}"))
    tools.append(GET_DETAILS)
    if "retrieval" in (api.get("external_tools") or []):
        tools.append(RETRIEVAL)
    return tools


# ----------------------------------------------------------------------------- gold
def parse_action(action: str, action_input: Any) -> tuple[Call | None, dict[str, Any]]:
    """One ReAct step -> (Call or None when its input is unparsed, notes)."""
    notes: dict[str, Any] = {}
    name = str(action).strip()
    if name.startswith("[Optional]"):
        notes["gold_name_fixed"] = name
        name = name[len("[Optional]"):].strip()
    if isinstance(action_input, dict):
        return Call(name, action_input), notes
    text = str(action_input).strip() or "{}"
    try:
        args = json.loads(text)
    except json.JSONDecodeError as err:
        notes["gold_unparsed"] = {"name": name, "raw": text, "error": err.msg}
        return None, notes
    if not isinstance(args, dict):
        notes["gold_unparsed"] = {"name": name, "raw": text, "error": "not a JSON object"}
        return None, notes
    return Call(name, args), notes


def _request(rid: str, split: str, source: str, instruction: str, tools: list[dict[str, Any]],
             action: str, action_input: Any, meta: dict[str, Any]) -> Request:
    call, notes = parse_action(action, action_input)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction.strip()}]
    return Request(id=rid, benchmark="toolalpaca", split=split, messages=messages, tools=tools,
                   gold=[call] if call else [], source=source,
                   meta={"raw_gold": {"Action": action, "Action_Input": action_input}, **meta, **notes})


# ----------------------------------------------------------------------------- loaders
def load_eval(kind: str, root: Path | None = None) -> SourceLoad:
    """``kind`` in {"simulated", "real"}."""
    rel = EVAL_FILES[kind]
    load = SourceLoad(source=f"toolalpaca-{kind}", split="eval", files=[rel])
    apis = read_json(raw_file(rel, root=root))
    for a, api in enumerate(apis):
        where = f"{rel} API {a}"
        require(api, TOOL_FIELDS + ("Golden_Answers",), where)
        tools = api_tools(api, f"{where} ({api['Name']})")
        for i, (instruction, answer) in enumerate(zip(api["Instructions"], api["Golden_Answers"], strict=True)):
            if not answer:
                raise DataError(f"{where} ({api['Name']}) instruction {i}: empty golden answer")
            step = answer[0]
            require(step, ("Action", "Action_Input"), f"{where} instruction {i} step 0")
            rid = f"toolalpaca-{kind}-{a}-{i}"
            request = _request(rid, "eval", load.source, instruction, tools, step["Action"], step["Action_Input"],
                               {"api": api["Name"], "api_index": a, "instruction_index": i, "steps": len(answer)})
            if "gold_unparsed" in request.meta:
                load.flag("gold_unparsed", rid)
            check_gold(load, request, rel, f"API {a} instruction {i}", strict=False)
            load.requests.append(request)
    return load


def strip_hint(text: str) -> str:
    """Upstream's SFT builder removes a trailing ``\\nHint: ...`` from training inputs."""
    return re.split(r"\nHint:", text, maxsplit=1)[0]


def load_train(root: Path | None = None, path: Path | None = None) -> SourceLoad:
    """``train_data.json`` (one object per API with ``Instances``) when present.

    Gold = the first ``intermediate_steps`` action. Instances without steps are dropped
    (``no_gold_call``), as are those whose only action is ``getDetails`` (upstream's SFT rule).
    """
    load = SourceLoad(source="toolalpaca-train", split="train", files=[TRAIN_FILE])
    path = path or optional_raw_file(TRAIN_FILE, root=root)
    if path is None:
        load.notes["absent"] = True
        return load
    apis = read_json(path)
    if not isinstance(apis, list):
        raise DataError(f"{path}: expected a JSON array of APIs")
    for a, api in enumerate(apis):
        where = f"{path} API {a}"
        instances = api.get("Instances") if isinstance(api, dict) else None
        if not isinstance(instances, list):
            load.drop(str(path), f"API {a}", "malformed_record", f"{where}: no Instances list")
            continue
        try:
            require(api, ("Name", "Documentation", "Function_Description", "Function_Projection"), where)
            tools = api_tools(api, f"{where} ({api['Name']})")
        except DataError as err:
            for j in range(len(instances)):
                load.drop(str(path), f"API {a} instance {j}", "malformed_record", str(err))
            continue
        for j, inst in enumerate(instances):
            record = f"API {a} instance {j}"
            try:
                require(inst, ("input", "intermediate_steps"), f"{where} instance {j}")
            except DataError as err:
                load.drop(str(path), record, "malformed_record", str(err))
                continue
            steps = inst["intermediate_steps"] or []
            if not steps:
                load.drop(str(path), record, "no_gold_call")
                continue
            actions = [s[0][0] for s in steps if s and s[0]]
            if actions and all(a_ == "getDetails" for a_ in actions):
                load.drop(str(path), record, "only_getDetails")
                continue
            try:
                action, action_input = steps[0][0][0], steps[0][0][1]
            except (IndexError, TypeError):
                load.drop(str(path), record, "malformed_record", "intermediate_steps[0] is not [[action, input, text], obs]")
                continue
            rid = f"toolalpaca-train-{a}-{j}"
            request = _request(rid, "train", load.source, strip_hint(str(inst["input"])), tools, action, action_input,
                               {"api": api["Name"], "api_index": a, "instance_index": j, "steps": len(steps)})
            if "gold_unparsed" in request.meta:
                load.flag("gold_unparsed", rid)
            if check_gold(load, request, str(path), record, strict=True):
                load.requests.append(request)
    return load


def eval_api_names(root: Path | None = None) -> set[str]:
    """API names (``Name``) of both evaluation files: part of the decontamination manifest."""
    return {api["Name"] for rel in EVAL_FILES.values() for api in read_json(raw_file(rel, root=root))}
