"""Gorilla OpenFunctions-v1 test set (substitute training data) -> `Request`.

One function per question. The tool is named by its ``api_call`` (the callable, often dotted, as
the gold answer spells it), not by its display ``name``. Gold = the ``model_answer`` Python call,
read with ``ast`` or, for bare-word values (``loc=Berkeley``), the tolerant scanner. An answer
whose callee differs from ``api_call`` is dropped (``gold_not_in_tools``).
"""

from __future__ import annotations

from pathlib import Path

from ooospec.data.loading import SourceLoad, check_gold, read_json, require
from ooospec.data.pycall import CallParseError, parse_python_call
from ooospec.data.raw import raw_file
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError, function_spec, normalize_schema

TEST_FILE = "train-extra/gorilla/openfunctions/openfunctions-v1/gorilla_openfunctions_v1_test.json"
SYSTEM = "Call the function that answers the user's question."


def load(root: Path | None = None) -> SourceLoad:
    out = SourceLoad(source="openfunctions-v1", split="train", files=[TEST_FILE])
    for i, row in enumerate(read_json(raw_file(TEST_FILE, root=root))):
        where = f"{TEST_FILE} record {i}"
        try:
            require(row, ("question", "function", "model_answer"), where)
            fn = row["function"]
            require(fn, ("api_call", "parameters"), f"{where} function")
            params = normalize_schema(fn["parameters"], f"{where} {fn['api_call']}")
            params.setdefault("properties", {})
            params.setdefault("required", [])
            tool = function_spec(fn["api_call"], fn.get("description", ""), params, where)
            name, args, exact = parse_python_call(row["model_answer"])
        except (DataError, CallParseError) as err:
            out.drop(TEST_FILE, str(i), "malformed_record", str(err))
            continue
        request = Request(
            id=f"openfunctions-v1-{i}", benchmark="openfunctions", split="train",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}],
            tools=[tool], gold=[Call(name, args)], source=out.source,
            meta={"raw_gold": row["model_answer"], "display_name": fn.get("name", ""), "exact_parse": exact},
        )
        if check_gold(out, request, TEST_FILE, str(i), strict=True):
            out.requests.append(request)
    return out
