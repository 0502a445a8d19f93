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
import os
import random
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ooospec.bench.compare import NEAR_TIE_GAP, near_tie_gap
from ooospec.bench.methods import MethodSpec, default_budget, method_budget, method_sources, parse_methods
from ooospec.bench.tree_budget import BudgetChoice, machine_budget
from ooospec.bench.oracle_calls import CallDirectory, first_call
from ooospec.bench.placement import CorePlan, ElasticCores, placed, pinned_cores
from ooospec.data.request import Call, Request, check_tool_names
from ooospec.models.context import fit_budget, model_context
from ooospec.decoding.hint import HintBank
from ooospec.decoding.loop import DecodeResult, Prefill, decode
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import first_difference, profile_arithmetic, running_arithmetic, sentences
from ooospec.progress import progress_bar
from ooospec.stage import Stage, code_fingerprint, config_key, read_jsonl

STAGE_NAME = "results"
# the package source a slice's records depend on: its hash is part of the stage key
BENCH_CODE = ("bench/runner.py", "bench/methods.py", "bench/compare.py", "bench/oracle_calls.py", "bench/tree_budget.py",
              "decoding", "sidecar", "models", "data/request.py")
DEFAULT_TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
BENCHMARKS = ("apibank", "toolalpaca", "bfcl")
# requests a setting may be tuned on (the tree budget): the dev split of the training pool, never
# an evaluation file
TUNING_SPLITS = ("dev",)
DEFAULT_METHODS = ("ar", "pld", "toolspec", "ooospec")
SIDECAR_CHOICES = ("auto", "slot", "oracle", "gold")
# the only benchmark none of whose APIs the sidecar saw in training (see the data card)
HELD_OUT_BENCHMARKS = ("bfcl",)


TREE_BUDGET_CHOICES = ("machine", "fixed")


@dataclass
class BenchConfig:
    """Everything a bench run depends on; see the module docstring for the semantics."""

    profile: str = "cpu"
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    benchmarks: list[str] = field(default_factory=lambda: list(BENCHMARKS))
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    requests: int | None = 8  # per benchmark; None = the whole evaluation file
    seed: int = 0
    warmup: int = 2  # untimed warm-up requests per target (each through every method)
    max_new_tokens: int = 160
    sidecar: str = "auto"  # auto: the trained sidecar if an adapter exists, else the oracle
    sidecar_adapter: str | None = None  # explicit adapter dir; None: the sidecar stage's
    oracle_wave_s: float = 0.0  # simulated wave time of the oracle / gold sidecars
    threads: int = 1
    sidecar_threads: int = 1
    pin_cores: bool = True
    track_margins: bool = True
    # "machine": each target's node budget chosen at the start of its run from this machine's verify
    # cost and the committed dev acceptance (`ooospec.bench.tree_budget`); "fixed": the fixed default
    tree_budget: str = "machine"

    def __post_init__(self) -> None:
        if self.tree_budget not in TREE_BUDGET_CHOICES:
            raise ValueError(f"BenchConfig.tree_budget must be one of {TREE_BUDGET_CHOICES}, got {self.tree_budget!r}")
        if self.sidecar not in SIDECAR_CHOICES:
            raise ValueError(f"BenchConfig.sidecar must be one of {SIDECAR_CHOICES}, got {self.sidecar!r}")
        for name in self.benchmarks:
            if name not in BENCHMARKS + TUNING_SPLITS:
                raise ValueError(f"BenchConfig.benchmarks: unknown benchmark {name!r}; one of {BENCHMARKS} "
                                 f"(or {TUNING_SPLITS} to tune on)")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"BenchConfig.requests must be >= 1 or None, got {self.requests}")
        if self.max_new_tokens < 1:
            raise ValueError(f"BenchConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        parse_methods(list(self.methods))  # fail early on a misspelt method


# ---------------------------------------------------------------- requests


def sample_requests(requests: list[Request], n: int | None, seed: int, benchmark: str) -> list[Request]:
    """A seeded sample of ``n`` requests, kept in file order (retrieval memory depends on order).
    Every request of the file is checked first (`check_tool_names`): a bad one stops the run at
    load, whoever made the list."""
    for position, request in enumerate(requests):
        check_tool_names(request, f"benchmark {benchmark} request {position}")
    if n is None or n >= len(requests):
        return list(requests)
    chosen = sorted(random.Random(f"{seed}:{benchmark}").sample(range(len(requests)), n))
    return [requests[i] for i in chosen]


def warmup_requests(requests: list[Request], sample: list[Request], n: int) -> list[Request]:
    """The first ``n`` requests of the file outside the sample (warm-up never sees a timed one)."""
    taken = {r.id for r in sample}
    return [r for r in requests if r.id not in taken][:n]


def targets_sharing_teacher(profile: str, targets: list[str]) -> list[str]:
    """Targets that run the teacher's own model (on the cpu profile: the Qwen target), whose
    greedy calls are therefore exactly what the sidecar was trained to predict."""
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    return [t for t in targets if t in prof.targets and prof.targets[t].model == prof.teacher.model]


def load_benchmark(name: str) -> list[Request]:
    """An evaluation file by benchmark name, or a tuning split (`TUNING_SPLITS`) by its own name."""
    from ooospec.data import load_split

    return load_split(name if name in TUNING_SPLITS else f"eval_{name}")


# ---------------------------------------------------------------- targets and sidecars


class TargetProvider(Protocol):
    def fingerprint(self, name: str) -> str:
        """Identity of the target's weights; raises FileNotFoundError when they are missing."""

    def load(self, name: str) -> Any:
        """A loaded `ooospec.models.target.TargetModel`."""


class ProfileTargets:
    """The profile's targets; a target whose adapter is not trained yet raises FileNotFoundError."""

    def __init__(self, profile: str):
        from ooospec.models.registry import load_profile

        self.profile = load_profile(profile)

    def fingerprint(self, name: str) -> str:
        role = self.profile.target(name)
        source = self.profile.model(role.model).source
        pin = {"pypi_gguf": source.sha256, "hub": f"{source.repo}@{source.revision}", "local": source.path}
        parts = [str(pin.get(source.kind))]
        if role.adapter == "tool_lora":
            from ooospec.models.adapters import ADAPTER_HASH_FILE, tool_adapter_path

            parts.append((Path(tool_adapter_path(self.profile.name)) / ADAPTER_HASH_FILE).read_text().strip())
        return config_key({"target": name, "weights": parts}, 8)

    def load(self, name: str) -> Any:
        from ooospec.decoding.compiled import load_for_decoding

        return load_for_decoding(name, self.profile)


def find_sidecar_adapter(profile: str) -> Path | None:
    """The frozen sidecar adapter of ``profile``: the full preset's (the committed one), else the
    budget preset's; for a derived profile (``cpu-fp32``, ``cpu-compiled``: same weights, other
    arithmetic or kernels) the nearest ancestor's. Other sidecar stages (layer sweeps, experiments)
    are never picked up silently; pass ``BenchConfig.sidecar_adapter`` to bench one of them."""
    from ooospec.models.registry import load_profile
    from ooospec.training.sidecar import find_finished, sidecar_config

    for name in load_profile(profile).lineage:
        for preset in ("full", "budget"):
            found = find_finished(sidecar_config(preset, name))
            if found is not None:
                return Path(found.adapter_dir)
    return None


@dataclass
class BenchPlan:
    """A config resolved against what exists: the sidecar that runs, the methods that can run."""

    sidecar: str  # slot | oracle | gold
    adapter: Path | None
    methods: list[MethodSpec]
    skipped_methods: dict[str, str]
    notes: list[str]

    def key_config(self, cfg: BenchConfig) -> dict[str, Any]:
        """What decides a slice's records (targets and benchmarks only pick slices)."""
        config = {k: v for k, v in asdict(cfg).items() if k not in ("targets", "benchmarks", "sidecar_adapter")}
        config.update(code=code_fingerprint(*BENCH_CODE), sidecar=self.sidecar, methods=[m.name for m in self.methods],
                      sidecar_adapter_sha256=_adapter_sha(self.adapter),
                      # what this machine runs the profile in: slices of another arithmetic never mix
                      arithmetic=profile_arithmetic(cfg.profile).dtype)
        return config


def _requested_dtype(profile: str, target: str) -> str | None:
    """The profile's dtype for a target (None for an injected test target it does not name)."""
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    return prof.model(prof.target(target).model).dtype if target in prof.targets else None


def _adapter_sha(adapter: Path | None) -> str | None:
    if adapter is None:
        return None
    from ooospec.models.adapters import ADAPTER_HASH_FILE

    return (adapter / ADAPTER_HASH_FILE).read_text().strip()


def plan_bench(cfg: BenchConfig) -> BenchPlan:
    """Resolve ``sidecar="auto"`` and drop (with the reason) methods whose sidecar is missing."""
    notes: list[str] = []
    adapter = Path(cfg.sidecar_adapter) if cfg.sidecar_adapter else find_sidecar_adapter(cfg.profile)
    if adapter is not None:
        from ooospec.models.adapters import read_frozen

        read_frozen(adapter)  # refuses an adapter whose files changed since freezing
    sidecar = cfg.sidecar
    if sidecar == "auto":
        sidecar = "slot" if adapter is not None else "oracle"
        if adapter is None:
            notes.append("no trained sidecar adapter found: OoO-Spec runs with the ORACLE sidecar "
                         "(the target's own greedy call), an upper bound, not the paper's sidecar")
    methods, skipped = [], {}
    for spec in parse_methods(list(cfg.methods)):
        kind = spec.sidecar or sidecar
        if spec.uses_sidecar and kind in ("slot", "base_only") and adapter is None:
            skipped[spec.name] = (f"needs the trained sidecar adapter (none found for profile {cfg.profile!r}; "
                                  "train it with notebooks/02_sidecar.ipynb)")
            continue
        methods.append(spec)
    return BenchPlan(sidecar, adapter, methods, skipped, notes)


@dataclass(frozen=True)
class SidecarKey:
    kind: str
    placement: str
    delay_s: float
    required_values: bool  # off only for the ``nullable`` ablation


class SidecarPool:
    """One started `SidecarService` per distinct (kind, placement, delay), for one target."""

    def __init__(self, cfg: BenchConfig, plan: BenchPlan, cores: CorePlan, oracle_calls: CallDirectory,
                 gold_calls: dict[str, dict[str, Any]]):
        self.cfg, self.plan, self.cores = cfg, plan, cores
        self.oracle_calls, self.gold_calls = oracle_calls, gold_calls
        self.services: dict[SidecarKey, Any] = {}

    def key(self, spec: MethodSpec) -> SidecarKey:
        return SidecarKey(spec.sidecar or self.plan.sidecar, spec.placement, spec.delay_s, required_values=not spec.nullable)

    def service(self, spec: MethodSpec) -> Any:
        if not spec.uses_sidecar:
            return None
        key = self.key(spec)
        if key not in self.services:
            self.services[key] = self._start(key)
        return self.services[key]

    def _start(self, key: SidecarKey) -> Any:
        from ooospec.sidecar.service import SidecarService
        from ooospec.sidecar.specs import oracle_sidecar, slot_sidecar

        if key.kind in ("slot", "base_only"):
            spec = slot_sidecar(self.plan.adapter, self.cfg.profile, base_only=key.kind == "base_only",
                                required_values=key.required_values)
        elif key.kind == "oracle":
            spec = oracle_sidecar(self.oracle_calls, wave_s=self.cfg.oracle_wave_s)
        elif key.kind == "gold":
            spec = oracle_sidecar(self.gold_calls, wave_s=self.cfg.oracle_wave_s)
        else:
            raise ValueError(f"unknown sidecar kind {key.kind!r}")
        placement = "thread" if key.placement == "in_process" else "process"
        core = self.cores.target_core if key.placement == "shared_core" else self.cores.sidecar_core
        return SidecarService(spec, placement=placement, threads=self.cfg.sidecar_threads,
                              cpu_affinity=None if core is None else [core], delay_s=key.delay_s).start()

    def close(self) -> None:
        for service in self.services.values():
            service.stop()
        self.services.clear()


# ---------------------------------------------------------------- one decode -> one record


def hint_fields(bank: HintBank | None, trace: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The hint bank's per-request stats, with the arrival time on the request's clock."""
    if bank is None:
        return None
    stats = bank.stats
    payload_bytes = stats.payload_bytes
    if not payload_bytes and stats.call is not None:
        payload_bytes = len(Call.from_dict(stats.call).compact().encode("utf-8"))
    ready = next((e for e in trace if e["kind"] == "hint_ready"), None)
    wave = next((e for e in trace if e["kind"] == "sidecar_wave"), None)
    return {
        "ready_round": stats.ready_round,
        "ready_t": None if ready is None else ready["t"],
        "error": stats.error,
        "payload_bytes": payload_bytes,
        "wave_s": stats.wave_s,
        "wave_start_t": None if wave is None else wave["start"],
        "wave_end_t": None if wave is None else wave["end"],
        "received_t": None if wave is None else wave["received"],
        "hint_text": stats.hint_text,
        "call": stats.call,
        "proposals": stats.proposals,
        **stats.extra,
    }


class LosslessViolation(RuntimeError):
    """A decode differs from AR where AR's top-2 logits were not a near-tie: a bug, never a result."""


def check_lossless(records: list[dict[str, Any]], where: str) -> None:
    """Fail loudly on a mismatch with AR that is not a near-tie (near-ties are listed by the book)."""
    bad = [r for r in records if not r["identical_to_ar"] and not r.get("near_tie")]
    if bad:
        lines = [f"{r['id']}: token {r['mismatch']['position']}, AR top-2 gap {r['mismatch']['ar_margin']}" for r in bad]
        raise LosslessViolation(f"{where}: {len(bad)} decode(s) differ from AR beyond a near-tie:\n" + "\n".join(lines))


def make_record(result: DecodeResult, *, target: str, benchmark: str, request: Request, position: int,
                spec: MethodSpec, sidecar: str | None, ar: DecodeResult | None, shared_prefill: bool,
                bank: HintBank | None, tie_gap: float = NEAR_TIE_GAP) -> dict[str, Any]:
    record = result.to_record()
    request_id = record.pop("id")
    reference = ar or result
    diff = first_difference(reference.output_ids, result.output_ids)
    mismatch = None
    if diff is not None:
        def at(values: list, i: int) -> Any:
            return values[i] if i < len(values) else None

        mismatch = {"position": diff, "ar_token": at(reference.output_ids, diff), "token": at(result.output_ids, diff),
                    "ar_margin": at(reference.margins, diff), "margin": at(result.margins, diff)}
    return {
        "id": f"{target}/{benchmark}/{request_id}/{spec.name}",
        "request_id": request_id,
        "target": target,
        "benchmark": benchmark,
        "position": position,
        "method": spec.name,
        "method_base": spec.base,
        "sidecar": sidecar,
        "shared_prefill": shared_prefill,
        "sidecar_restarted": any(e["kind"] == "sidecar_restarted" for e in record["trace"]),
        "identical_to_ar": diff is None,
        # a first difference where AR's own top-2 gap is within the arithmetic's rounding
        "near_tie": mismatch is not None and mismatch["ar_margin"] is not None and mismatch["ar_margin"] < tie_gap,
        "mismatch": mismatch,
        "hint": hint_fields(bank, record["trace"]),
        **record,
    }


class SliceRunner:
    """Decodes slices of one loaded target: every method on every request, in a per-request order."""

    def __init__(self, cfg: BenchConfig, plan: BenchPlan, target: Any, pool: SidecarPool, oracle_calls: CallDirectory):
        self.cfg, self.plan, self.target, self.pool = cfg, plan, target, pool
        self.oracle_calls = oracle_calls
        self.verifier = TreeVerifier.for_target(target, track_margins=cfg.track_margins)
        self.arithmetic = running_arithmetic(target.model, requested=_requested_dtype(cfg.profile, target.name)).to_dict()
        self.budget_choice: BudgetChoice | None = None  # `choose_budget` sets it before any decode

    def choose_budget(self, requests: list[Request]) -> BudgetChoice:
        """This run's tree budget for the target (`ooospec.bench.tree_budget`), measured on the first
        of ``requests`` the target can be prompted with."""
        prompt = next((ids for ids in map(self._prompt_or_none, requests) if ids), None)
        if self.cfg.tree_budget == "machine" and prompt is not None:
            self.budget_choice = machine_budget(self.verifier, prompt, self.target.name)
        else:
            fixed = default_budget(self.target.name)
            why = "fixed (BenchConfig)" if self.cfg.tree_budget == "fixed" else "fixed default: no request to measure on"
            self.budget_choice = BudgetChoice(self.target.name, {"max_nodes": fixed.max_nodes,
                                                                 "max_depth": fixed.max_depth}, why)
        return self.budget_choice

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
        placement = ElasticCores(service, self.pool.cores, self.cfg.threads) if spec.elastic else None
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
                sources = method_sources(spec, self.pool.service(spec))
                self.decode_one(spec, sources, request, min(self.cfg.max_new_tokens, 16), None)

    def needs_ar_first(self, spec: MethodSpec) -> bool:
        """The oracle sidecar answers with AR's call of the same request: AR must decode first."""
        return spec.uses_sidecar and self.pool.key(spec).kind == "oracle"

    def run(self, benchmark: str, requests: list[Request]) -> list[dict[str, Any]]:
        sources = {spec: method_sources(spec, self.pool.service(spec)) for spec in self.plan.methods}
        records: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        bar = progress_bar(requests, desc=f"{self.target.name} / {benchmark}", unit="req")
        for position, request in enumerate(bar):
            error = self.refusal(request)  # recorded beside the slice, never aborts it
            if error is not None:
                self.failed.append({"target": self.target.name, "benchmark": benchmark, "request_id": request.id,
                                    "position": position, "error": error})
                continue
            order = method_order(self.plan.methods, self.cfg.seed, benchmark, request.id, self.needs_ar_first)
            results: dict[MethodSpec, tuple[DecodeResult, Prefill | None]] = {}
            shared: Prefill | None = None
            for spec in order:
                prefill = None
                if spec.shares_prefill:
                    shared = shared or self.shared_prefill(request)
                    prefill = shared
                result = self.decode_one(spec, sources[spec], request, self.cfg.max_new_tokens, prefill)
                if spec.base == "ar":
                    self.oracle_calls.put(request.id, first_call(self.target.surface, result.text))
                results[spec] = (result, prefill)
            ar = next((results[s][0] for s in self.plan.methods if s.base == "ar"), None)
            for spec in self.plan.methods:  # records in plan order; each says when it ran
                result, prefill = results[spec]
                bank = next((s for s in sources[spec] if isinstance(s, HintBank)), None)
                record = make_record(result, target=self.target.name, benchmark=benchmark, request=request,
                                     position=position, spec=spec, sidecar=self._sidecar_label(spec),
                                     ar=ar, shared_prefill=prefill is not None, bank=bank,
                                     tie_gap=near_tie_gap(self.verifier.dtype))
                record["run_order"] = order.index(spec)
                record["arithmetic"] = self.arithmetic
                used = self.budget(spec)
                record["tree_budget"] = {"max_nodes": used.max_nodes, "max_depth": used.max_depth,
                                         "chosen_by": "method option" if spec.budget or spec.depth else
                                         (self.budget_choice.chosen_by if self.budget_choice else "fixed")}
                records.append(record)
            bar.set_postfix(lossless=f"{sum(r['identical_to_ar'] for r in records)}/{len(records)}")
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


# ---------------------------------------------------------------- slices on disk


def bench_stage(cfg: BenchConfig, plan: BenchPlan | None = None) -> Stage:
    plan = plan or plan_bench(cfg)
    return Stage(STAGE_NAME, plan.key_config(cfg))


def budget_path(slice_file: Path) -> Path:
    """The tree-budget choice (and its measured inputs) beside a slice."""
    return slice_file.with_name(slice_file.stem + ".budget.json")


def slice_path(stage: Stage, target: str, fingerprint: str, benchmark: str) -> Path:
    return stage.dir / "slices" / f"{target}@{fingerprint}" / f"{benchmark}.jsonl"


def failed_path(slice_file: Path) -> Path:
    """Requests of a slice that could not be decoded, with the reason (not a ``*.jsonl``, so
    `assemble_records` reads only decoded records)."""
    return slice_file.with_suffix(".failed.json")


def write_slice(path: Path, records: list[dict[str, Any]]) -> None:
    """All of a slice's records at once (tmp file + rename): a slice file is always complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def assemble_records(stage: Stage) -> Path:
    """``records.jsonl``: every finished slice of the stage, in a stable order."""
    out = stage.path("records.jsonl")
    tmp = out.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for path in sorted((stage.dir / "slices").glob("*/*.jsonl")):
            handle.write(path.read_text(encoding="utf-8"))
    os.replace(tmp, out)
    return out


class BenchRecords(list):
    """The records of a run (a plain list of dicts) plus what the run could not do."""

    def __init__(self, records: list[dict[str, Any]], stage: Stage, plan: BenchPlan,
                 skipped_targets: dict[str, str], cores: CorePlan | None,
                 failed: list[dict[str, Any]] | None = None):
        super().__init__(records)
        self.stage, self.plan = stage, plan
        self.skipped_targets, self.cores = skipped_targets, cores
        self.failed = list(failed or [])  # requests that could not be decoded, counted in n

    @property
    def sidecar(self) -> str:
        return self.plan.sidecar

    def budget_choices(self) -> list[dict[str, Any]]:
        """Per slice: the tree budget the run used and what chose it (`ooospec.bench.tree_budget`)."""
        out = []
        for path in sorted((self.stage.dir / "slices").glob("*/*.budget.json")):
            out.append({"slice": f"{path.parent.name}/{path.name.removesuffix('.budget.json')}",
                        **json.loads(path.read_text())})
        return out

    def arithmetic(self) -> str:
        """The arithmetic and machine the records were measured in ("fp32 on a 2-core AVX2 CPU ...")."""
        return sentences(r.get("arithmetic") for r in self)

    def notes(self) -> list[str]:
        """Lines a reader must see next to the numbers."""
        which = {"slot": f"the trained sidecar ({self.plan.adapter})", "oracle": "the ORACLE sidecar (the target's "
                 "own greedy call)", "gold": "a sidecar answering with the GOLD call"}[self.plan.sidecar]
        lines = [f"measured in {self.arithmetic()}", f"OoO-Spec ran with {which}"] + list(self.plan.notes)
        lines += [f"target {t} skipped: {why}" for t, why in self.skipped_targets.items()]
        lines += [f"method {m} skipped: {why}" for m, why in self.plan.skipped_methods.items()]
        lines += [f"request {f['request_id']} ({f['target']} / {f['benchmark']}) not decoded: {f['error']}"
                  for f in self.failed]
        if self.cores is not None and not self.cores.pinned:
            lines.append("cores not pinned (fewer than 2 cores available or pin_cores=False)")
        return lines


def run_bench(cfg: BenchConfig, *, targets: TargetProvider | None = None,
              load_requests: Callable[[str], list[Request]] = load_benchmark) -> BenchRecords:
    """Run (or resume) the bench and return the records of ``cfg``'s targets x benchmarks.

    ``targets`` and ``load_requests`` replace the profile's models and the evaluation files (tests).
    A target that cannot be loaded (e.g. its tool adapter is not trained yet) is skipped with
    its reason in `BenchRecords.skipped_targets`; its slices stay pending for a later run.
    """
    plan = plan_bench(cfg)
    stage = bench_stage(cfg, plan)
    provider = targets or ProfileTargets(cfg.profile)
    files = {b: load_requests(b) for b in cfg.benchmarks}
    samples = {b: sample_requests(files[b], cfg.requests, cfg.seed, b) for b in cfg.benchmarks}
    gold = {r.id: r.gold[0].to_dict() for s in samples.values() for r in s if r.gold}
    skipped: dict[str, str] = {}
    fingerprints: dict[str, str] = {}
    for note in plan.notes + [f"method {m} skipped: {why}" for m, why in plan.skipped_methods.items()]:
        print(f"bench: {note}")
    with pinned_cores(cfg.threads, cfg.pin_cores) as cores:
        for name in cfg.targets:
            try:
                fingerprints[name] = provider.fingerprint(name)
            except FileNotFoundError as err:
                skipped[name] = str(err)
                print(f"bench: target {name} skipped: {err}")
                continue
            pending = [b for b in cfg.benchmarks if not slice_path(stage, name, fingerprints[name], b).exists()]
            if not pending:
                continue
            _run_target(cfg, plan, stage, provider, name, fingerprints[name], pending, files, samples, gold, cores)
    assemble_records(stage)
    records = [r for name, fp in fingerprints.items() for b in cfg.benchmarks
               for r in read_jsonl(slice_path(stage, name, fp, b))]
    failed = [f for name, fp in fingerprints.items() for b in cfg.benchmarks
              if failed_path(slice_path(stage, name, fp, b)).exists()
              for f in json.loads(failed_path(slice_path(stage, name, fp, b)).read_text())]
    status = {"targets": fingerprints, "skipped_targets": skipped, "skipped_methods": plan.skipped_methods,
              "sidecar": plan.sidecar, "sidecar_adapter": str(plan.adapter) if plan.adapter else None,
              "notes": plan.notes, "cores": asdict(cores), "records": len(records), "failed_requests": len(failed),
              "arithmetic": [json.loads(a) for a in sorted({json.dumps(r.get("arithmetic"), sort_keys=True) for r in records})]}
    stage.path("status.json").write_text(json.dumps(status, indent=2))
    if not skipped:
        stage.mark_done(**status)
    return BenchRecords(records, stage, plan, skipped, cores, failed)


def _run_target(cfg: BenchConfig, plan: BenchPlan, stage: Stage, provider: TargetProvider, name: str,
                fingerprint: str, pending: list[str], files: dict[str, list[Request]],
                samples: dict[str, list[Request]], gold: dict[str, dict[str, Any]], cores: CorePlan) -> None:
    target = provider.load(name)
    compiled = getattr(target, "compiled", None)
    if compiled is not None and (compiled.mode or compiled.fallback):
        print(f"bench: {name}: " + (f"compiled ({compiled.mode}) in {compiled.seconds:.0f} s, outside every timed region"
                                    if compiled.mode else f"eager (compile fell back: {compiled.fallback})"))
    oracle_calls = CallDirectory(stage.dir / "oracle_calls" / f"{name}@{fingerprint}")
    pool = SidecarPool(cfg, plan, cores, oracle_calls, gold)
    try:
        runner = SliceRunner(cfg, plan, target, pool, oracle_calls)
        choice = runner.choose_budget(samples[pending[0]])
        print(f"bench: {name}: tree budget {choice.budget['max_nodes']} nodes ({choice.chosen_by})")
        for benchmark in pending:
            path = slice_path(stage, name, fingerprint, benchmark)
            path.parent.mkdir(parents=True, exist_ok=True)
            budget_path(path).write_text(json.dumps(choice.to_dict(), indent=1))
        if cfg.warmup:
            first = pending[0]
            runner.warm_up(warmup_requests(files[first], samples[first], cfg.warmup))
        for benchmark in pending:
            records = runner.run(benchmark, samples[benchmark])
            path = slice_path(stage, name, fingerprint, benchmark)
            path.parent.mkdir(parents=True, exist_ok=True)
            failed_path(path).write_text(json.dumps(runner.failed, indent=1))  # before the slice: it marks done
            write_slice(path, records)
            check_lossless(records, f"{name}/{benchmark}")  # after writing: the slice stays for inspection
    finally:
        pool.close()
        if compiled is not None and (compiled.mode or compiled.fallback):
            from ooospec.decoding.compiled import compiled_graphs

            report = asdict(compiled)
            if compiled.mode:
                report["graphs_compiled_inside_decodes"] = compiled_graphs() - compiled.graphs
            stage.path(f"compile-{name}.json").write_text(json.dumps(report, indent=1))
        del target
        gc.collect()


def run_cell(cfg: BenchConfig, target: str, benchmark: str, *, targets: TargetProvider | None = None,
             load_requests: Callable[[str], list[Request]] = load_benchmark) -> tuple[Path, list[dict[str, Any]]]:
    """One (target, benchmark) slice on its own -> (its slice file, its records).

    The unit of work of `ooospec.bench.sweep` (one Ray task each). It runs `_run_target`, the same code
    as `run_bench`'s loop, for a single pending benchmark: same requests in file order, all
    methods interleaved, same slice file; only its warm-up requests are this benchmark's instead
    of the target's first pending one's (warm-up is untimed and leaves no state in the records).
    A finished slice is read, not redone. Stage-wide files (``records.jsonl``, ``status.json``)
    are left to the caller: many cells of one stage may run at once.
    """
    plan = plan_bench(cfg)
    stage = bench_stage(cfg, plan)
    provider = targets or ProfileTargets(cfg.profile)
    fingerprint = provider.fingerprint(target)
    path = slice_path(stage, target, fingerprint, benchmark)
    if not path.exists():
        files = {benchmark: load_requests(benchmark)}
        samples = {benchmark: sample_requests(files[benchmark], cfg.requests, cfg.seed, benchmark)}
        gold = {r.id: r.gold[0].to_dict() for r in samples[benchmark] if r.gold}
        with pinned_cores(cfg.threads, cfg.pin_cores) as cores:
            _run_target(cfg, plan, stage, provider, target, fingerprint, [benchmark], files, samples, gold, cores)
    return path, list(read_jsonl(path))

