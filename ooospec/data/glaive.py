"""glaive-function-calling (LLaMA-Factory English demo; substitute training data) -> `Request`.

Every ``function_call`` turn is one request: the dialogue before it is the prompt, the call is
the gold. ``human`` turns become user turns, ``gpt`` turns assistant turns; an earlier
``function_call`` and its ``observation`` stay as assistant-turn text (as for API-Bank). ``tools``
is a JSON *string* of OpenAI-style functions. A dialogue without any call is one raw record
dropped as ``no_gold_call`` (many are refusals). The Chinese demo is left out unless asked for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, require
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, normalize_schema

FILES = {"en": "train-extra/llamafactory-glaive/data/glaive_toolcall_en_demo.json",
         "zh": "train-extra/llamafactory-glaive/data/glaive_toolcall_zh_demo.json"}
SYSTEM = "You are a helpful assistant with access to the functions below. Use them if required."


def parse_tools(text: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(text, str):
        if not text.strip():
            return []
        try:
            text = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: tools is not a JSON string ({err.msg})") from err
    if text in ("", None):
        return []
    if not isinstance(text, list):
        raise DataError(f"{where}: tools decode to {type(text).__name__}, expected a list")
    tools = []
    for k, fn in enumerate(text):
        require(fn, ("name",), f"{where} tools[{k}]")
        params = normalize_schema(fn.get("parameters") or {"type": "object", "properties": {}}, f"{where} {fn['name']}")
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        params.setdefault("required", [])
        tools.append(function_spec(fn["name"], fn.get("description", ""), params, where))
    return tools


def parse_call(value: str, where: str) -> Call:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: function_call value is not JSON ({err.msg})") from err
    if not isinstance(data, dict) or "name" not in data:
        raise DataError(f"{where}: function_call has no name")
    args = data.get("arguments") or {}
    if isinstance(args, str):
        args = json.loads(args)
    return Call(data["name"], dict(args))


def load(root: Path | None = None, languages: tuple[str, ...] = ("en",)) -> SourceLoad:
    out = SourceLoad(source="glaive-" + "-".join(languages), split="train")
    for lang in languages:
        rel = FILES[lang]
        out.files.append(rel)
        for i, row in enumerate(read_json(raw_file(rel, root=root))):
            where = f"{rel} record {i}"
            try:
                require(row, ("conversations", "tools"), where)
                tools = parse_tools(row["tools"], where)
            except DataError as err:
                out.drop(rel, str(i), "malformed_record", str(err))
                continue
            messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
            calls = 0
            for t, turn in enumerate(row["conversations"]):
                kind, value = turn.get("from"), str(turn.get("value", ""))
                record = f"{i} turn {t}"
                if kind == "function_call":
                    calls += 1
                    try:
                        call = parse_call(value, f"{where} turn {t}")
                    except (DataError, json.JSONDecodeError) as err:
                        out.drop(rel, record, "malformed_record", str(err))
                    else:
                        request = Request(id=f"glaive-{lang}-{i}-{t}", benchmark="glaive", split="train",
                                          messages=[dict(m) for m in messages], tools=tools, gold=[call],
                                          source=out.source, meta={"raw_gold": value, "language": lang})
                        if check_gold(out, request, rel, record, strict=True):
                            out.requests.append(request)
                    piece = f"<functioncall> {value}"
                elif kind == "observation":
                    piece = f"<observation> {value}"
                elif kind == "human":
                    messages.append({"role": "user", "content": value})
                    continue
                else:
                    piece = value
                if messages[-1]["role"] == "assistant":
                    messages[-1]["content"] += "\n" + piece
                else:
                    messages.append({"role": "assistant", "content": piece})
            if calls == 0:
                out.drop(rel, str(i), "no_gold_call")
    return out
