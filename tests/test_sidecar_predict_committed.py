"""The committed adapters still match what the code derives today.

`make reproduce` reuses the adapters under ``artifacts/committed/adapters/`` instead of training
them; these tests re-derive a small slice and compare: the slot rows of a few training requests
(from the current data and prompt code), the sidecar's wave on two dev requests, and the tool
target's greedy output on one dev request (real SmolLM2, seconds).
"""

import json

import pytest
import torch

from ooospec.paths import REPO_ROOT
from ooospec.training.sidecar import PRESETS, committed_adapters_dir, select_calls
from ooospec.sidecar.slots import SlotPromptConfig
from ooospec.training.slot_rows import build_rows, read_rows
from ooospec.models.adapters import read_frozen, tool_adapter_committed_dir
from ooospec.models.packed_linear import uses_packed_linears

torch.set_num_threads(1)
COMMITTED = REPO_ROOT / "artifacts" / "committed" / "adapters"


@pytest.fixture(scope="module")
def sidecar_dir():
    path = COMMITTED / PRESETS["full"].committed_name
    assert (path / "adapter" / "FROZEN.json").exists(), f"{path}: the full preset's sidecar adapter is not committed"
    return path


def test_committed_sidecar_is_the_full_preset_and_verifies(sidecar_dir):
    record = read_frozen(sidecar_dir / "adapter")
    assert record["config_key"] == PRESETS["full"].key()
    assert committed_adapters_dir().name == "adapters"
    assert record["dev_metrics"]["requests"] > 0 and (sidecar_dir / "loss.png").exists()


def test_committed_rows_rederive_from_current_data(sidecar_dir):
    from ooospec.data import load_split

    record = read_frozen(sidecar_dir / "adapter")
    stored = list(read_rows(sidecar_dir / "rows_train_sample.jsonl"))
    ids = {row.request_id for row in stored}
    requests = [r for r in load_split("train") if r.id in ids]
    assert len(requests) == len(ids), "a committed training request is no longer in the train split"
    selection, _ = select_calls(requests, "train", PRESETS["full"])
    selection.kept = [k for k in selection.kept if k.request_id in ids]
    rows = build_rows(requests, selection, SlotPromptConfig(**record["prompt"]))
    key = lambda r: (r.request_id, r.kind, r.function or "", r.parameter or "")  # noqa: E731
    assert sorted(rows, key=key) == sorted(stored, key=key)


@pytest.mark.slow
@pytest.mark.parametrize("waves_file, profile, required_values, optional_values, packed", [
    # the adapter was trained and its dev waves written in fp32 with torch's plain products:
    # reproduce them in that arithmetic
    ("dev_predictions.jsonl", "cpu-fp32", False, False, False),
    # the waves the book scored as served: the cpu profile's arithmetic (on a CPU without bf16
    # kernels: fp32 on packed weights, as the bench's sidecar runs), required slots filled
    ("dev_predictions_served-cpu.jsonl", "cpu", True, False, True),
    # and as served now: every slot filled (`OPTIONAL_VALUES`)
    ("dev_predictions_served-fill-cpu.jsonl", "cpu", True, True, True),
], ids=["as trained", "as served (required)", "as served"])
def test_committed_sidecar_reproduces_its_dev_waves(sidecar_dir, waves_file, profile, required_values, optional_values,
                                                    packed):
    from ooospec.data import load_split
    from ooospec.sidecar.predictor import SlotPredictor

    stored = [json.loads(line) for line in (sidecar_dir / waves_file).read_text().splitlines()[:2]]
    dev = {r.id: r for r in load_split("dev")}
    predictor = SlotPredictor.from_frozen(sidecar_dir / "adapter", profile=profile, required_values=required_values,
                                          packed=packed, optional_values=optional_values)
    fp32 = next(predictor.model.parameters()).dtype == torch.float32
    assert uses_packed_linears(predictor.model) == (packed and fp32)  # packing is fp32-only
    for record in stored:
        wave = predictor.predict_wave(dev[record["request_id"]])
        assert [row.text for row in wave.rows] == [row["text"] for row in record["rows"]]
        shipped = json.loads(wave.payload)  # the chosen call first, then the other functions' (alternatives)
        stored_payload = json.loads(record["payload"])  # as stored: the chosen call, or every function's
        assert shipped == stored_payload or (shipped[0] if isinstance(shipped, list) else shipped) == stored_payload


@pytest.mark.slow
def test_committed_tool_adapter_reproduces_a_dev_output():
    from ooospec.data import load_split
    from ooospec.training.tool_lora import PRESETS as TOOL_PRESETS, greedy_text, load_parts
    from ooospec.models.adapters import load_frozen_adapter

    adapter = tool_adapter_committed_dir()
    record = read_frozen(adapter)
    assert record["config_key"] == TOOL_PRESETS["full"].key()
    # a dev request whose prompt has no earlier calls: API-Bank history is rendered as structured
    # tool calls since the adapter was frozen, so those prompts (and outputs) changed
    dev = {r.id: r for r in load_split("dev")}
    outputs = [json.loads(line) for line in (adapter.parent / "dev_outputs.jsonl").read_text().splitlines()]
    first = next(o for o in outputs if not any(m.get("tool_calls") for m in dev[o["id"]].messages))
    request = dev[first["id"]]
    parts = load_parts(TOOL_PRESETS["full"])
    parts.model = load_frozen_adapter(parts.model, adapter, merge=True)
    text, _ = greedy_text(parts.model, parts.tokenizer, parts.prompt_ids(request), parts.eos_id,
                          TOOL_PRESETS["full"].max_new_tokens)
    assert text == first["text"]


def test_function_cases_split_misses_by_whose_departure():
    from ooospec.training.sidecar_dev import FUNCTION_CASES, function_cases

    predicted = {"a": "f", "b": "f", "c": "g", "d": "g", "e": None, "x": "f"}
    target = {"a": "f", "b": "f", "c": "f", "d": "f", "e": "h", "z": "f"}  # z: no sidecar call, skipped
    gold = {"a": "f", "b": "k", "c": "f", "d": "g", "e": "k"}
    counts = function_cases(predicted, target, gold)
    assert list(counts) == list(FUNCTION_CASES)
    assert list(counts.values()) == [1, 1, 1, 1, 1]  # a, b, c (sidecar's miss), d (target departs), e


@pytest.mark.parametrize("served", [False, True], ids=["as trained", "as served"])
def test_committed_function_cases_add_up_to_the_dev_scores(sidecar_dir, served):
    from ooospec.training.sidecar_dev import FUNCTION_CASES, TARGET_REFERENCE, dev_scores, function_cases_table

    table = function_cases_table({"full": sidecar_dir / "adapter"}, served=served)
    scores = dev_scores(sidecar_dir / "adapter", served=served).loc[TARGET_REFERENCE]
    assert table["full"].sum() == scores["requests"]
    agree = table.loc[list(FUNCTION_CASES[:2]), "full"].sum()
    assert agree / scores["requests"] == pytest.approx(scores["function_index_accuracy"], abs=1e-3)


def test_value_cases_split_slots_by_whose_departure():
    from ooospec.data.request import Call
    from ooospec.training.sidecar_dev import VALUE_CASES, value_cases

    target = {"a": Call("f", {"x": 1, "y": "CDG", "z": "NYC"}), "b": Call("f", {"x": 2}), "c": Call("g", {"x": 3}),
              "d": Call("f", {"x": 4})}
    predicted = {"a": Call("f", {"x": 1, "z": "New York", "w": 5}),  # w: a slot only the sidecar fills
                 "b": Call("f", {"x": 9}),
                 "c": Call("h", {"x": 3}),  # another function: its slots are not compared
                 "d": Call("f", {"x": 7})}
    gold = {"a": Call("f", {"x": 1, "z": "New York"}), "b": Call("f", {"x": 2}), "d": Call("k", {"x": 7})}
    counts = value_cases(predicted, target, gold)
    assert list(counts) == list(VALUE_CASES)
    # a: x agrees; y (the target's placeholder, gold empty, sidecar empty = gold); z (sidecar = gold);
    # w (sidecar fills, target and gold empty: the sidecar's miss). b: x is the sidecar's miss.
    # d: gold names another function, so the target departs and the sidecar differs from both.
    assert counts == {VALUE_CASES[0]: 1, VALUE_CASES[1]: 2, VALUE_CASES[2]: 2, VALUE_CASES[3]: 1}

