"""This machine's forward times per target: what a time plan multiplies work by, and what a hint
replay models seconds from.

A calibration is a study of its own (a few forwards on one dev request, on one and two threads),
kept apart from the time plan so that the replay study can read a plan's speeds without importing
the planner that estimates the replay.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

PLAN_FILE = "plan.json"  # a reproduce plan's calibration and estimate, under artifacts/reproduce-plan/


@dataclass(frozen=True)
class Speed:
    """A target's forward times on this machine (seconds; minimum of a few repeats)."""

    target: str
    step_s: float  # a one-row decode step, one thread
    step_2t_s: float  # the same on two threads
    verify_s: dict[int, float]  # draft nodes -> verify forward, one thread
    verify_2t_s: dict[int, float]
    prefill_token_s: float  # prefill time per prompt token, one thread
    prefill_2t_token_s: float
    nodes: int  # the tree budget the bench will choose here
    calibrate_s: float = 0.0
    dtype: str | None = None  # the arithmetic these times ran in (None: a plan written before it was kept)

    def verify(self, nodes: int | None = None, both_cores: bool = False) -> float:
        """Verify time at ``nodes`` (None: the chosen budget), interpolated between measured sizes."""
        curve = self.verify_2t_s if both_cores else self.verify_s
        nodes = self.nodes if nodes is None else nodes
        sizes = sorted(curve)
        if nodes in curve:
            return curve[nodes]
        below = max([s for s in sizes if s < nodes], default=sizes[0])
        above = min([s for s in sizes if s > nodes], default=sizes[-1])
        if above == below:
            return curve[below] * nodes / below if below else curve[below]
        share = (nodes - below) / (above - below)
        return curve[below] + share * (curve[above] - curve[below])



def calibrate(target_name: str, profile: str, repeats: int = 3) -> Speed:
    """Load the target and time it on the first dev request (about 30 s for Qwen on the AVX2 CPU)."""
    from ooospec.studies.target_cache import cached_target
    from ooospec.data import load_split

    started = time.perf_counter()
    target = cached_target(target_name, profile)
    speed = measure_speed(target, target.prompt_ids(load_split("dev")[0]), target_name, repeats)
    return replace(speed, calibrate_s=round(time.perf_counter() - started, 1))


def measure_speed(target: Any, prompt: list[int], target_name: str, repeats: int = 3,
                  sizes: tuple[int, ...] = (0, 4, 8, 16, 32)) -> Speed:
    """Time one prefill, a one-row step and verify forwards, on one and two threads, and the tree
    budget the bench will choose here (`ooospec.bench.tree_budget.machine_budget`)."""
    from ooospec.studies.target_cache import torch_threads
    from ooospec.bench.tree_budget import machine_budget
    from ooospec.bench.verify_cost import verify_cost_curve
    from ooospec.decoding.loop import Prefill
    from ooospec.decoding.verifier import TreeVerifier

    verifier = TreeVerifier.for_target(target)
    curves, prefill = {}, {}
    for threads in (1, 2):
        with torch_threads(threads):
            prefill[threads] = min(Prefill.measure(verifier, prompt).seconds for _ in range(2)) / len(prompt)
            curves[threads] = {p.nodes: p.min_s for p in verify_cost_curve(verifier, prompt, sizes, repeats)}
    with torch_threads(1):
        nodes = machine_budget(verifier, prompt, target_name, repeats=repeats).budget["max_nodes"]
    one, two = curves[1], curves[2]
    return Speed(target_name, one[0], two[0], {n: s for n, s in one.items() if n}, {n: s for n, s in two.items() if n},
                 prefill[1], prefill[2], nodes, dtype=str(verifier.dtype).removeprefix("torch."))



@dataclass(frozen=True)
class SidecarSpeed:
    """The served sidecar on this machine: what a bench slice pays for it outside its timed decodes.

    Each distinct sidecar of a slice is started once (a process, its model and adapter loaded), and
    after each decode the bench waits for the sidecar to be idle, so a wave that outlasts its
    request is paid in full (`ooospec.bench.runner`)."""

    start_s: float  # process spawn to ready
    wave_s: float  # median of the timed waves, the sidecar alone on one thread
    waves: int  # waves timed (after one untimed, which warms its shapes up)
    calibrate_s: float = 0.0


SIDECAR_WAVES = 3  # dev requests whose waves are timed


def calibrate_sidecar(profile: str, waves: int = SIDECAR_WAVES) -> SidecarSpeed | None:
    """Start the profile's served sidecar and time its waves on the first dev requests (27 s on
    the Xeon with amx_bf16, beside a training job: most of it the start); None where no sidecar adapter is trained."""
    from ooospec.bench.plan import find_sidecar_adapter
    from ooospec.data import load_split
    from ooospec.sidecar.specs import slot_sidecar

    adapter = find_sidecar_adapter(profile)
    if adapter is None:
        return None
    return measure_sidecar(slot_sidecar(adapter, profile), load_split("dev")[:waves + 1])


def measure_sidecar(spec: Any, requests: list[Any]) -> SidecarSpeed:
    """Start ``spec`` as the bench does (a process, one thread), send ``requests`` one at a time and
    time each wave from submission to result; the first is untimed. A wave that fails is refused:
    a plan cannot be made from a sidecar that does not answer."""
    from ooospec.sidecar.service import SidecarService

    if len(requests) < 2:
        raise ValueError(f"measure_sidecar: needs at least 2 requests (one untimed), got {len(requests)}")
    started = time.perf_counter()
    service = SidecarService(spec, placement="process", threads=1).start()
    start_s = time.perf_counter() - started
    times = []
    try:
        for request in requests:
            begun = time.perf_counter()
            result = service.submit(request).wait()
            if result.error is not None:
                raise RuntimeError(f"measure_sidecar: the sidecar's wave on {request.id} failed: {result.error}")
            times.append(time.perf_counter() - begun)
    finally:
        service.stop()
    timed = sorted(times[1:])
    return SidecarSpeed(round(start_s, 3), round(timed[len(timed) // 2], 3), len(timed),
                        round(time.perf_counter() - started, 1))


def load_speed(target_name: str, plan_path: Path) -> Speed:
    """The target's calibrated forward times from a reproduce plan (`ooospec.reproduce.time_plan`)."""
    plan = json.loads(Path(plan_path).read_text())
    for s in plan["speeds"]:
        if s["target"] == target_name:
            return Speed(**{**s, "verify_s": {int(k): v for k, v in s["verify_s"].items()},
                            "verify_2t_s": {int(k): v for k, v in s["verify_2t_s"].items()}})
    raise ValueError(f"{plan_path}: no calibration of {target_name!r}")
