"""Slot rows: expansion counts and targets on a handmade request, call selection, row files, join."""

import json
from collections import Counter

import pytest

from ooospec.data.request import Call, Request
from ooospec.sidecar.join import join_rows, parse_function_index
from ooospec.sidecar.slots import (ARGUMENT, DIRECT_CALL, FUNCTION_INDEX, RowKey, SlotPromptConfig, expand_call,
                                   online_questions, reference_call, request_prefix)
from ooospec.training.slot_rows import (PAPER_ROW_COUNTS, build_rows, calls_from_gold, calls_from_traces, read_rows,
                                        row_count_table, row_counts, write_rows)

TOOLS = [
    {"name": "get_weather", "description": "Current weather for a city. " * 10,
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "City name"},
         "unit": {"type": "string", "enum": ["c", "f"]},
         "days": {"type": "integer"}}, "required": ["city"]}},
    {"name": "book.hotel", "description": "Book a hotel",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"},
         "guests": {"type": "array", "items": {"type": "object"}}}}},
    {"name": "ping", "description": "No arguments", "parameters": {"type": "object", "properties": {}}},
]


def make_request(call: Call | None = None, rid: str = "r1") -> Request:
    gold = [call] if call else [Call("book.hotel", {"guests": [{"name": "Zoë", "age": 3}], "city": "Köln", "extra": 1})]
    return Request(rid, "test", "train", [{"role": "system", "content": "Today is 2024-05-01."},
                                         {"role": "user", "content": "Book a hotel in Köln for Zoë."}], TOOLS, gold)


def test_expansion_counts_and_targets():
    request = make_request()
    rows = expand_call(request, request.gold[0])
    kinds = Counter(row.kind for row in rows)
    assert kinds == {FUNCTION_INDEX: 1, ARGUMENT: 5, DIRECT_CALL: 1}  # 3 + 2 + 0 parameters
    by_key = {(r.kind, r.function, r.parameter): r.target for r in rows}
    assert by_key[(FUNCTION_INDEX, None, None)] == " 1"
    assert by_key[(ARGUMENT, "book.hotel", "city")] == ' "Köln"'
    assert by_key[(ARGUMENT, "book.hotel", "guests")] == ' [{"name":"Zoë","age":3}]'
    # same parameter name in another (not chosen) function is null
    assert by_key[(ARGUMENT, "get_weather", "city")] == " null"
    assert by_key[(ARGUMENT, "get_weather", "days")] == " null"
    # the direct call drops the non-schema argument and follows schema order
    direct = json.loads(by_key[(DIRECT_CALL, None, None)])
    assert direct == {"name": "book.hotel", "arguments": {"city": "Köln", "guests": [{"name": "Zoë", "age": 3}]}}
    assert list(direct["arguments"]) == ["city", "guests"]
    # every row shares one prefix, and prompts are prefix + question
    assert len({r.prefix for r in rows}) == 1 and all(r.prompt == r.prefix + r.question for r in rows)


def test_chosen_parameter_left_unused_is_null():
    request = make_request(Call("get_weather", {"city": "Oslo"}))
    by_key = {(r.function, r.parameter): r.target for r in expand_call(request, request.gold[0]) if r.kind == ARGUMENT}
    assert by_key[("get_weather", "city")] == ' "Oslo"'
    assert by_key[("get_weather", "unit")] == " null"


def test_online_questions_match_training_rows():
    request = make_request()
    rows = [r for r in expand_call(request, request.gold[0]) if r.kind != DIRECT_CALL]
    online = online_questions(request)
    assert [q for _, q in online] == [r.question for r in rows]
    only = online_questions(request, functions=["get_weather"])
    assert [k for k, _ in only] == [RowKey(FUNCTION_INDEX)] + [RowKey(ARGUMENT, "get_weather", p) for p in ("city", "unit", "days")]


def test_prefix_is_compact():
    cfg = SlotPromptConfig(max_function_desc=40)
    prefix = request_prefix(make_request(), cfg)
    assert "[0] get_weather: Current weather" in prefix and "[2] ping" in prefix
    assert "Current weather for a city. " * 3 not in prefix  # clipped description
    assert 'one of "c"|"f"' in prefix and "city* (string)" in prefix and "guests (array<object>)" in prefix
    assert "system: Today is 2024-05-01." in prefix and prefix.endswith("Köln for Zoë.\n")


def test_unknown_function_is_an_error_naming_the_request():
    with pytest.raises(ValueError, match="request r1: call names 'nope'"):
        expand_call(make_request(), Call("nope", {}))


def test_selection_from_gold_and_traces_reconciles():
    requests = [make_request(rid="a"), make_request(rid="b"), make_request(rid="c"), make_request(rid="d")]
    requests[3].gold = None
    gold = calls_from_gold(requests)
    assert [k.request_id for k in gold.kept] == ["a", "b", "c"] and gold.dropped == {"no gold call": 1}
    traces = [{"id": "a", "call": {"name": "ping", "arguments": {}}, "reason": None},
              {"id": "b", "call": None, "reason": "no fenced json"},
              {"id": "c", "call": {"name": "ghost", "arguments": {}}, "reason": None}]
    sel = calls_from_traces(requests, traces, "traces.jsonl")
    assert [(k.request_id, k.origin) for k in sel.kept] == [("a", "teacher")]
    assert sum(sel.dropped.values()) + len(sel.kept) == len(requests)
    assert sel.dropped["not traced"] == 1 and sel.dropped["teacher: no fenced json"] == 1
    with pytest.raises(ValueError, match="traces.jsonl: record 1"):
        calls_from_traces(requests, [{"call": None}], "traces.jsonl")


def test_counts_table_and_row_file_round_trip(tmp_path):
    requests = [make_request(rid="a"), make_request(Call("ping", {}), rid="b")]
    rows = build_rows(requests, calls_from_gold(requests))
    counts = row_counts(rows)
    assert counts == {FUNCTION_INDEX: 2, ARGUMENT: 10, DIRECT_CALL: 2, "total": 14, "requests": 2}
    table = row_count_table({"train": counts})
    assert table[0]["paper rows"] == PAPER_ROW_COUNTS["train"] and table[0]["rows / request"] == 7.0
    path = tmp_path / "rows.jsonl"
    assert write_rows(path, rows) == 14
    assert list(read_rows(path)) == rows
    path.write_text(json.dumps({**rows[0].to_dict(), "kind": "bogus"}) + "\n")
    with pytest.raises(ValueError, match=r"rows.jsonl: record 1: unknown row kind"):
        list(read_rows(path))


def test_join_drops_nulls_and_invalid_values():
    request = make_request()
    answers = {RowKey(FUNCTION_INDEX): "0", RowKey(ARGUMENT, "get_weather", "city"): '"Paris"',
               RowKey(ARGUMENT, "get_weather", "unit"): "null", RowKey(ARGUMENT, "get_weather", "days"): '"3',
               RowKey(ARGUMENT, "book.hotel", "city"): '"Rome"'}
    joined = join_rows(request, answers)
    assert joined.call == Call("get_weather", {"city": "Paris"})
    assert joined.payload == '{"name":"get_weather","arguments":{"city":"Paris"}}'
    assert [(d.parameter, d.reason.split(" (")[0]) for d in joined.dropped] == [("days", "invalid JSON")]
    truncated = join_rows(request, {**answers, RowKey(ARGUMENT, "get_weather", "days"): "12"},
                          frozenset({RowKey(ARGUMENT, "get_weather", "days")}))
    assert truncated.call.arguments == {"city": "Paris"} and truncated.dropped[0].reason.startswith("truncated")


def test_join_without_a_usable_function_index():
    request = make_request()
    assert join_rows(request, {}).reason == "no function-index answer"
    assert join_rows(request, {RowKey(FUNCTION_INDEX): "7"}).call is None
    assert parse_function_index(" 2", 3) == (2, None)
    assert parse_function_index("3", 3)[1] == "function index 3 out of range (0..2)"
    assert "not a number" in parse_function_index('"get_weather"', 3)[1]
    assert join_rows(request, {RowKey(FUNCTION_INDEX): "2"}).call == Call("ping", {})


def test_reference_call_keeps_schema_order():
    request = make_request()
    assert list(reference_call(request, request.gold[0]).arguments) == ["city", "guests"]


def test_a_properties_list_names_the_tool_and_the_field():
    from ooospec.sidecar.slots import ToolSchemaError, tool_parameters

    bad = {"name": "book_hotel", "parameters": {"type": "object", "properties": [{"name": "city"}]}}
    with pytest.raises(ToolSchemaError, match=r"tool 'book_hotel': parameters.properties must map"):
        tool_parameters(bad)
