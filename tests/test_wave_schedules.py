"""When the wave runs (`ooospec.decoding.wave_policy`): at arrival, after the prefill, or not at all.

The schedules move the sidecar's work, never the output: every schedule writes AR's tokens on the
tiny model. What each schedule does is read from the trace: a deferred wave is submitted after
the prefill's first token (and the elastic target prefills wide, since no job is in flight yet),
``none`` submits nothing, and the policy records its modelled times and why.
"""

from __future__ import annotations

import json

import pytest
import torch

from ooospec.bench.methods import MethodSpec, method_sources
from ooospec.bench.placement import CorePlan, ElasticCores
from ooospec.data.request import Request
from ooospec.decoding.base import DecodeContext, EventTrace
from ooospec.decoding.hint import HintBank
from ooospec.decoding.loop import decode
from ooospec.decoding.out_of_order import ooospec_sources
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.wave_policy import SCHEDULES, WaveCosts, WaveDecision, WavePolicy, expected_seconds
from ooospec.models.tiny import FixedText, tiny_target
from ooospec.sidecar.service import SidecarService
from ooospec.sidecar.specs import oracle_sidecar

TOOLS = [{"name": "get_weather", "description": "weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}


def costs(**changes) -> WaveCosts:
    """Costs shaped like a 2-core CPU's: the prefill gains 2x from the second core, a round 1.4x."""
    base = dict(machine="test", target="tiny", prefill_token_s=0.015, prefill_2t_token_s=0.0075,
                round_s=0.28, round_2t_s=0.2, wave_base_s=1.0, wave_token_s=0.001, contention=1.1,
                rounds=12.0, hint_saved=((0.0, 3.0),))
    return WaveCosts(**{**base, **changes})


def _request(rid: str = "r1") -> Request:
    return Request(rid, "test", "eval", [{"role": "user", "content": "weather"}], TOOLS, None)


def _ctx(request: Request, tokenizer, surface) -> DecodeContext:
    ids = tokenizer.encode("Weather in Paris please, in celsius. Call the tool.", add_special_tokens=False)
    return DecodeContext(request=request, tokenizer=tokenizer, surface=surface, prompt_ids=ids,
                         eos_token_ids=[], trace=EventTrace())


def _kinds(out) -> list[str]:
    return [e["kind"] for e in out.trace.events]


# ---- the model ---------------------------------------------------------------------------------
def test_the_model_prefers_no_wave_where_the_prefill_dominates_and_a_wave_where_it_is_cheap():
    long = expected_seconds(costs(wave_base_s=3.0), prompt_tokens=1341)
    assert long["none"] < long["prefill"]  # a wave inside a 10 s prefill costs more than it saves
    cheap = expected_seconds(costs(wave_base_s=0.05, wave_token_s=0.0), prompt_tokens=200)
    assert cheap["prefill"] < cheap["none"] and cheap["deferred"] < cheap["none"]  # a cheap wave pays either way
    # a wave longer than the whole decode: the deferred hint comes after the request is done
    late = expected_seconds(costs(wave_base_s=60.0), prompt_tokens=100)
    assert late["deferred"] > late["none"]


def test_a_prefill_and_a_wave_slowing_each_other_make_the_wave_dearer():
    # measured alone the wave pays for itself; slowed beside the narrow prefill it no longer does
    alone = expected_seconds(costs(wave_base_s=1.0, wave_token_s=0.0), prompt_tokens=400)
    beside = expected_seconds(costs(wave_base_s=1.0, wave_token_s=0.0, prefill_contention=1.6, wave_contention=1.6),
                              prompt_tokens=400)
    assert alone["prefill"] < alone["none"] < beside["prefill"]
    assert beside["none"] == alone["none"] and beside["deferred"] == alone["deferred"]  # neither runs beside a prefill
    with pytest.raises(ValueError, match="prefill_contention"):
        costs(prefill_contention=0.9)


def test_a_slowdown_is_read_from_the_seconds_two_jobs_overlapped():
    from ooospec.bench.wave_costs import _slowdown

    # 10 s of work took 12 s: 4 s beside a wave at half speed (2 s of work), then 8 s alone
    assert _slowdown(beside=12.0, alone=10.0, overlap=4.0) == pytest.approx(2.0)
    assert _slowdown(beside=6.0, alone=4.0, overlap=6.0) == pytest.approx(1.5)  # overlapped throughout
    assert _slowdown(beside=9.0, alone=10.0, overlap=3.0) == 1.0  # faster than alone: noise, never below 1
    assert _slowdown(beside=5.0, alone=4.0, overlap=0.0) == pytest.approx(1.25)


def test_the_policy_records_every_modelled_time_and_prefers_a_wave_at_a_tie():
    decision = WavePolicy(costs()).choose(500)
    assert decision.schedule in SCHEDULES and set(decision.expected_s) == set(SCHEDULES)
    assert decision.expected_s[decision.schedule] == min(decision.expected_s.values())
    assert "500 tokens" in decision.why
    free = costs(wave_base_s=0.0, wave_token_s=0.0, hint_saved=((0.0, 0.0),), contention=1.0, prefill_token_s=0.0075)
    assert WavePolicy(free).choose(100).schedule == "prefill"  # equal times: the wave, not none


def test_bad_costs_and_schedules_are_refused_naming_them():
    with pytest.raises(ValueError, match="contention"):
        costs(contention=0.5)
    with pytest.raises(ValueError, match="round_s"):
        costs(round_s=-1.0)
    with pytest.raises(ValueError, match="unknown wave schedule 'later'"):
        WaveDecision.fixed("later")
    with pytest.raises(ValueError, match="unknown wave schedule"):
        HintBank(service=None, schedule="later")
    with pytest.raises(ValueError, match="blocking"):
        HintBank(service=None, blocking=True, schedule="deferred")


# ---- the method names --------------------------------------------------------------------------
def test_wave_is_a_method_option_with_one_canonical_name():
    spec = MethodSpec.parse("ooospec:wave=deferred")
    assert spec.wave == "deferred" and spec.name == "ooospec:wave=deferred"
    assert MethodSpec.parse("ooospec:wave=prefill").name == "ooospec"  # the default is not spelt out
    assert MethodSpec.parse("ooospec:static:wave=policy").wave == "policy"
    with pytest.raises(ValueError, match="wave='later'"):
        MethodSpec.parse("ooospec:wave=later")
    with pytest.raises(ValueError, match="wave"):
        MethodSpec.parse("toolspec:wave=none")
    with pytest.raises(ValueError, match="blocking"):
        MethodSpec("ooospec", blocking=True, wave="deferred")
    with pytest.raises(ValueError, match="wave costs"):
        method_sources(MethodSpec.parse("ooospec:wave=policy"), service=object())
    bank = method_sources(MethodSpec.parse("ooospec:wave=policy"), service=object(), wave_costs=costs())[0]
    assert isinstance(bank, HintBank) and bank.policy is not None


# ---- the schedules on the tiny model ------------------------------------------------------------
def test_a_deferred_wave_is_submitted_after_a_wide_prefill_and_the_output_stays_ar(tiny, tokenizer):
    request = _request()
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=24)
        surface = FixedText(tokenizer.decode(ar.output_ids, skip_special_tokens=False))
        with SidecarService(oracle_sidecar({request.id: CALL}, wave_s=0.2), placement="thread") as service:
            bank, toolspec = ooospec_sources(service, schedule="deferred", every_wave=True)
            elastic = ElasticCores(service, CorePlan(None, None), threads=1)
            out = decode(tiny_target(tiny, tokenizer), [bank, toolspec], _ctx(request, tokenizer, surface), 24,
                         budget=TreeBudget(8, 8), placement=elastic)
            service.wait_idle()
        assert out.output_ids == ar.output_ids
        kinds = _kinds(out)
        assert kinds.index("prefill_end") < kinds.index("sidecar_submit")
        assert out.trace.of_kind("prefill_end")[0]["threads"] == 2  # no job in flight: the prefill is wide
        assert out.trace.of_kind("sidecar_submit")[0]["schedule"] == "deferred"
        assert out.rounds[0].threads == 1  # the wave is out: the target gives the core back
        assert bank.stats.submitted and bank.stats.schedule["schedule"] == "deferred"
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_writes_ar_and_says_which_ran(tiny, tokenizer, schedule):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=24)
    surface = FixedText(tokenizer.decode(ar.output_ids, skip_special_tokens=False))
    with SidecarService(oracle_sidecar({request.id: CALL}), placement="thread") as service:
        bank, toolspec = ooospec_sources(service, schedule=schedule, every_wave=True)
        out = decode(tiny_target(tiny, tokenizer), [bank, toolspec], _ctx(request, tokenizer, surface), 24,
                     budget=TreeBudget(8, 8))
        service.wait_idle()
    assert out.output_ids == ar.output_ids
    assert out.trace.of_kind("wave_schedule")[0]["schedule"] == schedule
    assert ("sidecar_submit" in _kinds(out)) == (schedule != "none") == bank.stats.submitted
    if schedule == "none":
        assert bank.stats.error.startswith("no wave") and out.source_counts.get("hint", 0) == 0


def test_the_policy_chooses_per_request_and_the_record_says_why(tiny, tokenizer):
    request = _request()
    ar = decode(tiny_target(tiny, tokenizer), [], _ctx(request, tokenizer, None), max_new_tokens=16)
    surface = FixedText(tokenizer.decode(ar.output_ids, skip_special_tokens=False))
    expensive = costs(wave_base_s=100.0)  # a wave that can never pay: the policy runs none
    with SidecarService(oracle_sidecar({request.id: CALL}), placement="thread") as service:
        for wave_costs, expected in ((expensive, "none"), (costs(wave_base_s=0.0, wave_token_s=0.0), "prefill")):
            bank, toolspec = ooospec_sources(service, policy=WavePolicy(wave_costs), every_wave=True)
            out = decode(tiny_target(tiny, tokenizer), [bank, toolspec], _ctx(request, tokenizer, surface), 16,
                         budget=TreeBudget(8, 8))
            service.wait_idle()
            assert out.output_ids == ar.output_ids
            recorded = bank.stats.schedule
            assert recorded["schedule"] == expected and set(recorded["expected_s"]) == set(SCHEDULES)
            assert "least modelled time" in recorded["why"]


def test_rounds_saved_are_interpolated_between_the_replay_points_and_end_at_r():
    measured = costs(rounds=10.0, hint_saved=((0, 3.0), (2, 2.0), (4, 1.0)))
    assert [measured.saved(k) for k in (0, 1, 2, 3, 4)] == [3.0, 2.5, 2.0, 1.5, 1.0]
    assert measured.saved(7) == pytest.approx(0.5) and measured.saved(10) == 0.0 == measured.saved(12)
    assert WaveCosts(**measured.to_dict()) == measured  # what the calibration file holds reads back as is
    with pytest.raises(ValueError, match="hint_saved"):
        costs(hint_saved=((1, 3.0),))


# ---- the bench: the policy on calibrated costs, a calibration from elsewhere refused ----------
def test_a_bench_run_records_each_requests_schedule_and_its_calibration(tmp_path, monkeypatch, capsys):
    from test_bench import FILES, TinyTargets, _config

    from ooospec.bench.runner import run_bench
    from ooospec.bench.slices import slice_path, wave_costs_path
    from ooospec.bench.wave_costs import costs_path
    from ooospec.paths import shown
    from ooospec.studies.wave_schedules import policy_decisions, schedule_table

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    methods = ["toolspec:both_cores", "ooospec:wave=policy", "ooospec:wave=deferred", "ooospec:wave=none"]
    cfg = _config(targets=["tiny"], benchmarks=["bfcl"], methods=methods, warmup=0)
    records = run_bench(cfg, targets=TinyTargets(), load_requests=FILES.__getitem__)
    assert all(r["identical_to_ar"] or r["near_tie"] for r in records)
    by_method = {m: [r for r in records if r["method"] == m] for m in methods}
    assert all(r["hint"]["schedule"]["schedule"] == "deferred" for r in by_method["ooospec:wave=deferred"])
    assert all(not r["hint"]["submitted"] for r in by_method["ooospec:wave=none"])
    chosen = [r["hint"]["schedule"] for r in by_method["ooospec:wave=policy"]]
    assert len(chosen) == 2 and all(set(c["expected_s"]) == set(SCHEDULES) and c["why"] for c in chosen)
    # the study's tables (`python -m ooospec.studies.wave_schedules`) read the same records
    table = schedule_table(records)
    assert list(table.index.get_level_values("method")) == ["ooospec:wave=deferred", "ooospec:wave=policy",
                                                             "ooospec:wave=none"]  # the study's order, then others
    assert table.loc[("tiny", "bfcl", "ooospec:wave=deferred"), "wave ran"] == "2 of 2"
    assert table.loc[("tiny", "bfcl", "ooospec:wave=none"), "wave ran"] == "0 of 2"
    assert set(table.columns) >= {"wave ran", "schedules", "n", "decode", "end to end"}
    assert all(cell.endswith("]") or cell == "no same output" for cell in table["end to end"])
    decisions = policy_decisions(records)
    assert len(decisions) == 2 and set(decisions.chose) <= set(SCHEDULES)
    assert decisions[[f"{s} (s)" for s in SCHEDULES]].notna().all().all()
    beside = json.loads(wave_costs_path(slice_path(records.stage, "tiny", "tiny0001", "bfcl")).read_text())
    assert beside["costs"]["target"] == "tiny" and beside["machine"]["dtype"] == "float32"
    assert json.loads(costs_path("tiny").read_text()) == beside

    # a calibration from another machine is refused with one line naming the file, then measured again
    elsewhere = {**beside, "machine": {**beside["machine"], "cpu_capability": "AVX2", "cores": 16}}
    costs_path("tiny").write_text(json.dumps(elsewhere))
    capsys.readouterr()
    run_bench(_config(targets=["tiny"], benchmarks=["apibank"], methods=methods, warmup=0),
              targets=TinyTargets(), load_requests=FILES.__getitem__)
    refused = [line for line in capsys.readouterr().out.splitlines() if "refused" in line]
    assert len(refused) == 1 and shown(costs_path("tiny")) in refused[0] and "cores 16 there" in refused[0]
    assert json.loads(costs_path("tiny").read_text())["machine"] == beside["machine"]


def test_the_wave_share_table_splits_the_speedup_by_whether_a_wave_ran():
    from ooospec.report.wave_share import schedule_of, wave_share_table

    def record(method, rid, total, schedule=None, submitted=True, out=(1, 2)):
        hint = None if method.startswith("toolspec") else {
            "submitted": submitted, "schedule": None if schedule is None else {"schedule": schedule}}
        return {"target": "t", "benchmark": "b", "request_id": rid, "method": method, "total_s": total,
                "decode_s": total / 2, "output_ids": list(out), "hint": hint}

    records = [record("toolspec:both_cores", f"r{i}", 10.0) for i in range(4)]
    records += [record("ooospec:wave=policy", "r0", 8.0, "prefill"), record("ooospec:wave=policy", "r1", 5.0, "deferred"),
                record("ooospec:wave=policy", "r2", 10.0, "none", submitted=False),
                record("ooospec:wave=policy", "r3", 1.0, "deferred", out=(9,))]  # other output: not the same work
    assert schedule_of(records[0]) is None and schedule_of({"hint": {"submitted": False}}) == "none"
    assert schedule_of({"hint": {"submitted": True}}) == "prefill"  # a record from before schedules
    row = wave_share_table(records).iloc[0]
    assert (row.requests, row.with_wave, row.wave_share) == (4, 3, 0.75)
    assert row.schedules == "deferred 2, none 1, prefill 1"
    assert (row.n_wave, row.n_no_wave) == (2, 1)
    assert row.speedup_wave == pytest.approx(20 / 13) and row.speedup_no_wave == pytest.approx(1.0)
    from ooospec.report.wave_share import wave_share_compact

    compact = wave_share_compact(wave_share_table(records))
    assert list(compact.columns) == ["wave ran", "with a wave", "without"]
    assert compact.index[0] == ("t", "b", "wave=policy")
    assert compact.iloc[0].tolist() == ["3 of 4", "1.54x [1.25, 2.00] (n 2)", "1.00x [1.00, 1.00] (n 1)"]
