"""The latency decomposition (`ooospec.report.latency_cost`): the awaited hint's wait is taken off its
seconds and nothing else, each step is over ToolSpec on the same work, and a run without the three
methods gets no table."""

from __future__ import annotations

import pytest

from ooospec.report.latency_cost import AWAITED, AWAITED_LABEL, latency_table, wait_left_out


def _record(method: str, request: int, decode_s: float, waited_s: float | None = None, forwards: int = 10,
            tokens: int = 21) -> dict:
    hint = None if waited_s is None else {"waited_s": waited_s, "ready_round": 0}
    return {"target": "t", "benchmark": "b", "request_id": f"r{request}", "position": request, "method": method,
            "method_base": method.split(":")[0], "sidecar": None, "identical_to_ar": True, "near_tie": False,
            "tokens": tokens, "prefill_s": 1.0, "decode_s": decode_s, "total_s": 1.0 + decode_s,
            "forwards": forwards, "target_forwards": forwards + 1, "output_ids": list(range(tokens)), "hint": hint}


def _run(requests: int = 12) -> list[dict]:
    out = []
    for i in range(requests):
        base = 2.0 + 0.1 * i
        out += [_record("toolspec", i, base), _record("ooospec:oracle:static", i, base / 1.5, forwards=6),
                _record(AWAITED, i, base / 1.25 + 0.4, waited_s=0.4, forwards=8),  # awaited: 1.25x once the wait is out
                _record("ooospec:static", i, base / 1.1, waited_s=0.0, forwards=9)]
    return out


def test_the_wait_is_taken_off_the_awaited_method_only():
    records = _run(3)
    derived = wait_left_out(records)
    assert [r["method"] for r in derived] == [AWAITED_LABEL] * 3
    blocking = [r for r in records if r["method"] == AWAITED]
    assert [d["decode_s"] for d in derived] == pytest.approx([r["decode_s"] - 0.4 for r in blocking])
    assert [d["total_s"] for d in derived] == pytest.approx([r["total_s"] - 0.4 for r in blocking])
    assert all(r["method"] == AWAITED for r in blocking)  # the records themselves are left as they were
    older = [{**r, "hint": {"ready_round": 0}} for r in blocking]  # made before the wait was kept
    assert wait_left_out(older) == []


def test_each_step_over_toolspec_with_its_counts():
    table = latency_table(_run())
    row = table.loc[("t", "b")]
    assert row["oracle / ToolSpec"].startswith("1.50x")
    assert row["awaited / ToolSpec"].startswith("1.25x")
    assert row["as timed / ToolSpec"].startswith("1.10x")
    assert row["oracle: forwards / MAT"] == "7.0 / 3.33" and row["as timed: forwards / MAT"] == "10.0 / 2.22"
    assert row["median wait (s)"] == pytest.approx(0.4)


def test_a_run_without_the_awaited_method_has_no_table():
    records = [r for r in _run() if r["method"] != AWAITED]
    assert latency_table(records).empty
