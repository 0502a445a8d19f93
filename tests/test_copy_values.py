"""Copy-aware string slots: a value stays a span of the request unless the model is sure it is not."""

import json

import torch

from ooospec.data.request import Call, Request
from ooospec.models.tiny import tiny_model_and_tokenizer
from ooospec.sidecar.copy_values import CopySettings, SpanCopier, keeps_span, request_text, string_body
from ooospec.sidecar.predictor import SlotPredictor
from ooospec.training.lora import LoraTrainConfig, train_lora
from ooospec.training.sidecar import rows_to_examples
from ooospec.training.slot_rows import build_rows, calls_from_gold

torch.set_num_threads(1)

TOOLS = [{"name": "get_weather", "description": "Get the weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}]


def test_string_body_and_spans():
    assert string_body('"Par') == ("Par", False)
    assert string_body('"Paris"') == ("Paris", True)
    assert string_body('"Paris" ') == ("Paris", True)
    assert string_body('"Paris",') is None  # not one JSON value
    assert string_body('"a\\"b') is None  # escapes are not followed
    assert string_body("null") is None
    text = "weather in Paris?"
    assert keeps_span('"Paris', text) and keeps_span('"Paris"', text)
    assert not keeps_span('"Paris, France"', text)
    assert not keeps_span('""', text)  # an empty string copies nothing
    assert keeps_span("nul", text) and keeps_span("3", text)  # not a string: nothing to check


def test_request_text_holds_contents_and_earlier_arguments():
    request = Request("r", "t", "dev", [
        {"role": "user", "content": "token for alice"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"user": "alice"}}}]},
        {"role": "tool", "content": "tok-123"}], TOOLS, None)
    text = request_text(request)
    assert "token for alice" in text and "tok-123" in text and '"user":"alice"' in text


def copier_on(texts, margin):
    return SpanCopier(texts, "weather in Paris?", [True], CopySettings(margin=margin, top_k=4), lead=" ")


def test_the_copier_closes_the_span_when_greedy_leaves_it_within_the_margin():
    texts = [" ", '"', "Paris", ", France", '"', "<eos>"]
    eos = {5}
    copier = copier_on(texts, margin=3.0)
    for token in (0, 1, 2):  # ' ', '"', 'Paris' are greedy and copying
        logits = torch.full((1, 6), -10.0)
        logits[0, token] = 5.0
        assert copier.choose(logits, [0], eos) == [token]
    logits = torch.full((1, 6), -10.0)
    logits[0, 3], logits[0, 4] = 5.0, 4.0  # greedy ', France' leaves the span; '"' closes it, 1 nat below
    assert copier.choose(logits, [0], eos) == [4]
    assert copier.answers[0] == ' "Paris"' and copier.changed[0]
    logits = torch.full((1, 6), -10.0)
    logits[0, 5] = 5.0
    assert copier.choose(logits, [0], eos) == [5]  # the string is closed: it may end


def test_a_row_the_model_is_sure_of_writes_free_text():
    texts = [" ", '"', "Paris", ", France", '"', "<eos>"]
    copier = copier_on(texts, margin=3.0)
    for token in (0, 1, 2):
        logits = torch.full((1, 6), -10.0)
        logits[0, token] = 5.0
        copier.choose(logits, [0], {5})
    logits = torch.full((1, 6), -10.0)
    logits[0, 3], logits[0, 4] = 5.0, -5.0  # closing is 10 nats below: the model is sure
    assert copier.choose(logits, [0], {5}) == [3]
    assert not copier.copying[0] and not copier.changed[0]


def test_copy_aware_wave_keeps_a_memorized_invented_value_inside_the_request():
    """A tiny model memorized to answer "Paris, France" for a request that says "Paris": plain
    argmax writes the invented value; copy-aware decoding writes a span of the request instead,
    and leaves the integer slot alone."""
    model, tokenizer = tiny_model_and_tokenizer(seed=6)
    reqs = [Request(rid, "test", "train", [{"role": "user", "content": f"weather in {city} for 3 days?"}], TOOLS,
                    [Call("get_weather", {"city": f"{city}, France", "days": 3})])
            for rid, city in (("a", "Paris"), ("b", "Lyon"))]
    examples = rows_to_examples(build_rows(reqs, calls_from_gold(reqs)), tokenizer, tokenizer.eos_token_id)
    cfg = LoraTrainConfig(lr=1e-2, dropout=0.0, epochs=60, step_completion_tokens=1, warmup_frac=0.0)
    train_lora(model.train(), examples, cfg, tokenizer.pad_token_id)
    plain = SlotPredictor(model, tokenizer, max_new_tokens=24)
    copying = SlotPredictor(model, tokenizer, max_new_tokens=24, copy_values=CopySettings(margin=50.0, top_k=len(tokenizer)))
    for req in reqs:
        wave = plain.predict_wave(req)
        invented = wave.call
        assert invented is not None and "city" in invented.arguments, [(r.key.parameter, r.text) for r in wave.rows]
        assert invented is not None and invented.arguments["city"].endswith(", France")
        copied = copying.predict_wave(req).call
        assert copied is not None, req.id
        city = copied.arguments["city"]
        assert isinstance(city, str) and city and city in req.messages[0]["content"], city
        assert copied.arguments["days"] == 3
        assert json.dumps(copied.arguments["days"]) == "3"


def test_an_adapter_whose_prompt_this_service_cannot_render_is_refused_by_name():
    import pytest

    from ooospec.models.adapters import read_frozen
    from ooospec.paths import artifacts_dir
    from ooospec.sidecar.predictor import AdapterPromptMismatch, adapter_prompt
    from ooospec.sidecar.slots import CALLS_DIALOGUE, SlotPromptConfig

    for adapter in sorted((artifacts_dir() / "committed" / "adapters").glob("sidecar-*/adapter")):
        record = read_frozen(adapter)
        assert adapter_prompt(record, adapter).to_dict() == record["prompt"]  # every committed adapter is served
    calls = SlotPromptConfig(dialogue=CALLS_DIALOGUE).to_dict()
    assert adapter_prompt({"prompt": calls, "config": {"prompt": calls}}, "x") == SlotPromptConfig(**calls)
    bad = [({"prompt": {**calls, "max_hints": 3}, "config": {"prompt": {**calls, "max_hints": 3}}}, "does not match"),
           ({"prompt": {**calls, "dialogue": "xml"}, "config": {"prompt": {**calls, "dialogue": "xml"}}}, "does not match"),
           ({"prompt": calls, "config": {"prompt": SlotPromptConfig().to_dict()}}, "differs from its training"),
           ({"config": {}}, "no prompt config")]
    for record, why in bad:
        with pytest.raises(AdapterPromptMismatch, match=f"sidecar adapter some/adapter: .*{why}"):
            adapter_prompt(record, "some/adapter")
