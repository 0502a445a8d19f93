"""Teacher tracing end to end on a tiny random model: validity parsing, resume, committed reuse."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ooospec.data.request import Request
from ooospec.models.formats import get_surface
from ooospec.report.training_chapters import validity_table
from ooospec.training.teacher import TeacherSettings, commit_traces, first_valid_call, run_teacher, validity_by_source

TOOLS = [{"name": "get_weather", "description": "Weather now.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
         {"name": "math.add", "description": "Add.",
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]


def _requests(n: int = 5) -> list[Request]:
    return [Request(id=f"r{i}", benchmark="test", split="train", source=f"src{i % 2}",
                    messages=[{"role": "user", "content": "weather in Paris? " * (1 + i % 3) + str(i)}],
                    tools=TOOLS, gold=None) for i in range(n)]


def _run(teacher, requests, on_batch=None, **settings):
    return run_teacher(requests, TeacherSettings(split="train", model_pin="tiny-seed1", max_new_tokens=6, **settings),
                       teacher=teacher, on_batch=on_batch)


def test_first_valid_call_rules():
    request = _requests(1)[0]
    qwen = get_surface("qwen_fenced_json")
    text = 'Sure.\n```json\n{"name": "search", "arguments": {}}\n```\n```json\n{"name": "math.add", "arguments": {"b": 2, "a": 1}}\n```'
    verdict = first_valid_call(text, request, qwen)
    assert verdict.call == {"name": "math.add", "arguments": {"b": 2, "a": 1}}
    assert list(verdict.call["arguments"]) == ["b", "a"]
    assert verdict.reason is None and verdict.calls_parsed == 2 and verdict.syntax == "surface"
    unknown = first_valid_call('{"name": "search", "arguments": {}}', request, qwen)
    assert (unknown.call, unknown.reason) == (None, "unknown_function: search")
    assert first_valid_call("It is sunny in Paris.", request, qwen).reason == "no_call_parsed"
    assert first_valid_call("It is sunny in", request, qwen, stopped_on_eos=False).reason == "no_call_parsed_truncated"


def test_calls_in_apibank_syntax_count_and_are_typed_by_the_schema():
    request = _requests(1)[0]
    qwen = get_surface("qwen_fenced_json")
    text = "API-Request: [math.add(a='1', b='2')]->{'result': 3}"
    verdict = first_valid_call(text, request, qwen)
    assert verdict.call == {"name": "math.add", "arguments": {"a": 1, "b": 2}} and verdict.syntax == "apibank"
    assert first_valid_call("API-Request: [Unknown(x='1')]", request, qwen).reason == "unknown_function: Unknown"
    assert first_valid_call("API-Request: [broken(", request, qwen).reason == "no_call_parsed"


def test_teacher_resumes_after_interruption(tmp_path, monkeypatch, tiny_teacher):
    requests = _requests()
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "once"))
    uninterrupted = _run(tiny_teacher, requests, limit=None, batch_size=1)
    assert uninterrupted.stage.done and len(uninterrupted.records) == 5

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "twice"))

    def interrupt(done: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tiny_teacher, requests, limit=None, batch_size=1, on_batch=interrupt)
    traces = next((tmp_path / "twice" / "teacher").glob("*/traces.jsonl"))
    assert len(traces.read_text().splitlines()) == 2
    with open(traces, "a") as handle:  # a torn line, as a kill mid-write leaves
        handle.write('{"id": "r9", "raw')
    resumed = _run(tiny_teacher, requests, limit=None, batch_size=1)
    assert resumed.generated == 3 and resumed.stage.done
    assert [r["id"] for r in resumed.records] == [r["id"] for r in uninterrupted.records]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(resumed.records) == strip(uninterrupted.records)
    again = _run(tiny_teacher, requests, limit=None, batch_size=1)
    assert again.generated == 0


def test_batched_generation_matches_one_by_one(artifacts, tiny_teacher):
    requests = _requests()
    single = {r["id"]: r["raw_text"] for r in _run(tiny_teacher, requests, limit=None, batch_size=1).records}
    batched = {r["id"]: r["raw_text"] for r in _run(tiny_teacher, requests, limit=None, batch_size=3).records}
    assert single == batched


def test_committed_traces_are_reused_and_checked(artifacts, tiny_teacher):
    requests = _requests()
    first = _run(tiny_teacher, requests, limit=3, batch_size=1)
    config = json.loads(first.stage.path("config.json").read_text())
    committed = commit_traces(first.records, "tiny", config, {"note": "test"})
    run = _run(tiny_teacher, requests, limit=None, batch_size=1)  # another stage key
    assert run.reused == 3 and run.generated == 2
    origins = {r["id"]: r["origin"] for r in run.records}
    assert sorted(o for o in origins.values() if o.startswith("committed")) == ["committed:tiny"] * 3
    changed = run_teacher(requests, TeacherSettings(split="train", model_pin="tiny-seed1", max_new_tokens=5, limit=None,
                                                    batch_size=1), teacher=tiny_teacher)
    assert changed.reused == 0  # other generation settings: nothing reused
    (committed / "traces.jsonl").write_text((committed / "traces.jsonl").read_text().replace('"r', '"x', 1))
    with pytest.raises(ValueError, match="does not match provenance"):
        _run(tiny_teacher, requests, limit=4, batch_size=1)


def test_validity_per_source_counts(tiny_teacher, artifacts):
    records = _run(tiny_teacher, _requests(), limit=None, batch_size=1).records
    table = validity_by_source(records)
    assert sum(row["requests"] for row in table.values()) == 5
    for row in table.values():
        assert row["valid"] + sum(row["reasons"].values()) == row["requests"]
    frame = validity_table(records)
    assert frame.iloc[-1]["source"] == "all" and frame.iloc[-1]["requests"] == 5


def test_a_smaller_run_reuses_a_larger_runs_records(artifacts, tiny_teacher):
    large = _run(tiny_teacher, _requests(), limit=None, batch_size=1)
    small = _run(tiny_teacher, _requests(), limit=2, batch_size=1)
    assert small.generated == 0 and small.reused == 2
    assert {r["origin"] for r in small.records} == {f"stage:{large.stage.key}"}
    fresh = _run(tiny_teacher, _requests(), limit=3, batch_size=1, reuse=False)
    assert fresh.generated == 3


def test_engine_traces_equal_generate_traces(tiny_teacher, artifacts):
    """The default decoder (our engine with ToolSpec drafts) writes exactly HF generate's text."""
    requests = _requests(4)
    engine = _run(tiny_teacher, requests, limit=None).records
    plain = _run(tiny_teacher, requests, limit=None, decoder="generate", batch_size=1).records
    assert [r["raw_text"] for r in engine] == [r["raw_text"] for r in plain]
    assert engine[0]["call"] == plain[0]["call"]


def test_shards_split_the_work_and_complete_one_stage(tiny_teacher, artifacts):
    requests = _requests(5)
    run = TeacherSettings(split="train", model_pin="tiny-seed1", max_new_tokens=5, limit=None, reuse=False)
    first = run_teacher(requests, replace(run, shard=(0, 2)), teacher=tiny_teacher)
    assert first.generated == 3 and not first.stage.done
    second = run_teacher(requests, replace(run, shard=(1, 2)), teacher=tiny_teacher)
    assert second.generated == 2 and second.stage.done
    assert len(second.records) == 5 and {r["id"] for r in second.records} == {r.id for r in requests}


def test_frozen_traces_serve_any_arithmetic_and_are_re_derived_only_on_purpose(artifacts, monkeypatch, tiny_teacher):
    """Committed traces made in bf16 are read by an fp32 run (their arithmetic carried along); a
    request no committed trace holds stops the profile's teacher with one line instead of hours of
    tracing; `rederive` ignores the committed set and traces here, into a stage of its own."""
    from ooospec.stage import FrozenAssetMissing
    from ooospec.training.teacher import committed_dir, committed_records, model_teacher_settings

    requests = _requests()
    first = _run(tiny_teacher, requests, limit=3, batch_size=1)
    config = json.loads(first.stage.path("config.json").read_text())
    config["generation"]["dtype"] = "bfloat16"  # as if traced on a CPU with bf16 kernels
    commit_traces(first.records, "bf16-set", config, {"note": "test"})
    assert json.loads((committed_dir() / "bf16-set" / "provenance.json").read_text())["machine"]["cpu"]
    fp32 = model_teacher_settings(tiny_teacher, "tiny-seed1", 6, 1)
    assert fp32["dtype"] == "float32" and len(committed_records(fp32)) == 3
    assert {r["arithmetic"] for r in committed_records(fp32).values()} == {"bfloat16"}
    run = _run(tiny_teacher, requests, limit=None, batch_size=1)
    assert run.reused == 3 and run.generated == 2
    again = _run(tiny_teacher, requests, limit=None, batch_size=1, rederive=True)
    assert again.stage.dir != run.stage.dir  # earlier local runs in this arithmetic count, the committed set not
    assert not any(r["origin"].startswith("committed") for r in again.records) and len(again.records) == 5
    # a run whose every request is committed needs no teacher at all (make reproduce's 01)
    from ooospec.training import teacher as teacher_module

    with monkeypatch.context() as patched:
        patched.setattr(teacher_module, "profile_teacher_settings", lambda *args, **kwargs: fp32)
        patched.setattr(teacher_module, "profile_teacher", lambda profile: pytest.fail("the teacher was loaded"))
        served = run_teacher(requests[:3], TeacherSettings(split="train", profile="cpu", limit=None, max_new_tokens=6,
                                                           batch_size=1))
    assert served.generated == 0 and len(served.records) == 3
    # the profile's own teacher is never loaded for a request without a committed trace
    other = [Request(id="unseen", benchmark="test", split="train", source="s", tools=TOOLS, gold=None,
                     messages=[{"role": "user", "content": "a request nobody traced"}])]
    with pytest.raises(FrozenAssetMissing, match="1 of 1 requests have no committed trace.*unseen.*make retrace"):
        run_teacher(other, TeacherSettings(split="train", profile="cpu", limit=None))
