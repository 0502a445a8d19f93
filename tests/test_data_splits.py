"""Splits: determinism, decontamination, dedup, eval overlap; and the built files end to end."""

import json

import pytest

from ooospec.data.loading import SourceLoad
from ooospec.data.request import Call, Request
from ooospec.data.splits import DEFAULT_DEV_FRACTION, eval_manifest, is_dev, normalize_name, split_training


def _request(rid, user, tools=("f",), gold="f", meta=None):
    return Request(id=rid, benchmark="t", split="train", messages=[{"role": "user", "content": user}],
                   tools=[{"name": n, "description": "", "parameters": {"type": "object", "properties": {}}} for n in tools],
                   gold=[Call(gold, {})], source="t", meta=meta or {})


def test_is_dev_is_a_pure_function_of_the_hash():
    hashes = [f"{i:064x}" for i in range(0, 16**6, 997)]
    assert [is_dev(h, 0.05) for h in hashes] == [is_dev(h, 0.05) for h in hashes]
    assert is_dev("0" * 64, 0.05) and not is_dev("f" * 64, 0.05)
    assert abs(DEFAULT_DEV_FRACTION - 529 / 10191) < 1e-12


def test_split_decontaminates_dedups_and_drops_eval_overlap():
    evals = [_request("e1", "eval question", tools=("math.factorial", "ToolSearcher"), gold="math.factorial")]
    load = SourceLoad(source="t", split="train", files=["t.json"], requests=[
        _request("a", "q1", tools=("math_factorial",), gold="math_factorial"),   # name overlap after normalising
        _request("b", "q2", tools=("ToolSearcher", "g"), gold="g"),              # protocol tool is exempt
        _request("c", "q2", tools=("ToolSearcher", "g"), gold="g"),              # duplicate prompt of b
        _request("d", "eval question", tools=("math.factorial", "ToolSearcher"), gold="h"),
        _request("e", "q3", tools=("h",), gold="h", meta={"api": "Axolotl"}),    # ToolAlpaca API name
        _request("e1", "q4", tools=("k",), gold="k"),                            # id of an eval request
    ])
    result = split_training([load], evals, extra_eval_names=["Axolotl"], dev_fraction=0.0)
    assert [r.id for r in result.train] == ["b"] and result.dev == []
    reasons = {d.record: d.reason for d in load.drops}
    assert reasons == {"a": "eval_name_overlap", "c": "duplicate_prompt", "d": "eval_name_overlap",
                       "e": "eval_name_overlap", "e1": "eval_prompt_overlap"}
    assert load.raw == 6 and len(load.requests) == 1
    assert normalize_name("Math.Factorial") == normalize_name("math_factorial")
    assert "toolsearcher" not in eval_manifest(evals)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    import os

    from ooospec.data import build

    old = os.environ.get("OOOSPEC_ARTIFACTS")
    os.environ["OOOSPEC_ARTIFACTS"] = str(tmp_path_factory.mktemp("artifacts"))
    try:
        card = build.build_data()
        splits = {name: build.load_split(name) for name in build.SPLIT_FILES}
        again = build.build_data()
        yield card, splits, again
    finally:
        if old is None:
            os.environ.pop("OOOSPEC_ARTIFACTS")
        else:
            os.environ["OOOSPEC_ARTIFACTS"] = old


def test_build_outputs_and_card(built):
    card, splits, again = built
    assert again == card  # second call reuses the stage
    assert {k: len(v) for k, v in splits.items()} == card["outputs"]
    assert card["outputs"]["eval_apibank"] == 534 and card["outputs"]["eval_toolalpaca"] == 214
    assert card["outputs"]["eval_bfcl"] == 1000 and card["outputs"]["eval_bfcl_irrelevance"] == 240
    for entry in card["sources"]:
        assert entry["raw"] == entry["kept"] + sum(entry["dropped"].values())
        if entry["split"] == "train":
            assert entry["kept"] == entry["kept_train"] + entry["kept_dev"]
    assert card["totals"]["all_train"] == len(splits["train"]) and card["totals"]["all_dev"] == len(splits["dev"])
    assert 0.03 < len(splits["dev"]) / (len(splits["train"]) + len(splits["dev"])) < 0.08
    assert card["paper"]["all_train"] == 9662


def test_no_overlap_between_train_dev_and_eval(built):
    _, splits, _ = built
    groups = {"train": splits["train"], "dev": splits["dev"],
              "eval": [r for k, v in splits.items() if k.startswith("eval") for r in v]}
    for a in groups:
        for b in groups:
            if a < b:
                assert not {r.id for r in groups[a]} & {r.id for r in groups[b]}
                assert not {r.prompt_hash for r in groups[a]} & {r.prompt_hash for r in groups[b]}
    eval_names = eval_manifest(groups["eval"])
    for request in groups["train"] + groups["dev"]:
        assert not {normalize_name(t["name"]) for t in request.tools} & eval_names


def test_card_table(built):
    from ooospec.data.card import card_table

    card, _, _ = built
    table = card_table(card)
    assert {"source", "split", "raw", "kept", "train", "dev", "dropped", "gold unparsed"} <= set(table.columns)
    paper = table[table.source == "all training (paper)"].iloc[0]
    assert (paper.train, paper.dev) == (9662, 529)
    json.dumps(card)  # the card is plain JSON
