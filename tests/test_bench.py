"""The bench: method names, summary math on synthetic records, and resumable slices on a tiny model.

The slice tests run the real bench loop (shared prefill, interleaved methods, a sidecar process
answering with gold calls) on a random 2-layer Llama with a tiny byte-level tokenizer, so they
need no downloaded weights and take seconds.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ooospec.bench.config import BenchConfig
from ooospec.bench.plan import BENCH_CODE
from ooospec.bench.runner import method_order, run_bench
from ooospec.bench.sampling import sample_requests, warmup_requests
from ooospec.bench.slices import bench_stage, slice_path
from ooospec.models.arithmetic import first_difference
from ooospec.bench.methods import (HINT_ROOM_ABLATION, HINT_ROOM_CONTROL, FSMOff, MethodSpec, RetrievalOff,
                                   ablation_methods, budget_methods, method_budget, method_sources, parse_methods)
from ooospec.bench.oracle_calls import CallDirectory
from ooospec.report.ablations import ablation_findings, ablation_table, crossover, delay_sweep
from ooospec.report.hint_tables import arrival_bucket, hint_table
from ooospec.report.tables import main_table, method_table
from ooospec.data.request import Request
from ooospec.decoding.toolspec import ToolSpec
from weather_requests import weather_requests

# ---------------------------------------------------------------- method names


@pytest.mark.parametrize("text, canonical", [
    ("ar", "ar"),
    ("ooospec:delay=2.0", "ooospec:delay=2"),
    ("ooospec:shared_core:no_fsm", "ooospec:no_fsm:shared_core"),
    ("ooospec:two_waves:oracle:budget=32", "ooospec:two_waves:oracle:budget=32"),
    ("toolspec:no_retrieval:pld=off", "toolspec:no_retrieval:pld=off"),
    ("pld:budget=8", "pld:budget=8"),
    ("toolspec:both_cores:budget=8", "toolspec:both_cores:budget=8"),
    ("ooospec:plain_hint:oracle", "ooospec:oracle:plain_hint"),
    ("ooospec:every_wave:static", "ooospec:static:every_wave"),
    ("ooospec:prefill_chunk=128", "ooospec"),
    ("ooospec:prefill_chunk=0", "ooospec:prefill_chunk=0"),
])
def test_method_names_are_canonical_and_round_trip(text, canonical):
    spec = MethodSpec.parse(text)
    assert spec.name == canonical
    assert MethodSpec.parse(spec.name) == spec


def test_elastic_ooospec_prefills_in_chunks_by_default_and_its_control_in_one_forward():
    from ooospec.bench.methods import ELASTIC_PREFILL_CHUNK

    assert MethodSpec.parse("ooospec").target_prefill_chunk == ELASTIC_PREFILL_CHUNK
    assert MethodSpec.parse("ooospec:prefill_chunk=64").target_prefill_chunk == 64
    assert MethodSpec.parse("ooospec:prefill_chunk=0").target_prefill_chunk is None
    for static in ("ooospec:static", "ooospec:shared_core", "toolspec", "toolspec:both_cores"):
        assert MethodSpec.parse(static).target_prefill_chunk is None
    with pytest.raises(ValueError, match="needs elastic"):
        MethodSpec.parse("ooospec:static:prefill_chunk=64")


def test_method_options_parse_into_fields():
    spec = MethodSpec.parse("ooospec:no_retrieval:blocking:sequential:base_only:delay=0.5:in_process:hint_tokens=8")
    assert (spec.fsm, spec.retrieval, spec.blocking) == (True, False, True)
    assert (spec.sidecar_mode, spec.sidecar, spec.delay_s) == ("sequential", "base_only", 0.5)
    assert (spec.placement, spec.hint_tokens) == ("in_process", 8)
    assert MethodSpec.parse("ooospec:no_prefix_share").sidecar_mode == "wave_no_prefix_share"
    nullable = MethodSpec.parse("ooospec:nullable:slot")
    assert nullable.nullable and nullable.name == "ooospec:slot:nullable" and not MethodSpec.parse("ooospec").nullable
    assert not MethodSpec.parse("ooospec").shares_prefill and MethodSpec.parse("toolspec").shares_prefill
    assert not MethodSpec.parse("toolspec:both_cores").shares_prefill  # its own, faster prefill


def test_plain_hint_is_the_earlier_hint_use():
    """OoO-Spec bounds the hint's share of ToolSpec's tree and gates and follows it; ``plain_hint``
    is the earlier use (no bound, no gate, no follow), and ToolSpec's own budget is never touched."""
    from ooospec.bench.methods import method_budget, method_sources
    from ooospec.decoding.out_of_order import HINT_SHARE

    now, plain = MethodSpec.parse("ooospec"), MethodSpec.parse("ooospec:plain_hint")
    assert method_budget(now, "qwen2.5-coder-0.5b").hint_share == HINT_SHARE
    assert method_budget(plain, "qwen2.5-coder-0.5b").hint_share is None
    assert method_budget(MethodSpec.parse("toolspec"), "qwen2.5-coder-0.5b").hint_share is None
    assert method_budget(MethodSpec.parse("ooospec:hint_room=32"), "qwen2.5-coder-0.5b").hint_share is None
    bank_now, bank_plain = method_sources(now, service=object())[0], method_sources(plain, service=object())[0]
    assert (bank_now.gate, bank_now.follow) == (True, True) and (bank_plain.gate, bank_plain.follow) == (False, False)
    # the wave gate is its own option: on unless every_wave (or blocking, which is never late)
    assert bank_now.wave_gate is not None and bank_plain.wave_gate is not None
    assert method_sources(MethodSpec.parse("ooospec:every_wave"), service=object())[0].wave_gate is None
    assert method_sources(MethodSpec.parse("ooospec:blocking"), service=object())[0].wave_gate is None


@pytest.mark.parametrize("text, message", [
    ("eagle3", "unknown base"),
    ("ar:no_fsm", "applies only to"),
    ("toolspec:blocking", "applies only to"),
    ("toolspec:every_wave", "applies only to"),
    ("ooospec:delay=soon", "needs a float"),
    ("ooospec:delay=-1", "must be >="),
    ("ooospec:oracle:gold", "conflicts"),
    ("ooospec:warp_speed", "unknown option"),
    ("toolspec:nullable", "applies only to"),
    ("toolspec:pld=sometimes", "pld="),
    ("ooospec:both_cores", "applies only to"),
])
def test_bad_method_names_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message) as err:
        MethodSpec.parse(text)
    assert repr(text) in str(err.value)


def test_parse_methods_puts_ar_first_and_drops_duplicates():
    specs = parse_methods(["toolspec", "ooospec:delay=1.0", "ar", "ooospec:delay=1"])
    assert [s.name for s in specs] == ["ar", "toolspec", "ooospec:delay=1"]


def test_ablation_sources_switch_parts_off_and_budgets_resize():
    (toolspec,) = method_sources(MethodSpec.parse("toolspec:no_fsm"))
    assert isinstance(toolspec, ToolSpec) and isinstance(toolspec.fsm, FSMOff)
    assert not isinstance(toolspec.retrieval, RetrievalOff)
    (toolspec,) = method_sources(MethodSpec.parse("toolspec:no_retrieval"))
    assert isinstance(toolspec.retrieval, RetrievalOff) and not isinstance(toolspec.fsm, FSMOff)
    assert method_sources(MethodSpec("ar")) == []
    with pytest.raises(ValueError, match="needs a sidecar"):
        method_sources(MethodSpec("ooospec"))
    assert method_budget(MethodSpec.parse("toolspec:budget=8"), "qwen2.5-coder-0.5b").max_nodes == 8
    # the paper's budget: OoO-Spec's hint competes for ToolSpec's nodes, no room of its own
    for budget in ("", ":budget=8"):
        ours = method_budget(MethodSpec.parse("ooospec" + budget), "qwen2.5-coder-0.5b")
        theirs = method_budget(MethodSpec.parse("toolspec" + budget), "qwen2.5-coder-0.5b")
        assert replace(ours, hint_share=None) == theirs  # the share only bounds the hint inside it
        assert ours.hint_nodes == 0
    # the reserved-room ablation and the ToolSpec control with the same total nodes and depth
    room = method_budget(MethodSpec.parse(HINT_ROOM_ABLATION), "qwen2.5-coder-0.5b")
    control = method_budget(MethodSpec.parse(HINT_ROOM_CONTROL), "qwen2.5-coder-0.5b")
    assert (room.max_nodes, room.hint_nodes, room.total_nodes) == (16, 32, 48)
    assert (control.total_nodes, control.max_depth) == (48, max(room.max_depth, room.hint_depth)) == (48, 32)
    assert MethodSpec.parse("toolspec:depth=32:budget=48").name == HINT_ROOM_CONTROL
    assert HINT_ROOM_ABLATION in ablation_methods([], []) and HINT_ROOM_CONTROL in ablation_methods([], [])
    # both methods on one core each: OoO-Spec in the paper's placement, so the budget is the only difference
    assert budget_methods([8]) == ["ar", "toolspec", "ooospec:static", "toolspec:budget=8", "ooospec:static:budget=8"]
    with pytest.raises(ValueError, match="applies only to"):
        MethodSpec.parse("toolspec:hint_room=8")


def test_fsm_off_proposes_nothing_where_the_fsm_would():
    from ooospec.decoding.base import DecodeContext, DecodeState
    from ooospec.models.formats.llama_json import LlamaJson
    from ooospec.models.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    request = weather_requests("apibank", 1)[0]
    proposals = {}
    for spec in ("toolspec", "toolspec:no_fsm"):
        (source,) = method_sources(MethodSpec.parse(spec))
        ctx = DecodeContext(request, tokenizer, LlamaJson(), tokenizer.encode("weather?"), [tokenizer.eos_token_id])
        source.begin(ctx)
        state = DecodeState(ctx)
        state.commit(tokenizer.encode('{"name": "'))
        proposals[spec] = {d.source for d in source.propose(state)}
    assert "fsm" in proposals["toolspec"] and "fsm" not in proposals["toolspec:no_fsm"]


def test_config_rejects_unknown_benchmark_and_method():
    with pytest.raises(ValueError, match="unknown benchmark"):
        BenchConfig(benchmarks=["apibank", "gsm8k"])
    with pytest.raises(ValueError, match="unknown base"):
        BenchConfig(methods=["ar", "medusa"])
    assert BenchConfig(benchmarks=["dev"]).benchmarks == ["dev"]  # the tuning split (the budget sweep)
    with pytest.raises(ValueError, match="unknown benchmark 'eval_dev'"):
        BenchConfig(benchmarks=["eval_dev"])


# ---------------------------------------------------------------- requests and records




def test_sample_is_seeded_in_file_order_and_warmup_is_outside_it():
    requests = weather_requests("apibank", 20)
    sample = sample_requests(requests, 5, seed=3, benchmark="apibank")
    assert sample == sample_requests(requests, 5, seed=3, benchmark="apibank")
    assert sample != sample_requests(requests, 5, seed=4, benchmark="apibank")
    positions = [requests.index(r) for r in sample]
    assert positions == sorted(positions)
    assert sample_requests(requests, None, 0, "apibank") == requests
    warm = warmup_requests(requests, sample, 2)
    assert len(warm) == 2 and not set(r.id for r in warm) & set(r.id for r in sample)


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_call_directory_is_a_mapping_filled_later(tmp_path):
    calls = CallDirectory(tmp_path / "calls")
    assert calls.get("r/1") is None and len(calls) == 0
    calls.put("r/1", {"name": "f", "arguments": {"x": 1}})
    assert calls["r/1"] == {"name": "f", "arguments": {"x": 1}} and list(calls) == ["r/1"]
    calls.put("r/1", None)
    assert "r/1" not in calls


# ---------------------------------------------------------------- summary math


def fake(method: str, request: str, decode_s: float, total_s: float, tokens: int = 11, forwards: int = 10,
         identical: bool = True, counts: dict | None = None, hint: dict | None = None,
         target: str = "t", benchmark: str = "apibank") -> dict:
    return {"id": f"{target}/{benchmark}/{request}/{method}", "target": target, "benchmark": benchmark,
            "request_id": request, "method": method, "method_base": method.split(":")[0], "sidecar": None,
            "identical_to_ar": identical, "tokens": tokens, "prefill_s": total_s - decode_s, "decode_s": decode_s,
            "total_s": total_s, "forwards": forwards, "target_forwards": forwards + 1, "mean_tree_size": 4.0,
            "source_counts": counts or {"bonus": tokens}, "hint": hint, "trace": [], "shared_prefill": True}


SYNTHETIC = [
    fake("ar", "a", 10.0, 20.0), fake("toolspec", "a", 5.0, 15.0, forwards=4), fake("ooospec", "a", 4.0, 14.0, forwards=2,
         counts={"hint": 6, "fsm": 2, "bonus": 3}, hint={"ready_round": 0, "payload_bytes": 80, "wave_s": 2.0}),
    fake("ar", "b", 30.0, 40.0), fake("toolspec", "b", 10.0, 20.0, forwards=5), fake("ooospec", "b", 10.0, 20.0, forwards=5,
         identical=False, hint={"ready_round": None, "error": "hint not ready before the request finished", "wave_s": None}),
]


def test_speedups_are_means_of_ratios_and_ratios_of_totals():
    table = method_table(SYNTHETIC).set_index("method")
    assert table.loc["ar", "decode_speedup"] == pytest.approx(1.0)
    assert table.loc["toolspec", "decode_speedup"] == pytest.approx((10 / 5 + 30 / 10) / 2)
    assert table.loc["toolspec", "decode_speedup_total"] == pytest.approx(40 / 15)
    assert table.loc["ooospec", "e2e_speedup"] == pytest.approx((20 / 14 + 40 / 20) / 2)
    assert table.loc["ooospec", "mat"] == pytest.approx((10 + 10) / (2 + 5))  # tokens after the first / forwards
    assert table.loc["ooospec", "lossless"] == pytest.approx(0.5)
    # each OoO-Spec against ToolSpec on its own hardware: static (the paper's placement) against ToolSpec
    # on one core; elastic against ToolSpec on both cores, which this run lacks (NaN, never one core)
    static = [r | {"method": "ooospec:static"} if r["method"] == "ooospec" else r for r in SYNTHETIC]
    main = main_table(SYNTHETIC + [r for r in static if r["method"] == "ooospec:static"]).set_index("method")
    assert main.loc["ooospec:static", "decode_vs_toolspec"] == pytest.approx((5 / 4 + 10 / 10) / 2)
    assert main.loc["ooospec:static", "toolspec_cores"] == "one" and main.loc["ooospec", "toolspec_cores"] == "both"
    assert math.isnan(main.loc["ooospec", "decode_vs_toolspec"])
    assert not main.held_out.any()


def test_hint_table_counts_arrivals_shares_and_bytes():
    row = hint_table(SYNTHETIC).iloc[0]
    assert row["arrived: first boundary"] == 1 and row["arrived: not before finish"] == 1
    assert row["hint_share_of_drafted"] == pytest.approx(6 / 8)
    assert row["hint_share_of_output"] == pytest.approx(6 / 22)
    assert row["payload_bytes"] == pytest.approx(80)
    assert row["wave_over_ar_total"] == pytest.approx(2.0 / 20.0)
    assert arrival_bucket(5, None) == "boundary 4+" and arrival_bucket(None, "payload is not JSON") == "rejected"
    assert arrival_bucket(None, "wave skipped: the last 2 waves were still out when their requests finished") == "wave skipped"


def test_the_wave_gate_table_sets_the_gate_beside_its_control():
    from ooospec.report.ablations import wave_gate_table

    skipped = {"submitted": False, "ready_round": None, "error": "wave skipped: the last 2 waves were still out"}
    late = {"submitted": True, "ready_round": None, "error": "hint not ready before the request finished"}
    records = []
    for i, request in enumerate("abcd"):
        records += [fake("ar", request, 10.0, 20.0), fake("toolspec", request, 5.0, 15.0),
                    fake("ooospec:static", request, 5.0, 15.0, hint=late if i < 2 else skipped),
                    fake("ooospec:static:every_wave", request, 6.0, 16.0, hint=late)]
    table = wave_gate_table(records).set_index(["method", "vs"])
    gate = table.loc[("ooospec:static", "ooospec:static:every_wave")]
    assert gate.speedup == pytest.approx(24 / 20) and gate.n == 4
    assert (gate["submitted"], gate["skipped"], gate["in time"]) == (2, 2, 0)
    assert table.loc[("ooospec:static:every_wave", "toolspec")].speedup == pytest.approx(20 / 24)
    assert table.loc[("ooospec:static:every_wave", "toolspec"), "skipped"] == 0
    assert ("ooospec", "toolspec:both_cores") not in table.index  # neither ran: no row


def test_ablation_findings_are_computed_from_the_table():
    records = SYNTHETIC + [fake("ooospec:no_fsm", "a", 8.0, 18.0), fake("ooospec:no_fsm", "b", 20.0, 30.0)]
    table = ablation_table(records)
    no_fsm = next(line for line in ablation_findings(table, records) if line.startswith("OoO-Spec, FSM off"))
    # (4+10)/(8+20) on the same two requests; both are 2x slower, so the interval is [0.50, 0.50]
    assert "0.50x [0.50, 0.50] (n=2) the speed of ooospec (too few requests)" in no_fsm  # n < 5: no verdict
    unpaired = next(line for line in ablation_findings(table) if line.startswith("OoO-Spec, FSM off"))
    assert "0.50x the speed of ooospec (no interval: no verdict)" in unpaired


def test_latency_crossover_interpolates_where_the_hint_stops_paying():
    records = [fake("ar", "a", 10.0, 20.0), fake("toolspec", "a", 5.0, 15.0), fake("ooospec:static", "a", 2.5, 12.5),
               fake("ooospec:delay=1:static", "a", 4.0, 14.0), fake("ooospec:delay=4:static", "a", 10.0, 20.0),
               fake("ooospec", "a", 2.0, 12.0)]  # elastic: not part of the sweep (it runs in the paper's placement)
    sweep = delay_sweep(records)
    assert list(sweep.delay_s) == [0.0, 1.0, 4.0]
    # 5/4 = 1.25 at 1 s, 5/10 = 0.5 at 4 s: crosses 1.0 a third of the way
    assert crossover(sweep) == pytest.approx(1.0 + 0.25 / 0.75 * 3.0)
    assert crossover(sweep[sweep.delay_s < 2]) is None
    assert math.isclose(sweep.iloc[0].decode_vs_toolspec, 2.0)


# ---------------------------------------------------------------- resumable slices on a tiny model


class TinyTargets:
    """A random 2-layer Llama as the only target; counts loads, and can be interrupted at its
    (n+1)-th prefill (a forward over more than one token that starts an empty cache)."""

    def __init__(self, fail_after_prefills: int | None = None):
        self.loads = 0
        self.fail_after_prefills = fail_after_prefills

    def fingerprint(self, name: str) -> str:
        if name != "tiny":
            raise FileNotFoundError(f"no weights for {name}")
        return "tiny0001"

    def load(self, name: str):
        from ooospec.models.formats.llama_json import LlamaJson
        from ooospec.models.target import TargetModel
        from ooospec.models.tiny import tiny_model_and_tokenizer

        self.loads += 1
        model, tokenizer = tiny_model_and_tokenizer(seed=1)
        if self.fail_after_prefills is not None:
            budget = {"left": self.fail_after_prefills}
            original = model.forward

            def forward(*args, **kwargs):
                cache = kwargs.get("cache") or kwargs.get("past_key_values")
                if cache is not None and cache.get_seq_length() == 0:
                    budget["left"] -= 1
                    if budget["left"] < 0:
                        raise KeyboardInterrupt("interrupted mid-slice")
                return original(*args, **kwargs)

            model.forward = forward
        return TargetModel("tiny", model, tokenizer, LlamaJson(), [tokenizer.eos_token_id], "system_tools_json")


FILES = {"apibank": weather_requests("apibank", 6), "bfcl": weather_requests("bfcl", 6)}


def _config(**overrides) -> BenchConfig:
    settings = dict(targets=["tiny", "absent"], benchmarks=["apibank", "bfcl"],
                    methods=["toolspec", "ooospec", "toolspec:no_fsm:no_retrieval"],
                    requests=2, warmup=1, max_new_tokens=6, sidecar="gold", pin_cores=False)
    return BenchConfig(**{**settings, **overrides})


def test_tiny_bench_run_writes_lossless_records_and_resumes_per_slice(artifacts):
    cfg = _config()
    targets = TinyTargets()
    records = run_bench(cfg, targets=targets, load_requests=FILES.__getitem__)
    assert len(records) == 2 * 2 * 4  # benchmarks x requests x (ar, toolspec, ooospec, toolspec:no_fsm:...)
    assert records.skipped_targets.keys() == {"absent"} and "no weights" in " ".join(records.notes())
    assert all(r["identical_to_ar"] for r in records)
    assert [r["method"] for r in records[:4]] == ["ar", "toolspec", "ooospec", "toolspec:no_fsm:no_retrieval"]
    orders = [tuple(r["run_order"] for r in records[i:i + 4]) for i in range(0, len(records), 4)]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders) and len(set(orders)) > 1  # shuffled per request
    def drafted(method: str) -> set[str]:  # sources that put nodes into some verify tree
        return {s for r in records if r["method"] == method for rnd in r["rounds"] for s in rnd["sources"]}

    assert "retrieval" in drafted("toolspec") and not {"fsm", "retrieval"} & drafted("toolspec:no_fsm:no_retrieval")
    ooo = [r for r in records if r["method"] == "ooospec"]
    assert all(r["sidecar"] == "gold" and not r["shared_prefill"] and r["hint"] is not None for r in ooo)
    assert all(r["shared_prefill"] for r in records if r["method"] != "ooospec")
    assert {e["kind"] for e in ooo[0]["trace"]} >= {"sidecar_submit", "prefill_start", "prefill_end", "finish"}
    assert (records.stage.dir / "records.jsonl").read_text().count("\n") == len(records)
    # every record names the arithmetic and CPU that made it, and the tree budget it used (the tiny
    # target has no committed dev acceptance: the fixed default, said so beside each slice)
    assert all(r["arithmetic"]["dtype"] == "float32" and r["arithmetic"]["cpu"] for r in records)
    assert records.arithmetic().startswith("fp32 on a ") and "measured in fp32" in " ".join(records.notes())
    assert all(r["tree_budget"]["max_nodes"] == 16 for r in records)
    assert [c["chosen_by"] for c in records.budget_choices()] == ["fixed default: no committed dev acceptance for "
                                                                   "this target"] * 2

    # a finished slice is never redone: nothing pending, the target is not even loaded
    again = run_bench(cfg, targets=targets, load_requests=FILES.__getitem__)
    assert targets.loads == 1 and [r["id"] for r in again] == [r["id"] for r in records]

    # a removed (unfinished) slice is redone, the other is kept as it was
    kept = slice_path(records.stage, "tiny", "tiny0001", "apibank")
    redo = slice_path(records.stage, "tiny", "tiny0001", "bfcl")
    stamp = kept.stat().st_mtime_ns
    redo.unlink()
    run_bench(cfg, targets=targets, load_requests=FILES.__getitem__)
    assert targets.loads == 2 and redo.exists() and kept.stat().st_mtime_ns == stamp


def test_one_bench_run_reads_its_profile_once(artifacts, monkeypatch):
    """The plan resolves the profile and carries it (`BenchPlan.profile`): the stage key, the
    arithmetic, the sidecar adapter and every target read it from there, not from the YAML again."""
    from ooospec.models import registry

    reads = []
    real = registry._read_yaml
    monkeypatch.setattr(registry, "_read_yaml", lambda path: reads.append(path) or real(path))
    records = run_bench(_config(), targets=TinyTargets(), load_requests=FILES.__getitem__)
    assert records.plan.profile is not None and records.plan.profile.name == "cpu"
    assert len(reads) == 1, f"the profile was read {len(reads)} times: {reads}"


def test_studies_decode_through_the_bench_loop_without_a_stage(artifacts):
    """`decode_requests` is the runner's own loop for the studies and the lossless test: AR first in
    the plan, a record per request and method compared with AR, one slice per benchmark (or one
    named slice), a method's own budget option beside the study's budget; no sidecar, no stage."""
    from ooospec.bench.runner import StudySettings, decode_requests
    from ooospec.decoding.tree import TreeBudget

    target = TinyTargets().load("tiny")
    requests = FILES["apibank"][:2] + FILES["bfcl"][:1]
    records = decode_requests(target, requests, ["toolspec", "toolspec:budget=4:depth=4"],
                              StudySettings(max_new_tokens=6, budget=TreeBudget(8, 8), progress=False))
    assert len(records) == 3 * 3 and all(r["identical_to_ar"] for r in records)
    assert [r["benchmark"] for r in records[::3]] == ["apibank", "apibank", "bfcl"]
    budgets = {r["method"]: r["tree_budget"]["max_nodes"] for r in records}
    assert budgets == {"ar": 8, "toolspec": 8, "toolspec:budget=4:depth=4": 4}
    one = decode_requests(target, requests, ["toolspec"], StudySettings(max_new_tokens=6, slice_name="dev",
                                                                        progress=False))
    assert {r["benchmark"] for r in one} == {"dev"} and not list(artifacts.iterdir())
    with pytest.raises(ValueError, match="runs no sidecar"):
        decode_requests(target, requests, ["ooospec"])


def test_an_interrupted_slice_leaves_no_file_and_is_redone(artifacts):
    cfg = _config(methods=["toolspec"], warmup=0, targets=["tiny"])
    with pytest.raises(KeyboardInterrupt):  # apibank's 2 requests share one prefill each; bfcl's first fails
        run_bench(cfg, targets=TinyTargets(fail_after_prefills=2), load_requests=FILES.__getitem__)
    done = slice_path(bench_stage(cfg), "tiny", "tiny0001", "apibank")
    assert done.exists() and not done.with_name("bfcl.jsonl").exists()
    assert not list(done.parent.glob("*.tmp"))
    records = run_bench(cfg, targets=TinyTargets(), load_requests=FILES.__getitem__)
    assert len(records) == 2 * 2 * 2 and records.stage.done


def test_speedup_intervals_and_the_generated_verdict():
    from ooospec.report.speedups import interval_pivot, speedup_intervals
    from ooospec.report.verdict import Claims, verdict

    records = []
    for i in range(12):  # OoO-Spec (static) 1.25x faster than ToolSpec in the decode phase on every request
        ar_decode = 10.0 + i
        records += [fake("ar", f"r{i}", ar_decode, ar_decode + 5), fake("toolspec", f"r{i}", ar_decode / 2, ar_decode / 2 + 5),
                    fake("ooospec:static", f"r{i}", ar_decode / 2.5, ar_decode / 2.5 + 5)]
    intervals = speedup_intervals(records)
    row = intervals[(intervals.method == "ooospec:static") & (intervals.phase == "decode")].iloc[0]
    assert row.n == 12 and row.speedup == pytest.approx(2.5) and row.verdict == "faster"
    assert "2.50x [2.50, 2.50]" in interval_pivot(intervals, "decode").loc[("t", "apibank", 12), "ooospec:static"]
    claims = Claims.measure(records)
    decode = claims.paper[claims.paper.phase == "decode"].iloc[0]
    assert decode.speedup == pytest.approx(1.25) and decode.verdict == "faster"
    assert claims.equal_hardware.empty and claims.elastic_gain.empty  # neither elastic nor the control ran
    text = verdict(claims)
    assert "OoO-Spec (static) is faster than ToolSpec, 1.25x [1.25, 1.25], n = 12" in text
    assert "1 of 1 cells in the paper's comparison" in text and "Equal hardware" not in text
    assert "n = 12 of 12 with the same output" in text and "oracle" not in text
    # the elastic method beside the both-cores control, and the oracle hint: every claim is stated
    records += [fake("ooospec:oracle:static", f"r{i}", (10.0 + i) / 4, (10.0 + i) / 4 + 5) for i in range(12)]
    records += [fake("toolspec:both_cores", f"r{i}", (10.0 + i) / 2.2, (10.0 + i) / 2.2 + 4) for i in range(12)]
    records += [fake("ooospec", f"r{i}", (10.0 + i) / 2.75, (10.0 + i) / 2.75 + 5) for i in range(12)]
    claims = Claims.measure(records)
    text = verdict(claims)
    assert "The oracle first-call hint" in text and "not an upper bound" in text
    assert "t / apibank: 2.00x [2.00, 2.00], n = 12 of 12 with the same output (faster)" in text
    assert "OoO-Spec (elastic) is faster than ToolSpec on both cores, 1.25x [1.25, 1.25]" in text
    assert "elastic over static" in text and "t / apibank: 1.10x [1.10, 1.10]" in text
    assert "1 of 1 cells in the paper's comparison and 1 of 1 cells on equal hardware" in text
    pivot = claims.pivot("decode")
    assert list(pivot.columns) == ["OoO-Spec (static) / ToolSpec", "OoO-Spec (elastic) / ToolSpec on both cores",
                                   "OoO-Spec elastic / static"]
    assert pivot.loc[("t", "apibank"), "OoO-Spec elastic / static"] == "1.10x [1.10, 1.10] (n = 12)"
    # the wave policy beside the same control: its cell says how many requests had a wave
    for i in range(12):
        wave = i % 3 != 0
        records.append(fake("ooospec:wave=policy", f"r{i}", (10.0 + i) / 2.75, (10.0 + i) / 2.75 + 4, hint={
            "submitted": wave, "schedule": {"schedule": "deferred" if wave else "none", "expected_s": {}, "why": ""}}))
    claims = Claims.measure(records)
    assert "OoO-Spec (wave policy) is faster than ToolSpec on both cores, 1.25x [1.25, 1.25]" in verdict(claims)
    assert "a wave on 8 of 12 requests (deferred 8, none 4))." in verdict(claims)
    assert "OoO-Spec (wave policy) / ToolSpec on both cores" in claims.pivot("decode").columns
    # the headline a reader scans: one table and three sentences
    from ooospec.report.verdict import headline_verdict

    head = headline_verdict(claims, machine="fp32 on a test CPU")
    table, words = head.split("\n\n")
    assert table.splitlines()[2] == ("| t | apibank | 1.25x [1.25, 1.25] (n = 12) | 1.25x [1.25, 1.25] (n = 12) | "
                                     "25% (1.25x of 2.00x) |")
    assert words.startswith("Measured in fp32 on a test CPU; decode phase") and words.count(". ") == 2
    assert "1 of 1 cells of the paper's comparison and 1 of 1 cells on equal hardware" in words


def test_speedups_are_over_the_same_work_and_a_near_tie_flip_is_left_out():
    """A request whose output differs from the reference's (a near-tie flip that wrote a much longer
    output) did other work: it leaves the primary ratio and its n, and stays in the all-requests ones."""
    from ooospec.report.speedups import interval_pivot, speedup_intervals
    from ooospec.report.verdict import Claims, verdict

    def out(n: int, flip: bool = False) -> list[int]:
        return [7] * n if not flip else [7, 8] + [9] * (n - 2)

    ar_s = [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    ts_s = [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    ooo_s = [4.0, 5.0, 5.0, 6.0, 7.0, 30.0]  # the last request flips and writes 40 tokens instead of 10
    records = []
    for i, (a, t, o) in enumerate(zip(ar_s, ts_s, ooo_s)):
        flip = i == 5
        records += [fake("ar", f"r{i}", a, a + 1, tokens=10) | {"output_ids": out(10)},
                    fake("toolspec", f"r{i}", t, t + 1, tokens=10) | {"output_ids": out(10)},
                    fake("ooospec", f"r{i}", o, o + 1, tokens=40 if flip else 10, identical=not flip)
                    | {"output_ids": out(40 if flip else 10, flip)}]
    intervals = speedup_intervals(records, phases=("decode",))
    row = intervals[intervals.method == "ooospec"].iloc[0]
    assert row.n == 5 and row.n_all == 6
    assert row.speedup == pytest.approx(sum(ar_s[:5]) / sum(ooo_s[:5]))
    assert row.mean_of_ratios == pytest.approx(sum(a / o for a, o in zip(ar_s[:5], ooo_s[:5])) / 5)
    assert row.speedup_all == pytest.approx(sum(ar_s) / sum(ooo_s))
    assert row.speedup_per_token == pytest.approx((sum(ar_s) / 60) / (sum(ooo_s) / 90))
    assert row.ci_low <= row.speedup <= row.ci_high and row.verdict == "faster"
    assert intervals[intervals.method == "toolspec"].iloc[0].n == 6  # same output on every request
    assert interval_pivot(intervals, "decode").index.get_level_values("n").tolist() == [6]
    # against ToolSpec the same request is left out the same way
    static = [r | {"method": "ooospec:static"} if r["method"] == "ooospec" else r for r in records]
    claims = Claims.measure(static, phases=("decode",))
    h2h = claims.paper
    assert h2h.iloc[0].n == 5 and h2h.iloc[0].speedup == pytest.approx(sum(ts_s[:5]) / sum(ooo_s[:5]))
    text = verdict(claims, machine="fp32 on a 2-core AVX2 CPU (AMD EPYC)")
    assert text.splitlines()[0] == "Measured in fp32 on a 2-core AVX2 CPU (AMD EPYC)."
    assert f"{h2h.iloc[0].speedup:.2f}x" in text and "n = 5 of 6 with the same output" in text
    assert "Measured in" not in verdict(claims)


def test_without_any_request_of_the_same_work_there_is_no_speedup_and_no_verdict():
    from ooospec.report.intervals import TOO_FEW
    from ooospec.report.speedups import speedup_intervals
    from ooospec.report.verdict import Claims, verdict

    records = []
    for i in range(6):
        records += [fake("ar", f"r{i}", 10.0, 11.0) | {"output_ids": [1, 2]},
                    fake("toolspec", f"r{i}", 5.0, 6.0) | {"output_ids": [1, 2]},
                    fake("ooospec:static", f"r{i}", 4.0, 5.0, identical=False) | {"output_ids": [1, 3]}]
    intervals = speedup_intervals(records, phases=("decode",))
    row = intervals[intervals.method == "ooospec:static"].iloc[0]
    assert row.n == 0 and row.n_all == 6 and math.isnan(row.speedup) and math.isnan(row.ci_low)
    assert row.verdict == TOO_FEW and row.speedup_all == pytest.approx(2.5)
    assert "no request of 6 with the same output" in verdict(Claims.measure(records, phases=("decode",)))


def test_stored_records_without_outputs_are_judged_by_their_flag_against_ar_only():
    from ooospec.report.speedups import speedup_intervals

    records = []
    for i in range(6):  # no output_ids: AR judges by identical_to_ar, ToolSpec cannot judge at all
        records += [fake("ar", f"r{i}", 10.0, 11.0), fake("toolspec", f"r{i}", 5.0, 6.0),
                    fake("ooospec", f"r{i}", 4.0, 5.0, identical=i != 0)]
    over_ar = speedup_intervals(records, phases=("decode",)).set_index("method")
    assert over_ar.loc["ooospec", "n"] == 5 and over_ar.loc["toolspec", "n"] == 6
    h2h = speedup_intervals(records, reference="toolspec", methods=["ooospec"], phases=("decode",))
    assert h2h.iloc[0].n == 6


def test_the_equal_hardware_control_decodes_on_both_cores(artifacts):
    cfg = _config(targets=["tiny"], benchmarks=["bfcl"], methods=["toolspec", "toolspec:both_cores"], pin_cores=True)
    records = run_bench(cfg, targets=TinyTargets(), load_requests=FILES.__getitem__)
    control = [r for r in records if r["method"] == "toolspec:both_cores"]
    assert len(control) == 2 and not any(r["shared_prefill"] for r in control)
    assert all(r["identical_to_ar"] or r["near_tie"] for r in control)


def test_a_hung_sidecar_is_restarted_and_the_restart_recorded():
    from ooospec.bench.placement import CorePlan
    from ooospec.bench.plan import BenchPlan
    from ooospec.bench.runner import SliceRunner

    class HungService:
        timeout_s, alive, restarts = 1.0, True, 0

        def wait_idle(self, timeout_s=None):
            return self.restarts > 0 or not getattr(self, "decoded", False)

        def restart(self):
            self.restarts += 1

    class Pool:
        cores = CorePlan(None, None)

        def __init__(self):
            self.hung = HungService()

        def service(self, spec):
            return self.hung

    targets = TinyTargets()
    target = targets.load("tiny")
    pool = Pool()
    runner = SliceRunner(_config(), BenchPlan("gold", None, [MethodSpec("toolspec")], {}, []), target, pool, None)
    request = FILES["bfcl"][0]
    pool.hung.decoded = True  # the job of this decode is never answered
    result = runner.decode_one(MethodSpec("toolspec"), [], request, 4, None)
    assert pool.hung.restarts == 1
    assert [e["reason"] for e in result.trace.of_kind("sidecar_restarted")] == ["still busy after 1 s"]


def test_a_request_the_target_cannot_be_prompted_with_is_recorded_not_fatal(artifacts):
    from ooospec.report.tables import main_table

    empty = Request("apibank-empty", "apibank", "eval", [], FILES["apibank"][0].tools, None)
    files = {"apibank": [empty] + FILES["apibank"][:2], "bfcl": FILES["bfcl"]}
    cfg = _config(targets=["tiny"], benchmarks=["apibank"], methods=["toolspec"], requests=None, warmup=0)
    records = run_bench(cfg, targets=TinyTargets(), load_requests=files.__getitem__)
    assert {r["request_id"] for r in records} == {r.id for r in FILES["apibank"][:2]}
    assert [f["request_id"] for f in records.failed] == ["apibank-empty"]
    assert "empty dialogue" in records.failed[0]["error"] and any("apibank-empty" in n for n in records.notes())
    assert set(main_table(records).failed_requests) == {1}


def test_method_order_is_seeded_per_request_and_puts_ar_before_an_oracle_method():
    methods = parse_methods(["ar", "pld", "toolspec", "ooospec", "toolspec:both_cores"])
    orders = {tuple(m.name for m in method_order(methods, 0, "bfcl", f"r{i}")) for i in range(40)}
    assert len(orders) > 10 and {o[0] for o in orders} >= {"ar", "pld", "toolspec"}  # nobody always first
    assert method_order(methods, 0, "bfcl", "r1") == method_order(methods, 0, "bfcl", "r1")  # a rerun repeats it
    oracle = lambda spec: spec.base == "ooospec"
    for i in range(40):
        names = [m.name for m in method_order(methods, 0, "bfcl", f"r{i}", oracle)]
        assert names.index("ar") < names.index("ooospec") and sorted(names) == sorted(m.name for m in methods)


def test_code_fingerprint_follows_the_source_and_refuses_a_missing_part():
    from ooospec.stage import code_fingerprint

    assert code_fingerprint("stage.py") == code_fingerprint("stage.py")
    assert code_fingerprint("stage.py") != code_fingerprint("stage.py", "paths.py")
    assert len(code_fingerprint(*BENCH_CODE)) == 12
    with pytest.raises(FileNotFoundError, match="no_such_module"):
        code_fingerprint("no_such_module")


def test_prefill_ratios_set_the_own_prefill_against_the_shared_one():
    from ooospec.report.speedups import prefill_ratios

    records = []
    for i in range(8):  # OoO-Spec's own prefill takes 6 s where the shared one took 5 s
        records += [fake("ar", f"r{i}", 10.0, 15.0), fake("ooospec", f"r{i}", 4.0, 10.0)]
    row = prefill_ratios(records).iloc[0]
    assert row.phase == "prefill" and row.n == 8 and row["shared / own prefill"] == pytest.approx(5 / 6)
    assert row.verdict == "slower"


@pytest.mark.parametrize("text, kind", [
    ("API-Request: [GetWeather(city='Paris')]", "API-Bank's own API-Request: syntax"),
    ('{"name": "GetWeather", "argument": 3', "call-like, not valid in its surface"),
    ("Sure! The weather in Paris is sunny.", "prose (no call)"),
])
def test_an_unparsed_output_is_labelled_by_what_it_is(text, kind):
    from ooospec.report.ar_accuracy import output_kind

    assert output_kind(text) == kind


def test_compact_tables_keep_the_primary_statistic_under_readable_names():
    from ooospec.report.tables import compact, main_table

    table = compact(main_table(SYNTHETIC), "main")
    assert table.index.names == ["target", "benchmark", "method"]
    assert {"n", "decode x AR", "e2e x AR", "MAT", "= AR"} <= set(table.columns)
    assert len(table.columns) <= 9


def test_derived_profiles_bench_the_committed_sidecar_of_their_ancestor():
    """cpu-fp32 and cpu-compiled change arithmetic or kernels, not weights: they must not fall back
    to the oracle sidecar because no adapter was trained under their own name."""
    from ooospec.bench.plan import find_sidecar_adapter

    committed = find_sidecar_adapter("cpu")
    assert committed is not None
    assert find_sidecar_adapter("cpu-fp32") == committed == find_sidecar_adapter("cpu-compiled")
