"""Requests at the edges, on tiny models with a small context: a prompt past the target's context is
refused before any forward (every method, the teacher, the sidecar), one that fits but leaves less
than ``max_new_tokens`` decodes with the budget capped (recorded), no forward ever runs past the
context, a slice with such requests among good ones still writes the good ones, and a request
listing one tool name twice is refused at load, naming the file, the record and the name."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ooospec.bench.config import BenchConfig
from ooospec.bench.runner import run_bench
from ooospec.bench.slices import slice_path
from ooospec.data.loading import SourceLoad, check_gold
from ooospec.data.request import DuplicateToolName, Request, check_tool_names, read_requests, write_requests
from ooospec.decoding.base import DecodeContext, Draft, DraftSource, EventTrace
from ooospec.models.context import PromptTooLong, fit_budget, model_context
from ooospec.decoding.loop import Prefill, decode
from ooospec.decoding.tree import TreeBudget
from ooospec.models.tiny import tiny_causal_lm, tiny_model_and_tokenizer, tiny_target
from weather_requests import WEATHER_TOOL, weather_requests

torch.set_num_threads(1)
PROMPT = [3, 17, 42, 5, 9, 33, 8, 21, 60, 2, 11, 47]


class PositionProbe:
    """Forward pre-hook recording every forward and the highest position it feeds."""

    def __init__(self, model: torch.nn.Module):
        self.forwards, self.max_position = 0, -1
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        positions = kwargs.get("position_ids")
        if positions is not None:
            top = int(positions.max())
        else:
            cache = kwargs.get("cache") or kwargs.get("past_key_values")
            top = (cache.get_seq_length() if cache is not None else 0) + ids.shape[-1] - 1
        self.forwards += 1
        self.max_position = max(self.max_position, top)


def _ctx(prompt: list[int]) -> DecodeContext:
    request = Request(id="edge", benchmark="tiny", split="test", messages=[], tools=[], gold=None)
    return DecodeContext(request, _Ids(), None, list(prompt), [], EventTrace())


class _Ids:
    def decode(self, ids, **kwargs):
        return " ".join(map(str, ids))


class Oracle(DraftSource):
    """Offers the whole rest of a reference: a tree as deep as its budget allows."""

    def __init__(self, reference: list[int]):
        self.reference, self.begun = reference, 0

    def begin(self, ctx):
        self.begun += 1

    def propose(self, state):
        return [Draft(self.reference[len(state.output_ids):], "retrieval")]


# ---------------------------------------------------------------- the one check


def test_fit_budget_refuses_caps_or_passes():
    assert fit_budget(100, 20, 128) == 20
    assert fit_budget(100, 28, 128) == 28  # exactly fits
    assert fit_budget(100, 40, 128) == 28  # capped to the room
    assert fit_budget(127, 40, 128) == 1
    assert fit_budget(12000, 160, None) == 160  # a model naming no context: no check
    with pytest.raises(PromptTooLong) as err:
        fit_budget(12000, 160, 8192, "apibank-7")
    assert str(err.value).startswith("request apibank-7: prompt of 12000 tokens does not fit the model's context "
                                     "of 8192 positions")
    assert err.value.reason == "prompt_too_long: 12000 + 160 > 8192"
    with pytest.raises(PromptTooLong):
        fit_budget(128, 1, 128)  # no room for a single token


def test_the_context_is_the_text_configs_positions():
    model = tiny_causal_lm("qwen2")
    assert model_context(model) == 512
    model.config.max_position_embeddings = 64
    assert model_context(model) == 64
    assert model_context(object()) is None


# ---------------------------------------------------------------- the decode loop


def test_a_prompt_past_the_context_is_refused_before_anything_runs():
    model = tiny_causal_lm("llama", seed=1)
    model.config.max_position_embeddings = len(PROMPT)
    probe, source = PositionProbe(model), Oracle([])
    with pytest.raises(PromptTooLong, match=f"request edge: prompt of {len(PROMPT)} tokens .* {len(PROMPT)} positions"):
        decode(tiny_target(model), [source], _ctx(PROMPT), 8)
    # a shared prefill of the same prompt is not used either (it would decode past the context)
    shared = Prefill(state=None, seconds=0.0, margin=None, prompt_ids=list(PROMPT))
    with pytest.raises(PromptTooLong):
        decode(tiny_target(model), [], _ctx(PROMPT), 8, prefill=shared)
    assert probe.forwards == 0 and source.begun == 0  # no prefill, and no source (sidecar) saw it


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_prompt_near_the_context_decodes_the_room_that_is_left(arch):
    model = tiny_causal_lm(arch, seed=1)
    reference = decode(tiny_target(model), [], _ctx(PROMPT), 30).output_ids  # the full context
    context = len(PROMPT) + 7
    model.config.max_position_embeddings = context
    probe = PositionProbe(model)
    ar = decode(tiny_target(model), [], _ctx(PROMPT), 30)
    assert ar.output_ids == reference[:7] and ar.finish == "length"
    record = ar.to_record()
    assert (record["max_new_tokens"], record["capped_from"]) == (7, 30)
    (event,) = ar.trace.of_kind("budget_capped")
    assert (event["max_new_tokens"], event["asked"], event["context"]) == (7, 30, context)
    # a deep tree near the end of the context is cut to the positions that are left
    spec = decode(tiny_target(model), [Oracle(reference)], _ctx(PROMPT), 30, TreeBudget(64, 64))
    assert spec.output_ids == ar.output_ids and spec.capped_from == 30
    assert probe.max_position < context
    # a budget that fits is neither capped nor recorded as capped
    fits = decode(tiny_target(model), [], _ctx(PROMPT), 5)
    assert (fits.max_new_tokens, fits.capped_from) == (5, None) and not fits.trace.of_kind("budget_capped")


# ---------------------------------------------------------------- the bench


def _asking(rid: str, pad: int) -> Request:
    """A weather request whose dialogue is ``pad`` words longer (6 tiny tokens each)."""
    return Request(rid, "apibank", "eval", [{"role": "user", "content": "Weather in Paris? " + "please " * pad}],
                   [WEATHER_TOOL], [{"name": "get_weather", "arguments": {"city": "Paris"}}])


class SmallContextTargets:
    """The tiny Llama target with ``context`` positions; records the highest position it is fed."""

    def __init__(self, context: int):
        self.context, self.probes = context, []

    def fingerprint(self, name: str) -> str:
        return "tinyctx1"

    def load(self, name: str):
        from ooospec.models.formats.llama_json import LlamaJson
        from ooospec.models.target import TargetModel

        model, tokenizer = tiny_model_and_tokenizer(seed=1)
        model.config.max_position_embeddings = self.context
        self.probes.append(PositionProbe(model))
        return TargetModel("tiny", model, tokenizer, LlamaJson(), [tokenizer.eos_token_id], "system_tools_json")


def _prompt_tokens(request: Request) -> int:
    return len(SmallContextTargets(4096).load("tiny").prompt_ids(request))


def test_a_slice_with_a_too_long_and_a_near_request_writes_the_good_ones(artifacts):
    from ooospec.report.tables import main_table

    good = weather_requests("apibank", 2)
    near, long = _asking("apibank-near", 10), _asking("apibank-long", 20)
    context = _prompt_tokens(near) + 3  # room for 3 of the 6 new tokens
    long_tokens = _prompt_tokens(long)
    assert long_tokens > context and max(_prompt_tokens(r) for r in good) + 6 <= context
    files = {"apibank": [good[0], long, near, good[1]]}
    cfg = BenchConfig(targets=["tiny"], benchmarks=["apibank"], methods=["pld", "toolspec", "ooospec"], requests=None,
                      warmup=0, max_new_tokens=6, sidecar="gold", pin_cores=False)
    targets = SmallContextTargets(context)
    records = run_bench(cfg, targets=targets, load_requests=files.__getitem__)

    assert [r["request_id"] for r in records[::4]] == ["apibank-0", "apibank-near", "apibank-1"]
    assert len(records) == 3 * 4 and all(r["identical_to_ar"] for r in records)
    (failed,) = records.failed
    assert (failed["request_id"], failed["position"]) == ("apibank-long", 1)
    assert failed["error"].startswith(f"request apibank-long: prompt of {long_tokens} tokens does not fit "
                                      f"the model's context of {context} positions")
    assert any("apibank-long" in note and "does not fit" in note for note in records.notes())
    path = slice_path(records.stage, "tiny", "tinyctx1", "apibank")
    assert [f["request_id"] for f in json.loads(path.with_suffix(".failed.json").read_text())] == ["apibank-long"]
    assert json.loads(records.stage.path("status.json").read_text())["failed_requests"] == 1
    assert set(main_table(records).failed_requests) == {1}

    for r in records:  # every method decoded the near request with the capped budget, the others in full
        capped = r["request_id"] == "apibank-near"
        assert (r["max_new_tokens"], r["capped_from"]) == ((3, 6) if capped else (6, None))
        assert r["tokens"] <= r["max_new_tokens"]
        assert any(e["kind"] == "budget_capped" for e in r["trace"]) == capped
    assert {r["method"] for r in records if r["request_id"] == "apibank-near"} == {"ar", "pld", "toolspec", "ooospec"}
    (probe,) = targets.probes
    assert 0 <= probe.max_position < context  # the long prompt was never prefilled, nothing ran past the context


def test_warm_up_skips_a_request_that_cannot_be_decoded():
    from ooospec.bench.methods import MethodSpec
    from ooospec.bench.placement import CorePlan
    from ooospec.bench.plan import BenchPlan
    from ooospec.bench.runner import SliceRunner

    class Pool:
        cores = CorePlan(None, None)

        def service(self, spec):
            return None

    long, good = _asking("apibank-long", 20), weather_requests("apibank", 1)[0]
    target = SmallContextTargets(_prompt_tokens(long) - 1).load("tiny")
    cfg = BenchConfig(targets=["tiny"], benchmarks=["apibank"], methods=["toolspec"], max_new_tokens=4, pin_cores=False)
    runner = SliceRunner(cfg, BenchPlan("gold", None, [MethodSpec("toolspec")], {}, []), target, Pool(), None)
    decoded = []
    runner.decode_one = lambda spec, sources, request, *rest: decoded.append(request.id)
    runner.warm_up([long, good])
    assert decoded == [good.id]
    assert "does not fit" in runner.refusal(long) and runner.refusal(good) is None


# ---------------------------------------------------------------- the teacher


@pytest.mark.parametrize("decoder", ["toolspec", "generate"])
def test_the_teacher_records_a_too_long_prompt_and_caps_a_near_one(artifacts, decoder):
    from ooospec.models.formats import get_surface
    from ooospec.models.target import TargetModel
    from ooospec.training.teacher import TeacherSettings, run_teacher

    model, tokenizer = tiny_model_and_tokenizer(seed=1)
    teacher = TargetModel("tiny-teacher", model, tokenizer, get_surface("qwen_fenced_json"),
                          [tokenizer.eos_token_id], prompt_style="system_tools_json")
    requests = [dataclasses.replace(_asking(rid, pad), split="train", source="src")
                for rid, pad in (("short", 0), ("near", 10), ("long", 20), ("short2", 1))]
    lengths = {r.id: len(teacher.prompt_ids(r)) for r in requests}
    context = lengths["near"] + 3
    model.config.max_position_embeddings = context
    probe = PositionProbe(model)
    asked = TeacherSettings(split="train", model_pin="tiny-seed1", max_new_tokens=6, limit=None, batch_size=4,
                            decoder=decoder)
    run = run_teacher(requests, asked, teacher=teacher)
    by_id = {r["id"]: r for r in run.records}
    assert len(by_id) == 4 and run.stage.done
    long = by_id["long"]
    assert (long["call"], long["reason"]) == (None, f"prompt_too_long: {lengths['long']} + 6 > {context}")
    assert (long["raw_text"], long["new_tokens"]) == ("", 0)
    assert by_id["near"]["capped_to"] == 3 and by_id["near"]["new_tokens"] <= 3
    assert "capped_to" not in by_id["short"] and "capped_to" not in by_id["short2"]
    assert 0 <= probe.max_position < context
    assert run.summary["validity_by_source"]["src"]["reasons"].get("prompt_too_long") == 1
    # the refusal survives a rerun that reads the records back (verdicts are re-derived from the text)
    again = run_teacher(requests, asked, teacher=teacher)
    assert again.generated == 0 and {r["id"]: r["reason"] for r in again.records}["long"] == long["reason"]


# ---------------------------------------------------------------- the sidecar


def test_a_sidecar_wave_past_its_context_returns_no_call_and_the_reason():
    from ooospec.sidecar.predictor import SlotPredictor
    from ooospec.sidecar.protocol import MODES

    model, tokenizer = tiny_model_and_tokenizer(seed=5)
    predictor = SlotPredictor(model, tokenizer, max_new_tokens=6, required_values=False)
    short, long = weather_requests("apibank", 1)[0], _asking("apibank-long", 20)
    model.config.max_position_embeddings = len(predictor.prefix_ids(long)) + 2  # the questions do not fit
    probe = PositionProbe(model)
    for mode in MODES:
        wave = predictor.predict(long, mode)
        assert (wave.call, wave.payload, wave.rows, wave.forwards) == (None, None, [], 0)
        assert wave.reason.startswith("prompt_too_long: ") and "(sidecar: prefix " in wave.reason
        assert wave.mode == mode and wave.to_dict()["reason"] == wave.reason
    assert probe.forwards == 0
    assert predictor.predict(short, "wave").forwards > 0 and probe.max_position < model.config.max_position_embeddings


# ---------------------------------------------------------------- tool names


def test_a_request_listing_a_tool_name_twice_is_refused_at_load(tmp_path, artifacts):
    ok, zero = weather_requests("apibank", 1)[0], dataclasses.replace(weather_requests("apibank", 1)[0], id="none",
                                                                         tools=[], gold=None, prompt_hash="")
    twice = dataclasses.replace(ok, id="apibank-dup", tools=[WEATHER_TOOL, {**WEATHER_TOOL, "description": "Other."}],
                                prompt_hash="")
    check_tool_names(ok, "here")
    check_tool_names(zero, "here")  # no tools: decoded as plain text, not refused
    path = tmp_path / "eval_mine.jsonl"
    write_requests(path, [ok, zero, twice])
    with pytest.raises(DuplicateToolName, match=rf"^{path}: record 3: request apibank-dup lists tool 'get_weather' "
                                                r"more than once"):
        list(read_requests(path))

    # the source loaders: an evaluation set fails naming file and record, a training source drops it
    with pytest.raises(DuplicateToolName, match="^eval.json record 7: request apibank-dup lists tool 'get_weather'"):
        check_gold(SourceLoad("mine", "eval"), twice, "eval.json", "7", strict=False)
    train = SourceLoad("mine", "train")
    assert not check_gold(train, twice, "train.json", "7", strict=True)
    (drop,) = train.drops
    assert (drop.file, drop.record, drop.reason) == ("train.json", "7", "duplicate_tool_name")
    assert "'get_weather'" in drop.detail

    # hand-made requests handed to the bench stop the run before any target is loaded
    targets = SmallContextTargets(4096)
    cfg = BenchConfig(targets=["tiny"], benchmarks=["apibank"], methods=["toolspec"], warmup=0, sidecar="gold",
                      pin_cores=False)
    with pytest.raises(DuplicateToolName,
                       match="^benchmark apibank request 1: request apibank-dup lists tool 'get_weather'"):
        run_bench(cfg, targets=targets, load_requests=lambda name: [ok, twice])
    assert targets.probes == []
