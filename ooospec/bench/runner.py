"""The benchmark: methods x targets x benchmarks -> one record per decode, with its event trace.

How a run is laid out, and why:

* **Fixed request order.** Each benchmark's slice is a seeded sample of its evaluation file, kept
  in file order. Call retrieval learns from the calls produced earlier in the run, so each
  (method, target, benchmark) run keeps one set of sources across the slice's requests.
* **Methods interleaved per request** (``for request: for method: decode``), in an order shuffled
  per request (`method_order`; AR ahead of any method whose oracle sidecar needs its call), so that
  every ratio compares decodes made seconds apart on a noisy shared machine, no method always runs
  first, and every record can be checked against AR's output of the same request.
* **Prefill.** AR, PLD and ToolSpec start from one measured prefill per request (`Prefill`); their
  prefill times are then the same sample. OoO-Spec runs its own prefill, because its sidecar
  works *during* the target's prefill: sharing it would hide the overlap the method relies on.
* **Cores.** The target runs with ``threads`` torch threads pinned to the first core; the sidecar
  process with ``sidecar_threads`` pinned to the second ("own core", the CPU analogue of the
  paper's second GPU). ``:shared_core`` pins the sidecar to the target's core, ``:in_process``
  runs it as a thread of the target's process.
* **Sidecars.** One service per distinct sidecar configuration and target, started before its
  first use (model load outside any timing) and reused; `SidecarService.wait_idle` runs between
  decodes, outside timing, so every request finds its sidecar free, as at batch 1.
* **Resumable slices.** Records are written per (target, benchmark) slice, atomically, when the
  slice is complete; a finished slice is never redone, an interrupted one is redone from its
  start (its retrieval memory must be rebuilt in order). The stage key covers everything that
  decides a slice's records except the choice of targets and benchmarks, so a larger run reuses
  a smaller run's finished slices. Slice files carry the target's weight fingerprint, so a
  retrained tool adapter never reuses stale records.
"""


from __future__ import annotations

import gc
import json
import random
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ooospec.bench.config import BenchConfig
from ooospec.bench.methods import MethodSpec, default_budget, method_budget, method_sources, parse_methods
from ooospec.bench.oracle_calls import CallDirectory, first_call
from ooospec.bench.placement import CorePlan, ElasticCores, placed, pinned_cores
from ooospec.bench.plan import BenchPlan, ProfileTargets, TargetProvider, plan_bench, requested_dtype
from ooospec.bench.records import BenchRecords, Decoded, check_lossless, make_record
from ooospec.bench.sampling import load_benchmark, sample_requests, warmup_requests
from ooospec.bench.sidecars import SidecarPool
from ooospec.bench.slices import (assemble_records, bench_stage, budget_path, failed_path, slice_path, wave_costs_path,
                                  write_slice)
from ooospec.bench.tree_budget import BudgetChoice, machine_budget
from ooospec.bench.wave_costs import Calibration, wave_costs
from ooospec.data.request import Request
from ooospec.decoding.hint import HintBank
from ooospec.decoding.loop import DecodeResult, Prefill, decode
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import model_near_tie_gap, running_arithmetic
from ooospec.models.context import fit_budget, model_context
from ooospec.models.lean_decoder import check_against_transformers, lean_decoder_of
from ooospec.progress import progress_bar
from ooospec.stage import Stage, read_jsonl


class SliceRunner:
    """Decodes slices of one loaded target: every method on every request, in a per-request order."""

    def __init__(self, cfg: BenchConfig, plan: BenchPlan, target: Any, pool: SidecarPool,
                 oracle_calls: CallDirectory | None):
        self.cfg, self.plan, self.target, self.pool = cfg, plan, target, pool
        self.oracle_calls = oracle_calls  # AR's first calls, for the oracle sidecar (None: no oracle runs)
        self.verifier = TreeVerifier.for_target(target, track_margins=cfg.track_margins)
        self.arithmetic = running_arithmetic(target.model, requested=requested_dtype(plan.resolved_profile(cfg), target.name)).to_dict()
        self.budget_choice: BudgetChoice | None = None  # `choose_budget` sets it before any decode
        self.calibration: Calibration | None = None  # `calibrate_waves` sets it where a method needs it

    def choose_budget(self, requests: list[Request]) -> BudgetChoice:
        """This run's tree budget for the target (`ooospec.bench.tree_budget`), measured on the first
        of ``requests`` the target can be prompted with."""
        usable = [(r, ids) for r, ids in ((r, self._prompt_or_none(r)) for r in requests) if ids]
        prompt = usable[0][1] if usable else None
        if usable and lean_decoder_of(self.target.model) is not None:  # refused if it is not transformers' forward
            state, _ = self.verifier.prefill(prompt)
            check_against_transformers(self.target.model, state.cache, [state.root],
                                       f"{self.target.name}/{usable[0][0].id}")
        if self.cfg.tree_budget == "machine" and prompt is not None:
            self.budget_choice = machine_budget(self.verifier, prompt, self.target.name)
        else:
            fixed = default_budget(self.target.name)
            why = "fixed (BenchConfig)" if self.cfg.tree_budget == "fixed" else "fixed default: no request to measure on"
            self.budget_choice = BudgetChoice(self.target.name, {"max_nodes": fixed.max_nodes,
                                                                 "max_depth": fixed.max_depth}, why)
        return self.budget_choice

    def calibrate_waves(self, requests: list[Request]) -> Calibration | None:
        """This machine's wave costs (`ooospec.bench.wave_costs`), where a method chooses its wave
        per request (``wave=policy``); timed on ``requests`` after the budget is chosen, outside
        every timed decode. None where no method needs them."""
        spec = next((s for s in self.plan.methods if s.wave == "policy"), None)
        if spec is None:
            return None
        usable = [r for r in requests if self.refusal(r) is None]
        nodes = self.budget(spec).max_nodes
        self.calibration = wave_costs(self.target, self.verifier, self.pool.service(spec), usable, nodes,
                                      self.pool.cores, self.cfg.threads, self.arithmetic)
        return self.calibration

    def sources(self, spec: MethodSpec) -> list:
        """Fresh sources of ``spec`` with this run's sidecar and wave costs."""
        return method_sources(spec, self.pool.service(spec), self.calibration.costs if self.calibration else None)

    def _prompt_or_none(self, request: Request) -> list[int] | None:
        """The request's prompt, or None where it is refused (`refusal`: recorded by `run`)."""
        return None if self.refusal(request) is not None else self.target.prompt_ids(request)

    def budget(self, spec: MethodSpec) -> TreeBudget:
        return method_budget(spec, self.target.name, self.budget_choice.tree_budget if self.budget_choice else None)

    def _sidecar_label(self, spec: MethodSpec) -> str | None:
        return self.pool.key(spec).kind if spec.uses_sidecar else None

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` cannot be decoded on this target (None: it can): a prompt the target
        cannot be built (an empty dialogue) or one that does not fit its context. Checked before any
        prefill, the shared one included."""
        try:
            prompt = self.target.prompt_ids(request)
            fit_budget(len(prompt), self.cfg.max_new_tokens, model_context(self.target.model), request.id)
        except ValueError as err:
            return str(err)
        return None

    def shared_prefill(self, request: Request) -> Prefill:
        return Prefill.measure(self.verifier, self.target.prompt_ids(request))

    def decode_one(self, spec: MethodSpec, sources: list, request: Request, max_new_tokens: int,
                   prefill: Prefill | None) -> DecodeResult:
        service = self.pool.service(spec)
        if service is not None:
            service.wait_idle()
        placement = (ElasticCores(service, self.pool.cores, self.cfg.threads, spec.target_prefill_chunk)
                     if spec.elastic else None)
        with self.both_cores() if spec.both_cores else nullcontext():
            result = decode(self.target, sources, request, max_new_tokens,
                            self.budget(spec), prefill=prefill, verifier=self.verifier, placement=placement)
        if placement is not None:
            result.trace.emit("elastic_cores", switches=placement.switches, switch_s=placement.switch_s)
        if service is not None and not service.wait_idle():  # outside timing: the next decode finds it free
            # the sidecar hung or died: without a restart every later request would silently get
            # no hint (plain ToolSpec); restart it and say so in this record's trace
            reason = "died" if not service.alive else f"still busy after {service.timeout_s:.0f} s"
            service.restart()
            result.trace.emit("sidecar_restarted", reason=reason)
        return result

    def both_cores(self):
        """The equal-hardware control: the target on its own core and the sidecar's, two threads."""
        cores = self.pool.cores
        return placed({cores.target_core, cores.sidecar_core} if cores.pinned else None, 2 * self.cfg.threads)

    def warm_up(self, requests: list[Request]) -> None:
        """Untimed decodes through every method with throwaway sources (first-call overheads,
        sidecar start-up and its first wave)."""
        for request in progress_bar(requests, desc=f"warm-up {self.target.name}", unit="req", leave=False):
            if self.refusal(request) is not None:  # a request that cannot be decoded warms nothing up
                continue
            for spec in self.plan.methods:
                sources = self.sources(spec)
                self.decode_one(spec, sources, request, min(self.cfg.max_new_tokens, 16), None)

    def needs_ar_first(self, spec: MethodSpec) -> bool:
        """The oracle sidecar answers with AR's call of the same request: AR must decode first."""
        return spec.uses_sidecar and self.pool.key(spec).kind == "oracle"

    def run(self, benchmark: str, requests: list[Request], progress: bool = True) -> list[dict[str, Any]]:
        """Every method on every request of a slice, in file order; a request the target refuses is
        recorded in ``self.failed`` and skipped, never aborting the slice."""
        sources = {spec: self.sources(spec) for spec in self.plan.methods}
        records: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        bar = progress_bar(requests, desc=f"{self.target.name} / {benchmark}", unit="req", disable=not progress)
        for position, request in enumerate(bar):
            error = self.refusal(request)
            if error is not None:
                self.failed.append({"target": self.target.name, "benchmark": benchmark, "request_id": request.id,
                                    "position": position, "error": error})
                continue
            records += self.request_records(benchmark, position, request, sources)
            bar.set_postfix(lossless=f"{sum(r['identical_to_ar'] for r in records)}/{len(records)}")
        return records

    def request_records(self, benchmark: str, position: int, request: Request,
                        sources: dict[MethodSpec, list]) -> list[dict[str, Any]]:
        """One request through every method in its shuffled order (`method_order`); the records in
        plan order, each compared with AR's decode and saying when it ran."""
        order = method_order(self.plan.methods, self.cfg.seed, benchmark, request.id, self.needs_ar_first)
        decoded: dict[MethodSpec, Decoded] = {}
        shared: Prefill | None = None
        for spec in order:
            prefill = None
            if spec.shares_prefill:
                shared = shared or self.shared_prefill(request)
                prefill = shared
            result = self.decode_one(spec, sources[spec], request, self.cfg.max_new_tokens, prefill)
            if spec.base == "ar" and self.oracle_calls is not None:
                self.oracle_calls.put(request.id, first_call(self.target.surface, result.text))
            bank = next((s for s in sources[spec] if isinstance(s, HintBank)), None)
            decoded[spec] = Decoded(spec, result, self._sidecar_label(spec), prefill is not None, bank)
        ar = next((decoded[s].result for s in self.plan.methods if s.base == "ar"), None)
        records = []
        for spec in self.plan.methods:
            record = make_record(decoded[spec], target=self.target.name, benchmark=benchmark, position=position,
                                 ar=ar, tie_gap=model_near_tie_gap(self.target.model))
            used = self.budget(spec)
            record.update(run_order=order.index(spec), arithmetic=self.arithmetic, tree_budget={
                "max_nodes": used.max_nodes, "max_depth": used.max_depth,
                "chosen_by": "method option" if spec.budget or spec.depth else
                (self.budget_choice.chosen_by if self.budget_choice else "fixed")})
            records.append(record)
        return records


def method_order(methods: list[MethodSpec], seed: int, benchmark: str, request_id: str,
                 needs_ar_first: Callable[[MethodSpec], bool] = lambda spec: False) -> list[MethodSpec]:
    """This request's order of methods: a shuffle seeded by (seed, benchmark, request), so no method
    always runs first (a warm cache or a drifting clock would favour it) and a rerun repeats it.
    AR moves just ahead of the first method that needs its output (the oracle sidecar)."""
    order = list(methods)
    random.Random(f"{seed}/{benchmark}/{request_id}").shuffle(order)
    ar = next((spec for spec in order if spec.base == "ar"), None)
    first = next((i for i, spec in enumerate(order) if needs_ar_first(spec)), None)
    if ar is not None and first is not None and order.index(ar) > first:
        order.remove(ar)
        order.insert(first, ar)
    return order



# ---------------------------------------------------------------- a run: targets x slices


@dataclass
class Workload:
    """The requests of a run: each benchmark's file (warm-up is drawn from it) and its timed sample."""

    files: dict[str, list[Request]]
    samples: dict[str, list[Request]]

    @classmethod
    def load(cls, cfg: BenchConfig, benchmarks: list[str], load_requests: Callable[[str], list[Request]]) -> "Workload":
        files = {b: load_requests(b) for b in benchmarks}
        return cls(files, {b: sample_requests(files[b], cfg.requests, cfg.seed, b) for b in benchmarks})

    @property
    def gold(self) -> dict[str, dict[str, Any]]:
        """request id -> its first gold call (what the ``gold`` sidecar answers)."""
        return {r.id: r.gold[0].to_dict() for s in self.samples.values() for r in s if r.gold}


@dataclass
class BenchRun:
    """What every target of a run shares: its config and plan, its stage, the targets and requests,
    and the cores it was placed on."""

    cfg: BenchConfig
    plan: BenchPlan
    stage: Stage
    provider: TargetProvider
    work: Workload
    cores: CorePlan

    def run_target(self, name: str, fingerprint: str, pending: list[str]) -> None:
        """Load ``name`` and decode its ``pending`` slices, writing each when it is complete; the
        sidecars are stopped and the model freed whatever happens."""
        target = self.provider.load(name)
        compiled = getattr(target, "compiled", None)
        if compiled is not None and (compiled.mode or compiled.fallback):
            print(f"bench: {name}: " + (f"compiled ({compiled.mode}) in {compiled.seconds:.0f} s, outside every timed region"
                                        if compiled.mode else f"eager (compile fell back: {compiled.fallback})"))
        oracle_calls = CallDirectory(self.stage.dir / "oracle_calls" / f"{name}@{fingerprint}")
        pool = SidecarPool(self.cfg, self.plan, self.cores, oracle_calls, self.work.gold)
        try:
            runner = SliceRunner(self.cfg, self.plan, target, pool, oracle_calls)
            paths = [slice_path(self.stage, name, fingerprint, b) for b in pending]
            self._choose_budget(runner, paths, pending[0])
            self._calibrate_waves(runner, paths, pending[0])
            if self.cfg.warmup:
                first = pending[0]
                runner.warm_up(warmup_requests(self.work.files[first], self.work.samples[first], self.cfg.warmup))
            for benchmark in pending:
                self._run_slice(runner, slice_path(self.stage, name, fingerprint, benchmark), benchmark)
        finally:
            pool.close()
            if compiled is not None and (compiled.mode or compiled.fallback):
                self._compile_report(name, compiled)
            del target
            gc.collect()

    def _choose_budget(self, runner: SliceRunner, paths: list[Path], first: str) -> None:
        choice = runner.choose_budget(self.work.samples[first])
        print(f"bench: {runner.target.name}: tree budget {choice.budget['max_nodes']} nodes ({choice.chosen_by})")
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            budget_path(path).write_text(json.dumps(choice.to_dict(), indent=1))

    def _calibrate_waves(self, runner: SliceRunner, paths: list[Path], first: str) -> None:
        calibration = runner.calibrate_waves(self.work.samples[first])
        if calibration is None:
            return
        costs = calibration.costs
        print(f"bench: {runner.target.name}: wave costs on {costs.machine}: prefill {costs.prefill_token_s * 1e3:.1f} / "
              f"{costs.prefill_2t_token_s * 1e3:.1f} ms a token (1 / 2 threads), round {costs.round_s:.2f} / "
              f"{costs.round_2t_s:.2f} s, wave {costs.wave_base_s:.2f} s + {costs.wave_token_s * 1e3:.2f} ms a token, "
              f"contention {costs.contention:.2f} (rounds), {costs.prefill_contention:.2f} / {costs.wave_contention:.2f} "
              f"(prefill / wave beside each other)")
        for path in paths:
            wave_costs_path(path).write_text(json.dumps(calibration.to_dict(), indent=1))

    def _run_slice(self, runner: SliceRunner, path: Path, benchmark: str) -> None:
        records = runner.run(benchmark, self.work.samples[benchmark])
        path.parent.mkdir(parents=True, exist_ok=True)
        failed_path(path).write_text(json.dumps(runner.failed, indent=1))  # before the slice: it marks done
        write_slice(path, records)
        check_lossless(records, f"{runner.target.name}/{benchmark}")  # after writing: the slice stays for inspection

    def _compile_report(self, name: str, compiled: Any) -> None:
        from ooospec.decoding.compiled import compiled_graphs

        report = asdict(compiled)
        if compiled.mode:
            report["graphs_compiled_inside_decodes"] = compiled_graphs() - compiled.graphs
        self.stage.path(f"compile-{name}.json").write_text(json.dumps(report, indent=1))


def run_bench(cfg: BenchConfig, *, targets: TargetProvider | None = None,
              load_requests: Callable[[str], list[Request]] = load_benchmark) -> BenchRecords:
    """Run (or resume) the bench and return the records of ``cfg``'s targets x benchmarks.

    ``targets`` and ``load_requests`` replace the profile's models and the evaluation files (tests).
    A target that cannot be loaded (e.g. its tool adapter is not trained yet) is skipped with
    its reason in `BenchRecords.skipped_targets`; its slices stay pending for a later run.
    """
    plan = plan_bench(cfg)
    stage = bench_stage(cfg, plan)
    provider = targets or ProfileTargets(plan.profile)
    work = Workload.load(cfg, cfg.benchmarks, load_requests)
    skipped: dict[str, str] = {}
    fingerprints: dict[str, str] = {}
    for note in plan.notes + [f"method {m} skipped: {why}" for m, why in plan.skipped_methods.items()]:
        print(f"bench: {note}")
    with pinned_cores(cfg.threads, cfg.pin_cores) as cores:
        run = BenchRun(cfg, plan, stage, provider, work, cores)
        for name in cfg.targets:
            try:
                fingerprints[name] = provider.fingerprint(name)
            except FileNotFoundError as err:
                skipped[name] = str(err)
                print(f"bench: target {name} skipped: {err}")
                continue
            pending = [b for b in cfg.benchmarks if not slice_path(stage, name, fingerprints[name], b).exists()]
            if pending:
                run.run_target(name, fingerprints[name], pending)
    assemble_records(stage)
    paths = [slice_path(stage, name, fp, b) for name, fp in fingerprints.items() for b in cfg.benchmarks]
    records = [r for path in paths for r in read_jsonl(path)]
    failed = [f for path in paths if failed_path(path).exists() for f in json.loads(failed_path(path).read_text())]
    status = {"targets": fingerprints, "skipped_targets": skipped, "skipped_methods": plan.skipped_methods,
              "sidecar": plan.sidecar, "sidecar_adapter": str(plan.adapter) if plan.adapter else None,
              "notes": plan.notes, "cores": asdict(cores), "records": len(records), "failed_requests": len(failed),
              "arithmetic": [json.loads(a) for a in sorted({json.dumps(r.get("arithmetic"), sort_keys=True) for r in records})]}
    stage.path("status.json").write_text(json.dumps(status, indent=2))
    if not skipped:
        stage.mark_done(**status)
    return BenchRecords(records, stage, plan, skipped, cores, failed)


def run_cell(cfg: BenchConfig, target: str, benchmark: str, *, targets: TargetProvider | None = None,
             load_requests: Callable[[str], list[Request]] = load_benchmark) -> tuple[Path, list[dict[str, Any]]]:
    """One (target, benchmark) slice on its own -> (its slice file, its records).

    The unit of work of `ooospec.reproduce.ray_sweep` (one Ray task each). It runs `BenchRun.run_target`, the
    same code as `run_bench`'s loop, for a single pending benchmark: same requests in file order, all
    methods interleaved, same slice file; only its warm-up requests are this benchmark's instead
    of the target's first pending one's (warm-up is untimed and leaves no state in the records).
    A finished slice is read, not redone. Stage-wide files (``records.jsonl``, ``status.json``)
    are left to the caller: many cells of one stage may run at once.
    """
    plan = plan_bench(cfg)
    stage = bench_stage(cfg, plan)
    provider = targets or ProfileTargets(plan.profile)
    fingerprint = provider.fingerprint(target)
    path = slice_path(stage, target, fingerprint, benchmark)
    if not path.exists():
        work = Workload.load(cfg, [benchmark], load_requests)
        with pinned_cores(cfg.threads, cfg.pin_cores) as cores:
            BenchRun(cfg, plan, stage, provider, work, cores).run_target(target, fingerprint, [benchmark])
    return path, list(read_jsonl(path))


# ---------------------------------------------------------------- studies: the same loop, no stage


@dataclass(frozen=True)
class StudySettings:
    """How `decode_requests` decodes: output length, the tree for methods without their own
    ``budget=``/``depth=`` option (None: the target's default), the seed of the per-request method
    order, one slice name for every request (None: one slice per benchmark) and a progress bar."""

    max_new_tokens: int = 128
    budget: TreeBudget | None = None
    seed: int = 0
    slice_name: str | None = None
    progress: bool = True


def decode_requests(target: Any, requests: Iterable[Request], methods: Iterable[str],
                    settings: StudySettings = StudySettings()) -> list[dict[str, Any]]:
    """AR and ``methods`` on ``requests`` with one loaded target: the bench's own per-request loop
    (seeded interleaved order, one shared prefill, every record compared with AR's output of the same
    request), outside any stage and with no sidecar, for the studies and the lossless test.

    Requests are decoded in the order given, as one slice (retrieval remembers the slice's earlier
    calls) or one per benchmark (`StudySettings.slice_name`). A request the target refuses (empty
    dialogue, prompt too long) raises ValueError naming it: a study's slice is chosen, never trimmed
    silently."""
    specs = parse_methods(list(dict.fromkeys(["ar", *methods])))
    if any(spec.uses_sidecar for spec in specs):
        raise ValueError(f"decode_requests runs no sidecar; use run_bench for {[s.name for s in specs if s.uses_sidecar]}")
    cfg = BenchConfig(targets=[target.name], benchmarks=[], methods=[s.name for s in specs], warmup=0,
                      seed=settings.seed, max_new_tokens=settings.max_new_tokens, pin_cores=False, tree_budget="fixed")
    plan = BenchPlan("none", None, specs, {}, [])
    runner = SliceRunner(cfg, plan, target, SidecarPool(cfg, plan, CorePlan(None, None), {}, {}), None)
    chosen = settings.budget or default_budget(target.name)
    runner.budget_choice = BudgetChoice(target.name, {"max_nodes": chosen.max_nodes, "max_depth": chosen.max_depth},
                                        "the study's budget")
    slices: dict[str, list[Request]] = {}
    for request in requests:
        slices.setdefault(settings.slice_name or request.benchmark, []).append(request)
    records = []
    for name, chosen_requests in slices.items():
        records += runner.run(name, chosen_requests, progress=settings.progress)
        if runner.failed:
            raise ValueError(f"decode_requests: {target.name} refuses " + "; ".join(
                f"{f['request_id']} ({f['error']})" for f in runner.failed))
    return records
