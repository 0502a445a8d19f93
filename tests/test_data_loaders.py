"""Every loader on the real mirror files: published counts and upstream pitfalls."""

import json

import pytest

from ooospec.data import apibank, bfcl, glaive, nestful, openfunctions, sealtools, toolalpaca, toolrl
from ooospec.data.raw import raw_file
from ooospec.data.request import prompt_hash


def _unique_ids(requests):
    ids = [r.id for r in requests]
    return len(ids) == len(set(ids))


@pytest.fixture(scope="module")
def apibank_eval():
    return {level: apibank.load_eval(level) for level in (1, 2)}


def test_apibank_eval_counts_and_shape(apibank_eval):
    assert len(apibank_eval[1].requests) == 399 and len(apibank_eval[2].requests) == 135
    for load in apibank_eval.values():
        assert _unique_ids(load.requests)
        assert "gold_unparsed" not in load.issues and "gold_not_in_tools" not in load.issues
        for request in load.requests:
            assert request.messages[0]["role"] == "system" and "API descriptions" not in request.messages[0]["content"]
            assert request.meta["raw_gold"].startswith("API-Request: [")
            assert len(request.gold) == 1
            assert request.prompt_hash == prompt_hash(request.messages, request.tools)
    level2 = apibank_eval[2].requests
    assert all(r.tools[0]["name"] == "ToolSearcher" for r in level2)
    assert any(r.gold[0].name == "GetUserToken" for r in level2)  # answerable: dialogue APIs are offered


def test_apibank_typed_values(apibank_eval):
    args = [c.arguments for load in apibank_eval.values() for r in load.requests for c in r.gold]
    assert any(isinstance(v, list) for a in args for v in a.values())  # attendees='[...]' -> list
    assert any(isinstance(v, bool) for a in args for v in a.values())  # on='False' -> False


def test_apibank_lv3_train():
    lv3, lv1, lv2 = apibank.load_train()
    assert lv3.raw == 907 and len(lv3.requests) >= 880
    assert set(lv3.drop_counts()) <= {"gold_not_in_tools"}
    request = lv3.requests[1]
    assert "{{time}}" not in request.messages[0]["content"] and "2034-04-15 10:00:00" in request.messages[0]["content"]
    assert "TIME:" not in request.messages[1]["content"]
    assert [t["name"] for t in request.tools] == ["ToolSearcher", "HealthcareProviderAppointmentChecker"]
    assert lv1.notes.get("absent") and lv2.notes.get("absent")


def test_toolalpaca_eval_counts():
    sim, real = toolalpaca.load_eval("simulated"), toolalpaca.load_eval("real")
    assert (len(sim.requests), len(real.requests)) == (100, 114)
    assert len(sim.issues["gold_unparsed"]) == 7 and len(real.issues["gold_unparsed"]) == 4
    assert sorted(set(r.gold[0].name for r in real.requests if r.id in real.issues["gold_not_in_tools"])) == [
        "preferred-routes_search_get", "vatsim_controllers_get", "vatsim_pilots_get", "weather_metar_get", "weather_taf_get"]
    assert all("retrievalDataFromFile" in {t["name"] for t in r.tools} for r in real.requests)
    assert all(r.tools[-1]["name"] == "getDetails" for r in sim.requests)
    nager = real.requests[0]
    assert nager.tool("LongWeekendLongWeekend")["parameters"]["properties"]["year"]["type"] == "integer"


def test_bfcl_counts_dotted_names_and_jsonl():
    with pytest.raises(json.JSONDecodeError):  # the .json files are JSON Lines
        json.loads(raw_file(bfcl.question_path("simple_python")).read_text())
    loads = {load.source: load for load in bfcl.load_eval(include_live=True)}
    counts = {k: len(v.requests) for k, v in loads.items()}
    assert counts == {"bfcl-simple_python": 400, "bfcl-multiple": 200, "bfcl-parallel": 200, "bfcl-parallel_multiple": 200,
                      "bfcl-live_simple": 258, "bfcl-live_multiple": 1053, "bfcl-live_parallel": 16,
                      "bfcl-live_parallel_multiple": 24}
    simple = loads["bfcl-simple_python"].requests
    dotted = [r for r in simple if "." in r.tools[0]["name"]]
    assert len(dotted) == 167 and all(r.gold[0].name == r.tools[0]["name"] for r in dotted)
    assert simple[0].gold[0].arguments == {"base": 10, "height": 5, "unit": "units"}  # unit: ["units", ""] -> first value
    omitted = [r for r in simple if any(v[0] == "" for c in r.meta["acceptable"] for a in c.values() for v in a.values())]
    assert omitted and all(len(r.gold[0].arguments) < len(next(iter(r.meta["acceptable"][0].values()))) for r in omitted)
    assert simple[0].meta["acceptable"][0]["calculate_triangle_area"]["unit"] == ["units", ""]
    assert all(2 <= len(r.gold) <= 8 for r in loads["bfcl-parallel"].requests)
    assert any(m["role"] == "system" for r in loads["bfcl-live_multiple"].requests for m in r.messages[:1])
    (irrelevance,) = bfcl.load_irrelevance()
    assert len(irrelevance.requests) == 240 and all(r.gold is None for r in irrelevance.requests)
    java = bfcl.load_category("simple_java")
    assert len(java.requests) == 100
    assert all(p["type"] == "string" for r in java.requests for t in r.tools for p in t["parameters"]["properties"].values())


def test_substitute_training_sources():
    seal = sealtools.load()
    assert seal.raw == 2054 and all(len(r.tools) == 5 for r in seal.requests)
    rl = toolrl.load()
    assert rl.raw == 400 and rl.drop_counts()["no_gold_call"] == 54
    assert sum(len(r.gold) for r in rl.requests) + 2 >= 570
    multi_turn = [r for r in rl.requests if sum(m["role"] == "user" for m in r.messages) > 1]
    assert multi_turn and all("<think>" not in m["content"] for r in multi_turn for m in r.messages)
    nest = nestful.load()
    assert nest.raw == 300 and all(c.name != "var_result" for r in nest.requests for c in r.gold)
    assert {n for d in nest.drops if d.reason == "gold_not_in_tools" for n in d.detail.split(", ")} == {
        "calculate_rectangle_perimeter", "calculate_tip_amount", "convert_temperature", "create_contact", "create_task",
        "get_news_headlines", "search_book"}
    gl = glaive.load()
    assert len(gl.requests) == 211 and gl.drop_counts() == {"no_gold_call": 147}
    of = openfunctions.load()
    assert len(of.requests) == 112 and any("." in r.tools[0]["name"] for r in of.requests)
    for load in (seal, rl, nest, gl, of):
        assert _unique_ids(load.requests)
