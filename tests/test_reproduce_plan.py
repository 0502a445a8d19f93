"""`make reproduce`'s time plan: the estimate follows the machine, reductions are stated and in order."""

from __future__ import annotations

import json

import pytest
import yaml

from ooospec.bench.methods import MethodSpec
from ooospec.bench.config import notebook_parameters
from ooospec.reproduce.time_plan import Work, audit_work, make_plan, method_seconds, slice_seconds, write_plan
from ooospec.studies.machine_calibration import Speed, measure_speed
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


def plan_for(step: float, minutes: float | None = 90):
    return make_plan(minutes, {t: speed(t, step) for t in TARGETS}, works(), {}, "fp32 on a test machine", params())


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


def test_a_hopeless_machine_runs_the_least_plan_and_says_it_does_not_fit():
    plan = plan_for(2.0)
    assert not plan.fits
    assert plan.overrides["05_bench"]["requests"] == 10
    assert any("still over" in line for line in plan.lines())


def test_the_plan_files_are_parameters_the_notebooks_have(tmp_path):
    plan = plan_for(0.5)
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
