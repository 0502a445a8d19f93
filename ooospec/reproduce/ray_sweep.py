"""The sweep: every bench cell as a Ray task, on a Ray cluster or on a local Ray instance.

A full-size sweep takes days on 2 cores, so it is cut into **cells** that run anywhere:

* **A cell** is one (config, target, benchmark) slice: every method of the config interleaved per
  request, the requests in file order (call retrieval learns from earlier calls), exactly the
  slice `ooospec.bench.runner.run_bench` decodes, through the same code (`ooospec.bench.runner.run_cell`).
  Nothing is shared between slices (retrieval memory and the oracle's calls live inside one), so
  cells run in any order, on any node, and give the sequential run's records.
* **The configs** are the notebooks' own: the defaults of the ``parameters`` cells of
  ``05_bench`` (one cell per target x benchmark) and ``06_ablations`` (one per target x benchmark
  of the ablation set), with the same overrides papermill takes. The slices therefore land in the
  stages the chapters read, and the book is built from them unchanged.
* **Cores.** A task asks Ray for ``threads + sidecar_threads`` CPUs (the target's core plus the
  sidecar's), so Ray never places more cells on a node than it has CPUs. Inside the task,
  `reserved_cores` takes that many *specific* cores: one ``flock`` per core on a node-local lock
  file (``$TMPDIR/ooospec-cores/core-<n>.lock``), then ``os.sched_setaffinity`` on the task's
  process; the bench pins the target to the first of them and the sidecar process to the second.
  Two cells therefore never share a core, even when Ray's CPU count and the core ids disagree,
  and a lock dies with its process, so a crashed task frees its cores. The affinity is restored
  afterwards, because Ray reuses worker processes.
* **Failures.** A task that raises or whose worker dies is retried (``max_retries``, exceptions
  included), then reported with a one-line error while the other cells finish. Each finished
  cell's slice is written (atomically) as soon as it comes back, so nothing finished is lost;
  a rerun skips every finished slice.
* **Bad input** fails before any task runs, in one line: an unreachable ``RAY_ADDRESS`` (probed
  with a TCP connect first, since ``ray.init`` retries an absent cluster for minutes) or a
  cluster with no node that has the CPUs of one cell (Ray would otherwise wait forever).

``ray`` is imported only here and only when a sweep runs, so the rest of the package never
needs it.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ooospec.bench.config import BenchConfig, notebook_config
from ooospec.bench.plan import TargetProvider, plan_bench
from ooospec.bench.runner import run_cell
from ooospec.bench.sampling import load_benchmark
from ooospec.bench.slices import assemble_records, bench_stage, slice_path, write_slice
from ooospec.data.request import Request
from ooospec.paths import artifacts_dir

NOTEBOOKS = ("05_bench", "06_ablations")
EXECUTORS = ("local", "ray")
# driver settings a task must see too (a local Ray instance's workers inherit the environment of
# the moment Ray started, not of the moment a task is submitted)
FORWARDED_ENV = ("OOOSPEC_ARTIFACTS", "OOOSPEC_RAW_DATA", "OOOSPEC_PROFILE", "HF_HUB_OFFLINE",
                 "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
                 "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # `make KERNELS=avx2`
LOCK_DIR = Path(tempfile.gettempdir()) / "ooospec-cores"


class SweepError(RuntimeError):
    """The sweep cannot run, or some of its cells failed; the message is meant to be read as is."""


# ---------------------------------------------------------------- cells and their outcomes


@dataclass(frozen=True)
class Cell:
    """One slice of one config: the unit a Ray task runs."""

    label: str  # which config (the notebook's name)
    config: BenchConfig
    target: str
    benchmark: str
    slice_rel: str  # where its slice goes, relative to the artifacts root (target fingerprint included)

    @property
    def name(self) -> str:
        return f"{self.label}:{self.target}/{self.benchmark}"

    @property
    def cpus(self) -> int:
        """The target's cores plus the sidecar's."""
        return self.config.threads + self.config.sidecar_threads


@dataclass
class CellOutcome:
    cell: str
    status: str  # done | skipped (its slice existed) | failed
    records: int = 0
    error: str | None = None
    node: str | None = None
    cores: list[int] = field(default_factory=list)
    seconds: float | None = None
    attempts: int | None = None  # of a failed task: the first try and its retries

    def line(self) -> str:
        if self.status == "failed":
            tries = f" after {self.attempts} attempts" if self.attempts else ""
            return f"{self.cell}: FAILED{tries}: {self.error}"
        where = f" on {self.node} cores {self.cores}" if self.node else ""
        took = f" in {self.seconds:.0f} s" if self.seconds is not None else ""
        return f"{self.cell}: {self.status}, {self.records} records{where}{took}"


@dataclass
class SweepReport:
    outcomes: list[CellOutcome]
    skipped_targets: dict[str, str] = field(default_factory=dict)  # target -> why (weights missing)

    @property
    def failed(self) -> list[CellOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def lines(self) -> list[str]:
        counts = {s: sum(o.status == s for o in self.outcomes) for s in ("done", "skipped", "failed")}
        head = f"sweep: {counts['done']} cells run, {counts['skipped']} already finished, {counts['failed']} failed"
        return ([head] + [f"  target {t} skipped: {why}" for t, why in self.skipped_targets.items()]
                + [f"  {o.line()}" for o in self.failed])

    def check(self) -> "SweepReport":
        """Raise `SweepError` naming every failed cell (finished slices stay on disk)."""
        if self.failed:
            raise SweepError("\n".join(self.lines()))
        return self


@dataclass
class CellResult:
    """What a task sends back: the records (the driver writes the slice where it runs, so a
    cluster needs no shared filesystem), and where the slice was meant to go, as a check."""

    records: list[dict[str, Any]]
    slice_rel: str  # the slice path relative to the artifacts root of the node that ran it
    node: str
    cores: list[int]
    seconds: float


def plan_cells(configs: dict[str, BenchConfig], targets: TargetProvider | None = None
               ) -> tuple[list[Cell], list[CellOutcome], dict[str, str]]:
    """Pending cells, the cells whose slice exists (skipped) and the targets that cannot run."""
    from ooospec.bench.plan import ProfileTargets

    pending, finished, skipped_targets = [], [], {}
    for label, cfg in configs.items():
        plan = plan_bench(cfg)
        stage = bench_stage(cfg, plan)
        provider = targets or ProfileTargets(plan.profile)
        for name in cfg.targets:
            try:
                fingerprint = provider.fingerprint(name)
            except FileNotFoundError as err:
                skipped_targets[name] = str(err)
                continue
            for benchmark in cfg.benchmarks:
                path = slice_path(stage, name, fingerprint, benchmark)
                cell = Cell(label, cfg, name, benchmark, str(path.relative_to(artifacts_dir())))
                if path.exists():
                    finished.append(CellOutcome(cell.name, "skipped"))
                else:
                    pending.append(cell)
    return pending, finished, skipped_targets


# ---------------------------------------------------------------- inside a task


@contextmanager
def reserved_cores(count: int, lock_dir: Path = LOCK_DIR) -> Iterator[list[int]]:
    """Hold ``count`` cores of this node that no other sweep task holds, and pin this process
    (and so the processes it starts) to them; release and restore the affinity on exit."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    before = os.sched_getaffinity(0)
    held: list[tuple[int, Any]] = []
    try:
        for core in sorted(before):
            handle = open(lock_dir / f"core-{core}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            held.append((core, handle))
            if len(held) == count:
                break
        if len(held) < count:
            raise SweepError(f"node {socket.gethostname()}: {len(held)} of its {len(before)} cores are free, a cell "
                             f"needs {count}; is Ray's CPU count for this node above its cores (ray start --num-cpus)?")
        cores = [core for core, _ in held]
        os.sched_setaffinity(0, cores)
        yield cores
    finally:
        os.sched_setaffinity(0, before)
        for _, handle in held:
            handle.close()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the task's duration (Ray workers are reused)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cell_task(cell: Cell, env: dict[str, str], targets: TargetProvider | None,
                  load_requests: Callable[[str], list[Request]]) -> CellResult:
    """The body of a Ray task: take the cell's cores, decode its slice, send the records back."""
    start = time.perf_counter()
    with environment(env), reserved_cores(cell.cpus) as cores:
        path, records = run_cell(cell.config, cell.target, cell.benchmark, targets=targets,
                                 load_requests=load_requests)
        rel = str(path.relative_to(artifacts_dir()))
    return CellResult(records, rel, socket.gethostname(), cores, time.perf_counter() - start)


# ---------------------------------------------------------------- the driver


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address no Ray cluster answers (``ray.init`` would retry for minutes)."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise SweepError(f"RAY_ADDRESS={address!r} is not host:port (or ray://host:port, auto)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise SweepError(f"no Ray cluster answers at RAY_ADDRESS={address} ({err.strerror or err}); start one "
                         "with `ray start --head` there, or unset RAY_ADDRESS to run on a local Ray instance") from None


@contextmanager
def ray_session(address: str | None, num_cpus: int | None) -> Iterator[Any]:
    """Connect to ``address`` (default ``RAY_ADDRESS``) or start a local instance; reuse one
    already initialized (tests); shut down only what was started here."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _probe(address)
        try:
            ray.init(address=address)
        except (ConnectionError, RuntimeError) as err:
            raise SweepError(f"cannot join the Ray cluster at {address}: {str(err).splitlines()[0]}") from None
    else:
        ray.init(address="local", num_cpus=num_cpus or len(os.sched_getaffinity(0)), include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _check_cpus(ray: Any, cells: list[Cell]) -> None:
    """Refuse cells that no node can hold (Ray would keep them pending forever)."""
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=0)
    need = max(cell.cpus for cell in cells)
    if need > largest:
        raise SweepError(f"a cell needs {need} CPUs on one node (its target's core plus its sidecar's); "
                         f"the largest node of this Ray cluster has {largest:g}")


def _one_line(err: BaseException) -> str:
    """``Type: message`` of the error a task raised (not Ray's wrapper), or of Ray's own error."""
    cause = getattr(err, "cause", None)
    err = cause if isinstance(cause, BaseException) else err
    text = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {text}"


def run_sweep(configs: dict[str, BenchConfig], *, address: str | None = None, num_cpus: int | None = None,
              max_retries: int = 1, targets: TargetProvider | None = None,
              load_requests: Callable[[str], list[Request]] = load_benchmark,
              log: Callable[[str], None] = print) -> SweepReport:
    """Run every pending cell of ``configs`` (label -> config) as a Ray task and write its slice.

    ``address`` (else ``RAY_ADDRESS``) names a cluster; without one a local Ray instance with
    ``num_cpus`` (default: this process's cores) runs for the sweep. ``targets`` and
    ``load_requests`` replace the profile's models and evaluation files (tests); they are sent
    to the tasks. Failed cells are in the report; call `SweepReport.check` to raise on them.
    """
    pending, outcomes, skipped_targets = plan_cells(configs, targets)
    for target, why in skipped_targets.items():
        log(f"sweep: target {target} skipped: {why}")
    log(f"sweep: {len(pending)} cells to run, {len(outcomes)} already finished")
    if pending:
        with ray_session(address, num_cpus) as ray:
            _check_cpus(ray, pending)
            outcomes += _run_tasks(ray, pending, max_retries, targets, load_requests, log)
    for cfg in configs.values():
        assemble_records(bench_stage(cfg))
    report = SweepReport(outcomes, skipped_targets)
    for line in report.lines():
        log(line)
    return report


def _run_tasks(ray: Any, cells: list[Cell], max_retries: int, targets: TargetProvider | None,
               load_requests: Callable[[str], list[Request]], log: Callable[[str], None]) -> list[CellOutcome]:
    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    env.setdefault("OOOSPEC_ARTIFACTS", str(artifacts_dir()))
    remote = ray.remote(run_cell_task)
    refs = {remote.options(num_cpus=cell.cpus, max_retries=max_retries, retry_exceptions=True,
                           name=f"ooospec {cell.name}").remote(cell, env, targets, load_requests): cell
            for cell in cells}
    outcomes = []
    waiting = list(refs)
    try:
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            cell = refs[ready[0]]
            try:
                result = ray.get(ready[0])
            except Exception as err:  # a task that failed after its retries: report it, keep going
                outcome = CellOutcome(cell.name, "failed", error=_one_line(err), attempts=max_retries + 1)
            else:
                outcome = _store(cell, result)
            outcomes.append(outcome)
            log(f"sweep: [{len(outcomes)}/{len(cells)}] {outcome.line()}")
    except KeyboardInterrupt:
        for ref in waiting:
            ray.cancel(ref, force=True)
        raise
    return outcomes


def _store(cell: Cell, result: CellResult) -> CellOutcome:
    """Write the slice the task sent back, where this driver's bench will look for it."""
    if result.slice_rel != cell.slice_rel:
        return CellOutcome(cell.name, "failed", node=result.node, error=(
            f"node {result.node} keyed its slice as {result.slice_rel}, this driver as {cell.slice_rel}: "
            "its models, adapters or code differ from the driver's"))
    path = artifacts_dir() / cell.slice_rel
    if not path.exists():
        write_slice(path, result.records)
    return CellOutcome(cell.name, "done", len(result.records), node=result.node, cores=result.cores,
                       seconds=result.seconds)


def run_cells(executor: str, configs: dict[str, BenchConfig], **options: Any) -> SweepReport | None:
    """The notebooks' ``executor`` parameter: ``local`` leaves every cell to `run_bench` (in this
    process, one after another); ``ray`` runs the missing cells as Ray tasks first and raises
    if any failed, so `run_bench` afterwards only reads finished slices."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    if executor == "local":
        return None
    return run_sweep(configs, **options).check()


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(prog="python -m ooospec.reproduce.ray_sweep", description=(
        "Run the bench's and the ablations' cells as Ray tasks (RAY_ADDRESS, else a local Ray instance)."))
    parser.add_argument("--profile", default=os.environ.get("OOOSPEC_PROFILE", "cpu"))
    parser.add_argument("--params", default="{}", help="YAML overrides of the notebooks' parameters, "
                        "as papermill -y, e.g. '{requests: null}' for the full-size sweep")
    parser.add_argument("--notebooks", nargs="+", default=list(NOTEBOOKS), choices=NOTEBOOKS)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS)")
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray instance")
    parser.add_argument("--max-retries", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true", help="list the pending cells and stop")
    args = parser.parse_args(argv)
    overrides = yaml.safe_load(args.params) or {}
    if not isinstance(overrides, dict):
        parser.error(f"--params must be a YAML mapping, got {args.params!r}")
    overrides["profile"] = args.profile
    try:
        configs = {nb: notebook_config(nb, overrides) for nb in args.notebooks}
        if args.dry_run:
            pending, finished, skipped = plan_cells(configs)
            for cell in pending:
                print(f"pending {cell.name} ({cell.cpus} CPUs)")
            print(f"{len(pending)} pending, {len(finished)} finished, targets skipped: {sorted(skipped) or 'none'}")
            return 0
        report = run_sweep(configs, address=args.address, num_cpus=args.num_cpus, max_retries=args.max_retries)
    except (SweepError, ValueError) as err:
        print(f"sweep: {err}", file=sys.stderr)
        return 2
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
