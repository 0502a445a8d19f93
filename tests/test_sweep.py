"""The sweep: bench cells as Ray tasks give the sequential bench's records, failed cells are
retried then reported while the others finish, and bad input fails in one line.

The Ray tests share one local instance (``ray.init(num_cpus=2)``, shut down after the module);
its cells run the real bench loop on the random 2-layer Llama of `ooospec.models.tiny`, so no
downloaded weights are needed. The tests that need no cluster come first, before it starts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ooospec.bench.config import BenchConfig
from ooospec.bench.runner import run_bench
from ooospec.bench.slices import bench_stage, slice_path
from ooospec.bench.config import notebook_config, notebook_parameters
from ooospec.reproduce.ray_sweep import SweepError, reserved_cores, run_cells, run_sweep
from weather_requests import weather_requests




FILES = {"apibank": weather_requests("apibank", 5), "bfcl": weather_requests("bfcl", 5)}


class TinyTargets:
    """Picklable targets for Ray tasks: ``tiny`` (a random 2-layer Llama), ``broken`` (raises at
    load, counting its attempts in ``attempts_file``) and ``crashing`` (its process dies at load)."""

    def __init__(self, attempts_file: str | None = None):
        self.attempts_file = attempts_file

    def fingerprint(self, name: str) -> str:
        if name not in ("tiny", "broken", "crashing"):
            raise FileNotFoundError(f"no weights for {name}")
        return f"{name}-01"

    def load(self, name: str):
        from ooospec.models.formats.llama_json import LlamaJson
        from ooospec.models.target import TargetModel
        from ooospec.models.tiny import tiny_model_and_tokenizer

        if name == "broken":
            with open(self.attempts_file, "a") as handle:
                handle.write("attempt\n")
            raise RuntimeError("tiny target broken on purpose")
        if name == "crashing":
            os._exit(3)  # the worker dies, as on a segfault or an OOM kill
        model, tokenizer = tiny_model_and_tokenizer(seed=1)
        return TargetModel("tiny", model, tokenizer, LlamaJson(), [tokenizer.eos_token_id], "system_tools_json")


def _config(**overrides) -> BenchConfig:
    settings = dict(targets=["tiny"], benchmarks=["apibank", "bfcl"], methods=["toolspec", "ooospec:blocking"],
                    requests=3, warmup=1, max_new_tokens=6, sidecar="gold", pin_cores=True)
    return BenchConfig(**{**settings, **overrides})


@pytest.fixture()
def artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "artifacts"))
    return tmp_path / "artifacts"


def _sweep(configs, **options):
    lines: list[str] = []
    report = run_sweep(configs, targets=options.pop("targets", TinyTargets()), load_requests=FILES.__getitem__,
                       log=lines.append, **options)
    return report, lines


# ---------------------------------------------------------------- no cluster needed


@pytest.mark.parametrize("notebook, smoke", [("05_bench", False), ("06_ablations", False), ("06_ablations", True)])
def test_sweep_configs_are_the_notebooks_own(notebook, smoke, monkeypatch):
    """The sweep keys the stage the chapter reads: run the notebook's config code, catch its config."""
    import nbformat
    import yaml

    import ooospec.bench.runner

    class Captured(Exception):
        pass

    def capture(cfg, **_):
        raise Captured(cfg)

    monkeypatch.setattr(ooospec.bench.runner, "run_bench", capture)
    root = Path(__file__).resolve().parent.parent
    overrides = yaml.safe_load((root / "notebooks" / "smoke.yaml").read_text())[f"{notebook}.ipynb"] if smoke else {}
    nb = nbformat.read(root / "notebooks" / f"{notebook}.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    namespace: dict = {}
    exec(code[0], namespace)
    namespace.update(overrides)
    with pytest.raises(Captured) as caught:
        exec(code[1], namespace)
    assert caught.value.args[0] == notebook_config(notebook, overrides)
    assert notebook_parameters(notebook)["executor"] == "local"


def test_executor_parameter_is_checked_and_local_runs_nothing():
    assert run_cells("local", {"05_bench": _config()}) is None
    with pytest.raises(ValueError, match="executor must be one of"):
        run_cells("dask", {"05_bench": _config()})


def test_reserved_cores_never_overlap_and_restore_affinity(tmp_path):
    import fcntl

    cores = sorted(os.sched_getaffinity(0))
    with open(tmp_path / f"core-{cores[0]}.lock", "w") as other:  # another task holds the first core
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if len(cores) > 1:
            with reserved_cores(1, tmp_path) as mine:
                assert mine == [cores[1]] and os.sched_getaffinity(0) == {cores[1]}
        with pytest.raises(SweepError, match=f"{len(cores) - 1} of its {len(cores)} cores are free"):
            with reserved_cores(len(cores), tmp_path):
                pass
    assert sorted(os.sched_getaffinity(0)) == cores
    with reserved_cores(len(cores), tmp_path) as mine:  # released: all free again
        assert mine == cores


def test_unreachable_ray_address_fails_in_one_line_and_keeps_slices(artifacts, monkeypatch):
    import ray

    assert not ray.is_initialized()
    cfg = _config()
    done = slice_path(bench_stage(cfg), "tiny", "tiny-01", "apibank")
    done.parent.mkdir(parents=True)
    done.write_text("{}\n")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(SweepError, match=r"no Ray cluster answers at RAY_ADDRESS=127.0.0.1:1") as err:
        _sweep({"05_bench": cfg})
    assert "\n" not in str(err.value) and done.read_text() == "{}\n"


# ---------------------------------------------------------------- on a local Ray instance


@pytest.fixture(scope="module")
def local_ray():
    import ray
    from ray import cloudpickle

    # the workers cannot import this test module: ship TinyTargets by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _slice_records(cfg: BenchConfig, benchmark: str) -> list[dict]:
    path = slice_path(bench_stage(cfg), "tiny", "tiny-01", benchmark)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sweep_gives_the_sequential_records(local_ray, artifacts, monkeypatch):
    cfg = _config()
    report, lines = _sweep({"05_bench": cfg})
    assert [o.status for o in report.outcomes] == ["done", "done"] and not report.failed
    assert all(len(o.cores) == 2 for o in report.outcomes)  # target core + sidecar core, pinned
    swept = {b: _slice_records(cfg, b) for b in cfg.benchmarks}
    assert (bench_stage(cfg).dir / "records.jsonl").read_text().count("\n") == 2 * 3 * 3

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(artifacts.parent / "sequential"))
    sequential = run_bench(cfg, targets=TinyTargets(), load_requests=FILES.__getitem__)
    by_slice = {b: [r for r in sequential if r["benchmark"] == b] for b in cfg.benchmarks}

    def same(record: dict) -> tuple:
        return (record["id"], record["position"], record["output_ids"], record["forwards"],
                record["target_forwards"], record["source_counts"], record["identical_to_ar"])

    for benchmark in cfg.benchmarks:
        assert [same(r) for r in swept[benchmark]] == [same(r) for r in by_slice[benchmark]]
    assert {r["method"] for r in sequential} == {"ar", "toolspec", "ooospec:blocking"}

    # a second sweep finds every slice and starts no task
    again, _ = _sweep({"05_bench": cfg})
    assert [o.status for o in again.outcomes] == ["skipped", "skipped"]


def test_failed_cells_are_retried_then_reported_and_the_others_kept(local_ray, artifacts, tmp_path):
    attempts = tmp_path / "attempts.txt"
    cfg = _config(targets=["tiny", "broken", "crashing", "absent"], benchmarks=["apibank"], methods=["toolspec"],
                  warmup=0)
    report, lines = _sweep({"05_bench": cfg}, targets=TinyTargets(str(attempts)), max_retries=1)
    outcome = {o.cell: o for o in report.outcomes}
    assert outcome["05_bench:tiny/apibank"].status == "done"
    assert outcome["05_bench:broken/apibank"].error == "RuntimeError: tiny target broken on purpose"
    assert outcome["05_bench:crashing/apibank"].status == "failed"
    assert "died" in outcome["05_bench:crashing/apibank"].error.lower()
    assert attempts.read_text().count("attempt") == 2  # the first try and one retry
    assert report.skipped_targets.keys() == {"absent"}
    assert len(_slice_records(cfg, "apibank")) == 3 * 2
    with pytest.raises(SweepError) as err:
        report.check()
    assert "broken/apibank: FAILED after 2 attempts: RuntimeError: tiny target broken on purpose" in str(err.value)


def test_a_cluster_without_cpus_for_one_cell_is_refused(local_ray, artifacts):
    cfg = _config(threads=2)  # 2 target cores + 1 sidecar core on a 2-CPU cluster
    with pytest.raises(SweepError, match="needs 3 CPUs on one node .* has 2"):
        _sweep({"05_bench": cfg})
    assert not list(bench_stage(cfg).dir.glob("slices/*/*.jsonl"))


def test_a_chapter_reading_the_results_run_refuses_a_misspelt_override():
    from ooospec.bench.config import notebook_config

    assert notebook_config("05_bench", {"requests": 3}, strict=True).requests == 3
    assert notebook_config("05_bench", {"reqests": 3}) == notebook_config("05_bench")  # the sweep's shared overrides: ignored
    with pytest.raises(ValueError, match="'reqests'"):
        notebook_config("05_bench", {"reqests": 3}, strict=True)
