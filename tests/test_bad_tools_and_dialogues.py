"""Bad tools and dialogues, tried as a new user would: a tool schema that breaks the JSON Schema
metaschema is a warning recorded on the request (naming tool and field) and counted in the data
card, never a silent pass nor a drop; an empty dialogue is refused for every prompt style, naming
the request."""

from __future__ import annotations

import pytest

from ooospec.data.build import schema_warning_summary
from ooospec.data.card import build_card, card_table
from ooospec.data.loading import SourceLoad, check_tool_schemas, flag_schema_warnings
from ooospec.data.request import Call, Request
from ooospec.data.schema import tool_schema_warnings
from ooospec.models.prompts import prompt_text
from ooospec.models.tiny import tiny_tokenizer

GOOD_TOOL = {"name": "get_weather", "description": "Weather now.",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TYPO_TOOL = {"name": "book", "description": "",
             "parameters": {"type": "object", "properties": {"when": {"type": "strnig"}}}}
LIST_TOOL = {"name": "search", "description": "",
             "parameters": {"type": "object", "properties": [{"name": "q", "type": "string"}]}}
TOOLS_TEMPLATE = (  # a tools-aware template that, unlike Qwen's, does not refuse an empty dialogue itself
    "{% if tools %}TOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|eos|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def _request(rid: str, tools: list, messages: list | None = None) -> Request:
    if messages is None:
        messages = [{"role": "user", "content": "Book it for Friday."}]
    return Request(id=rid, benchmark="t", split="eval", messages=messages, tools=tools,
                   gold=[Call(tools[0]["name"], {})], source="mine")


# --- tool schemas -------------------------------------------------------------------------------

def test_a_mistyped_property_type_names_tool_and_field():
    assert tool_schema_warnings([GOOD_TOOL]) == []
    assert tool_schema_warnings([GOOD_TOOL, TYPO_TOOL]) == [
        "tool book: parameters.properties.when.type: 'strnig' is not valid under any of the given schemas"]
    (warning,) = tool_schema_warnings([LIST_TOOL])
    assert warning.startswith("tool search: parameters.properties: [{") and "is not of type 'object'" in warning


def test_the_schemas_own_dialect_decides_and_odd_tools_are_named():
    tuple_items = {"type": "array", "items": [{"type": "string"}]}  # fine in Draft 7, not in 2020-12
    draft7 = {"name": "f", "parameters": {"type": "object", "properties": {"xs": tuple_items}}}
    assert tool_schema_warnings([draft7]) == []
    modern = {"name": "f", "parameters": {**draft7["parameters"], "$schema": "https://json-schema.org/draft/2020-12/schema"}}
    assert tool_schema_warnings([modern]) == [
        "tool f: parameters.properties.xs.items: [{'type': 'string'}] is not of type 'object', 'boolean'"]
    unknown = {"name": "g", "parameters": {"$schema": "urn:nope", "type": "object"}}
    assert tool_schema_warnings([unknown]) == ["tool g: parameters.$schema: unknown metaschema 'urn:nope'; checked against Draft 7"]
    assert tool_schema_warnings(["f", {"name": "h"}, {"name": "k", "parameters": None}]) == [
        "tool 0: is a str, not an object", "tool h: has no parameters",
        "tool k: parameters: None is not of type 'object', 'boolean'"]


def test_warnings_are_recorded_on_the_request_and_counted_in_the_card():
    good, bad = _request("r-good", [GOOD_TOOL]), _request("r-bad", [GOOD_TOOL, TYPO_TOOL])
    load = SourceLoad(source="mine", split="eval", files=["mine.jsonl"], requests=[good, bad])
    before = good.to_dict()
    assert flag_schema_warnings(load) == 1
    assert flag_schema_warnings(load) == 1 and load.issues == {"tool_schema_warning": ["r-bad"]}  # idempotent
    assert good.to_dict() == before  # a valid request's record is unchanged
    assert bad.meta["schema_warnings"] == [
        "tool book: parameters.properties.when.type: 'strnig' is not valid under any of the given schemas"]
    assert [r.id for r in load.requests] == ["r-good", "r-bad"]  # warned, not dropped
    card = build_card([load], [], {"version": 0}, {"eval_mine": 2})
    (entry,) = card["sources"]
    assert entry["tool_schema_warnings"] == 1 and entry["kept"] == 2
    assert entry["schema_warning_examples"] == ["r-bad: " + bad.meta["schema_warnings"][0]]
    row = card_table(card).iloc[0]
    assert row["tool schema warnings"] == 1
    summary = schema_warning_summary(card)
    assert summary[0] == "tool schema warnings: 1 requests" and summary[1] == "  mine: 1 requests"
    assert "strnig" in summary[2]
    bad.tools = [GOOD_TOOL]
    assert check_tool_schemas(bad) == [] and "schema_warnings" not in bad.meta  # fixed tool: warning gone


def test_a_card_without_the_count_still_renders():
    load = SourceLoad(source="old", split="eval", requests=[_request("r", [GOOD_TOOL])])
    card = build_card([load], [], {"version": 0}, {})
    for source in card["sources"]:  # a card written before the count existed
        source.pop("tool_schema_warnings"), source.pop("schema_warning_examples")
    assert card_table(card).iloc[0]["tool schema warnings"] == 0
    assert schema_warning_summary(card) == ["tool schema warnings: none (every tool schema is valid JSON Schema)"]


# --- empty dialogues ----------------------------------------------------------------------------

@pytest.mark.parametrize("style", ["chat_template_tools", "system_tools_json"])
@pytest.mark.parametrize("messages", [
    [],
    [{"role": "system", "content": "Be brief."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "   "}],
    [{"role": "assistant", "content": "How can I help?"}],
], ids=["no-messages", "system-only", "blank-user", "assistant-only"])
def test_an_empty_dialogue_is_refused_for_every_style(style, messages):
    tok = tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE if style == "chat_template_tools" else tok.chat_template
    request = _request("req-empty", [GOOD_TOOL], messages=messages)
    with pytest.raises(ValueError, match=r"^request req-empty: empty dialogue .*prompt style") as err:
        prompt_text(tok, request, style)
    assert isinstance(err.value, ValueError)
    ok = _request("req-ok", [GOOD_TOOL], messages=messages + [{"role": "user", "content": "Weather in Oslo?"}])
    assert prompt_text(tok, ok, style).endswith("assistant: ")
