"""Seal-Tools (substitute training data) -> `Request`.

Requests come from ``dev.jsonl`` / ``test_in_domain.jsonl`` / ``test_out_domain.jsonl`` (the
training split itself is too large for the mirror). Each query is offered exactly the five
candidate tools its ``dataset_for_finetune`` prompt shows (gold tools plus distractors, the only
record of which tools a query was shown with), with schemas from those tool records (Python type
names ``str``/``int``/``float``/``bool``, upstream ``required`` lists). Gold = the whole
``calling`` list; nested calls keep their ``API_call_N`` reference strings as values. A query
whose gold tool is not among its five candidates is dropped (``gold_not_in_tools``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, read_json_lines, require
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, object_schema

BASE = "train-extra/seal-tools/Seal-Tools_Dataset"
SPLITS = ("dev", "test_in_domain", "test_out_domain")
SYSTEM = "Choose the APIs the task needs and call them with the right parameters."


def tool_spec(record: dict[str, Any], where: str) -> dict[str, Any]:
    require(record, ("api_name", "parameters"), where)
    schema = object_schema(record["parameters"], required=list(record.get("required") or []), where=where)
    return function_spec(record["api_name"], record.get("api_description", ""), schema, where)


def candidate_tools(prompt: str, where: str) -> list[dict[str, Any]]:
    """The ``api_list = [...]`` Python literal of a fine-tuning prompt -> tool specs."""
    match = re.search(r"api_list = (\[.*\])\s*\ntask_instruction = ", prompt, re.S)
    if not match:
        raise DataError(f"{where}: prompt has no 'api_list = [...]' before task_instruction")
    try:
        records = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError) as err:
        raise DataError(f"{where}: api_list is not a Python literal ({err})") from err
    return [tool_spec(r, f"{where} api_list[{k}]") for k, r in enumerate(records)]


def load(root: Path | None = None, splits: tuple[str, ...] = SPLITS) -> SourceLoad:
    out = SourceLoad(source="sealtools", split="train")
    for split in splits:
        jrel, frel = f"{BASE}/{split}.jsonl", f"{BASE}/dataset_for_finetune/{split}.json"
        out.files += [jrel, frel]
        rows = read_json_lines(raw_file(jrel, root=root))
        prompts = read_json(raw_file(frel, root=root))
        by_id = {p.get("id"): p for p in prompts if isinstance(p, dict)}
        for i, row in enumerate(rows):
            where = f"{jrel}:{i + 1}"
            try:
                require(row, ("id", "query", "calling"), where)
                prompt = by_id.get(row["id"])
                if prompt is None:
                    raise DataError(f"{where}: id {row['id']!r} has no fine-tuning prompt in {frel}")
                tools = candidate_tools(prompt["conversations"][0]["value"], f"{frel} id {row['id']}")
                gold = []
                for k, call in enumerate(row["calling"]):
                    require(call, ("api", "parameters"), f"{where} calling[{k}]")
                    gold.append(Call(call["api"], dict(call["parameters"] or {})))
            except DataError as err:
                out.drop(jrel, str(row.get("id", i)) if isinstance(row, dict) else str(i), "malformed_record", str(err))
                continue
            if not gold:
                out.drop(jrel, row["id"], "no_gold_call")
                continue
            request = Request(
                id=f"sealtools-{row['id']}", benchmark="sealtools", split="train",
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["query"]}],
                tools=tools, gold=gold, source=out.source,
                meta={"raw_gold": row["calling"], "upstream_split": split,
                      "nested": any(str(v).startswith("API_call_") for c in gold for v in c.arguments.values())},
            )
            if check_gold(out, request, jrel, row["id"], strict=True):
                out.requests.append(request)
    return out
