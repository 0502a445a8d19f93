"""`make reproduce`'s time plan: the estimate follows the machine, reductions are stated and in order."""

from __future__ import annotations

import json

import pytest
import yaml

from ooospec.bench.methods import MethodSpec
from ooospec.bench.config import notebook_parameters
from ooospec.data.request import Request
from ooospec.reproduce.time_plan import (Work, audit_work, bench_cells, bench_seconds, estimate, make_plan, makespan,
                                         method_seconds, sidecar_seconds, slice_seconds, submitted_waves, write_plan)
from ooospec.sidecar.specs import oracle_sidecar
from ooospec.studies.machine_calibration import SidecarSpeed, Speed, measure_sidecar, measure_speed
from ooospec.models.tiny import tiny_model_and_tokenizer, tiny_target

TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
NOTEBOOKS = ("02_sidecar", "03_toolspec", "05_bench", "06_ablations", "07_timelines", "08_arithmetic")


def speed(target: str, step: float) -> Speed:
    """A machine whose verify at 8 nodes costs 3x a step and whose prefill costs 10 steps per 400 tokens."""
    verify = {4: 2.5 * step, 8: 3 * step, 16: 4 * step, 32: 6 * step}
    return Speed(target, step, step, verify, verify, step / 40, step / 70, 8)


def works() -> dict[str, dict[str, Work]]:
    return {t: audit_work(t, 160) for t in TARGETS}


def params() -> dict[str, dict]:
    return {nb: notebook_parameters(nb) for nb in NOTEBOOKS}


def plan_for(step: float, minutes: float | None = 90, cores: int = 2):
    return make_plan(minutes, {t: speed(t, step) for t in TARGETS}, works(), {}, "fp32 on a test machine", params(),
                     cores=cores)


def test_the_committed_audit_gives_work_per_benchmark_within_the_cap():
    for target in TARGETS:
        per_benchmark = audit_work(target, 160)
        assert set(per_benchmark) == {"apibank", "toolalpaca", "bfcl"}
        for work in per_benchmark.values():
            assert 0 < work.tokens <= 160 and work.prompt_tokens > 100
            assert work.forwards["toolspec"] < work.forwards["ar"]  # ToolSpec commits more than one per forward


def test_a_target_without_an_audit_gets_a_generic_request(tmp_path):
    work = audit_work("no-such-target", 64, tmp_path)["bfcl"]
    assert work.tokens == 32 and work.forwards["ar"] == 32


def test_the_estimate_counts_prefills_and_forwards():
    work = Work(400.0, 20.0, {"ar": 20.0, "pld": 10.0, "toolspec": 5.0})
    fast = speed("qwen2.5-coder-0.5b", 0.1)
    assert method_seconds(MethodSpec.parse("ar"), work, fast) == pytest.approx(2.0)  # shares the prefill
    assert method_seconds(MethodSpec.parse("toolspec"), work, fast) == pytest.approx(1.5)  # 5 verifies at 3x
    own = method_seconds(MethodSpec.parse("ooospec"), work, fast)
    assert own == pytest.approx(1.0 + 1.5)  # its own prefill (400 tokens at 2.5 ms) + the same verifies
    delayed = method_seconds(MethodSpec.parse("ooospec:delay=2"), work, fast)
    assert delayed == pytest.approx(own + 2.0)
    one = slice_seconds(["ar", "toolspec"], work, fast, requests=1, warmup=0)
    two = slice_seconds(["ar", "toolspec"], work, fast, requests=2, warmup=0)
    assert two - one == pytest.approx(1.0 + 2.0 + 1.5)  # the shared prefill once, then each method


def test_a_slice_pays_each_distinct_sidecar_start_and_every_late_wave():
    """The bench waits for an idle sidecar after each request, so a wave longer than its request is
    paid in full; the gate submits five of twenty when every wave is late (2 in, 2 out, 1, 4 out, 1,
    8 out, 1, 16 out...), its control (``every_wave``) all twenty."""
    sidecar = SidecarSpeed(start_s=5.0, wave_s=3.0, waves=3)
    gated, every = MethodSpec.parse("ooospec:static"), MethodSpec.parse("ooospec:static:every_wave")
    assert submitted_waves(gated, 20) == 5 and submitted_waves(every, 20) == 20
    request_s = {gated.name: 1.0, every.name: 1.0}
    assert sidecar_seconds([gated, every], request_s, sidecar, 20) == pytest.approx(5.0 + 5 * 2.0 + 20 * 2.0)
    on_time = {gated.name: 4.0, every.name: 4.0}
    assert sidecar_seconds([gated, every], on_time, sidecar, 20) == pytest.approx(5.0)  # one sidecar, no wait
    oracle, blocking = MethodSpec.parse("ooospec:oracle"), MethodSpec.parse("ooospec:blocking")
    delayed = MethodSpec.parse("ooospec:delay=5:static")
    others = {oracle.name: 1.0, blocking.name: 1.0, delayed.name: 1.0}
    # three sidecars (the oracle, the bench's, a delayed one); only the delayed wave is late: 5 + 3 - 1
    assert sidecar_seconds([oracle, blocking, delayed], others, sidecar, 1) == pytest.approx(3 * 5.0 + 7.0)
    assert sidecar_seconds([MethodSpec.parse("ar"), MethodSpec.parse("toolspec")], {}, sidecar, 20) == 0.0


def test_a_slice_with_a_calibrated_sidecar_adds_exactly_its_sidecar_seconds():
    work = Work(400.0, 20.0, {"ar": 20.0, "pld": 10.0, "toolspec": 5.0})
    fast = speed("qwen2.5-coder-0.5b", 0.1)
    methods = ["ar", "toolspec", "ooospec:static", "ooospec:static:every_wave"]
    sidecar = SidecarSpeed(start_s=4.0, wave_s=10.0, waves=3)
    without = slice_seconds(methods, work, fast, requests=10, warmup=1)
    specs = [MethodSpec.parse(m) for m in methods]
    shared = work.prompt_tokens * fast.prefill_token_s
    request_s = {s.name: method_seconds(s, work, fast) + (shared if s.shares_prefill else 0.0) for s in specs}
    added = sidecar_seconds(specs, request_s, sidecar, 10)
    assert added > 4.0  # its waves outlast the requests
    assert slice_seconds(methods, work, fast, requests=10, warmup=1, sidecar=sidecar) == pytest.approx(without + added)


def test_the_plan_counts_and_prints_the_sidecar_it_calibrated():
    speeds = {t: speed(t, 0.02) for t in TARGETS}
    sidecar = SidecarSpeed(start_s=8.0, wave_s=2.5, waves=3, calibrate_s=20.0)
    before = make_plan(None, speeds, works(), {}, "fp32 on a test machine", params(), cores=2)
    after = make_plan(None, speeds, works(), {}, "fp32 on a test machine", params(), cores=2, sidecar=sidecar)
    stage = lambda plan, name: next(s.seconds for s in plan.full if s.stage == name)  # noqa: E731
    for name in ("03_toolspec", "06_ablations"):
        assert stage(after, name) > stage(before, name)
    assert stage(after, "calibration") == pytest.approx(stage(before, "calibration") + 20.0)
    assert after.to_dict()["sidecar"]["wave_s"] == 2.5
    assert any(line.startswith("  sidecar: start 8.0 s, wave 2.50 s") for line in after.lines())


def test_measure_sidecar_starts_a_process_and_times_its_waves():
    tools = [{"name": "f", "description": "f", "parameters": {"type": "object", "properties": {}}}]
    requests = [Request(f"r{i}", "test", "eval", [{"role": "user", "content": "x"}], tools, None) for i in range(3)]
    measured = measure_sidecar(oracle_sidecar({}, wave_s=0.2), requests)
    assert measured.waves == 2 and measured.start_s > 0
    assert 0.2 <= measured.wave_s < 5.0 and measured.calibrate_s >= measured.start_s
    with pytest.raises(ValueError, match="at least 2 requests"):
        measure_sidecar(oracle_sidecar({}), requests[:1])


def test_a_fast_machine_runs_the_full_plan():
    plan = plan_for(0.005)
    assert plan.fits and not plan.reasons and not plan.overrides
    assert plan.planned_minutes == plan.full_minutes <= 90


def test_no_budget_runs_the_full_plan_on_any_machine():
    plan = plan_for(0.5, minutes=None)
    assert not plan.reasons and not plan.overrides and plan.full_minutes > 90


def test_a_slow_machine_gets_stated_reductions_in_order_until_it_fits():
    plan = plan_for(0.1)
    assert plan.fits and plan.planned_minutes <= 90 < plan.full_minutes
    assert plan.reasons[0].startswith("PLD left out")
    assert sum(r.startswith("n = ") for r in plan.reasons) <= 1  # only the n that runs is stated
    bench = plan.overrides["05_bench"]
    assert "pld" not in bench["methods"]
    for reader in ("03_toolspec", "04_ooospec", "07_timelines"):  # the chapters reading 05's run
        assert plan.overrides[reader]["bench"] == bench
    note = plan.note()
    assert "fp32 on a test machine" in note and "PLD" in note and f"{plan.full_minutes:.0f} min" in note


def test_the_makespan_puts_the_longest_cells_first_onto_the_freest_slot():
    assert makespan([3.0, 1.0, 2.0], 1) == 6.0  # one slot: one after another
    assert makespan([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0  # LPT (3+2+2 | 3+2), not the best 6 (3+3 | 2+2+2)
    assert makespan([5.0, 1.0, 1.0], 8) == 5.0  # more slots than cells: the longest cell
    assert makespan([], 4) == 0.0


def test_two_cores_plan_as_before_and_write_no_executor(tmp_path):
    """The sum of the cells, one after another, and the parameter files of a 2-core plan."""
    plan = plan_for(0.1)
    assert plan.cores == 2 and not plan.parallel
    assert all("executor" not in values and "executor" not in values.get("bench", {}) for values in plan.overrides.values())
    speeds = {t: speed(t, 0.1) for t in TARGETS}
    chosen = {nb: {**values, **plan.overrides.get(nb, {})} for nb, values in params().items()}
    bench = chosen["05_bench"]
    assert bench_seconds(bench, speeds, works(), {}) == sum(bench_cells(bench, speeds, works(), {}))
    assert [s.seconds for s in plan.planned[1:]] == [s.seconds for s in estimate(chosen, speeds, works(), {})]
    assert "Ray" not in plan.note()
    full = plan_for(0.005)
    assert not full.overrides and full.to_dict()["note"] == ""


def test_eight_cores_run_the_bench_cells_as_ray_tasks_four_at_once(tmp_path):
    speeds = {t: speed(t, 0.1) for t in TARGETS}
    two, eight = plan_for(0.1, minutes=None), plan_for(0.1, minutes=None, cores=8)
    assert eight.parallel and eight.slots == 4
    stage = lambda plan, name: next(s.seconds for s in plan.full if s.stage == name)  # noqa: E731
    bench, ablation = params()["05_bench"], params()["06_ablations"]
    cells = bench_cells(bench, speeds, works(), {})
    assert len(cells) == 6
    bench_two = stage(two, "03_toolspec") - sum(cells)  # the verify-cost curve, the same on any core count
    assert stage(eight, "03_toolspec") == pytest.approx(bench_two + makespan(cells, 4))
    assert makespan(cells, 4) < sum(cells)
    assert stage(eight, "06_ablations") <= stage(two, "06_ablations")
    for name in ("02_sidecar", "07_timelines", "08_arithmetic"):  # not bench cells: as on two cores
        assert stage(eight, name) == stage(two, name)
    assert eight.full_minutes < two.full_minutes

    write_plan(eight, tmp_path)
    for notebook in ("05_bench", "06_ablations"):
        assert yaml.safe_load((tmp_path / f"{notebook}.yaml").read_text())["executor"] == "ray"
    assert yaml.safe_load((tmp_path / "03_toolspec.yaml").read_text())["bench"] == {"executor": "ray"}  # 03 decodes 05's run
    assert not eight.reasons and "local Ray tasks (4 at once" in eight.note()
    assert json.loads((tmp_path / "plan.json").read_text())["note"] == eight.note()


def test_the_plan_prints_its_total_for_two_eight_and_sixteen_cores():
    for plan in (plan_for(0.1), plan_for(0.1, cores=8), plan_for(0.1, minutes=None, cores=16)):
        assert [c.cores for c in plan.by_cores] == [2, 8, 16]
        fulls = [c.full_minutes for c in plan.by_cores]
        planned = [c.planned_minutes for c in plan.by_cores]
        assert fulls == sorted(fulls, reverse=True)
        # the planned totals need not fall: more cores may leave more of the plan within the budget
        assert all(p <= f and (not plan.minutes or p <= plan.minutes) for p, f in zip(planned, fulls))
        line = next(ln for ln in plan.lines() if ln.startswith("  cores: "))
        assert line.startswith(f"  cores: 2 -> {fulls[0]:.0f} min, 8 -> {fulls[1]:.0f} min, 16 -> {fulls[2]:.0f} min")
        assert "local Ray tasks" in line
        assert plan.to_dict()["by_cores"][1]["cores"] == 8
    assert plan_for(0.1).by_cores[0].full_minutes == plan_for(0.1).full_minutes  # the 2-core entry is the plan itself


def test_more_cores_reduce_their_own_estimate_less():
    """The reductions apply to the parallel estimate: eight cores cut no more than two do."""
    two, eight = plan_for(0.1), plan_for(0.1, cores=8)
    assert two.reasons and len(eight.reasons) <= len(two.reasons)
    assert eight.reasons == two.reasons[:len(eight.reasons)] or eight.reasons[-1].startswith("n = ")
    assert eight.overrides["05_bench"]["executor"] == "ray" and eight.overrides["06_ablations"]["executor"] == "ray"
    assert "reduced" not in " ".join(ln for ln in eight.lines() if "Ray" in ln and ln.startswith("  parallel"))


def test_a_cores_what_if_prints_and_leaves_the_plan_files_alone(tmp_path, monkeypatch, capsys):
    import ooospec.reproduce.time_plan as time_plan

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "artifacts"))
    monkeypatch.setattr(time_plan, "calibrate", lambda target, profile: speed(target, 0.1))
    monkeypatch.setattr(time_plan, "calibrate_sidecar", lambda profile: SidecarSpeed(5.0, 2.0, 3, 12.0))
    assert time_plan.main(["--cores", "16", "--minutes", "0"]) == 0
    printed = capsys.readouterr().out
    assert "reproduce plan on" in printed and "sidecar: start 5.0 s, wave 2.00 s" in printed
    assert not (tmp_path / "artifacts" / "reproduce-plan").exists()
    assert time_plan.main(["--cores", "8", "--out", str(tmp_path / "what-if")]) == 0
    assert yaml.safe_load((tmp_path / "what-if" / "06_ablations.yaml").read_text())["executor"] == "ray"


def test_a_hopeless_machine_runs_the_least_plan_and_says_it_does_not_fit():
    plan = plan_for(2.0)
    assert not plan.fits
    assert plan.overrides["05_bench"]["requests"] == 10
    assert any("still over" in line for line in plan.lines())


@pytest.mark.parametrize("cores", [2, 8])
def test_the_plan_files_are_parameters_the_notebooks_have(tmp_path, cores):
    plan = plan_for(0.5, cores=cores)
    write_plan(plan, tmp_path)
    written = sorted(p.stem for p in tmp_path.glob("*.yaml"))
    assert written == sorted(plan.overrides)
    for notebook in written:
        values = yaml.safe_load((tmp_path / f"{notebook}.yaml").read_text())
        declared = notebook_parameters(notebook)
        assert set(values) <= set(declared), notebook
        assert values["plan"] == plan.note()
        if "bench" in values:  # 03/04/07 pass it to notebook_config("05_bench", ..., strict=True)
            assert set(values["bench"]) <= set(notebook_parameters("05_bench"))
    saved = json.loads((tmp_path / "plan.json").read_text())
    assert saved["note"] == plan.note() and saved["planned_minutes"] == round(plan.planned_minutes, 1)


def test_measure_speed_times_a_real_model():
    model, tokenizer = tiny_model_and_tokenizer()
    target = tiny_target(model, tokenizer)
    measured = measure_speed(target, list(range(3, 40)), "tiny", repeats=1)
    assert measured.step_s > 0 and measured.prefill_token_s > 0
    assert set(measured.verify_s) == {4, 8, 16, 32} and measured.nodes > 0  # no committed acceptance: the default
    assert measured.verify(12) == pytest.approx((measured.verify_s[8] + measured.verify_s[16]) / 2)


def test_make_reproduce_plans_after_the_data_chapter_and_runs_every_later_chapter_under_it():
    """The Makefile's order: 00 (the calibration times a dev request), the plan, then 01-07 with -f."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("no make")
    root = Path(__file__).resolve().parents[1]
    dry = subprocess.run(["make", "-n", "-B", "reproduce"], cwd=root, capture_output=True, text=True, check=True).stdout
    lines = dry.splitlines()
    plan = next(i for i, ln in enumerate(lines) if "ooospec.reproduce.time_plan" in ln)
    runs = {ln.split("notebooks/")[1].split(".ipynb")[0]: i for i, ln in enumerate(lines)
            if "papermill" in ln and "notebooks/0" in ln}
    assert runs["00_data"] < plan < min(i for nb, i in runs.items() if nb != "00_data")
    assert "--minutes 90" in lines[plan]
    assert dry.count("reproduce-plan/$*.yaml") == 0  # expanded per chapter
    assert all(f"reproduce-plan/{nb}.yaml" in dry for nb in runs)


def test_a_committed_canonical_run_lets_the_bench_re_measure_fewer_cells_before_n():
    from ooospec.reproduce.time_plan import CanonicalCover

    cells = frozenset((t, b) for t in TARGETS for b in ("apibank", "toolalpaca", "bfcl"))
    n = params()["05_bench"]["requests"]
    plain = plan_for(0.1)
    covered = make_plan(90, {t: speed(t, 0.1) for t in TARGETS}, works(), {}, "fp32 on a test machine", params(),
                        cores=2, canonical=CanonicalCover(cells, n))
    assert covered.fits
    stated = [r for r in covered.reasons if r.startswith("the results bench re-measures")]
    assert len(stated) == 1 and "canonical run stands for its other cells" in stated[0]
    bench = covered.overrides["05_bench"]
    kept = [(t, b) for t in bench.get("targets", params()["05_bench"]["targets"])
            for b in bench.get("benchmarks", params()["05_bench"]["benchmarks"])]
    assert 0 < len(kept) < len(cells)
    # fewer cells come before a smaller n: the kept cells run at the canonical n where that fits
    assert bench.get("requests", n) >= plain.overrides["05_bench"].get("requests", n)
    # a canonical run at another n, or without one of the cells, changes nothing
    other_n = make_plan(90, {t: speed(t, 0.1) for t in TARGETS}, works(), {}, "fp32 on a test machine", params(),
                        cores=2, canonical=CanonicalCover(cells, n + 5))
    assert other_n.reasons == plain.reasons
    partial = make_plan(90, {t: speed(t, 0.1) for t in TARGETS}, works(), {}, "fp32 on a test machine", params(),
                        cores=2, canonical=CanonicalCover(frozenset(list(cells)[1:]), n))
    assert partial.reasons == plain.reasons


def test_the_arithmetic_study_is_estimated_per_measurement_it_makes():
    """08 measures fp32 models twice (packed, plain), bf16 ones with fp32 logits twice (with them, with
    their own head) and, where bf16 runs, fp32 at its own price."""
    from dataclasses import replace

    from ooospec.reproduce.time_plan import FP32_BESIDE_BF16, LOAD_S, arithmetic_seconds, dev_work, floor_table_seconds
    from ooospec.studies.forward_cost import study_measurements

    fp32_only = {"cpu-fp32": "float32", "cpu": "float32"}
    with_bf16 = {"cpu-fp32": "float32", "cpu": "bfloat16"}
    assert study_measurements(fp32_only) == [("cpu-fp32", "float32")] * 2 + [("cpu", "float32")] * 2
    assert study_measurements(with_bf16) == [("cpu-fp32", "float32")] * 2 + [("cpu", "bfloat16")] * 4

    arith = {"targets": ["qwen2.5-coder-0.5b"], "arithmetic_threads": [1], "arithmetic_repeats": 5}
    fast = replace(speed("qwen2.5-coder-0.5b", 0.1), dtype="bfloat16")
    floor = floor_table_seconds(arith, fast, dev_work(works()[fast.target]).prompt_tokens)  # the floor table: once
    assert floor > LOAD_S
    on_fp32 = arithmetic_seconds(arith, {fast.target: replace(fast, dtype="float32")}, works(), fp32_only) - floor
    on_bf16 = arithmetic_seconds(arith, {fast.target: fast}, works(), with_bf16) - floor
    one = (on_fp32 - 2 * LOAD_S) / 4  # four measurements at the speeds' own price, two profiles loaded
    assert one > 5 * 10 * 0.1  # at least the repeats over the curve's rows, each a step or more
    assert on_bf16 - 2 * LOAD_S == pytest.approx(one * (4 + 2 * FP32_BESIDE_BF16))  # bf16: fp32 logits and own head
