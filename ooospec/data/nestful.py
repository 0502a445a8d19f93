"""NESTFUL (substitute training data) -> `Request`.

Each data file pairs with a spec file of the same part (executable / glaive / sgd), each in its
own dialect: RapidAPI ``query_parameters``/``path_parameters`` with words like ``String``,
``Number``, ``Enum``; glaive-style ``parameters``; SGD ``arguments`` without types but with
``allowed_values`` (-> ``enum``) and ``default_value``. The request's tools are the specs of the
functions its sequence calls (in order of first call); gold = the real calls (the closing
``var_result`` pseudo-call is not a tool and is left out; ``label`` is dropped; ``$var1.x$``
references stay as strings). A sequence that calls a function with no spec (7 glaive names) is
dropped (``gold_not_in_tools``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ooospec.data.loading import SourceLoad, check_gold, read_json, require
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, object_schema

BASE = "train-extra/nestful/data"
PARTS = {
    "executable": (f"{BASE}/executable/executable-data.json", f"{BASE}/executable/executable-spec.json"),
    "glaive": (f"{BASE}/non-executable/non-executable-glaive-data.json", f"{BASE}/non-executable/non-executable-glaive-spec.json"),
    "sgd": (f"{BASE}/non-executable/non-executable-sgd-data.json", f"{BASE}/non-executable/non-executable-sgd-spec.json"),
}
SYSTEM = "Answer the user's request by calling the available functions; a later call may use an earlier call's output."
PSEUDO_CALLS = ("var_result",)


def spec_tool(spec: dict[str, Any], where: str) -> dict[str, Any]:
    require(spec, ("name",), where)
    params: dict[str, Any] = {}
    for key in ("path_parameters", "query_parameters", "parameters", "arguments"):
        if isinstance(spec.get(key), dict):
            params.update(spec[key])
    return function_spec(spec["name"], spec.get("description", ""), object_schema(params, where=f"{where} {spec['name']}"), where)


def load(root: Path | None = None) -> SourceLoad:
    out = SourceLoad(source="nestful", split="train")
    for part, (drel, srel) in PARTS.items():
        out.files += [drel, srel]
        specs = {}
        for k, spec in enumerate(read_json(raw_file(srel, root=root))):
            tool = spec_tool(spec, f"{srel} record {k}")
            specs.setdefault(tool["name"], tool)
        for i, row in enumerate(read_json(raw_file(drel, root=root))):
            where = f"{drel} record {i}"
            try:
                require(row, ("input", "output"), where)
                gold = []
                for k, call in enumerate(row["output"]):
                    require(call, ("name",), f"{where} output[{k}]")
                    if call["name"] not in PSEUDO_CALLS:
                        gold.append(Call(call["name"], dict(call.get("arguments") or {})))
            except DataError as err:
                out.drop(drel, str(i), "malformed_record", str(err))
                continue
            if not gold:
                out.drop(drel, str(i), "no_gold_call")
                continue
            names = list(dict.fromkeys(c.name for c in gold))
            tools = [specs[n] for n in names if n in specs]
            request = Request(
                id=f"nestful-{part}-{i}", benchmark="nestful", split="train",
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["input"]}],
                tools=tools, gold=gold, source=out.source, meta={"raw_gold": row["output"], "part": part},
            )
            if check_gold(out, request, drel, str(i), strict=True):
                out.requests.append(request)
    return out
