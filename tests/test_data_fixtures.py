"""The training-file code paths whose real files are absent here, exercised on hand-written
fixtures in the documented upstream formats (tests/fixtures/)."""

from pathlib import Path

from ooospec.data import apibank, toolalpaca

FIXTURES = Path(__file__).parent / "fixtures"


def test_apibank_lv1_train_fixture():
    load = apibank.load_instruction_train(
        "api-bank/training-data/lv1-api-train.json", "apibank-lv1-train",
        FIXTURES / "apibank-lv1-api-train.json", known={},
    )
    assert load.raw == 5
    assert [r.id for r in load.requests] == ["apibank-lv1-train-0", "apibank-lv1-train-1"]
    meeting, hotel = load.requests
    assert meeting.gold[0].arguments["attendees"] == ["John", "Mary"]  # unescaped nested list
    assert hotel.gold[0].arguments == {"hotel_name": "Hilton", "room_count": 2}  # '2' -> 2 (int schema)
    assert [m["role"] for m in meeting.messages] == ["system", "user", "assistant", "user"]
    assert meeting.messages[0]["content"] == "Generate an API request based on the previous dialogue context.\nThe current year is 2023."
    reasons = {d.record: (d.reason, d.detail) for d in load.drops}
    assert reasons["2"] == ("gold_not_in_tools", "CancelHotel")
    assert reasons["3"][0] == "malformed_record" and "quaternion" in reasons["3"][1] and "record 3" in reasons["3"][1]
    assert reasons["4"][0] == "malformed_record" and "output" in reasons["4"][1]


def test_apibank_lv2_train_fixture_uses_retrieved_schema():
    load = apibank.load_instruction_train(
        "api-bank/training-data/lv2-api-train.json", "apibank-lv2-train",
        FIXTURES / "apibank-lv2-api-train.json", known={},
    )
    (request,) = load.requests
    assert [t["name"] for t in request.tools] == ["ToolSearcher", "BookHotel"]
    assert request.gold[0].arguments == {"hotel_name": "Hilton", "room_count": 2}
    # the earlier call becomes structured history: the AI text and the call in one assistant turn,
    # the result in a tool turn, the reply after it; the raw transcript stays in meta
    roles = [m["role"] for m in request.messages if m["role"] != "system"]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call_turn, result_turn, reply = request.messages[-3:]
    assert call_turn["content"] == "Let me search."
    assert call_turn["tool_calls"] == [{"type": "function", "function": {"name": "ToolSearcher",
                                                                         "arguments": {"keywords": "hotel booking"}}}]
    assert result_turn["name"] == "ToolSearcher" and result_turn["content"].startswith("{")
    assert reply == {"role": "assistant", "content": "Found it."}
    raw = [m for m in request.meta["raw_messages"] if m["role"] == "assistant"][0]["content"]
    assert raw.startswith("Let me search.\nAPI-Request: [ToolSearcher(keywords='hotel booking')]->{")
    assert raw.endswith("Found it.")
    assert request.split_key == request.meta["split_hash"] != request.prompt_hash


def test_apibank_absent_training_file_is_reported_not_raised():
    load = apibank.load_instruction_train("api-bank/training-data/lv1-api-train.json", "apibank-lv1-train", None, {})
    assert load.raw == 0 and load.notes == {"absent": True}


def test_toolalpaca_train_fixture():
    load = toolalpaca.load_train(path=FIXTURES / "toolalpaca-train_data.json")
    assert load.raw == 7
    by_index = {r.meta["instance_index"]: r for r in load.requests}
    get_cat = by_index[0]
    assert get_cat.messages[-1] == {"role": "user", "content": "Show me cat 7."}  # Hint stripped
    assert get_cat.gold[0].arguments == {"id": 7}
    tools = {t["name"]: t for t in get_cat.tools}
    assert set(tools) == {"getCat", "addCat", "getDetails"}
    assert tools["getCat"]["parameters"]["properties"]["id"]["type"] == "integer"
    assert tools["addCat"]["parameters"]["required"] == ["name"]  # from the $ref'd requestBody
    assert by_index[1].gold == [] and by_index[1].meta["gold_unparsed"]["name"] == "addCat"  # ${...} placeholder
    assert load.issues["gold_unparsed"] == ["toolalpaca-train-0-1"]
    assert by_index[6].gold[0].name == "addCat" and by_index[6].meta["gold_name_fixed"] == "[Optional]addCat"
    reasons = {d.record: d.reason for d in load.drops}
    assert reasons == {"API 0 instance 2": "no_gold_call", "API 0 instance 3": "only_getDetails",
                       "API 0 instance 4": "gold_not_in_tools", "API 0 instance 5": "malformed_record"}
