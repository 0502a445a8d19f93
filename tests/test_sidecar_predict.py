"""Slot-wave prediction on tiny random models: wave == sequential == no prefix sharing; the stage end to end."""

import pytest
import torch

from ooospec.data.request import Call, Request
from ooospec.sidecar.metrics import score_wave, summarize
from ooospec.sidecar.predictor import ChosenRows, SlotPredictor, encode
from ooospec.sidecar.protocol import MODES
from ooospec.models.tiny import tiny_model_and_tokenizer
from ooospec.training.sidecar import SidecarConfig, rows_to_examples, train_sidecar
from ooospec.sidecar.slots import expand_call, online_questions
from ooospec.training.slot_rows import build_rows, calls_from_gold
from ooospec.training.lora import LoraTrainConfig, train_lora

from tiny_sidecar import TOOLS, request, sharp_predictor

torch.set_num_threads(1)


def test_wave_rows_equal_sequential_rows_on_a_random_model():
    predictor = sharp_predictor()
    req = request(text="weather in Paris, please, in celsius?")
    wave = predictor.predict_wave(req)
    seq = predictor.predict_sequential(req)
    unshared = predictor.predict_wave(req, share_prefix=False)
    texts = [(r.key, r.text, r.truncated) for r in wave.rows]
    assert len(texts) == 4
    assert texts == [(r.key, r.text, r.truncated) for r in seq.rows]
    assert texts == [(r.key, r.text, r.truncated) for r in unshared.rows]
    assert len({t for _, t, _ in texts}) > 1  # not a degenerate constant output
    assert wave.forwards < seq.forwards


def memorized_predictor():
    """A tiny model fully fine-tuned on two requests' rows until it answers them exactly."""
    model, tokenizer = tiny_model_and_tokenizer(seed=6)
    reqs = [request("a", "Paris"), request("b", "Oslo")]
    rows = build_rows(reqs, calls_from_gold(reqs))
    examples = rows_to_examples(rows, tokenizer, tokenizer.eos_token_id)
    cfg = LoraTrainConfig(lr=1e-2, dropout=0.0, epochs=60, step_completion_tokens=1, warmup_frac=0.0)
    train_lora(model.train(), examples, cfg, tokenizer.pad_token_id)  # all weights trainable: memorize
    return SlotPredictor(model, tokenizer, max_new_tokens=12, required_values=False, optional_values=False), reqs


def test_all_modes_join_the_memorized_call():
    predictor, reqs = memorized_predictor()
    for req in reqs:
        results = {mode: predictor.predict(req, mode) for mode in MODES}
        expected = req.gold[0].compact()
        assert {mode: r.payload for mode, r in results.items()} == dict.fromkeys(results, expected)
        assert results["wave"].payload_bytes == len(expected.encode())
        assert len(results["two_waves"].rows) == 3  # index + the chosen function's two arguments
        assert len(results["wave"].rows) == 4
        score = score_wave(req, req.gold[0], results["wave"])
        assert score.function_correct and score.call_exact and score.argument_correct == 3
    summary = summarize(score_wave(r, r.gold[0], predictor.predict_wave(r)) for r in reqs)
    assert summary["whole_call_exact_match"] == 1.0 and summary["null_recall"] == 1.0


def test_scores_count_wrong_values_and_nulls():
    predictor, reqs = memorized_predictor()
    other = Call("get_weather", {"city": "Rome", "unit": "c"})  # the model says Paris and null
    score = score_wave(reqs[0], other, predictor.predict_wave(reqs[0]))
    assert score.function_correct and not score.call_exact
    assert (score.value_rows, score.value_correct) == (2, 0)
    assert (score.null_reference, score.null_predicted, score.null_true_pos) == (1, 2, 1)


def test_sidecar_stage_on_a_tiny_base_trains_freezes_and_reuses(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    splits = {"train": [request(f"t{i}", c) for i, c in enumerate(["Paris", "Oslo", "Rome", "Lima"])],
              "dev": [request("d0", "Bern")]}
    cfg = SidecarConfig(base="tiny", calls="gold", train_requests=3, dev_requests=None, max_new_tokens=4,
                        lora=LoraTrainConfig(lr=1e-3, checkpoint_every=1).to_dict())
    run = train_sidecar(cfg, requests=splits, progress=lambda _: None)
    assert run.reused is None and run.record["row_counts"]["train"]["requests"] == 3
    assert run.record["row_counts"]["train"]["dropped"] == {"beyond subset limit": 1}
    assert run.record["calls_origin"]["train"] == "gold" and run.dev_metrics["requests"] == 1
    assert run.loss_png.exists() and len(run.loss_log) == run.record["train"]["steps"]
    again = train_sidecar(cfg, requests=splits, progress=lambda _: None)
    assert again.reused == "stage" and again.record["sha256"] == run.record["sha256"]


def test_prefix_tokens_are_the_training_prefix():
    model, tokenizer = tiny_model_and_tokenizer(seed=7)
    req = request()
    row = expand_call(req, req.gold[0])[0]
    predictor = SlotPredictor(model, tokenizer, required_values=False)
    assert predictor.prefix_ids(req) == encode(tokenizer, row.prefix)


def test_teacher_calls_where_traced_gold_elsewhere(monkeypatch):
    from ooospec.training import sidecar as training

    reqs = [request("a", "Paris"), request("b", "Oslo"), request("c", "Rome")]
    traces = [{"id": "a", "call": {"name": "get_time", "arguments": {"zone": "CET"}}, "reason": None},
              {"id": "b", "call": None, "reason": "unknown_function: get_tide"}]
    monkeypatch.setattr(training, "teacher_traces", lambda requests, profile, limit=None: (traces, "2 test traces"))
    mixed, label = training.select_calls(reqs, "train", SidecarConfig(calls="teacher+gold"))
    assert [(k.request_id, k.origin, k.call.name) for k in mixed.kept] == [("a", "teacher", "get_time"),
                                                                           ("c", "gold", "get_weather")]
    assert dict(mixed.dropped) == {"teacher: unknown_function": 1} and "gold for the 1 untraced" in label
    only, _ = training.select_calls(reqs, "train", SidecarConfig(calls="teacher"))
    assert [k.request_id for k in only.kept] == ["a"] and only.dropped["not traced"] == 1
    first = training.subset(mixed, 1, seed=0)
    assert [k.origin for k in first.kept] == ["teacher"] and first.dropped["beyond subset limit"] == 1
    monkeypatch.setattr(training, "teacher_traces", lambda requests, profile, limit=None: None)
    fallback, label = training.select_calls(reqs, "train", SidecarConfig(calls="teacher+gold"))
    assert len(fallback.kept) == 3 and label.startswith("gold (fallback")


def test_teacher_traces_are_limited_to_the_first_requests_of_the_trace_order(monkeypatch):
    """A preset's labels stay fixed when further trace chunks are committed: only the first N
    requests of the trace order (the order the chunks follow) may carry a teacher call."""
    from ooospec.training import sidecar as training
    from ooospec.training import teacher

    reqs = [request(rid, city) for rid, city in (("a", "Paris"), ("b", "Oslo"), ("c", "Rome"), ("d", "Lima"))]
    committed = {(r.id, r.prompt_hash): {"id": r.id, "call": None, "reason": "no_call_parsed", "origin": "committed:x"}
                 for r in reqs}
    monkeypatch.setattr(teacher, "committed_records", lambda settings: committed)
    monkeypatch.setattr(teacher, "profile_teacher_settings", lambda *args, **kwargs: {})
    order = [r.id for r in teacher.subset(reqs, None)]
    for limit in (1, 3):
        records, label = training.teacher_traces(reqs, "cpu", limit)
        assert sorted(r["id"] for r in records) == sorted(order[:limit]) and label.startswith(f"{limit} committed")
    assert len(training.teacher_traces(reqs, "cpu", None)[0]) == 4
    # the option is left out of the key at the traces every earlier adapter was trained with
    assert "teacher_requests" not in SidecarConfig().key_config()
    assert SidecarConfig(teacher_requests=None).key() != SidecarConfig().key()
    # and an adapter on other traces is committed beside, never over, the existing ones
    assert SidecarConfig().committed_name == "sidecar-cpu-kall"
    assert SidecarConfig(teacher_requests=None).committed_name == "sidecar-cpu-kall-tracesall"


def test_required_slots_are_never_answered_null():
    """A sidecar memorized to answer null everywhere (the null collapse) still fills a parameter the
    schema marks required when `required_values` is on; optional and other functions' rows stay null."""
    model, tokenizer = tiny_model_and_tokenizer(seed=7)
    reqs = [Request(rid, "test", "train", [{"role": "user", "content": f"weather in {city}?"}], TOOLS,
                    [Call("get_weather", {})]) for rid, city in (("a", "Paris"), ("b", "Oslo"))]
    examples = rows_to_examples(build_rows(reqs, calls_from_gold(reqs)), tokenizer, tokenizer.eos_token_id)
    cfg = LoraTrainConfig(lr=1e-2, dropout=0.0, epochs=60, step_completion_tokens=1, warmup_frac=0.0)
    train_lora(model.train(), examples, cfg, tokenizer.pad_token_id)
    raw = SlotPredictor(model, tokenizer, max_new_tokens=6, required_values=False)
    filled = SlotPredictor(model, tokenizer, max_new_tokens=6, optional_values=False)
    for req in reqs:
        answers = {(r.key.function, r.key.parameter): r.text.strip() for r in raw.predict_wave(req).rows}
        assert answers[("get_weather", "city")] == "null"  # the collapse, memorized
        for mode in ("wave", "sequential", "two_waves"):
            rows = {(r.key.function, r.key.parameter): r.text.strip() for r in filled.predict(req, mode).rows}
            assert not rows[("get_weather", "city")].startswith("null"), (mode, rows)
            assert rows[("get_weather", "unit")] == "null"
            if mode != "two_waves":
                assert rows[("get_time", "zone")] == "null"
    # ``optional_values``: no parameter's row may answer null, optional ones and other functions' included
    every = SlotPredictor(model, tokenizer, max_new_tokens=6, optional_values=True)
    rows = {(r.key.function, r.key.parameter): r.text.strip() for r in every.predict_wave(reqs[0]).rows}
    params = {k: v for k, v in rows.items() if k[0] is not None and k[1] is not None}
    assert params and not any(v.startswith("null") for v in params.values()), params


def test_init_from_starts_at_a_committed_adapter_pinned_by_its_hash(tmp_path, monkeypatch):
    import shutil

    from ooospec.training.sidecar import load_lora_weights, start_adapter
    from ooospec.training.lora import attach_lora

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    splits = {"train": [request(f"t{i}", c) for i, c in enumerate(["Paris", "Oslo", "Rome"])],
              "dev": [request("d0", "Bern")]}
    lora = LoraTrainConfig(lr=1e-2, checkpoint_every=1).to_dict()
    first = train_sidecar(SidecarConfig(base="tiny", calls="gold", train_requests=3, dev_requests=None, max_new_tokens=4,
                                        lora=lora), requests=splits, progress=lambda _: None)
    committed = tmp_path / "committed" / "adapters" / "first" / "adapter"
    shutil.copytree(first.adapter_dir, committed)
    sha = first.record["sha256"]

    # the start's LoRA weights are loaded exactly into a fresh LoRA of the same shape
    model, _ = tiny_model_and_tokenizer(seed=0)
    model = attach_lora(model, LoraTrainConfig(**lora))
    load_lora_weights(model, start_adapter(f"first@{sha[:12]}").adapter_dir, LoraTrainConfig(**lora))
    from safetensors.torch import load_file
    saved = load_file(str(committed / "adapter_model.safetensors"))
    params = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert saved and all(any(torch.equal(v, p) for n, p in params.items() if n.startswith(k.rsplit(".weight", 1)[0]))
                         for k, v in saved.items())

    second = train_sidecar(SidecarConfig(base="tiny", calls="gold", train_requests=3, dev_requests=None, max_new_tokens=4,
                                         lora=lora, init_from=f"first@{sha[:12]}"), requests=splits, progress=lambda _: None)
    assert second.record["started_from"]["sha256"] == sha and second.record["sha256"] != sha
    assert second.record["name"].endswith("-pass2")
    with pytest.raises(ValueError, match="has sha256"):
        start_adapter("first@000000000000")
    (committed / "adapter_model.safetensors").write_bytes(b"changed")
    with pytest.raises(ValueError, match="changed since freezing"):
        start_adapter(f"first@{sha[:12]}")


def _blocked(ban, ids: list[int]) -> bool:
    """Whether `NullBan` stops this token sequence somewhere while the answer is blank."""
    blank = True
    for token in ids:
        if blank and bool(ban.starts_null[token]):
            return True
        blank = blank and bool(ban.blank[token])
    return False


def test_null_ban_blocks_every_spelling_of_null_and_nothing_else():
    """The tiny tokenizer spells null several ways (" " + "nu" + "l" + "l", "nu" + "l" + "l",
    "n" + "u" + ...): the ban stops each of them, whichever token comes first, and lets every
    non-null JSON answer through."""
    from ooospec.models.tiny import tiny_tokenizer
    from ooospec.sidecar.predictor import NullBan

    tokenizer = tiny_tokenizer()
    ban = NullBan(tokenizer, len(tokenizer))
    by_char = lambda text: [i for ch in text for i in tokenizer(ch, add_special_tokens=False).input_ids]  # noqa: E731
    spellings = {tuple(tokenizer(text, add_special_tokens=False).input_ids) for text in (" null", "null", "\nnull")}
    spellings |= {tuple(by_char(" null")), tuple(by_char("null"))}
    assert len(spellings) >= 3 and all(tokenizer.decode(list(s)).strip() == "null" for s in spellings)
    assert all(_blocked(ban, list(s)) for s in spellings)
    for answer in (' "nyc"', " 12", ' "n"', " true", " false", ' {"n":1}', " []"):
        assert not _blocked(ban, tokenizer(answer, add_special_tokens=False).input_ids), answer
    # exhaustively over two-token openings: whatever passes the ban never starts with n
    vocab = range(len(tokenizer))
    for first in vocab:
        if _blocked(ban, [first]):
            continue
        for second in vocab:
            if not _blocked(ban, [first, second]):
                assert not tokenizer.decode([first, second]).lstrip().startswith("n"), (first, second)


def test_a_frozen_adapter_is_never_retrained_as_a_side_effect(tmp_path, monkeypatch):
    """The committed preset adapters are frozen assets: a changed config under a committed name, or
    a missing committed adapter, stops with one line naming it; training it is a choice."""
    from dataclasses import replace

    from ooospec.stage import FrozenAssetMissing
    from ooospec.training.sidecar import sidecar_config
    from ooospec.training.tool_lora import PRESETS as TOOL_PRESETS, train_tool_lora

    changed = replace(sidecar_config("full"), max_prefix_tokens=641)  # same committed name, another key
    with pytest.raises(FrozenAssetMissing, match=r"sidecar-cpu-kall-pass2/adapter is frozen with config key \w+, "
                                                 rf"this config's key is {changed.key()}.*retrain True"):
        train_sidecar(changed)
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))  # a clone without the committed adapters
    with pytest.raises(FrozenAssetMissing, match="preset 'full' is a frozen asset .* is missing"):
        train_sidecar(sidecar_config("full"))
    with pytest.raises(FrozenAssetMissing, match="tool lora: the full preset's adapter is a frozen asset"):
        train_tool_lora(TOOL_PRESETS["full"])


def test_required_values_has_one_default_the_served_one():
    """Every hop from the bench to the predictor takes the same default (the runtime's setting)."""
    import inspect

    from ooospec.sidecar.predictor import REQUIRED_VALUES, SlotWavePredictor
    from ooospec.sidecar.specs import slot_sidecar

    assert REQUIRED_VALUES is True
    for hop in (SlotPredictor.__init__, SlotPredictor.from_frozen, SlotWavePredictor.__init__, slot_sidecar):
        assert inspect.signature(hop).parameters["required_values"].default is REQUIRED_VALUES, hop
    from ooospec.sidecar.predictor import OPTIONAL_VALUES

    assert OPTIONAL_VALUES is True  # chosen on the API-disjoint dev
    for hop in (SlotPredictor.__init__, SlotPredictor.from_frozen, SlotWavePredictor.__init__, slot_sidecar):
        assert inspect.signature(hop).parameters["optional_values"].default is OPTIONAL_VALUES, hop
    # the nullable ablation serves the raw answers: optional slots may be null as well
    assert slot_sidecar("a", required_values=False).options["optional_values"] is False


def test_a_calls_prompt_adapter_trains_in_sessions_and_is_served_with_its_own_prompt(tmp_path, monkeypatch):
    """The prompt that shows earlier calls goes through the stage like any other: a session that
    stops early returns None and the next resumes; the frozen record carries the prompt, and the
    served predictor rebuilds exactly the training prefix (earlier call included)."""
    from dataclasses import asdict

    from ooospec.sidecar.slots import SlotPromptConfig, request_prefix

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))

    def with_history(rid, city):
        req = request(rid, city)
        req.messages = [{"role": "user", "content": f"weather in {city}, and the time there?"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"type": "function", "function": {"name": "get_time", "arguments": {"zone": "CET"}}}]},
                        {"role": "tool", "name": "get_time", "content": "10:00"}]
        return req

    splits = {"train": [with_history(f"t{i}", c) for i, c in enumerate(["Paris", "Oslo", "Rome"])],
              "dev": [with_history("d0", "Bern")]}
    prompt = SlotPromptConfig(dialogue="calls")
    cfg = SidecarConfig(base="tiny", calls="gold", train_requests=3, dev_requests=None, max_new_tokens=4,
                        prompt=prompt.to_dict(),
                        lora=LoraTrainConfig(lr=1e-3, checkpoint_every=1, step_completion_tokens=8).to_dict())
    assert train_sidecar(cfg, requests=splits, progress=lambda _: None, stop_after=1) is None
    run = train_sidecar(cfg, requests=splits, progress=lambda _: None)
    assert run.reused is None and run.record["train"]["steps"] == run.record["train"]["planned_steps"] > 1
    sessions = run.record["training_sessions"]  # which steps each session trained, and where
    assert [s["steps"] for s in sessions] == ["1-1", f"2-{run.record['train']['steps']}"]
    assert all(s["machine"] == sessions[0]["machine"] and s["train_s"] >= 0 for s in sessions)
    assert run.record["prompt"] == prompt.to_dict() and run.record["config"] == asdict(cfg)
    served = SlotPredictor(*tiny_model_and_tokenizer(seed=0), SlotPromptConfig(**run.record["prompt"]),
                           required_values=False)
    prefix = request_prefix(splits["dev"][0], prompt)
    assert 'assistant call: {"name":"get_time","arguments":{"zone":"CET"}}' in prefix
    assert served.prefix_ids(splits["dev"][0]) == encode(served.tokenizer, prefix)


def test_a_larger_base_is_trained_on_and_served_with_the_model_its_record_names(tmp_path, monkeypatch):
    """The size ablation's base is any model of the profile: the stage loads it by name, the frozen
    record keeps the name, and the served predictor loads that model again (an adapter fits only the
    base it was trained on); records from before the option load the profile's sidecar_base, and a
    base the profile lacks is refused naming the adapter, before any weight is loaded."""
    import json

    import ooospec.models.loading as loading
    from ooospec.sidecar.predictor import AdapterBaseMissing, adapter_base

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    loaded: list[str] = []

    def fake_load_model(name, profile="cpu", *, num_layers=None, dtype=None):  # no weights: a tiny model
        loaded.append(name)
        return tiny_model_and_tokenizer(seed=0)

    monkeypatch.setattr(loading, "load_model", fake_load_model)
    larger = "qwen2.5-coder-0.5b-instruct"  # a model of the cpu profile
    splits = {"train": [request(f"t{i}", c) for i, c in enumerate(["Paris", "Oslo"])], "dev": [request("d0", "Bern")]}
    cfg = SidecarConfig(base=larger, calls="gold", train_requests=2, dev_requests=None, max_new_tokens=4,
                        lora=LoraTrainConfig(lr=1e-3).to_dict())
    assert cfg.committed_name.endswith(f"-base-{larger}")
    assert SidecarConfig().committed_name == "sidecar-cpu-kall" and "base" in SidecarConfig().key_config()
    run = train_sidecar(cfg, requests=splits, progress=lambda _: None)
    assert loaded == [larger] and run.record["config"]["base"] == larger and run.record["base"]["model"] == larger
    SlotPredictor.from_frozen(run.adapter_dir, packed=False)
    assert loaded == [larger, larger]
    assert adapter_base({"config": {"lora": {}}}) == "profile" and adapter_base({}) == "profile"
    from ooospec.sidecar.base_model import load_sidecar_base

    load_sidecar_base("cpu", None)
    assert loaded[-1] == "sidecar_base"
    record_file = run.adapter_dir / "FROZEN.json"
    record = json.loads(record_file.read_text())
    record["config"]["base"] = "no-such-model"
    record_file.write_text(json.dumps(record))
    with pytest.raises(AdapterBaseMissing, match=f"{run.adapter_dir}: trained on base 'no-such-model'"):
        SlotPredictor.from_frozen(run.adapter_dir, packed=False)
    assert len(loaded) == 3  # refused before loading


def test_the_head_reads_gathered_or_sliced_last_positions_alike_and_every_forward_is_timed():
    predictor = sharp_predictor()
    req = request(text="weather in Paris, please, in celsius?")
    gathered = predictor.predict_wave(req)
    predictor.gathered_head = False
    sliced = predictor.predict_wave(req)
    assert [(r.text, r.truncated, r.done_after) for r in gathered.rows] == \
        [(r.text, r.truncated, r.done_after) for r in sliced.rows]
    assert gathered.payload == sliced.payload
    for wave in (gathered, predictor.predict_sequential(req), predictor.predict_two_waves(req)):
        assert len(wave.timeline) == wave.forwards  # one record per forward
        assert wave.timeline[0].kind == "prefix" and wave.timeline[0].tokens == wave.prefix_tokens
        assert all(f.seconds >= 0 for f in wave.timeline)
        assert all(1 <= r.done_after <= wave.forwards for r in wave.rows)
    kinds = [f.kind for f in gathered.timeline]
    assert kinds[:2] == ["prefix", "rows"] and set(kinds[2:]) <= {"step"}
    assert gathered.timeline[1].rows == len(gathered.rows)
    # the batch shrinks as rows finish: forward f (1-based) holds exactly the rows not final before it
    for f in range(3, gathered.forwards + 1):
        assert gathered.timeline[f - 1].rows == sum(r.done_after >= f for r in gathered.rows)
    assert max(r.done_after for r in gathered.rows) == gathered.forwards
    back = type(gathered).from_dict(gathered.to_dict())
    assert back.timeline == gathered.timeline and [r.done_after for r in back.rows] == [r.done_after for r in gathered.rows]


class NamesTheFirstTool(ChosenRows):
    """Stands for a function row that named the first tool, whatever it wrote."""

    def chosen(self, answer):
        return self.names[0]


def early_ending_rows():
    """The sharp tiny sidecar's rows of one request, answers as token ids, and the function row's
    second token made the end token (the random model never ends a row otherwise): (predictor,
    prefix, keys, questions, the rows' generation)."""
    predictor = sharp_predictor()
    req = request(text="weather in Paris, please, in celsius?")
    prefix = predictor.prefix_ids(req)
    keys, questions = zip(*online_questions(req))
    encoded = [encode(predictor.tokenizer, q) for q in questions]
    predictor._decode = lambda ids: list(ids)
    predictor.eos = {predictor.generate_rows(prefix, encoded).texts[0][1]}
    return predictor, req, prefix, keys, encoded, predictor.generate_rows(prefix, encoded)


def test_a_chosen_wave_cuts_the_other_functions_rows_when_the_function_row_answers():
    predictor, req, prefix, keys, encoded, full = early_ending_rows()
    rows = NamesTheFirstTool([k.function for k in keys], [t["name"] for t in req.tools])
    cut = predictor.generate_rows(prefix, encoded, chosen_rows=rows)
    answered, stopped = full.done_after[rows.function_row], False
    assert cut.done_after[rows.function_row] == answered and cut.texts[0] == full.texts[0]
    for i, key in enumerate(keys):
        if key.function == "get_weather":  # the chosen function's rows: as in the whole wave
            assert (cut.texts[i], cut.truncated[i], cut.done_after[i]) == \
                (full.texts[i], full.truncated[i], full.done_after[i])
        elif key.function is not None and full.done_after[i] > answered:  # still running: cut there
            assert cut.truncated[i] and cut.done_after[i] == answered
            assert full.texts[i][:len(cut.texts[i])] == cut.texts[i]
            stopped = True
    assert stopped, "nothing was cut: the test does not exercise the cut"
    assert cut.forwards <= full.forwards and len(cut.timeline) == cut.forwards
    assert cut.forwards == max(cut.done_after)


def test_the_rows_a_function_answer_stops_are_the_other_functions():
    def after(answer, finished):
        rows = ChosenRows([None, "a", "a", "b", "c"], ["a", "b", "c"])
        return rows.after_step(finished, lambda row: answer)

    assert after(" 1", [True] + [False] * 4) == {1, 2, 4} and after("0", [True] + [False] * 4) == {3, 4}
    assert after("0", [True, False, False, True, False]) == {4}  # a finished row is not stopped
    assert after("7", [True] + [False] * 4) == set() and after("x", [True] + [False] * 4) == set()
    assert after("0", [False] * 5) == set()  # the function row has not answered yet


def test_the_chosen_call_is_announced_once_when_its_rows_are_final_and_others_still_run():
    heard = []
    rows = ChosenRows([None, "a", "b"], ["a", "b"], cut=False, on_complete=heard.append)
    answers = {0: "0", 1: '"x"', 2: '"y'}.get
    assert rows.after_step([True, False, False], answers) == set() and heard == []  # a's row still runs
    assert rows.after_step([True, True, False], answers) == set()
    assert heard == [{0: "0", 1: '"x"'}]
    rows.after_step([True, True, True], answers)
    assert len(heard) == 1  # once
    last = ChosenRows([None, "a", "b"], ["a", "b"], cut=False, on_complete=heard.append)
    last.after_step([True, True, True], answers)  # everything final at once: the wave's own end says it
    assert len(heard) == 1


def test_the_chosen_wave_serves_the_chosen_call_alone():
    predictor, reqs = memorized_predictor()
    for req in reqs:
        wave, chosen = predictor.predict(req, "wave"), predictor.predict(req, "chosen_wave")
        assert chosen.mode == "chosen_wave" and chosen.call == wave.call
        assert chosen.payload == wave.call.compact() and chosen.forwards <= wave.forwards


class NamesNoRowsTool(ChosenRows):
    """Stands for a function row that named a tool with no parameters: its call is complete at once."""

    def chosen(self, answer):
        return "a tool without parameters"


def test_a_progressive_wave_announces_the_chosen_call_while_other_rows_run_and_ends_as_the_wave():
    predictor, req, prefix, keys, encoded, full = early_ending_rows()
    heard = []
    rows = NamesNoRowsTool([k.function for k in keys], [t["name"] for t in req.tools], cut=False,
                           on_complete=heard.append)
    progressive = predictor.generate_rows(prefix, encoded, chosen_rows=rows)
    assert heard == [{0: full.texts[0]}]  # the function row's answer, once, while the others ran on
    assert (progressive.texts, progressive.done_after, progressive.forwards) == \
        (full.texts, full.done_after, full.forwards)  # nothing stopped


def test_the_progressive_mode_ends_with_the_whole_waves_payload():
    predictor, reqs = memorized_predictor()
    for req in reqs:
        heard = []
        wave, progressive = predictor.predict(req, "wave"), predictor.predict(req, "progressive_wave", early=heard.append)
        assert progressive.mode == "progressive_wave" and progressive.payload == wave.payload
        assert all(first.payload == wave.call.compact() for first in heard)  # the chosen call, if sent first


class KnownDrafter:
    """Proposes each row's own greedy continuation (read off a run without drafts), or, ``wrong``,
    tokens greedy decoding never writes there: every draft accepted, or none."""

    def __init__(self, answers, wrong=False):
        self.answers, self.wrong = answers, wrong

    def propose(self, written, room):
        for answer in self.answers:
            if answer[:len(written)] == written:
                rest = answer[len(written):][:min(room, 3)]
                return [(t + 1) % 50 for t in rest] if self.wrong else rest
        return []


def test_span_drafts_keep_every_rows_greedy_answer_in_fewer_forwards():
    predictor = sharp_predictor()
    predictor.max_new_tokens = 12
    req = request(text="weather in Paris, please, in celsius?")
    prefix = predictor.prefix_ids(req)
    encoded = [encode(predictor.tokenizer, q) for _, q in online_questions(req)]
    predictor._decode = lambda ids: list(ids)  # answers as token ids
    plain = predictor.generate_rows(prefix, encoded)
    right = predictor.generate_rows(prefix, encoded, drafter=KnownDrafter(plain.texts))
    wrong = predictor.generate_rows(prefix, encoded, drafter=KnownDrafter(plain.texts, wrong=True))
    for drafted in (right, wrong):
        assert (drafted.texts, drafted.truncated) == (plain.texts, plain.truncated)
        assert len(drafted.timeline) == drafted.forwards and max(drafted.done_after) == drafted.forwards
    assert all(len(t) == 12 for t in plain.texts)  # every row ran to the limit, and no further
    assert right.forwards < plain.forwards and wrong.forwards == plain.forwards
    assert any(f.tokens > 1 for f in right.timeline if f.kind == "step")


def test_a_span_drafter_proposes_what_follows_the_rows_end_in_the_request():
    from ooospec.sidecar.span_drafts import SpanDrafter, SpanDraftSettings

    source = [5, 6, 7, 8, 9, 6, 7, 1, 2, 3]
    drafter = SpanDrafter(source, SpanDraftSettings(max_ngram=2, max_tokens=3), stop={2})
    assert drafter.propose([4, 6, 7], room=10) == [1]  # the last "6 7" is followed by 1, then the stop token
    assert drafter.propose([9, 8], room=10) == [9, 6, 7]  # "9 8" is nowhere: "8" is, followed by 9 6 7 ...
    assert drafter.propose([8], room=2) == [9, 6] and drafter.propose([8], room=0) == []
    assert drafter.propose([42], room=5) == [] and drafter.propose([], room=5) == []
