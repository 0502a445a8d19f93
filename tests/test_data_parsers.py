"""Tolerant parsers for the upstream call syntaxes, on the pitfalls the data READMEs list."""

import ast
import json
import re

import pytest

from ooospec.data import apibank, bfcl, toolalpaca, toolrl
from ooospec.data.pycall import CallParseError, coerce_to_schema, parse_python_call, scan_arguments, split_call
from ooospec.data.raw import raw_file

LIST_SCHEMA = {"type": "object", "properties": {"attendees": {"type": "array"}, "health_data": {"type": "array"},
                                                "room_count": {"type": "integer"}, "on": {"type": "boolean"},
                                                "token": {"type": "string"}}}
TOOL = {"name": "X", "description": "", "parameters": LIST_SCHEMA}


def test_apibank_unescaped_nested_list_and_dicts():
    (name, args), = apibank.parse_api_request(
        "API-Request: [RecordHealthData(user_id='1', health_data='[{'name': 'blood_pressure', 'value': '120/80'}]', attendees='['John', 'Mary']')]")
    assert name == "RecordHealthData"
    call = apibank.typed_call(name, args, TOOL)
    assert call.arguments["health_data"] == [{"name": "blood_pressure", "value": "120/80"}]
    assert call.arguments["attendees"] == ["John", "Mary"]
    assert call.arguments["user_id"] == "1"


def test_apibank_clean_literals_follow_the_schema_and_others_stay_strings():
    assert coerce_to_schema("1", {"type": "integer"}) == (1, True)
    assert coerce_to_schema("False", {"type": "boolean"}) == (False, True)
    assert coerce_to_schema("2.5", {"type": "number"}) == (2.5, True)
    assert coerce_to_schema("two", {"type": "integer"}) == ("two", False)
    assert coerce_to_schema("1", {"type": "string"}) == ("1", False)
    assert coerce_to_schema("[broken", {"type": "array"}) == ("[broken", False)


def test_apibank_lv3_unquoted_unbracketed_and_multiple_calls():
    assert apibank.parse_api_request("API-Request: [FitnessClassAPI(location=New York)]") == [("FitnessClassAPI", {"location": "New York"})]
    assert apibank.parse_api_request("API-Request: PharmacyLocator(location=New York)") == [("PharmacyLocator", {"location": "New York"})]
    calls = apibank.parse_api_request("API-Request: [R(value1=80, value2=600), R(value1=90, value2=800)]")
    assert calls == [("R", {"value1": 80, "value2": 600}), ("R", {"value1": 90, "value2": 800})]
    tool = {"name": "E", "parameters": {"type": "object", "properties": {"patient_id": {"type": "string"}}}}
    assert apibank.typed_call("E", {"patient_id": 12345}, tool).arguments == {"patient_id": "12345"}


def test_apibank_quote_inside_value_needs_no_escape():
    args = scan_arguments("content='John's party', time='2023-01-01'")
    assert {k: v.text for k, v in args.items()} == {"content": "John's party", "time": "2023-01-01"}
    with pytest.raises(CallParseError):
        split_call("not a call")
    with pytest.raises(CallParseError):
        scan_arguments("a='unterminated")


def test_apibank_real_test_calls_recover_where_ast_fails():
    """ast rejects 41 of the 534 level-1/2 gold calls; the tolerant parser reads all of them."""
    ast_failures, parsed = 0, 0
    for rel in apibank.TEST_FILES.values():
        for record in json.loads(raw_file(rel).read_text()):
            body = re.sub(r"^API-Request:\s*", "", record["expected_output"].strip())
            try:
                ast.parse(body)
            except SyntaxError:
                ast_failures += 1
            parsed += len(apibank.parse_api_request(record["expected_output"])) == 1
    assert ast_failures == 41
    assert parsed == 534


def test_apibank_gold_agrees_with_dialogue_param_dicts():
    load = apibank.load_eval(1)
    assert load.notes["param_dict_checked"] >= 390
    assert load.notes["param_dict_agree"] / load.notes["param_dict_checked"] >= 0.99


def test_toolalpaca_placeholders_and_optional_names():
    call, notes = toolalpaca.parse_action("searchReports", '{"ip": "1.2.3.4", "startDate": ${start date}}')
    assert call is None and notes["gold_unparsed"]["raw"].startswith('{"ip"')
    call, notes = toolalpaca.parse_action("latest_get", '{"base": "USD", "symbols": "symbols": ["EUR"]}')
    assert call is None and "gold_unparsed" in notes
    call, notes = toolalpaca.parse_action("[Optional]updateUserProfile", '{"id": 1}')
    assert call.name == "updateUserProfile" and notes["gold_name_fixed"] == "[Optional]updateUserProfile"
    call, _ = toolalpaca.parse_action("getRandomAxolotlImage", "")
    assert call.arguments == {}


def test_bfcl_canonical_gold_rule():
    truth = [{"f": {"base": [10], "unit": ["", "units"], "opt": ["x", ""], "params": [{"limit": [50], "skip": [""]}],
                    "rows": [[{"field": ["age"], "op": [">", ">="]}]], "xs": [[3, 5]], "null": [None]}}]
    (call,) = bfcl.canonical_calls(truth, "here")
    assert call.name == "f"
    assert call.arguments == {"base": 10, "opt": "x", "params": {"limit": 50}, "rows": [{"field": "age", "op": ">"}],
                              "xs": [3, 5], "null": None}
    from ooospec.data.schema import DataError
    with pytest.raises(DataError, match="here"):
        bfcl.canonical_calls([{"f": {}, "g": {}}], "here")


def test_python_call_strings():
    assert parse_python_call('coffee_shop.find_nearby(location="San Francisco", amenities=["Wi-Fi"])') == (
        "coffee_shop.find_nearby", {"location": "San Francisco", "amenities": ["Wi-Fi"]}, True)
    name, args, exact = parse_python_call('target.order(loc=Berkeley, item="milk", n=2)')
    assert (name, args, exact) == ("target.order", {"loc": "Berkeley", "item": "milk", "n": 2}, False)


def test_toolrl_gold_after_think_with_parameters_key():
    output = ('<think> Maybe I should emit <tool_call> {"name": "decoy", "parameters": {}} </tool_call> later. </think>\n'
              '<tool_call>\n{"name": "A", "parameters": {"x": 1}}\n{"name": "B", "parameters": {}}\n</tool_call>')
    calls = toolrl.gold_calls(output, "here")
    assert [(c.name, c.arguments) for c in calls] == [("A", {"x": 1}), ("B", {})]
    assert toolrl.gold_calls("<think> no </think>\n<response> Which city? </response>", "here") == []
