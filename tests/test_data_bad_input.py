"""Bad input is an error or a recorded drop naming the file and the record, never a silent skip."""

import json

import pytest

from ooospec.data import apibank, glaive, toolalpaca
from ooospec.data.bfcl import bfcl_tools
from ooospec.data.loading import SourceLoad, check_gold, read_json_lines, require
from ooospec.data.request import Call, Request
from ooospec.data.schema import DataError


def test_truncated_json_file(tmp_path):
    path = tmp_path / "train_data.json"
    path.write_text('[{"Name": "Cats", "Instances": [')
    with pytest.raises(DataError, match=f"{path}: not valid JSON"):
        toolalpaca.load_train(path=path)
    with pytest.raises(DataError, match=f"{path}: not valid JSON"):
        apibank.load_instruction_train("x", "apibank-lv1-train", path, {})


def test_truncated_jsonl_line(tmp_path):
    path = tmp_path / "BFCL_v4_simple_python.json"
    path.write_text('{"id": "a"}\n{"id": "b", "quest\n')
    with pytest.raises(DataError, match=f"{path}:2"):
        read_json_lines(path)


def test_record_missing_a_field():
    with pytest.raises(DataError, match=r"level-1-api.json record 7: record is missing field\(s\) \['expected_output'\]"):
        require({"file": "f", "id": 1, "instruction": "", "input": ""}, ("file", "id", "instruction", "input", "expected_output"),
                "level-1-api.json record 7")
    with pytest.raises(DataError, match="BFCL_v4_x.json:3 function 0"):
        bfcl_tools([{"name": "f"}], "BFCL_v4_x.json:3", "python")


def test_unknown_tool_type_in_training_data_is_a_recorded_drop(tmp_path):
    path = tmp_path / "lv2-api-train.json"
    schema = {"name": "Warp", "description": "", "input_parameters": {"x": {"type": "tensor", "description": ""}}}
    path.write_text(json.dumps([{"instruction": "API descriptions:\n" + json.dumps(schema),
                                 "input": "User: go\nGenerate API Request:\n", "output": "API-Request: [Warp(x='1')]"}]))
    load = apibank.load_instruction_train("api-bank/training-data/lv2-api-train.json", "apibank-lv2-train", path, {})
    assert load.requests == [] and load.raw == 1
    (drop,) = load.drops
    assert (drop.file, drop.record, drop.reason) == ("api-bank/training-data/lv2-api-train.json", "0", "malformed_record")
    assert "record 0" in drop.detail and "'tensor'" in drop.detail
    with pytest.raises(DataError, match="record 0 f.x: unknown parameter type 'tensor'"):
        glaive.parse_tools(json.dumps([{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "tensor"}}}}]),
                           "record 0")


def test_unknown_tool_type_in_evaluation_data_raises():
    api = {"Name": "Bad", "Documentation": json.dumps({"paths": {"/x": {"get": {"parameters": [
        {"name": "q", "in": "query", "schema": {"type": "quaternion"}}]}}}}),
        "Function_Description": {"x": "X\nParameters: {}\nOutput: ."}, "Function_Projection": {"x": ["/x", "get"]}}
    with pytest.raises(DataError, match="eval_real.json API 3 .*function x parameter q.*quaternion"):
        toolalpaca.api_tools(api, "eval_real.json API 3")


def test_call_naming_a_function_not_in_its_tools():
    request = Request(id="r1", benchmark="t", split="train", messages=[{"role": "user", "content": "x"}],
                      tools=[{"name": "f", "description": "", "parameters": {"type": "object", "properties": {}}}],
                      gold=[Call("g", {})])
    train = SourceLoad(source="t", split="train")
    assert not check_gold(train, request, "t.json", "record 4", strict=True)
    assert [d.to_dict() for d in train.drops] == [{"source": "t", "file": "t.json", "record": "record 4",
                                                   "reason": "gold_not_in_tools", "detail": "g"}]
    evaluation = SourceLoad(source="e", split="eval")
    assert check_gold(evaluation, request, "e.json", "record 4", strict=False)
    assert evaluation.issues == {"gold_not_in_tools": ["r1"]}


def test_unparseable_call_is_recorded(tmp_path):
    path = tmp_path / "lv1-api-train.json"
    path.write_text(json.dumps([{"instruction": "API descriptions:\n", "input": "User: hi\nGenerate API Request:\n",
                                 "output": "API-Request: [???]"}]))
    load = apibank.load_instruction_train("lv1-api-train.json", "apibank-lv1-train", path, {})
    assert [(d.record, d.reason) for d in load.drops] == [("0", "gold_unparsed")]
