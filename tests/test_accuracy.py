"""Task accuracy: BFCL by BFCL's own checker (the pinned bfcl-eval), API-Bank/ToolAlpaca by call
match against gold, and the per-benchmark table."""

from __future__ import annotations

import math
import sys

import pytest

from ooospec.report.accuracy import (
    accuracy_table, bfcl_checker, bfcl_functions, bfcl_version, call_match, canonical_call, score_output, score_text,
)
from ooospec.data.bfcl import V4_DIR
from ooospec.data.request import Call, Request

# A hand-made BFCL entry in BFCL's own form: function docs with BFCL's types, possible answers per argument.
AREA_DOC = [{"name": "geometry.area", "description": "Area of a triangle.",
             "parameters": {"type": "dict", "properties": {"base": {"type": "integer", "description": "Base."},
                                                            "unit": {"type": "string", "description": "Unit."}},
                            "required": ["base"]}}]
AREA_ANSWER = [{"geometry.area": {"base": [10], "unit": ["units", ""]}}]
TOOLS = [{"name": "geometry.area", "description": "Area of a triangle.",
          "parameters": {"type": "object", "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
                         "required": ["base"]}}]

def _bfcl(rid: str, category: str, answer: list | None, gold: list[Call] | None) -> Request:
    meta = {"category": category} | ({"acceptable": answer} if answer is not None else {})
    return Request(id=rid, benchmark="bfcl", split="eval", messages=[{"role": "user", "content": "Area, base 10?"}],
                   tools=TOOLS, gold=gold, meta=meta)

def test_the_checker_is_bfcls_own_at_the_version_our_data_comes_from():
    ast_checker, language = bfcl_checker()
    assert ast_checker.__module__ == "bfcl_eval.eval_checker.ast_eval.ast_checker"
    assert language.PYTHON.value == "python"
    assert V4_DIR.endswith(bfcl_version())  # the checker and the questions move together
    assert "bfcl_eval.constants.eval_config" not in sys.modules  # it creates folders in site-packages

def test_bfcl_right_wrong_and_irrelevant_by_the_real_checker():
    simple = _bfcl("bfcl-hand_0", "simple_python", AREA_ANSWER, [Call("geometry.area", {"base": 10})])
    right = score_output(simple, [Call("geometry.area", {"base": 10, "unit": "Units"})], functions=AREA_DOC)
    assert right.bfcl_valid and right.name_match and right.parsed and right.error == ""  # BFCL ignores case
    wrong = score_output(simple, [Call("geometry.area", {"base": 11})], functions=AREA_DOC)
    assert not wrong.bfcl_valid and wrong.name_match
    assert wrong.error_type == "value_error:others" and "Invalid value for parameter 'base': 11" in wrong.error
    typed = score_output(simple, [Call("geometry.area", {"base": "10"})], functions=AREA_DOC)
    assert not typed.bfcl_valid and typed.error_type == "type_error:simple"
    none = score_output(simple, [], functions=AREA_DOC)
    assert not none.parsed and not none.bfcl_valid and "Wrong number of functions" in none.error

    irrelevant = _bfcl("bfcl-irrelevance_x", "irrelevance", None, None)
    assert score_output(irrelevant, []).bfcl_valid
    called = score_output(irrelevant, [Call("geometry.area", {"base": 1})])
    assert not called.bfcl_valid and called.error_type == "irrelevance_error:decoder_success"
    assert called.name_match is None

def test_bfcl_parallel_calls_in_any_order():
    answer = AREA_ANSWER + [{"geometry.area": {"base": [20], "unit": ["units", ""]}}]
    request = _bfcl("bfcl-hand_1", "parallel", answer, [Call("geometry.area", {"base": 10}), Call("geometry.area", {"base": 20})])
    swapped = [Call("geometry.area", {"base": 20}), Call("geometry.area", {"base": 10})]
    assert score_output(request, swapped, functions=AREA_DOC).bfcl_valid
    assert not score_output(request, swapped[:1], functions=AREA_DOC).bfcl_valid

def test_bfcl_docs_come_from_the_package_by_entry_id_and_text_goes_through_the_surface():
    answer = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    request = _bfcl("bfcl-simple_python_0", "simple_python", answer, [Call("calculate_triangle_area", {"base": 10, "height": 5})])
    assert bfcl_functions(request)[0]["parameters"]["type"] == "dict"  # BFCL's own doc, not our JSON Schema
    text = 'Sure.\n{"name": "calculate_triangle_area", "parameters": {"base": 10, "height": 5}}'
    record = score_text(request, text, "llama_json", target="smollm2")
    assert record.bfcl_valid and record.target == "smollm2"
    assert not score_text(request, "The area is 25.", "llama_json").parsed
    with pytest.raises(KeyError, match="bfcl-simple_python_x"):
        bfcl_functions(_bfcl("bfcl-simple_python_x", "simple_python", answer, None))

def _apibank(gold: list[Call], benchmark: str = "apibank") -> Request:
    return Request(id=f"{benchmark}-1", benchmark=benchmark, split="eval", messages=[{"role": "user", "content": "Weather?"}],
                   tools=[{"name": "GetWeather", "description": "", "parameters": {"type": "object", "properties": {}}}],
                   gold=gold)

def test_call_match_exact_vs_name_only():
    gold = [Call("GetWeather", {"city": "Oslo", "days": 2, "opts": {"b": 1, "a": [1.5]}})]
    request = _apibank(gold)
    same = score_output(request, [Call("GetWeather", {"opts": {"a": [1.5], "b": 1.0}, "days": 2.0, "city": "Oslo"})])
    assert (same.name_match, same.exact_match, same.bfcl_valid, same.error_type) == (True, True, None, "")
    value = score_output(request, [Call("GetWeather", {"city": "oslo", "days": 2, "opts": {"b": 1, "a": [1.5]}})])
    assert (value.name_match, value.exact_match, value.error_type) == (True, False, "wrong_arguments")
    name = score_output(request, [Call("GetForecast", gold[0].arguments)])
    assert (name.name_match, name.exact_match, name.error_type) == (False, False, "wrong_name")
    extra = score_output(request, gold + gold)
    assert (extra.name_match, extra.exact_match) == (False, False)
    nothing = score_output(_apibank(gold, "toolalpaca"), [])
    assert (nothing.parsed, nothing.name_match, nothing.exact_match, nothing.error_type) == (False, False, False, "no_call")
    unscored = score_output(_apibank([], "toolalpaca"), gold)
    assert (unscored.name_match, unscored.exact_match, unscored.error_type) == (None, None, "no_gold")
    assert canonical_call(Call("f", {"b": 1.0, "a": "x"})) == '{"arguments":{"a":"x","b":1},"name":"f"}'
    assert call_match([Call("f", {"x": True})], [Call("f", {"x": 1})]) == (True, False)  # true is not 1

def test_accuracy_table_per_benchmark_and_target():
    gold = [Call("GetWeather", {"city": "Oslo"})]
    simple = _bfcl("bfcl-hand_0", "simple_python", AREA_ANSWER, [Call("geometry.area", {"base": 10})])
    records = [
        score_output(_apibank(gold), gold, target="q"),
        score_output(_apibank(gold), [Call("GetWeather", {"city": "Bergen"})], target="q"),
        score_output(_apibank(gold, "toolalpaca"), [], target="q"),
        score_output(_apibank([], "toolalpaca"), gold, target="q"),
        score_output(simple, [Call("geometry.area", {"base": 10})], target="q", functions=AREA_DOC),
        score_output(simple, [Call("geometry.area", {"base": 9})], target="s", functions=AREA_DOC).to_dict(),
    ]
    table = accuracy_table(records).set_index("benchmark")
    assert list(table.index) == ["apibank", "bfcl", "toolalpaca"]
    assert table.loc["apibank", ["n", "scored", "parse rate", "name match", "exact match"]].tolist() == [2, 2, 1.0, 1.0, 0.5]
    assert math.isnan(table.loc["apibank", "BFCL valid"]) and math.isnan(table.loc["bfcl", "exact match"])
    assert table.loc["bfcl", ["n", "BFCL valid", "name match"]].tolist() == [2, 0.5, 1.0]
    assert table.loc["toolalpaca", ["n", "scored", "parse rate", "name match"]].tolist() == [2, 1, 0.5, 0.0]
    by_target = accuracy_table(records, by=("target", "benchmark"))
    assert by_target[["target", "benchmark", "n"]].values.tolist() == [
        ["q", "apibank", 2], ["q", "bfcl", 1], ["q", "toolalpaca", 2], ["s", "bfcl", 1]]
    assert accuracy_table([]).empty
