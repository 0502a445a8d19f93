"""The API-disjoint dev split and the distractor tools of training prompts."""

import random

import pytest

from ooospec.data.api_disjoint import NotDisjoint, api_disjoint_split, check_disjoint, function_names
from ooospec.data.request import Call, Request
from ooospec.training.distractors import NoToolPool, tool_pool, with_distractors


def tool(name):
    return {"name": name, "description": f"does {name}",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}


def req(rid, names, source="src", split="train"):
    tools = [tool(n) for n in names]
    return Request(f"{source}-{rid}", source, split, [{"role": "user", "content": f"please {rid}"}], tools,
                   [Call(names[0], {"x": "a"})])


def pool_of(n=300, seed=0):
    """Requests over a shared name pool, as Seal-Tools and API-Bank look: names recur across requests."""
    rng = random.Random(seed)
    names = [f"api_{i}" for i in range(120)]
    out = []
    for i in range(n):
        source = ("alpha", "beta", "gamma")[i % 3]
        out.append(req(i, rng.sample(names, rng.randint(1, 5)), source, "dev" if i % 10 == 0 else "train"))
    out.append(req("proto", ["ToolSearcher"], "alpha"))  # protocol tools only: no names, never placed
    return out


def test_no_dev_function_occurs_in_train_and_every_pool_request_is_placed_once():
    requests = pool_of()
    split = api_disjoint_split([r for r in requests if r.split == "train"], [r for r in requests if r.split == "dev"],
                               dev_requests=40, max_per_source=20)
    train_names = {n for r in split.train for n in function_names(r)}
    assert split.dev and split.train
    assert not any(function_names(r) & train_names for r in split.dev)
    ids = [r.id for r in split.train + split.dev + split.dropped]
    assert len(ids) == len(set(ids)) == len(requests) - 1
    assert {r.id.split("-")[0] for r in split.dev} == {"alpha", "beta", "gamma"}  # every source has a share
    counts = split.counts()
    assert counts["dev"]["requests"] == len(split.dev)
    assert sum(counts["dev"]["by_source"].values()) == len(split.dev)


def test_the_split_is_deterministic_and_salted():
    requests = pool_of()
    train, dev = [r for r in requests if r.split == "train"], [r for r in requests if r.split == "dev"]
    first = api_disjoint_split(train, dev, dev_requests=40)
    again = api_disjoint_split(list(reversed(train)), dev, dev_requests=40)
    assert sorted(r.id for r in first.dev) == sorted(r.id for r in again.dev)
    other = api_disjoint_split(train, dev, dev_requests=40, salt="another")
    assert sorted(r.id for r in first.dev) != sorted(r.id for r in other.dev)


def test_a_shared_name_is_named_with_both_requests():
    a, b = req("a", ["Get.Weather"]), req("b", ["get_weather", "other"])
    with pytest.raises(NotDisjoint, match=r"dev request src-b offers 'get_weather', also offered by training request src-a"):
        check_disjoint([a], [b])


def test_distractors_come_from_the_pool_keep_the_label_and_fit():
    requests = pool_of(60)
    pool = tool_pool(requests)
    counts = []
    for request in requests[:-1]:
        out = with_distractors(request, pool, max_tools=9)
        names = [t["name"] for t in out.tools]
        assert len(names) == len(set(names)) and set(t["name"] for t in request.tools) <= set(names)
        assert len(out.tools) <= max(9, len(request.tools))
        assert out.gold == request.gold and out.id == request.id and out.prompt_hash == request.prompt_hash
        assert out.tools == with_distractors(request, pool, max_tools=9).tools  # seeded by the request
        counts.append(len(out.tools))
    assert max(counts) >= 8 and min(counts) <= 2
    short = with_distractors(requests[0], pool, max_tools=9, fits=lambda r: len(r.tools) <= 3)
    assert len(short.tools) <= max(3, len(requests[0].tools))


def test_a_source_without_tools_is_refused_by_name():
    requests = pool_of(6) + [req("p", ["ToolSearcher"], "lonely")]
    with pytest.raises(NoToolPool, match="training source 'lonely' has no tool"):
        tool_pool(requests)


def test_a_distractor_config_trains_on_more_tools_than_the_requests_offer(tmp_path, monkeypatch):
    from ooospec.training.lora import LoraTrainConfig
    from ooospec.training.sidecar import SidecarConfig, train_sidecar

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    requests = pool_of(60)
    splits = {"train": [r for r in requests[:-1] if len(r.tools) <= 2][:4], "dev": [requests[1]]}
    cfg = SidecarConfig(base="tiny", calls="gold", train_requests=4, dev_requests=None, max_new_tokens=4,
                        distractors=6, max_prefix_tokens=100_000,
                        lora=LoraTrainConfig(lr=1e-3, checkpoint_every=1).to_dict())
    assert cfg.committed_name.endswith("-d6") and "distractors" in cfg.key_config()
    assert "distractors" not in SidecarConfig().key_config() and "dev_split" not in SidecarConfig().key_config()
    run = train_sidecar(cfg, requests=splits, progress=lambda _: None)
    tools = run.record["row_counts"]["train"]["tools_per_prompt"]
    assert sum(tools.values()) == 4 and max(int(n) for n in tools) > 2  # every request offered one or two
    with pytest.raises(ValueError, match="dev_split"):
        SidecarConfig(dev_split="random")


def test_the_committed_table_reads_scores_and_splits_unseen_requests(tmp_path, monkeypatch):
    import json

    from ooospec.training.disjoint_dev import committed_dir, committed_table

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    out = committed_dir()
    out.mkdir(parents=True)
    score = {"request_id": "", "function_correct": True, "argument_rows": 2, "argument_correct": 2, "value_rows": 1,
             "value_correct": 1, "null_true_pos": 1, "null_predicted": 1, "null_reference": 1, "call_exact": True,
             "invalid_answers": 0, "latency_s": 1.0, "payload_bytes": 20, "rows": 3}
    call = {"name": "f", "arguments": {"a": 1}}
    # r0, r2 and r4 are exact as the sidecar can express the call; at r4 the target also wrote an
    # argument its tool's schema lacks, so the call as written differs
    waves = [{"request_id": f"r{i}", "seen_in_training": i < 2, "payload": json.dumps([call]),
              "reference": call if i < 4 else {"name": "f", "arguments": {"a": 1, "extra": "x"}},
              "score": {**score, "request_id": f"r{i}", "call_exact": i % 2 == 0, "latency_s": float(i)}}
             for i in range(5)]
    (out / "a--served.jsonl").write_text("".join(json.dumps(w) + "\n" for w in waves))
    (out / "a--served.json").write_text(json.dumps({"adapter": "a", "label": "served",
                                                     "machine": {"cpu_capability": "AVX2", "cpu": "test cpu"}}))
    row = committed_table().iloc[0]
    assert (row["requests"], row["unseen requests"]) == (5, 3)
    assert row["whole call"] == 0.6 and row["whole call (unseen)"] == round(2 / 3, 4)
    assert row["as written"] == 0.4
    assert row["median wave s"] == 2.0 and row["machine"] == "AVX2, test cpu"
    (out / "a--served.json").write_text(json.dumps({"adapter": "a", "label": "served", "machine": {
        "cpu_capability": "AVX512", "cpu": "Intel(R) Xeon(R) Processor", "bf16_flag": "avx512_bf16"}}))
    assert committed_table().iloc[0]["machine"] == "AVX512 (avx512_bf16), Intel Xeon"


def test_a_score_from_another_machine_is_committed_beside_never_over(tmp_path):
    import json

    from ooospec.training.disjoint_dev import committed_name

    xeon = {"cpu": "Intel Xeon", "cpu_capability": "AVX512", "bf16_kernels": True, "bf16_flag": "none"}
    epyc = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "bf16_kernels": False, "bf16_flag": "none"}
    native = {**xeon, "bf16_flag": "avx512_bf16"}  # the same model name, bf16 in hardware
    assert committed_name(tmp_path, "a--served+fill", epyc) == "a--served+fill"  # nothing committed yet
    (tmp_path / "a--served+fill.json").write_text(json.dumps({"machine": xeon}))
    assert committed_name(tmp_path, "a--served+fill", xeon) == "a--served+fill"  # the same machine: its own file
    assert committed_name(tmp_path, "a--served+fill", epyc) == "a--served+fill--avx2"
    assert committed_name(tmp_path, "a--served+fill", native) == "a--served+fill--avx512_bf16"
    unrecorded = {k: v for k, v in xeon.items() if k != "bf16_flag"}  # written before the flag was recorded
    (tmp_path / "a--served+fill.json").write_text(json.dumps({"machine": unrecorded}))
    assert committed_name(tmp_path, "a--served+fill", xeon) == "a--served+fill--avx512"


def test_seen_in_training_is_drawn_from_the_adapters_own_training_side(monkeypatch):
    """An adapter trained on the API-disjoint training side saw those requests, not the hash split's."""
    import pytest

    from ooospec.training import disjoint_dev
    from dataclasses import asdict

    from ooospec.training.sidecar import PRESETS

    asked = {}

    class Drawn(Exception):
        pass

    def fake_splits(cfg):
        asked["dev_split"] = cfg.dev_split
        return {"train": ["disjoint-train-side"], "dev": []}

    def fake_select(train, split, cfg):
        asked["train"] = train
        raise Drawn

    monkeypatch.setattr(disjoint_dev, "load_splits", fake_splits)
    monkeypatch.setattr(disjoint_dev, "select_calls", fake_select)
    with pytest.raises(Drawn):
        disjoint_dev.trained_on({"config": asdict(PRESETS["disjoint"])}, tokenizer=None)
    assert asked == {"dev_split": "api_disjoint", "train": ["disjoint-train-side"]}


def test_two_committed_scores_are_paired_only_on_one_machine_and_the_same_requests(tmp_path):
    import json

    from ooospec.report.sidecar_choices import UnpairedScores, whole_call_difference

    xeon = {"cpu": "Intel Xeon", "cpu_capability": "AVX512", "bf16_kernels": True, "bf16_flag": "amx_bf16"}
    epyc = {"cpu": "AMD EPYC", "cpu_capability": "AVX2", "bf16_kernels": False, "bf16_flag": "none"}

    def commit(name, machine, exact):
        (tmp_path / f"{name}.json").write_text(json.dumps({"machine": machine}))
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"request_id": f"r{i}", "score": {"call_exact": e}}) + "\n" for i, e in enumerate(exact)))

    commit("served", xeon, [True, False, False, True] * 5)
    commit("new", xeon, [True, True, False, True] * 5)
    diff = whole_call_difference("served", "new", tmp_path)
    assert diff.n == 20 and diff.point == pytest.approx(0.25) and diff.verdict == "higher"
    commit("elsewhere", epyc, [True] * 20)
    with pytest.raises(UnpairedScores, match="served .*elsewhere .*different machines"):
        whole_call_difference("served", "elsewhere", tmp_path)
    commit("fewer", xeon, [True] * 19)
    with pytest.raises(UnpairedScores, match="differ in 1 requests"):
        whole_call_difference("served", "fewer", tmp_path)
    with pytest.raises(FileNotFoundError, match="missing"):
        whole_call_difference("served", "missing", tmp_path)


def test_a_runtime_names_its_choice_and_keeps_the_torch_choices_keys():
    """A choice scored on llama.cpp is its own stage and its own committed name; the torch choices'
    stage keys are the ones their committed scores were made under."""
    from ooospec.training.disjoint_dev import DecodingChoice

    served = DecodingChoice(optional_values=True)
    converted = DecodingChoice(optional_values=True, runtime="llama.cpp:bf16")
    assert served.to_dict() == {"required_values": True, "copy_values": None, "optional_values": True}
    assert converted.to_dict() == {**served.to_dict(), "runtime": "llama.cpp:bf16"}
    assert (served.label, converted.label) == ("served+fill", "served+fill+llama.cpp-bf16")
    assert DecodingChoice().to_dict() == {"required_values": True, "copy_values": None}
