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


def dialogue_with_history(request_text: str = "Find a dentist near me who accepts my insurance.") -> Request:
    """A user request followed by four call/result rounds: eight turns, two more than the window."""
    messages = [{"role": "system", "content": "The current time is 2034-06-22 10:00:00."},
                {"role": "user", "content": request_text}]
    for n in range(4):
        messages += [{"role": "assistant", "content": "", "tool_calls": [
                         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": f"C{n}"}}}]},
                     {"role": "tool", "name": "get_weather", "content": "sunny " * 100}]
    return Request("history", "test", "train", messages, TOOLS, [Call("get_weather", {"city": "Köln"})])


def test_calls_prompt_shows_earlier_calls_and_always_the_request():
    """`dialogue="calls"`: earlier calls in the payload's compact form, tool results clipped first,
    the latest user turn kept whole even where the window has moved past it. The committed
    adapters' prompt (`"content"`) shows neither."""
    long_request = "Find a dentist near me who accepts my insurance. " * 20  # over max_message_chars
    request = dialogue_with_history(long_request)
    today = request_prefix(request, SlotPromptConfig())
    assert "Find a dentist" not in today and "call" not in today.split("Dialogue:")[1]
    assert today.count("assistant: \n") == 3  # calls render as empty turns
    cfg = SlotPromptConfig(dialogue="calls")
    dialogue = request_prefix(request, cfg).split("Dialogue:\n")[1].splitlines()
    assert dialogue[0] == "system: The current time is 2034-06-22 10:00:00."
    assert dialogue[1] == "user: " + " ".join(long_request.split())  # first of the window, whole
    assert len(dialogue) == 1 + 6  # the window keeps its size: the request took the oldest place
    assert 'assistant call: {"name":"get_weather","arguments":{"city":"C3"}}' in dialogue
    tool_lines = [line for line in dialogue if line.startswith("tool get_weather: ")]
    assert len(tool_lines) == 3 and all(len(line) == len("tool get_weather: ") + cfg.max_tool_chars for line in tool_lines)
    # arguments given as a JSON string (OpenAI's wire form) read the same
    request.messages[-2]["tool_calls"][0]["function"]["arguments"] = '{"city": "C3"}'
    assert 'assistant call: {"name":"get_weather","arguments":{"city":"C3"}}' in request_prefix(request, cfg)


def test_calls_prompt_leaves_short_dialogues_alone_but_for_the_calls():
    request = make_request()  # system + one user turn: both prompts agree
    assert request_prefix(request, SlotPromptConfig(dialogue="calls")) == request_prefix(request, SlotPromptConfig())


def test_prompt_config_keys_stay_put_for_the_committed_adapters():
    """The committed adapters' records hold the prompt dict without the new fields; their configs
    (and keys) must not move, and a record round-trips into the same config."""
    assert set(SlotPromptConfig().to_dict()) == {"max_function_desc", "max_param_desc", "max_enum_values",
                                                 "max_system_chars", "max_message_chars", "max_messages"}
    calls = SlotPromptConfig(dialogue="calls")
    assert SlotPromptConfig(**calls.to_dict()) == calls and calls.to_dict()["dialogue"] == "calls"
    with pytest.raises(ValueError, match="dialogue must be one of"):
        SlotPromptConfig(dialogue="everything")
    from ooospec.training.sidecar import PRESETS

    assert PRESETS["calls"].committed_name == "sidecar-cpu-kall-calls"
    assert PRESETS["calls"].key() != PRESETS["teacher"].key()
    assert {k: v for k, v in PRESETS["calls"].key_config().items() if k != "prompt"} == \
        {k: v for k, v in PRESETS["teacher"].key_config().items() if k != "prompt"}  # the same recipe


def test_dialogue_coverage_on_the_dev_split():
    """On real dev requests: the committed prompt shows no earlier call and drops the request of
    some; the calls prompt shows the calls of every request that has them and drops no request."""
    from ooospec.data import load_split
    from ooospec.sidecar.slots import dialogue_coverage

    dev = load_split("dev")
    today = dialogue_coverage(dev, SlotPromptConfig())
    calls = dialogue_coverage(dev, SlotPromptConfig(dialogue="calls"))
    assert today.with_earlier_calls > 0 and today.earlier_calls_shown == 0 and today.request_turn_dropped > 0
    assert calls.earlier_calls_shown == calls.with_earlier_calls == today.with_earlier_calls
    assert calls.request_turn_dropped == 0
