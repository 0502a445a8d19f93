"""`make reproduce` within a time budget: calibrate this machine, estimate every stage, state what is cut.

The same notebooks take 51 minutes on the avx512_bf16 CPU and several hours on a 2-core AVX2 one
(fp32: a verify forward of 8 nodes costs 2.9x a one-row step there, against 1.3x for 16 nodes in
bf16, and the step itself is slower). So, after the data chapter, `make reproduce` measures this
machine (per target a one-row step, verify forwards around the tree budget the bench will choose
and a prefill, on one and on two threads: about 4 minutes on the AVX2 CPU, most of it loading and
the budget choice; and the served sidecar's start and a few of its waves), multiplies those times
by the work each chapter does (request counts from its parameters; output and prompt lengths and
forwards per method from the committed lossless audit; a bench slice also pays each sidecar's
start and, after each request, the rest of a wave that outlasts it), and prints the estimate per
stage. Where the estimate exceeds the budget, reductions are applied
in a fixed order, each with its reason, until it fits:

1. PLD leaves the results bench (the paper evaluates no PLD; 03's committed audit still shows it);
2. the ablations chapter drops its budget sweep (03 runs ToolSpec's, and the bench's budget is
   chosen per machine by `ooospec.bench.tree_budget`);
3. the sidecar chapter times half as many dev requests;
4. one untimed warm-up request per target instead of two;
5. where a canonical run is committed (`ooospec.report.canonical`) and holds every cell of the
   results bench at its n: the bench re-measures fewer cells, leaving out the costliest benchmark,
   then the costliest target, one at a time, each kept cell at full n; the chapter reads its claims
   from the canonical run and sets this machine's cells beside it;
6. n per benchmark goes down in steps of 5 (never below 10).

If even that is over the budget, the plan says so and runs anyway: nothing else is cut silently.

**More cores.** A bench cell (one target x benchmark slice) holds two cores, its target's and its
sidecar's, and nothing is shared between cells, so on a machine with ``cores // 2`` > 1 slots the
plan sets ``executor: ray`` for the results bench (decoded in 03, read by 04-07) and the ablations
bench (06): their missing cells run first as local Ray tasks, two cores each, with the sweep's
placement, core locks and failure handling (`ooospec.reproduce.ray_sweep`), and give the sequential
run's records. Those two stages are then estimated per cell and their wall time is the makespan of
the cells scheduled longest-first onto the slots; the rest of the plan (the studies, the dev
sweeps, 07's one request) runs as on two cores, and the reductions apply to this estimate. The
plan also prints the full (and the planned) total for 2, 8 and 16 cores. On two cores (or three:
one slot) nothing changes. ``--cores N`` plans for N cores as a what-if.

The plan is written as papermill parameter files, one per notebook, and every chapter that runs
under a reduced or parallel plan prints its note (the ``plan`` parameter). A user's own ``papermill`` run
takes the notebook's defaults; ``make reproduce MINUTES=0`` runs the full plan whatever it costs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ooospec.bench.methods import MethodSpec, ablation_methods, budget_methods, wave_gate_methods
from ooospec.bench.config import notebook_parameters
from ooospec.paths import artifacts_dir
from ooospec.studies.machine_calibration import PLAN_FILE, SidecarSpeed, Speed, calibrate, calibrate_sidecar

AUDIT_DIR = ("committed", "lossless-audit")
MIN_REQUESTS = 10
# 02's timed sections in Qwen prefills of a mean dev prompt, fitted on the AVX2 fresh clone (d5db038):
# one request in four sidecar modes took 39 s, one latency request against the target 45 s, with an
# 8.4 s prefill; the rest of the chapter (load, served examples) about a minute
SIDECAR_MODE_PREFILLS = 4.7
SIDECAR_LATENCY_PREFILLS = 5.3
SIDECAR_FIXED_S = 60.0
BOOK_S = 150.0  # jupyter-book build of every chapter
LOAD_S = 15.0  # a target load, a sidecar start, the budget choice: per slice
# an fp32 measurement of 08's arithmetic study beside bf16 speeds: measured 1.5-2.6x (median 2.0)
# the bf16 one on a Xeon with amx_bf16 (Qwen and SmolLM2, packed and plain, one and two threads)
FP32_BESIDE_BF16 = 2.0
REPLAY_CASES = 60  # dev requests with a committed teacher trace and a served sidecar wave
REPLAY_REQUEST_S = 0.08  # one request replayed by one hint use (AVX2 machine: 60 x 26 replays in 126 s)
CELL_CORES = 2  # a bench cell's target core and its sidecar's (ray_sweep.Cell.cpus at the notebooks' threads = 1)
WHAT_IF_CORES = (2, 8, 16)  # the core counts every plan also prints its total for
# the notebooks with an ``executor`` parameter; 03 decodes 05's run and takes it through ``bench``
RAY_NOTEBOOKS = ("05_bench", "06_ablations")


@dataclass(frozen=True)
class Work:
    """Mean work of one request for one target (from the committed audit, lengths scaled to the cap)."""

    prompt_tokens: float
    tokens: float
    forwards: dict[str, float]  # ar, pld, toolspec (at the audit's 16 nodes)


@dataclass
class StageEstimate:
    stage: str
    seconds: float
    detail: str = ""


@dataclass(frozen=True)
class CoresEstimate:
    """The plan's total on a machine with ``cores`` cores: the full plan and the one the budget leaves."""

    cores: int
    full_minutes: float
    planned_minutes: float


@dataclass
class ReproducePlan:
    """What `make reproduce` runs on this machine, why, and how long it is expected to take."""

    minutes: float | None  # the budget; None: the full plan whatever it costs
    arithmetic: str
    speeds: list[Speed]
    full: list[StageEstimate]
    planned: list[StageEstimate]
    overrides: dict[str, dict[str, Any]]  # notebook -> papermill parameters
    reasons: list[str] = field(default_factory=list)
    fits: bool = True
    cores: int = CELL_CORES  # the cores planned for (this process's, or the CLI's what-if)
    by_cores: list[CoresEstimate] = field(default_factory=list)
    sidecar: SidecarSpeed | None = None  # the served sidecar's start and wave here (None: not calibrated)

    @property
    def slots(self) -> int:
        return cell_slots(self.cores)

    @property
    def parallel(self) -> bool:
        """Whether the bench cells run as local Ray tasks (more than one slot)."""
        return self.slots > 1

    @property
    def full_minutes(self) -> float:
        return sum(s.seconds for s in self.full) / 60

    @property
    def planned_minutes(self) -> float:
        return sum(s.seconds for s in self.planned) / 60

    def note(self) -> str:
        """The sentence a chapter prints when it runs under this plan."""
        parallel = (f" on {self.cores} cores, the bench cells as local Ray tasks ({self.slots} at once, "
                    f"{CELL_CORES} cores each)" if self.parallel else "")
        head = f"`make reproduce` plan for {self.arithmetic}{parallel}: "
        if not self.reasons:
            return head + f"the full plan, estimated at {self.full_minutes:.0f} min."
        head += (f"the full plan was estimated at {self.full_minutes:.0f} min, over the {self.minutes:.0f}-minute "
                 "budget, so: ")
        return head + "; ".join(self.reasons) + f" (estimate now {self.planned_minutes:.0f} min)."

    def cores_line(self) -> str:
        """The totals for `WHAT_IF_CORES`, on one line: what more cores would buy."""
        full = ", ".join(f"{c.cores} -> {c.full_minutes:.0f} min" for c in self.by_cores)
        line = f"  cores: {full} (full plan; cells as local Ray tasks, {CELL_CORES} cores each)"
        if any(round(c.planned_minutes) != round(c.full_minutes) for c in self.by_cores):
            line += f"; planned within {self.minutes:.0f} min: " + ", ".join(
                f"{c.cores} -> {c.planned_minutes:.0f}" for c in self.by_cores)
        return line

    def lines(self) -> list[str]:
        rows = [f"reproduce plan on {self.arithmetic}, for {self.cores} cores"]
        for speed in self.speeds:
            rows.append(f"  {speed.target}: step {speed.step_s * 1e3:.0f} ms, verify@{speed.nodes} "
                        f"{speed.verify() / speed.step_s:.1f}x, prefill {speed.prefill_token_s * 1e3:.1f} ms/token "
                        f"(measured in {speed.calibrate_s:.0f} s)")
        if self.sidecar is not None:
            rows.append(f"  sidecar: start {self.sidecar.start_s:.1f} s, wave {self.sidecar.wave_s:.2f} s "
                        f"(median of {self.sidecar.waves}, measured in {self.sidecar.calibrate_s:.0f} s)")
        full = {s.stage: s for s in self.full}
        for stage in self.planned:
            before = full[stage.stage].seconds
            changed = f" (full plan {before / 60:.1f})" if abs(before - stage.seconds) > 1 else ""
            rows.append(f"  {stage.stage:<14} {stage.seconds / 60:6.1f} min{changed}  {stage.detail}")
        rows.append(f"  {'total':<14} {self.planned_minutes:6.1f} min (full plan {self.full_minutes:.1f} min"
                    + (f", budget {self.minutes:.0f} min)" if self.minutes else ", no budget)"))
        if self.parallel:
            rows.append(f"  parallel: the bench cells of 03 (05's run) and 06 as local Ray tasks, {self.slots} at "
                        f"once, {CELL_CORES} cores each")
        if self.by_cores:
            rows.append(self.cores_line())
        rows += [f"  reduced: {r}" for r in self.reasons]
        if not self.fits:
            rows.append(f"  the least plan is still over {self.minutes:.0f} min: it runs anyway")
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "note": self.note() if self.reasons or self.parallel else "",
                "full_minutes": round(self.full_minutes, 1),
                "planned_minutes": round(self.planned_minutes, 1)}


# ---------------------------------------------------------------- work counts


def audit_work(target: str, max_new_tokens: int, directory: Path | None = None) -> dict[str, Work]:
    """Per benchmark, the mean prompt, output and forwards per method of the committed audit; outputs
    the audit cut at its cap are scaled to ``max_new_tokens``. A target without an audit (a test
    model) gets a generic request (600-token prompt, half the cap written, ToolSpec at 3 per forward)."""
    directory = directory or artifacts_dir().joinpath(*AUDIT_DIR)
    provenance = directory / "provenance.json"
    files = list(directory.glob(f"{target}-*.jsonl"))
    if not files or not provenance.exists():
        tokens = max_new_tokens / 2
        generic = Work(600.0, tokens, {"ar": tokens, "pld": tokens / 2, "toolspec": tokens / 3})
        return {b: generic for b in ("apibank", "toolalpaca", "bfcl")}
    cap = next(s["config"]["max_new_tokens"] for s in json.loads(provenance.read_text())["sets"].values())
    records = [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]
    work = {}
    for benchmark in sorted({r["benchmark"] for r in records}):
        own = [r for r in records if r["benchmark"] == benchmark]
        scale = {r["id"]: (max_new_tokens / cap if r["finish"] == "length" else 1.0)
                 for r in own if r["method"] == "ar"}
        forwards = {}
        for method in ("ar", "pld", "toolspec"):
            rows = [r for r in own if r["method"] == method]
            forwards[method] = statistics.mean(r["forwards"] * scale.get(r["id"], 1.0) for r in rows)
        ar = [r for r in own if r["method"] == "ar"]
        work[benchmark] = Work(statistics.mean(r["prompt_tokens"] for r in ar),
                               statistics.mean(min(r["tokens"] * scale[r["id"]], max_new_tokens) for r in ar),
                               forwards)
    return work


def dev_work(work: dict[str, Work]) -> Work:
    """Dev requests are drawn from the same sources: the mean of the benchmarks."""
    items = list(work.values())
    return Work(statistics.mean(w.prompt_tokens for w in items), statistics.mean(w.tokens for w in items),
                {m: statistics.mean(w.forwards[m] for w in items) for m in items[0].forwards})


# ---------------------------------------------------------------- the estimate


def method_seconds(spec: MethodSpec, work: Work, speed: Speed, mat: dict[int, float] | None = None) -> float:
    """One decode of one request by ``spec`` (its own prefill included where it does not share one)."""
    both = spec.both_cores
    seconds = 0.0
    if not spec.shares_prefill:
        seconds += work.prompt_tokens * (speed.prefill_2t_token_s if both else speed.prefill_token_s)
    if spec.base == "ar":
        return seconds + work.forwards["ar"] * (speed.step_2t_s if both else speed.step_s)
    forwards = work.forwards["pld" if spec.base == "pld" else "toolspec"]
    nodes = spec.budget or speed.nodes
    if mat and spec.base != "pld" and nodes in mat and 16 in mat:
        forwards *= mat[16] / mat[nodes]  # the audit ran at 16 nodes
    seconds += forwards * speed.verify(nodes, both)
    return seconds + spec.delay_s


def slice_seconds(methods: list[str], work: Work, speed: Speed, requests: int, warmup: int,
                  mat: dict[int, float] | None = None, sidecar: SidecarSpeed | None = None) -> float:
    """A bench slice: the shared prefill once per request, every method's decode, the warm-up, and
    with ``sidecar`` what the slice pays for its sidecars outside the timed decodes (`sidecar_seconds`)."""
    specs = [MethodSpec.parse(m) for m in methods]
    shared = work.prompt_tokens * speed.prefill_token_s
    decode_s = {s.name: method_seconds(s, work, speed, mat) for s in specs}
    per_request = (shared if any(s.shares_prefill for s in specs) else 0.0) + sum(decode_s.values())
    short = replace(work, forwards={k: min(v, 16.0) for k, v in work.forwards.items()})
    per_warmup = sum(method_seconds(s, short, speed, mat) + (shared if s.shares_prefill else 0.0) for s in specs)
    outside = 0.0
    if sidecar is not None:  # a request as its wave sees it: the shared prefill, then the decode
        request_s = {s.name: decode_s[s.name] + (shared if s.shares_prefill else 0.0) for s in specs}
        outside = sidecar_seconds(specs, request_s, sidecar, requests)
    return requests * per_request + warmup * per_warmup + LOAD_S + outside


def sidecar_seconds(specs: list[MethodSpec], request_s: dict[str, float], sidecar: SidecarSpeed,
                    requests: int) -> float:
    """A slice's sidecar costs outside its timed decodes: one start per distinct sidecar
    (`ooospec.bench.sidecars.sidecar_key`), and the wait after each request whose wave (with its
    delay) outlasts the request (``request_s``: its prefill and decode), since the bench waits for
    an idle sidecar before the next one. Where every wave is late, a gated method submits only what
    `WaveGate` lets through. The oracle's waves are instant; a blocking method waits inside its decode."""
    from ooospec.bench.sidecars import sidecar_key

    starts = {sidecar_key(s, "slot") for s in specs if s.uses_sidecar}
    waits = 0.0
    for spec in specs:
        if not spec.uses_sidecar or spec.blocking or spec.wave == "none":
            continue
        wave = spec.delay_s + (sidecar.wave_s if (spec.sidecar or "slot") in ("slot", "base_only") else 0.0)
        late = wave - request_s[spec.name]
        if late > 0:
            waits += late * submitted_waves(spec, requests)
    return len(starts) * sidecar.start_s + waits


def submitted_waves(spec: MethodSpec, requests: int) -> int:
    """Waves a run of ``requests`` submits when every wave is late: each one without the gate
    (``every_wave``, the plain hint), else those `ooospec.decoding.wave_gate.WaveGate` lets through."""
    from ooospec.decoding.wave_gate import WaveGate

    if spec.every_wave or spec.plain_hint:
        return requests
    gate, submitted = WaveGate(), 0
    for _ in range(requests):
        if gate.submit():
            submitted += 1
            gate.record(in_time=False)
    return submitted


def counted(number: int, noun: str) -> str:
    """``1 target``, ``2 targets``: the plan's details read as sentences."""
    return f"{number} {noun}" + ("" if number == 1 else "s")


def machine_cores() -> int:
    """The cores this process may use: its affinity, which a container or ``taskset`` narrows, not
    the machine's count (the local Ray instance of the sweep takes the same number)."""
    return len(os.sched_getaffinity(0))


def cell_slots(cores: int) -> int:
    """Bench cells decoding at once: each holds `CELL_CORES` cores of its own, so an odd core idles."""
    return max(1, cores // CELL_CORES)


def makespan(seconds: list[float], slots: int) -> float:
    """Wall time of independent cells on ``slots`` equal slots, each cell given, longest first, to
    the slot free soonest (LPT: within 4/3 of the best schedule). Ray starts the sweep's tasks in
    the order they were submitted as slots free up; the notebooks list the larger target first, so
    that order is close to longest-first. One slot runs them one after another: the plain sum."""
    if slots <= 1:
        return sum(seconds)
    loads = [0.0] * slots
    for cell in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += cell
    return max(loads)


def bench_cells(params: dict[str, Any], speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
                mats: dict[str, dict[int, float]], methods: list[str] | None = None,
                sidecar: SidecarSpeed | None = None) -> list[float]:
    """Seconds per bench cell (target x benchmark slice, as the sweep cuts a run), in the run's order."""
    methods = methods if methods is not None else params["methods"]
    cells = []
    for target in params["targets"]:
        for benchmark in params["benchmarks"]:
            work = works[target].get(benchmark) or dev_work(works[target])
            cells.append(slice_seconds(methods, work, speeds[target], params["requests"], params["warmup"],
                                       mats.get(target), sidecar))
    return cells


def bench_seconds(params: dict[str, Any], speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
                  mats: dict[str, dict[int, float]], methods: list[str] | None = None, slots: int = 1,
                  sidecar: SidecarSpeed | None = None) -> float:
    """A bench run's wall time: its cells one after another, or their makespan on ``slots``."""
    return makespan(bench_cells(params, speeds, works, mats, methods, sidecar), slots)


# the notebooks whose parameters the estimate reads
PLANNED_NOTEBOOKS = ("02_sidecar", "03_toolspec", "05_bench", "06_ablations", "07_timelines", "08_arithmetic")


def sweep_seconds(methods: list[str], targets: list[str], requests: int, speeds: dict[str, Speed],
                  works: dict[str, dict[str, Work]], mats: dict[str, dict[int, float]], warmup: int = 0,
                  sidecar: SidecarSpeed | None = None) -> float:
    """A sweep on dev requests (06's budgets, its wave gate)."""
    return sum(slice_seconds(methods, dev_work(works[t]), speeds[t], requests, warmup, mats.get(t), sidecar)
               for t in targets)


def replay_seconds(replay_nodes: list[int], replay_requests: int | None = None) -> float:
    """06's hint-use replay on dev (`ooospec.studies.hint_replay`): no target forward, so a count of
    requests x uses x budgets at the time one took here (draft sources and merge only)."""
    from ooospec.studies.hint_replay import DEFAULT_USES, SHARE_GRID

    cases = min(REPLAY_CASES, replay_requests or REPLAY_CASES)
    return cases * (len(DEFAULT_USES) + len(SHARE_GRID)) * len(replay_nodes) * REPLAY_REQUEST_S


@lru_cache(maxsize=1)
def study_runs() -> dict[str, str]:
    """The dtype each profile of 08's arithmetic study runs in on this machine."""
    from ooospec.models.arithmetic import profile_arithmetic
    from ooospec.studies.forward_cost import ARITHMETIC_OPTIONS

    return {profile: profile_arithmetic(profile).dtype for profile, _ in ARITHMETIC_OPTIONS}


def arithmetic_seconds(arith: dict[str, Any], speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
                       runs: dict[str, str] | None = None) -> float:
    """08's arithmetic study (`ooospec.studies.forward_cost.arithmetic_study`): per target, a load per
    profile and, per thread count and measurement, three prefills and the verify curve's rows
    ``arithmetic_repeats`` times; an fp32 measurement beside bf16 speeds costs `FP32_BESIDE_BF16`."""
    from ooospec.studies.forward_cost import STUDY_ROWS, study_measurements

    runs = runs or study_runs()
    measurements = study_measurements(runs)
    seconds = 0.0
    for t in [t for t in arith["targets"] if t in speeds]:
        speed, tokens = speeds[t], dev_work(works[t]).prompt_tokens
        timed_in = speed.dtype or runs.get("cpu", "float32")  # a plan from before Speed.dtype: the cpu profile
        seconds += LOAD_S * len({profile for profile, _ in measurements})
        for threads in arith["arithmetic_threads"]:
            both = threads > 1
            one = (3 * tokens * (speed.prefill_2t_token_s if both else speed.prefill_token_s)
                   + arith["arithmetic_repeats"] * ((speed.step_2t_s if both else speed.step_s)
                                                     + sum(speed.verify(r - 1, both) for r in STUDY_ROWS if r > 1)))
            seconds += sum(one * _dtype_factor(dtype, timed_in) for _, dtype in measurements)
        seconds += floor_table_seconds(arith, speed, tokens)
    return seconds


def floor_table_seconds(arith: dict[str, Any], speed: Speed, prompt_tokens: int) -> float:
    """08's floor table for one target (`ooospec.studies.forward_floor`): a load, two forwards' prefill
    and verify curves, and llama.cpp's (its prefill taken as 4x ours, its curve as two of ours)."""
    sizes = [s for s in arith.get("floor_sizes", (0, 4, 8, 16, 32)) if s]
    curve = speed.step_s + sum(speed.verify(s) for s in sizes)
    return LOAD_S + 6 * prompt_tokens * speed.prefill_token_s + 4 * arith.get("floor_repeats", 5) * curve


def _dtype_factor(dtype: str, timed_in: str) -> float:
    if dtype == timed_in:
        return 1.0
    return FP32_BESIDE_BF16 if dtype == "float32" else 1 / FP32_BESIDE_BF16


def estimate(params: dict[str, dict[str, Any]], speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
             mats: dict[str, dict[int, float]], slots: int = 1, sidecar: SidecarSpeed | None = None) -> list[StageEstimate]:
    """Seconds per notebook for the given notebook parameters (03/04/07 read 05's run, decoded in 03);
    with ``slots`` > 1 the results and ablations benches run that many cells at once; with
    ``sidecar`` the benches pay their sidecars' starts and late waves (`sidecar_seconds`)."""
    qwen = speeds.get("qwen2.5-coder-0.5b") or next(iter(speeds.values()))
    qwen_work = dev_work(works.get(qwen.target) or next(iter(works.values())))
    prefill = qwen_work.prompt_tokens * qwen.prefill_token_s
    side = params["02_sidecar"]
    chapter_02_s = (SIDECAR_FIXED_S + side["mode_requests"] * SIDECAR_MODE_PREFILLS * prefill
                    + side["latency_requests"] * SIDECAR_LATENCY_PREFILLS * prefill)
    bench = params["05_bench"]
    studies = params["03_toolspec"]
    study_s = 0.0
    for t in [t for t in studies["targets"] if t in speeds]:  # the verify-cost curve
        warm = sum(speeds[t].verify(n) for n in studies["cost_sizes"] if n)
        study_s += (studies["cost_repeats"] + 1) * (warm + speeds[t].step_s)
    arithmetic_s = arithmetic_seconds(params["08_arithmetic"], speeds, works)
    ablation = params["06_ablations"]
    ablation_cells = len(ablation["targets"]) * len(ablation["benchmarks"])
    ablation_s = bench_seconds({**ablation, "methods": ablation_methods(ablation["ablations"], ablation["delays"])},
                               speeds, works, mats, slots=slots, sidecar=sidecar)
    if ablation["budgets"]:
        ablation_s += sweep_seconds(budget_methods(ablation["budgets"]), ablation["targets"],
                                    ablation["budget_requests"], speeds, works, mats, ablation["warmup"], sidecar)
    ablation_s += replay_seconds(ablation.get("replay_nodes") or [], ablation.get("replay_requests"))
    gate_target = ablation.get("gate_target")
    if ablation.get("gate_requests") and gate_target in speeds:
        ablation_s += sweep_seconds(wave_gate_methods(), [gate_target], ablation["gate_requests"], speeds, works, mats,
                                    ablation["warmup"], sidecar)
    n = bench["requests"]
    # 07 draws the wave schedules side by side: one request of the results bench's first target and
    # benchmark, each schedule beside ToolSpec on both cores, a run of its own
    schedules = ["toolspec:both_cores", *params.get("07_timelines", {}).get("schedules", [])]
    first = {**bench, "targets": bench["targets"][:1], "benchmarks": bench["benchmarks"][:1], "requests": 1, "warmup": 0}
    timelines_s = bench_seconds(first, speeds, works, mats, schedules, sidecar=sidecar) if len(schedules) > 1 else 0.0
    at_once = f"; {slots} cells at once" if slots > 1 else ""
    return [
        StageEstimate("00_data", 30.0, "build the splits"),
        StageEstimate("01_teacher", 15.0, "read the committed traces"),
        StageEstimate("02_sidecar", chapter_02_s, f"{side['mode_requests']} mode and {side['latency_requests']} latency requests"),
        StageEstimate("03_toolspec", study_s + bench_seconds(bench, speeds, works, mats, slots=slots, sidecar=sidecar),
                      f"results bench: {counted(len(bench['targets']), 'target')} x "
                      f"{counted(len(bench['benchmarks']), 'benchmark')} x n={n} x "
                      f"{counted(len(bench['methods']), 'method')}{at_once}; verify-cost curve"),
        StageEstimate("08_arithmetic", arithmetic_s, "step, prefill and verify cost per arithmetic and thread count"),
        StageEstimate("06_ablations", ablation_s,
                      f"{counted(len(ablation_methods(ablation['ablations'], ablation['delays'])), 'method')} "
                      f"x n={ablation['requests']}" + (at_once if ablation_cells > 1 else "")
                      + (", budget sweep" if ablation["budgets"] else "")
                      + (f", wave gate on {ablation['gate_requests']} dev requests" if ablation.get("gate_requests") else "")),
        StageEstimate("07_timelines", timelines_s, f"{len(schedules) - 1} wave schedules on one request"),
        StageEstimate("book", BOOK_S, "04, 05, 07 read 03's run; jupyter-book"),
    ]


@dataclass(frozen=True)
class CanonicalCover:
    """What the committed canonical run holds (`ooospec.report.canonical`): the results chapter
    reads its claims from it, so a cell it holds at the bench's n need not be re-measured here."""

    cells: frozenset[tuple[str, str]]  # (target, benchmark)
    requests: int


def committed_canonical() -> CanonicalCover | None:
    """The committed canonical run's cells (each file checked against its manifest), or None."""
    from ooospec.report.canonical import load_canonical

    run = load_canonical()
    return None if run is None else CanonicalCover(frozenset(run.cells()), int(run.provenance["requests"]))


RE_MEASURES = "the results bench re-measures "  # the prefix of the canonical-cells reduction


def _canonical_cells(current: dict[str, dict[str, Any]], cell_seconds: dict[tuple[str, str], float],
                     canonical: CanonicalCover) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """Leave out the costliest benchmark, then the costliest target, one at a time, while the
    canonical run holds every cell at the bench's n: the chapter shows the canonical run for the
    claims and this machine's cells beside it, each cell still at full n (so request by request)."""
    bench = current["05_bench"]
    held = {(t, b) for t in bench["targets"] for b in bench["benchmarks"]} <= canonical.cells
    if not held or bench["requests"] != canonical.requests:
        return []
    steps = []

    def cost(targets: list[str], benchmarks: list[str]) -> float:
        return sum(cell_seconds.get((t, b), 0.0) for t in targets for b in benchmarks)

    for key in ("benchmarks", "targets"):
        while len(bench[key]) > 1:
            drop = max(bench[key], key=lambda item: cost([item], bench["benchmarks"]) if key == "targets"
                       else cost(bench["targets"], [item]))
            bench[key] = [item for item in bench[key] if item != drop]
            steps.append((f"{RE_MEASURES}{', '.join(bench['targets'])} on {', '.join(bench['benchmarks'])} "
                          f"(n = {bench['requests']}); the committed canonical run stands for its other cells, "
                          "and the results chapter sets this run beside it", json.loads(json.dumps(current))))
    return steps


def reductions(params: dict[str, dict[str, Any]], cell_seconds: dict[tuple[str, str], float] | None = None,
               canonical: CanonicalCover | None = None) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """The stated reductions, in order; each entry is (reason, parameters after it). ``canonical``:
    the committed canonical run, which lets the results bench re-measure fewer cells (ordered by
    ``cell_seconds``) before it lowers n."""
    steps = []
    current = json.loads(json.dumps(params))
    if "pld" in current["05_bench"]["methods"]:
        current["05_bench"]["methods"] = [m for m in current["05_bench"]["methods"] if m != "pld"]
        steps.append(("PLD left out of the results bench (the paper evaluates no PLD; 03's committed audit "
                      "still checks it)", json.loads(json.dumps(current))))
    if current["06_ablations"]["budgets"]:
        current["06_ablations"]["budgets"] = []
        steps.append(("06's budget sweep left out (the bench chooses its budget per machine from the committed "
                      "dev acceptance, shown in 03)", json.loads(json.dumps(current))))
    side = current["02_sidecar"]
    if side["mode_requests"] > 3 or side["latency_requests"] > 5:
        side["mode_requests"], side["latency_requests"] = min(side["mode_requests"], 3), min(side["latency_requests"], 5)
        steps.append((f"02 times {side['mode_requests']} dev requests per sidecar mode and {side['latency_requests']} "
                      "against the target", json.loads(json.dumps(current))))
    if current["05_bench"]["warmup"] > 1:
        current["05_bench"]["warmup"] = 1
        steps.append(("one untimed warm-up request per target, not "
                      f"{params['05_bench']['warmup']}", json.loads(json.dumps(current))))
    if canonical is not None:
        steps += _canonical_cells(current, cell_seconds or {}, canonical)  # narrows ``current`` in place
    n = current["05_bench"]["requests"]
    while n - 5 >= MIN_REQUESTS:
        n -= 5
        current["05_bench"]["requests"] = n
        steps.append((f"n = {n} requests per benchmark (not {params['05_bench']['requests']})",
                      json.loads(json.dumps(current))))
    return steps


def make_plan(minutes: float | None, speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
              mats: dict[str, dict[int, float]], arithmetic: str,
              params: dict[str, dict[str, Any]] | None = None, cores: int | None = None,
              canonical: CanonicalCover | None = None, sidecar: SidecarSpeed | None = None) -> ReproducePlan:
    """The plan for ``cores`` (default: this process's), with the totals for `WHAT_IF_CORES` beside it;
    ``canonical``: the committed canonical run (`committed_canonical`), if any; ``sidecar``: the
    served sidecar's calibration (`calibrate_sidecar`), if any."""
    params = params or {nb: notebook_parameters(nb) for nb in PLANNED_NOTEBOOKS}
    plan = fit_plan(minutes, speeds, works, mats, arithmetic, params, cores or machine_cores(), canonical, sidecar)
    for count in WHAT_IF_CORES:
        other = plan if count == plan.cores else fit_plan(minutes, speeds, works, mats, arithmetic, params, count,
                                                           canonical, sidecar)
        plan.by_cores.append(CoresEstimate(count, other.full_minutes, other.planned_minutes))
    return plan


def fit_plan(minutes: float | None, speeds: dict[str, Speed], works: dict[str, dict[str, Work]],
             mats: dict[str, dict[int, float]], arithmetic: str, params: dict[str, dict[str, Any]],
             cores: int, canonical: CanonicalCover | None = None,
             sidecar: SidecarSpeed | None = None) -> ReproducePlan:
    """The full plan if it fits ``minutes`` (or no budget), else the least reduction that does, each
    estimated on ``cores``; with more than one slot the bench notebooks get ``executor: ray``."""
    slots = cell_slots(cores)
    measured = StageEstimate("calibration", sum(s.calibrate_s for s in speeds.values())
                             + (sidecar.calibrate_s if sidecar else 0.0),
                             "measured: target loads and forwards" + (", the sidecar's start and waves" if sidecar else ""))

    def estimate_all(chosen: dict[str, dict[str, Any]]) -> list[StageEstimate]:
        return [measured] + estimate(chosen, speeds, works, mats, slots, sidecar)

    full = estimate_all(params)
    plan = ReproducePlan(minutes, arithmetic, list(speeds.values()), full, full, {}, cores=cores, sidecar=sidecar)
    if not minutes or plan.full_minutes <= minutes:
        plan.overrides = _overrides(params, with_executor(params, slots))
        return plan
    reasons: list[str] = []
    chosen = params
    bench = params["05_bench"]
    cells = [(t, b) for t in bench["targets"] for b in bench["benchmarks"]]
    cell_seconds = dict(zip(cells, bench_cells(bench, speeds, works, mats, sidecar=sidecar)))
    for reason, reduced in reductions(params, cell_seconds, canonical):
        for stated in ("n = ", RE_MEASURES):  # only the n and the cells that run are stated
            if reason.startswith(stated):
                reasons = [r for r in reasons if not r.startswith(stated)]
        reasons.append(reason)
        chosen = reduced
        plan.planned = estimate_all(reduced)
        if plan.planned_minutes <= minutes:
            break
    plan.reasons, plan.fits = reasons, plan.planned_minutes <= minutes
    plan.overrides = _overrides(params, with_executor(chosen, slots))
    return plan


def with_executor(params: dict[str, dict[str, Any]], slots: int) -> dict[str, dict[str, Any]]:
    """``executor: ray`` for the bench notebooks when more than one cell fits at once: not a
    reduction (the records are the sequential run's), only where the cells go."""
    if slots <= 1:
        return params
    return {nb: ({**values, "executor": "ray"} if nb in RAY_NOTEBOOKS and "executor" in values else values)
            for nb, values in params.items()}


def _overrides(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Papermill parameters per notebook: what changed; the chapters reading 05's run get it as ``bench``
    (03, which decodes that run, takes its ``executor`` from there)."""
    changed = {nb: {k: v for k, v in after[nb].items() if before[nb].get(k) != v} for nb in after}
    out = {nb: values for nb, values in changed.items() if values and nb != "05_bench"}
    if changed["05_bench"]:
        out["05_bench"] = changed["05_bench"]
        for reader in ("03_toolspec", "04_ooospec", "07_timelines"):
            out.setdefault(reader, {})["bench"] = changed["05_bench"]
    return out


def committed_mats() -> dict[str, dict[int, float]]:
    from ooospec.bench.tree_budget import committed_acceptance

    out = {}
    for target in ("qwen2.5-coder-0.5b", "smollm2-135m-tool"):
        found = committed_acceptance(target)
        if found is not None:
            out[target] = found[0]
    return out


def write_plan(plan: ReproducePlan, directory: Path) -> None:
    """plan.json and one papermill parameter file per notebook it changes (``plan``: its note)."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.yaml"):
        old.unlink()
    for notebook, values in plan.overrides.items():
        (directory / f"{notebook}.yaml").write_text(yaml.safe_dump({**values, "plan": plan.note()}, sort_keys=False))
    (directory / PLAN_FILE).write_text(json.dumps(plan.to_dict(), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """CLI: calibrate this machine, print the estimate per stage, write the plan's parameter files."""
    import argparse

    from ooospec.models.arithmetic import profile_arithmetic

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--minutes", type=float, default=90.0, help="time budget; 0: the full plan, no budget")
    parser.add_argument("--out", type=Path, default=None, help="default: artifacts/reproduce-plan "
                        "(with --cores: nothing is written unless --out is given)")
    parser.add_argument("--cores", type=int, default=None, help="plan for this many cores, a what-if "
                        "(default: this process's cores)")
    args = parser.parse_args(argv)
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores must be at least 1, got {args.cores}")
    params = {nb: notebook_parameters(nb) for nb in PLANNED_NOTEBOOKS}
    targets = list(dict.fromkeys(params["05_bench"]["targets"] + params["03_toolspec"]["targets"]
                                 + params["08_arithmetic"]["targets"]))
    speeds = {t: calibrate(t, args.profile) for t in targets}
    sidecar = calibrate_sidecar(args.profile)
    works = {t: audit_work(t, params["05_bench"]["max_new_tokens"]) for t in targets}
    plan = make_plan(args.minutes or None, speeds, works, committed_mats(),
                     profile_arithmetic(args.profile).sentence(), params, args.cores, committed_canonical(), sidecar)
    if args.out or args.cores is None:  # a what-if leaves the plan `make reproduce` runs alone
        write_plan(plan, args.out or artifacts_dir() / "reproduce-plan")
    print("\n".join(plan.lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
