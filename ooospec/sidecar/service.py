"""The sidecar as a service next to the decode loop, polled without blocking.

The paper runs the sidecar on its own GPU; the CPU analogue is its own process with its own torch
threads, pinned to its own core when there is one. The decode loop submits the request on arrival
and then only ever *polls* (a zero-timeout queue read) at candidate-construction boundaries, so
the sidecar's latency never enters the decode path. Only the compact semantic call crosses the
process boundary, and its byte size is recorded (the paper: 85 B per request on average).

A predictor may hand part of its answer over before it returns (the progressive wave's chosen call,
`ooospec.sidecar.protocol.Predictor`): that result is sent at once with ``early`` set, and a ticket's
poll returns it once, then the final result when it comes.

Faults never change the output: a crashed, hung or garbage-returning sidecar resolves the ticket
to a `SidecarResult` with `error` set, and the hint bank simply offers nothing.

Placements (for the ablations): ``process`` (default), ``thread`` (in-process, sharing the
target's torch threads). ``cpu_affinity`` pins the sidecar process to given cores, so "own core"
vs "the target's core" is one parameter.

The process is watched both ways. It exits on its own within `PARENT_POLL_S` of its parent's
death (a killed bench or Ray worker must not leave a loaded model behind), and a sidecar that
dies while starting is reported at once with its exit code and the end of its stderr (kept in a
file for that), instead of after the whole startup timeout.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ooospec.data.request import Request
from ooospec.sidecar.protocol import MODES, Prediction, Predictor, PredictorSpec

PARENT_POLL_S = 0.5  # how often the sidecar process checks that its parent is still there
STARTUP_POLL_S = 0.2  # how often the parent checks, while waiting for ready, that the sidecar lives
STDERR_TAIL = 2000  # characters of a dead sidecar's stderr quoted in the error


class SidecarStartError(RuntimeError):
    """The sidecar could not start: its model failed to build, or its process died first."""

@dataclass
class SidecarResult:
    """One request's sidecar outcome, with timestamps on the shared monotonic clock."""

    request_id: str
    payload: str | None = None  # the compact semantic call as sent over the wire
    payload_bytes: int = 0
    submitted_at: float = 0.0
    wave_start: float = 0.0
    wave_end: float = 0.0
    sent_at: float = 0.0
    received_at: float = 0.0
    rows: int = 0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    early: bool = False  # a first delivery (the chosen call); the final result follows

    @property
    def wave_s(self) -> float:
        return self.wave_end - self.wave_start

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fill(out: SidecarResult, prediction: Prediction) -> None:
    """``prediction``'s call as it crosses the boundary: compact JSON, and its size."""
    out.rows = prediction.rows
    out.detail = prediction.detail
    if isinstance(prediction.call, str):  # a predictor may hand over raw text; the hint bank validates it
        out.payload = prediction.call
    elif prediction.call is not None:
        out.payload = json.dumps(prediction.call, separators=(",", ":"), ensure_ascii=False)
    if out.payload is not None:
        out.payload_bytes = len(out.payload.encode("utf-8"))


def _run_job(predictor: Predictor, job: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """One request's final result; a first delivery the predictor hands over goes out through
    ``send`` at once (``delay_s`` delays only the final result)."""
    request = Request.from_dict(job["request"])
    out = SidecarResult(request_id=request.id, submitted_at=job["submitted_at"])
    out.wave_start = time.monotonic()

    def early(prediction: Prediction) -> None:
        first = SidecarResult(request_id=request.id, submitted_at=job["submitted_at"], wave_start=out.wave_start,
                              early=True)
        _fill(first, prediction)
        first.wave_end = first.sent_at = time.monotonic()
        send(first.to_dict())

    try:
        _fill(out, predictor.predict(request, job["mode"], early=early))
    except Exception as err:  # a predictor bug must not take the service down
        out.error = f"predictor raised {type(err).__name__}: {err}"
    out.wave_end = time.monotonic()
    if job.get("delay_s"):
        time.sleep(job["delay_s"])  # injected latency (ablation): a slower sidecar or link
    out.sent_at = time.monotonic()
    return out.to_dict()


def _exit_with_parent(parent_pid: int) -> None:
    """End this process (freeing its model) soon after its parent is gone: a daemon thread polls
    the parent pid, since the main thread blocks on the job queue, which a dead parent never closes."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="sidecar-parent-watch", daemon=True).start()


def _serve(spec: PredictorSpec, jobs: Any, results: Any, threads: int | None,
           affinity: list[int] | None, parent_pid: int | None = None) -> None:
    """Sidecar process main: build the predictor once, then answer jobs until told to stop."""
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    if affinity:
        os.sched_setaffinity(0, set(affinity))
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        predictor = spec.build()
    except Exception as err:
        results.put({"ready": False, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()})
        return
    results.put({"ready": True, "pid": os.getpid()})
    while True:
        job = jobs.get()
        # batch 1: only the newest request matters; older queued jobs are answered as superseded
        while job is not None:
            try:
                newer = jobs.get_nowait()
            except queue.Empty:
                break
            results.put(SidecarResult(request_id=Request.from_dict(job["request"]).id,
                                      submitted_at=job["submitted_at"], sent_at=time.monotonic(),
                                      error="superseded by a newer request").to_dict())
            job = newer
        if job is None:
            return
        results.put(_run_job(predictor, job, results.put))


class SidecarService:
    """Owns the sidecar worker and the results it has sent back."""

    def __init__(self, spec: PredictorSpec, placement: str = "process", threads: int | None = 1,
                 cpu_affinity: list[int] | None = None, delay_s: float = 0.0, timeout_s: float = 120.0,
                 startup_timeout_s: float = 600.0):
        if placement not in ("process", "thread"):
            raise ValueError(f"placement must be 'process' or 'thread', not {placement!r}")
        self.spec, self.placement, self.threads = spec, placement, threads
        self.cpu_affinity, self.delay_s, self.timeout_s = cpu_affinity, delay_s, timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._results: dict[str, SidecarResult] = {}
        self._early: dict[str, SidecarResult] = {}  # first deliveries not yet polled
        self._pending: set[str] = set()
        self._worker: Any = None
        self.pid: int | None = None

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> "SidecarService":
        """Start the worker and wait for its model to load (once per run, not per request)."""
        if self.placement == "process":
            ctx = mp.get_context("spawn")
            self._jobs, self._out = ctx.Queue(), ctx.Queue()
            self._worker = ctx.Process(target=_serve, daemon=True, args=(
                self.spec, self._jobs, self._out, self.threads, self.cpu_affinity, os.getpid()))
            handle, name = tempfile.mkstemp(prefix="ooospec-sidecar-", suffix=".stderr")
            os.close(handle)
            self._stderr = Path(name)
            with _stderr_to(self._stderr):  # the child inherits it from its first instruction on
                self._worker.start()
        else:
            self._jobs, self._out = queue.Queue(), queue.Queue()
            self._worker = threading.Thread(target=_serve, daemon=True,
                                            args=(self.spec, self._jobs, self._out, None, None))
            self._worker.start()
        hello = self._await_ready()
        if not hello.get("ready"):
            self.stop()
            raise SidecarStartError(f"sidecar failed to start: {hello.get('error')}\n{hello.get('trace', '')}")
        self.pid = hello.get("pid")
        return self

    def _await_ready(self) -> dict[str, Any]:
        """The worker's first message; a worker that dies first is reported at once, with its exit
        code and the end of its stderr, not after ``startup_timeout_s``."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                return self._out.get(timeout=STARTUP_POLL_S)
            except queue.Empty:
                pass
            if not self._worker.is_alive():
                try:  # it may have said ready (or why not) just before it ended
                    return self._out.get(timeout=STARTUP_POLL_S)
                except queue.Empty:
                    code = getattr(self._worker, "exitcode", None)
                    tail = self.stderr_tail()
                    self.stop()
                    raise SidecarStartError(f"sidecar process died while starting (exit code {code})"
                                            + (f"; the end of its stderr:\n{tail}" if tail else "; it wrote no stderr"))
            if time.monotonic() > deadline:
                tail = self.stderr_tail()
                self.stop()
                raise SidecarStartError(f"sidecar did not say ready within {self.startup_timeout_s:.0f} s"
                                        + (f"; the end of its stderr:\n{tail}" if tail else ""))

    def stderr_tail(self) -> str:
        """The last `STDERR_TAIL` characters the sidecar process wrote to stderr ('' for a thread)."""
        path = getattr(self, "_stderr", None)
        if path is None or not path.exists():
            return ""
        return path.read_text(encoding="utf-8", errors="replace")[-STDERR_TAIL:].strip()

    def stop(self) -> None:
        if self._worker is None:
            return
        if self.alive:
            self._jobs.put(None)
            self._worker.join(timeout=10)
        if self.placement == "process" and self._worker.is_alive():
            self._worker.kill()
            self._worker.join(timeout=10)
        self._worker = None
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.unlink(missing_ok=True)
            self._stderr = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def __enter__(self) -> "SidecarService":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # requests ------------------------------------------------------------------------------
    def submit(self, request: Request, mode: str = "wave") -> "SidecarTicket":
        if mode not in MODES:
            raise ValueError(f"sidecar mode must be one of {MODES}, not {mode!r}")
        submitted_at = time.monotonic()
        self._results.pop(request.id, None)
        self._early.pop(request.id, None)
        self._pending.add(request.id)
        self._jobs.put({"request": request.to_dict(), "mode": mode, "submitted_at": submitted_at,
                        "delay_s": self.delay_s})
        return SidecarTicket(self, request.id, submitted_at)

    def result(self, request_id: str, submitted_at: float) -> "SidecarResult | None":
        """Zero-timeout check for one request: its result, an error result (the worker died, or
        the request is older than ``timeout_s``), or None (not yet). A first delivery comes before
        the final result, once, even when both are in."""
        self._drain()
        first = self._early.pop(request_id, None)
        if first is not None:
            return first
        result = self._results.pop(request_id, None)
        if result is not None:
            return result
        now = time.monotonic()
        if not self.alive:
            code = getattr(self._worker, "exitcode", None)
            tail = self.stderr_tail()[-300:]
            return failed_result(request_id, submitted_at, f"sidecar worker died (exit code {code})"
                                 + (f"; its stderr ends: {tail}" if tail else ""), now)
        if now - submitted_at > self.timeout_s:
            return failed_result(request_id, submitted_at, f"sidecar timed out after {self.timeout_s:.1f} s", now)
        return None

    def _drain(self) -> None:
        while True:
            try:
                message = self._out.get_nowait()
            except queue.Empty:
                return
            if "request_id" in message:
                result = SidecarResult(**message)
                result.received_at = time.monotonic()
                if result.early:
                    self._early[result.request_id] = result
                    continue
                self._results[result.request_id] = result
                self._pending.discard(result.request_id)

    @property
    def idle(self) -> bool:
        """No submitted job is still unanswered (a zero-timeout check: never waits). A worker
        that died counts as idle: it computes nothing."""
        self._drain()
        return not self._pending or not self.alive

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted job is answered (between requests, outside timing), so
        each request finds the sidecar free, as at batch 1 on its own device."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while self._pending and self.alive and time.monotonic() < deadline:
            self._drain()
            time.sleep(0.002)
        self._results.clear()
        self._early.clear()
        idle = not self._pending
        self._pending.clear()
        return idle


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """File descriptor 2 points at ``path`` inside the block (a spawned child inherits it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as handle:
        os.dup2(handle.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def failed_result(request_id: str, submitted_at: float, why: str, now: float) -> SidecarResult:
    return SidecarResult(request_id=request_id, submitted_at=submitted_at, received_at=now, error=why)


@dataclass
class SidecarTicket:
    """The decode loop's handle on one submitted request: a first delivery (``early``) is returned
    once, then nothing until the final answer, which stays."""

    service: SidecarService
    request_id: str
    submitted_at: float
    _final: SidecarResult | None = None

    def poll(self) -> SidecarResult | None:
        """Zero-timeout check: the result, an error result (crash / hang), a first delivery, or None."""
        if self._final is not None:
            return self._final
        result = self.service.result(self.request_id, self.submitted_at)
        if result is not None and not result.early:
            self._final = result
        return result

    def wait(self, timeout_s: float | None = None) -> SidecarResult:
        """Block until the result is in: used only by the *blocking* ablation."""
        deadline = time.monotonic() + (self.service.timeout_s if timeout_s is None else timeout_s)
        while True:
            result = self.poll()
            if result is not None:
                return result
            if time.monotonic() > deadline:
                self._final = failed_result(self.request_id, self.submitted_at, "sidecar wait timed out",
                                            time.monotonic())
                return self._final
            time.sleep(0.002)
