"""The before/after tables of the compiled study (`ooospec.studies.compile_study`) on synthetic records:
each run's speedups come from its own AR, AR outputs are compared token for token, and the
committed study is read back (or reported absent)."""

from __future__ import annotations

import json

from ooospec.studies.compile_study import ar_comparison, before_after, load_committed, slim


def _records(ar_s: float, toolspec_s: float, ar_ids: list[int], n: int = 6) -> list[dict]:
    rows = []
    for i in range(n):
        for method, seconds, forwards in (("ar", ar_s, 9), ("toolspec", toolspec_s, 3)):
            rows.append({"target": "t", "benchmark": "bfcl", "request_id": f"r{i}", "method": method,
                         "method_base": method, "identical_to_ar": True, "near_tie": False, "tokens": 10,
                         "prefill_s": 1.0, "decode_s": seconds * (1 + 0.01 * i), "total_s": 1.0 + seconds,
                         "forwards": forwards, "target_forwards": forwards + 1, "mean_tree_size": 4.0,
                         "source_counts": {"bonus": 3}, "output_ids": ar_ids if i else ar_ids[:5] + [0] * 5,
                         "trace": ["dropped"]})
    return rows


def test_each_run_is_compared_with_its_own_ar_and_outputs_token_by_token():
    ids = list(range(1, 11))
    before = _records(ar_s=2.0, toolspec_s=1.0, ar_ids=ids)
    after = _records(ar_s=1.0, toolspec_s=0.8, ar_ids=ids)
    after[0]["output_ids"] = ids[:5] + [99] * 5  # compiled AR differs from eager AR on request r0
    row = before_after(before, after).loc[("t", "bfcl", "toolspec")]
    assert row["n"] == 5  # r0's AR outputs differ between the runs: not the same work
    assert (row["x AR, eager"], row["x AR, compiled"], row["MAT compiled"]) == (2.0, 1.25, 3.0)  # MAT: 9 tokens / 3 forwards
    assert row["compiled x eager"].startswith("1.25x")  # ToolSpec itself: 1.0 s eager -> 0.8 s compiled
    ar = ar_comparison(before, after).iloc[0]
    assert (ar["n"], ar["same output"], ar["first differences at"]) == (6, 5, [5])
    assert ar["eager ms/token"] > ar["compiled ms/token"] and ar["AR decode, compiled x eager"].startswith("2.00x")
    assert "trace" not in slim(before)[0] and slim(before)[0]["output_ids"] == ids[:5] + [0] * 5


def test_the_committed_study_is_read_back_or_reported_absent(tmp_path):
    assert load_committed(tmp_path) is None
    (tmp_path / "points.json").write_text("[]")
    for name in ("before.jsonl", "after.jsonl"):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in slim(_records(1.0, 0.5, [1, 2]))))
    (tmp_path / "provenance.json").write_text(json.dumps({"date": "d", "code_commit": "c"}))
    study = load_committed(tmp_path)
    assert study["provenance"]["code_commit"] == "c" and len(study["before"]) == 12 and study["points"] == []
