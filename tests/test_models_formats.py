"""Render/parse round trips for every surface format, and the frozen Qwen rendering vs its evidence."""

from __future__ import annotations

import json

import pytest

from ooospec.data.request import Call, Request
from ooospec.models.formats import get_surface, surface_names
from ooospec.models.formats.qwen_fenced_json import QwenFencedJson
from ooospec.paths import configs_dir

TRICKY_CALLS = [
    [Call("get_weather", {"city": "Paris", "unit": "celsius"})],
    [Call("math.factorial", {"number": 5})],  # dotted name
    [Call("translate", {"text": "Divinópolis, 上海, naïve — ✓", "to": "中文"})],  # unicode
    [Call("quote", {"text": 'He said "hi" and \\o/ {not json} [x]', "tab": "a\tb\nc"})],  # quotes, escapes
    [Call("db.query", {"conditions": [{"field": "age", "op": ">", "value": 25}, {"field": "job", "value": None}],
                       "table": [[10, 20], [30, 40]], "opts": {"nested": {"deep": [1.5, True, "x"]}, "empty": {}},
                       "tags": [], "ratio": 0.05, "neg": -3})],  # nested dicts/lists
    [Call("no_args", {})],
    [Call("spotify.play", {"artist": "Taylor Swift", "duration": 20}),
     Call("spotify.play", {"artist": "Maroon 5", "duration": 15})],  # several calls
]


def _ordered(calls: list[Call]) -> list[str]:
    """Key order matters: a target renders keys in the order it emits them."""
    return [json.dumps(c.to_dict(), ensure_ascii=False) for c in calls]


SURFACES = {name: (lambda n=name: get_surface(n)) for name in surface_names()}
SURFACES["qwen_fenced_json/inline"] = lambda: QwenFencedJson("inline")


@pytest.mark.parametrize("format_name", sorted(SURFACES))
@pytest.mark.parametrize("calls", TRICKY_CALLS, ids=[c[0].name + f"-{len(c)}" for c in TRICKY_CALLS])
def test_render_parse_round_trip(format_name, calls):
    surface = SURFACES[format_name]()
    text = surface.render(calls)
    parsed = surface.parse(text)
    assert _ordered(parsed) == _ordered(calls)
    assert surface.render(parsed) == text


@pytest.mark.parametrize("format_name", sorted(SURFACES))
def test_parse_tolerates_prose_and_finds_nothing_in_plain_text(format_name):
    surface = SURFACES[format_name]()
    call = Call("get_weather", {"city": "Paris"})
    assert surface.parse("Sure! Here you go:\n" + surface.render([call]) + "\nHope that helps.") == [call]
    assert surface.parse("I cannot help with that {unbalanced") == []
    assert surface.parse("") == []


def test_arguments_given_as_a_json_string_are_decoded():
    surface = get_surface("hermes_tool_call")
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    assert surface.parse(text) == [Call("f", {"a": 1})]


def test_qwen_rendering_layout():
    text = get_surface("qwen_fenced_json").render([Call("f.g", {"xs": [1, 2], "d": {"k": "ü"}})])
    assert text == '```json\n{\n  "name": "f.g",\n  "arguments": {\n    "xs": [1, 2],\n    "d": {\n      "k": "ü"\n    }\n  }\n}\n```'


def test_qwen_layout_follows_the_benchmark():
    def request(benchmark: str) -> Request:
        return Request(id="x", benchmark=benchmark, split="eval", messages=[], tools=[], gold=None)

    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson, frozen_rendering

    surface = get_surface("qwen_fenced_json")
    by_benchmark = frozen_rendering()["variant_by_benchmark"]
    for benchmark in ("apibank", "bfcl", "toolalpaca"):
        chosen = surface.for_request(request(benchmark))
        assert chosen.layout_name == by_benchmark.get(benchmark, by_benchmark["*"])
        assert [v.layout_name for v in surface.layouts(request(benchmark))] == [chosen.layout_name] + sorted(
            {"fenced", "inline"} - {chosen.layout_name})
    assert QwenFencedJson("fenced").render([Call("f", {})]) == '```json\n{\n  "name": "f",\n  "arguments": {}\n}\n```'
    inline = QwenFencedJson("inline").render([Call("f", {"xs": [{"a": 1}]})])
    assert inline == '{"name": "f", "arguments": {"xs": [{"a": 1}]}}'


def test_llama_json_layout():
    text = get_surface("llama_json").render([Call("f.g", {"xs": [1, 2], "s": "ü"})])
    assert text == '{"name": "f.g", "parameters": {"xs": [1, 2], "s": "ü"}}'


def test_frozen_qwen_rendering_reproduces_every_observed_answer():
    """The stored evidence: Qwen's own greedy answers on dev requests; every answer said to be in a
    frozen layout is re-rendered byte for byte by that layout, and the choice per benchmark is the
    majority of the observations."""
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson
    from ooospec.models.rendering_evidence import layout_choice

    evidence = json.loads((configs_dir() / "renderings" / "qwen_fenced_json.json").read_text())
    observations = evidence["observations"]
    assert len(observations) >= 100 and not any(o["request_id"].startswith(("bfcl", "toolalpaca")) for o in observations)
    in_layout = [o for o in observations if o["variants"]]
    assert len(in_layout) >= 100 and {v for o in in_layout for v in o["variants"]} == {"fenced", "inline"}
    for obs in in_layout:
        for name in obs["variants"]:
            layout = QwenFencedJson(name)
            calls = layout.parse(obs["raw_text"])
            assert calls and layout.render(calls) == obs["raw_text"], obs["request_id"]
    layouts = {name: QwenFencedJson(name) for name in ("fenced", "inline")}
    assert layout_choice(observations, layouts) == evidence["variant_by_benchmark"]


def test_unknown_surface_lists_known_names():
    with pytest.raises(KeyError, match="llama_json"):
        get_surface("xml_calls")
