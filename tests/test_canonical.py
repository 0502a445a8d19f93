"""The canonical run as a frozen asset: written and read back byte for byte, refused where a file or
its provenance does not match (named), never pooled across arithmetics, and set against a reader's
own run (differences listed, ratios inside or flagged)."""

from __future__ import annotations

import copy
import gzip
import json
import random

import pytest

from ooospec.report.canonical import (
    MANIFEST, PROVENANCE_FIELDS, CanonicalError, cell_file, consistency, load_canonical, tree_budgets,
    write_canonical,
)

BF16 = {"dtype": "bfloat16", "requested": "bfloat16", "device": "cpu", "cpu": "Test CPU", "cpu_capability": "AVX512",
        "bf16_kernels": True, "cores": 2, "torch": "2.13.0+cpu", "kernels": None, "bf16_flag": "avx512_bf16"}
FP32 = {**BF16, "dtype": "float32", "requested": "float32", "cpu_capability": "AVX2", "bf16_kernels": False,
        "bf16_flag": "none"}
METHODS = {"ar": (1.0, 20), "toolspec": (0.5, 8), "ooospec:static": (0.4, 6)}  # decode time factor, forwards


def _records(seed: int = 0, arithmetic: dict = BF16, requests: int = 8, speed: float = 1.0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for benchmark in ("apibank", "bfcl"):
        for i in range(requests):
            base = 1.0 + rng.random()
            for method, (factor, forwards) in METHODS.items():
                decode = base * factor * (1.0 if method == "ar" else speed) * (1 + 0.05 * rng.random())
                out.append({"target": "qwen", "benchmark": benchmark, "request_id": f"{benchmark}-{i}",
                            "method": method, "method_base": method.split(":")[0], "identical_to_ar": True,
                            "near_tie": False, "tokens": 20, "prefill_s": 2.0, "decode_s": decode,
                            "total_s": 2.0 + decode, "forwards": forwards, "target_forwards": forwards + 1,
                            "output_ids": [i, 1, 2, 3], "arithmetic": arithmetic, "hint": None})
    return out


def _provenance(**changes) -> dict:
    base = {"code_commit": "abc123", "machine": {"cpu": "Test CPU"}, "arithmetic": "bf16 on a test CPU",
            "tree_budgets": {"qwen": 8}, "seed": 0, "requests": 8, "methods": list(METHODS),
            "sidecar_adapter": "sidecar (sha256 0123)", "created": "2026-12-04 10:00 UTC", "max_new_tokens": 160}
    return {**base, **changes}


def test_written_records_read_back_identically_with_their_provenance(tmp_path):
    records = _records()
    write_canonical(records, _provenance(), tmp_path)
    run = load_canonical(tmp_path)
    assert sorted(json.dumps(r, sort_keys=True) for r in run.records) == sorted(json.dumps(r, sort_keys=True)
                                                                              for r in records)
    assert run.cells() == [("qwen", "apibank"), ("qwen", "bfcl")]
    assert run.provenance["code_commit"] == "abc123" and "abc123" in run.summary()
    first = (tmp_path / cell_file("qwen", "apibank")).read_bytes()
    write_canonical(records, _provenance(), tmp_path)  # deterministic bytes: the hash is the records'
    assert (tmp_path / cell_file("qwen", "apibank")).read_bytes() == first


def test_no_manifest_means_no_canonical_run(tmp_path):
    assert load_canonical(tmp_path) is None


def test_a_changed_file_is_named_with_expected_and_found_hash(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    path = tmp_path / cell_file("qwen", "bfcl")
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    path.write_bytes(gzip.compress(("\n".join(lines[:-1]) + "\n").encode()))  # one record dropped
    expected = json.loads((tmp_path / MANIFEST).read_text())["files"][path.name]["sha256"]
    with pytest.raises(CanonicalError, match=rf"qwen--bfcl\.jsonl\.gz: expected sha256 {expected}, found [0-9a-f]{{64}}"):
        load_canonical(tmp_path)
    path.unlink()
    with pytest.raises(CanonicalError, match="qwen--bfcl.jsonl.gz: expected sha256 .*, found no file"):
        load_canonical(tmp_path)


def test_missing_provenance_is_named_and_an_unlisted_file_refused(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    del manifest["provenance"]["tree_budgets"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CanonicalError, match="manifest.json: provenance expected .*found no tree_budgets"):
        load_canonical(tmp_path)
    with pytest.raises(CanonicalError, match="missing seed"):
        write_canonical(_records(), {k: v for k, v in _provenance().items() if k != "seed"}, tmp_path)
    write_canonical(_records(), _provenance(), tmp_path)
    (tmp_path / "extra--cell.jsonl.gz").write_bytes(gzip.compress(b"{}\n"))
    with pytest.raises(CanonicalError, match="extra--cell.jsonl.gz: expected only the manifest's files"):
        load_canonical(tmp_path)
    assert set(PROVENANCE_FIELDS) >= {"code_commit", "machine", "arithmetic", "tree_budgets", "seed", "sidecar_adapter"}


def test_two_arithmetics_are_never_pooled(tmp_path):
    mixed = _records() + [{**r, "target": "other"} for r in _records(arithmetic=FP32)]
    with pytest.raises(CanonicalError, match="2 arithmetics"):
        write_canonical(mixed, _provenance(), tmp_path)


def test_the_same_run_again_agrees_everywhere(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    check = consistency(load_canonical(tmp_path), _records(), {"qwen": 8})
    assert check.same_arithmetic and check.compared == 2 * 8 * 3
    assert check.differences.empty and check.flagged.empty and len(check.ratios) > 0
    assert "0 differ" in check.summary()


def test_a_changed_output_or_forward_count_is_listed(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    mine = copy.deepcopy(_records())
    mine[0]["output_ids"] = [9, 9]  # apibank-0, ar
    mine[4]["target_forwards"] += 1  # apibank-1, toolspec: forwards depend on nothing but the request
    mine[5]["target_forwards"] += 1  # apibank-1, ooospec:static: forwards depend on the sidecar's clock
    check = consistency(load_canonical(tmp_path), mine, {"qwen": 8})
    listed = check.differences.set_index(["request", "method"]).what.to_dict()
    assert listed == {("apibank-0", "ar"): "tokens", ("apibank-1", "toolspec"): "forwards"}
    assert not check.differences["near-tie"].any() and "near-tie" not in check.summary()
    # a decode that departs from its own AR at a near-tie in one run: rounding, and said so
    tie = copy.deepcopy(mine)
    tie[1].update(output_ids=[7], identical_to_ar=False, near_tie=True)  # apibank-0, toolspec
    tied = consistency(load_canonical(tmp_path), tie, {"qwen": 8})
    assert tied.differences.set_index(["request", "method"])["near-tie"].to_dict()[("apibank-0", "toolspec")]
    assert "1 of them in tokens at a rounding near-tie" in tied.summary()
    # another tree budget: forwards are not comparable, and the check says so
    other = consistency(load_canonical(tmp_path), mine, {"qwen": 4})
    assert list(other.differences.what) == ["tokens"] and "tree budget 4 here, 8 in the canonical run" in other.summary()
    # another output cap: outputs end elsewhere, nothing is compared token by token
    capped = consistency(load_canonical(tmp_path), mine, {"qwen": 8}, max_new_tokens=48)
    assert capped.differences.empty and "capped at 48 tokens here, 160 in the canonical run" in capped.summary()


def test_a_ratio_outside_the_canonical_interval_is_flagged(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    slower = _records(seed=0, speed=2.0)  # every drafting method takes twice as long
    check = consistency(load_canonical(tmp_path), slower, {"qwen": 8})
    over_ar = check.flagged[check.flagged.claim == "over_ar"]
    assert len(over_ar) == 2 * 2 * 2  # two drafting methods x two benchmarks x two phases
    assert set(over_ar["against the canonical interval"]) == {"below"}
    assert "outside (flagged below)" in check.summary()


def test_another_arithmetic_compares_ratios_only(tmp_path):
    write_canonical(_records(), _provenance(), tmp_path)
    mine = _records(arithmetic=FP32)
    mine[0]["output_ids"] = [9]
    check = consistency(load_canonical(tmp_path), mine, {"qwen": 8})
    assert not check.same_arithmetic and check.differences.empty and check.compared == 0
    assert "Different arithmetic" in check.summary() and len(check.ratios) > 0


def test_tree_budgets_per_target_from_the_slices_choices():
    choices = [{"slice": "qwen@ab12/apibank", "budget": {"max_nodes": 4, "max_depth": 4}},
               {"slice": "qwen@ab12/bfcl", "budget": {"max_nodes": 4, "max_depth": 4}},
               {"slice": "smol@cd34/bfcl", "budget": {"max_nodes": 8, "max_depth": 4}}]
    assert tree_budgets(choices) == {"qwen": 4, "smol": 8}


def test_the_readme_headline_reads_the_canonical_run(tmp_path):
    from ooospec.report.headline import headline, read_records

    write_canonical(_records(), _provenance(), tmp_path)
    records = read_records(tmp_path)
    assert len(records) == len(_records())
    table = headline(records, ooospec="ooospec:static").table
    assert list(table.benchmark) == ["apibank", "bfcl"]
