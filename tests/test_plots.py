"""Figures from synthetic bench records: each plot is drawn, labelled, and the timeline geometry is right."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=True)  # tests only: no display here

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from ooospec.report import figures, paper_numbers
from ooospec.report.ablations import ablation_table, budget_sweep, crossover, delay_sweep
from ooospec.report.hint_tables import arrival_rounds
from ooospec.report.tables import headline, main_table
from ooospec.report.timelines import pick_timelines, reference_record, timeline_groups


def _trace(prefill: tuple[float, float], rounds: list[tuple[float, list[str]]], hint_round: int | None = None,
           sidecar: bool = False) -> list[dict]:
    events = []
    if sidecar:
        events.append({"t": 0.001, "kind": "sidecar_submit", "mode": "wave"})
    events += [{"t": prefill[0], "kind": "prefill_start"}, {"t": prefill[1], "kind": "prefill_end"}]
    for index, (t, credits) in enumerate(rounds):
        if hint_round == index:
            events.append({"t": events[-1]["t"], "kind": "hint_ready", "round": index})
        events.append({"t": t, "kind": "round", "index": index, "credits": credits})
    events.append({"t": rounds[-1][0], "kind": "finish"})
    return events


def record(method: str, request: str, benchmark: str, decode_s: float, shared: bool, trace: list[dict],
           counts: dict, hint: dict | None = None, target: str = "qwen") -> dict:
    tokens = sum(counts.values())
    return {"id": f"{target}/{benchmark}/{request}/{method}", "target": target, "benchmark": benchmark,
            "request_id": request, "method": method, "method_base": method.split(":")[0], "sidecar": None,
            "identical_to_ar": True, "tokens": tokens, "prefill_s": 2.0, "decode_s": decode_s,
            "total_s": 2.0 + decode_s, "forwards": len([e for e in trace if e["kind"] == "round"]),
            "target_forwards": 1, "mean_tree_size": 8.0, "source_counts": counts, "hint": hint, "trace": trace,
            "shared_prefill": shared, "tree_budget": {"max_nodes": 16, "max_depth": 16}}


def synthetic() -> list[dict]:
    out = []
    for benchmark in ("apibank", "bfcl"):
        for i, ready in enumerate((0, 3, None)):
            rid = f"{benchmark}-{i}"
            ar_trace = _trace((0.0, 0.0), [(0.5 * (k + 1), ["bonus"]) for k in range(8)])
            out.append(record("ar", rid, benchmark, 4.0, True, ar_trace, {"bonus": 8}))
            ts_trace = _trace((0.0, 0.0), [(1.0, ["fsm", "fsm", "bonus"]), (2.0, ["retrieval", "bonus"]),
                                           (2.5, ["bonus"])])
            out.append(record("toolspec", rid, benchmark, 2.5, True, ts_trace, {"fsm": 2, "retrieval": 1, "bonus": 3}))
            oo_trace = _trace((0.0, 2.0), [(2.5, ["fsm", "bonus"]), (3.0, ["hint", "hint", "hint", "bonus"]),
                                           (3.5, ["bonus"]), (3.9, ["hint", "bonus"])],
                              hint_round=ready, sidecar=True)
            hint = {"ready_round": ready, "error": None if ready is not None else "hint not ready before the request finished",
                    "wave_start_t": 0.01, "wave_end_t": 1.5, "received_t": 2.0, "wave_s": 1.49, "payload_bytes": 70}
            counts = {"fsm": 1, "hint": 4 if ready is not None else 0, "bonus": 4}
            out.append(record("ooospec", rid, benchmark, 1.9, False, oo_trace, counts, hint))
            out.append(record("ooospec:static", rid, benchmark, 2.1, False, oo_trace, counts, hint))
            for delay, extra in ((1, 0.5), (4, 2.0)):  # the latency sweep runs in the paper's placement
                out.append(record(f"ooospec:delay={delay}:static", rid, benchmark, 2.1 + extra, False, oo_trace, counts, hint))
            out.append(record("toolspec:budget=8", rid, benchmark, 3.0, True, ts_trace, {"bonus": 6}))
    return out


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _labelled(fig) -> None:
    for ax in fig.axes:
        if ax.has_data():
            assert ax.get_xlabel() or ax.get_ylabel(), f"unlabelled axes in {fig._suptitle}"


def test_timeline_segments_split_rounds_by_source_and_shift_a_shared_prefill():
    records = synthetic()
    ooo = next(r for r in records if r["method"] == "ooospec")
    segments, marks = figures.timeline_segments(ooo)
    prefill = segments[0]
    assert (prefill.kind, prefill.start, prefill.end) == ("prefill", 0.0, 2.0)
    second = [s for s in segments if s.lane == "target: ooospec" and 2.5 <= s.start < 3.0]
    assert [s.kind for s in second] == ["hint", "bonus"]
    assert second[0].end - second[0].start == pytest.approx(3 * (second[1].end - second[1].start))
    assert [s.kind for s in segments if s.lane == "sidecar"] == ["queue", "wave", "transfer"]
    assert marks and "boundary 0" in marks[0].label

    ts = next(r for r in records if r["method"] == "toolspec")
    ts_segments, _ = figures.timeline_segments(ts)
    assert ts_segments[0].end == pytest.approx(2.0)  # measured shared prefill, drawn at its length
    assert ts_segments[-1].end == pytest.approx(2.0 + 2.5)


def test_timeline_needs_prefill_events():
    broken = dict(synthetic()[0], trace=[])
    with pytest.raises(ValueError, match="no prefill events"):
        figures.timeline_segments(broken)


def test_elastic_rounds_are_hatched_and_counted():
    """A round the target ran on both cores carries its thread count into the timeline (drawn
    hatched) and into the core-use table, with the placement switches of the trace."""
    from ooospec.report.timelines import core_use

    records = synthetic()
    ooo = next(r for r in records if r["method"] == "ooospec")
    ooo = {**ooo, "trace": [({**e, "threads": 2} if e["kind"] == "round" and e["index"] >= 2 else e) for e in ooo["trace"]]
           + [{"t": 4.0, "kind": "elastic_cores", "switches": 2, "switch_s": 0.0001}]}
    segments, _ = figures.timeline_segments(ooo)
    assert {s.threads for s in segments if s.kind != "prefill"} == {1, 2}
    fig, ax = plt.subplots()
    figures.draw_timeline(ax, [ooo])
    assert any(patch.get_hatch() == "////" for patch in ax.patches)
    use = core_use([ooo]).iloc[0]
    assert use["share of rounds on both cores"] == pytest.approx(2 / 4) and use["switches per request"] == 2
    assert use["us per switch"] == pytest.approx(50.0)


def test_every_figure_draws_from_synthetic_records():
    records = synthetic()
    table = main_table(records)
    fig = figures.speedup_bars(table, "decode_speedup")
    assert len(fig.axes) == 1 and "(held out)" in [t.get_text() for t in fig.axes[0].get_xticklabels()][1]
    _labelled(fig)
    ours = pd.concat([headline(table, m).assign(metric=m) for m in ("e2e_speedup", "decode_speedup")])
    _labelled(figures.headline_figure(ours, paper_numbers.headline()))

    picks = pick_timelines(records)
    assert set(picks) == {"early", "late", "none"}
    assert picks["late"]["hint"]["ready_round"] == 3
    groups = timeline_groups(records)
    assert list(groups) == ["qwen: early", "qwen: late", "qwen: none"]
    assert [r["method"] for r in groups["qwen: late"]] == ["ar", "ooospec"]
    assert groups["qwen: late"][0]["request_id"] == picks["late"]["request_id"] == reference_record(records, picks["late"])["request_id"]
    fig = figures.timelines_figure(groups)
    assert len(fig.axes) == 3 and fig.legends
    _labelled(fig)

    arrivals = arrival_rounds(records)
    assert sorted(arrivals.bucket.unique()) == ["boundaries 1-3", "first boundary", "not before finish"]
    _labelled(figures.arrival_figure(arrivals))
    _labelled(figures.ablation_bars(ablation_table(records)))
    sweep = delay_sweep(records)
    _labelled(figures.delay_sweep_figure(sweep, crossover(sweep)))
    budgets = budget_sweep(records)
    assert list(budgets.nodes) == [8, 16]
    _labelled(figures.budget_sweep_figure(budgets))
    _labelled(figures.source_shares_figure(records))


def test_paper_numbers_name_their_source():
    table = paper_numbers.table()
    assert {"ooospec_speedup_mean", "toolspec_speedup_mean", "payload_bytes"} <= set(table.key)
    assert table.source.str.len().min() > 10
    assert not table.set_index("key").loc["ooospec_mat_range", "in_paper_text"]
    assert paper_numbers.headline()["ooospec_range"] == (2.46, 5.34)
    with pytest.raises(KeyError, match="no paper number"):
        paper_numbers.number("eagle3_speedup")


def test_the_arithmetic_figure_labels_each_line_with_its_own_arithmetic():
    points = [{"target": "t", "dtype": dtype, "attention": "sdpa", "threads": 1, "step_ms": 100.0,
               "prefill_s": 1.0, "ratios": {"1": 1.0, "17": ratio}} for dtype, ratio in (("float32", 2.8), ("bfloat16", 1.4))]
    fig = figures.arithmetic_figure(points)
    labels = [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert labels[0].startswith("float32, sdpa") and labels[1].startswith("bfloat16, sdpa")
    styles = {line.get_label().split(",")[0]: line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert styles["bfloat16"] == "-" and styles["float32"] == "--"
    plt.close(fig)


def test_the_per_request_scatter_pairs_requests_per_target():
    records = [{"target": t, "benchmark": b, "request_id": f"{b}{i}", "method": m, "decode_s": s}
               for t in ("a", "b") for b in ("bfcl", "apibank") for i in range(3)
               for m, s in (("toolspec", 2.0 + i), ("ooospec", 1.0 + i))]
    fig = figures.per_request_scatter(records)
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "a: n = 6 requests"
    points = fig.axes[0].collections[0].get_offsets()
    assert len(points) == 3 and all(y < x for x, y in points)
    plt.close(fig)
