"""This machine's costs for the wave policy, measured once per target and kept beside the artifacts.

`ooospec.decoding.wave_policy.WavePolicy` chooses each request's wave schedule from a modelled
end-to-end time; the model's inputs are this machine's prefill, verify-round and wave seconds and
how much a running wave slows the target (`WaveCosts`). They are measured on dev requests with the
loaded target and its started sidecar, outside every timed decode, and written to
``artifacts/wave-costs/<target>.json`` with the arithmetic and machine they were measured on.

A file measured on another machine or in another arithmetic is never used: it is refused with one
line naming it and what differs, and the costs are measured again (and the file replaced).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ooospec.bench.placement import CorePlan, placed
from ooospec.bench.verify_cost import random_tree_drafts
from ooospec.data.request import Request
from ooospec.decoding.loop import Prefill
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier, commit_kv
from ooospec.decoding.wave_policy import WaveCosts
from ooospec.paths import artifact_path, shown

# what must match for a calibration to be used: the arithmetic and the machine it ran on
MACHINE_FIELDS = ("dtype", "device", "cpu", "cpu_capability", "bf16_kernels", "bf16_flag", "cores", "kernels")
# costs a calibration must have measured (a file from before they were timed is measured again)
MODEL_FIELDS = ("prefill_contention", "wave_contention")
ROUND_REPEATS = 5
WAVE_REQUESTS = 4  # requests whose waves are timed (the fit's points): the run's first, as for the tree budget; timing only
# The model's dev constants, from the hint replay on the 60 dev requests with a committed teacher
# trace and a served wave (`python -m ooospec.studies.hint_replay --nodes 16 --arrivals`, Qwen target,
# sidecar-cpu-kall-pass2 as served, every slot filled; counts, not seconds, so they hold on any
# machine): ToolSpec 625 verify rounds (R = 10.4 a request); OoO-Spec's hint arriving after 0 / 1 / 2 /
# 4 / 8 rounds: 419 / 434 / 457 / 519 / 578 rounds (G(k) = 3.43 / 3.18 / 2.80 / 1.77 / 0.78). A replay
# needs the target's own greedy outputs, which only the teacher (Qwen) has committed: the SmolLM2
# target uses Qwen's.
DEV_ROUNDS = 625 / 60
DEV_HINT_SAVED = tuple((k, round((625 - forwards) / 60, 2))
                       for k, forwards in ((0, 419), (1, 434), (2, 457), (4, 519), (8, 578)))


def machine_of(arithmetic: dict[str, Any]) -> dict[str, Any]:
    """The part of a run's arithmetic record that says which machine and arithmetic it was."""
    return {field: arithmetic.get(field) for field in MACHINE_FIELDS}


def costs_path(target: str) -> Path:
    return artifact_path("wave-costs", f"{target}.json")


@dataclass(frozen=True)
class Calibration:
    """Wave costs and the machine they were measured on (what the file holds)."""

    costs: WaveCosts
    machine: dict[str, Any]
    measured: dict[str, Any]  # the raw points the costs were fitted on

    def to_dict(self) -> dict[str, Any]:
        return {"costs": self.costs.to_dict(), "machine": self.machine, "measured": self.measured}

    @classmethod
    def read(cls, path: Path) -> "Calibration":
        data = json.loads(path.read_text())
        return cls(WaveCosts(**data["costs"]), data["machine"], data.get("measured", {}))


def usable(path: Path, target: str, machine: dict[str, Any]) -> tuple[Calibration | None, str | None]:
    """The calibration in ``path`` if it was measured here for ``target``; else None and why not
    (None, None: there is no file)."""
    if not path.exists():
        return None, None
    try:
        found = Calibration.read(path)
    except (ValueError, KeyError, TypeError) as err:
        return None, f"{shown(path)}: not a wave-cost calibration ({err})"
    missing = [f for f in MODEL_FIELDS if f not in json.loads(path.read_text())["costs"]]
    if missing:
        return None, f"{shown(path)}: measured without {', '.join(missing)}: refused, measuring again"
    if found.costs.target != target:
        return None, f"{shown(path)}: measured for {found.costs.target}, not {target}"
    differs = {k: (found.machine.get(k), v) for k, v in machine.items() if found.machine.get(k) != v}
    if differs:
        what = "; ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in differs.items())
        return None, f"{shown(path)}: measured on another machine or arithmetic ({what}): refused, measuring again"
    return found, None


def _round_seconds(verifier: TreeVerifier, prompt: list[int], nodes: int, repeats: int,
                   busy: Any = None, after_prefill: Any = None) -> list[float]:
    """Verify forwards of a ``nodes``-node tree after ``prompt``; with ``busy`` (a callable that
    says whether the sidecar still computes) only those taken while it does. ``after_prefill`` runs
    once the prompt is in (where the wave is submitted, so that it runs beside the rounds)."""
    state, _ = verifier.prefill(prompt)
    if after_prefill is not None:
        after_prefill()
    vocab = verifier.config.get_text_config().vocab_size
    tree = build_tree(random_tree_drafts(nodes, vocab, random.Random(0)), TreeBudget(nodes, nodes))
    times = []
    for index in range(repeats + 1):
        if busy is not None and not busy():
            break
        prefix = state.cache_len
        start = time.perf_counter()
        verifier.forward_tree(state, tree)
        elapsed = time.perf_counter() - start
        commit_kv(state.cache, prefix, [], dense=verifier.dense_cache)
        if index or busy is not None:  # the first idle forward warms the shape up
            times.append(elapsed)
    return times


def measure(target: Any, verifier: TreeVerifier, service: Any, requests: list[Request], nodes: int,
            cores: CorePlan, threads: int, machine: dict[str, Any]) -> Calibration:
    """Time this machine's prefill per token and verify round (one and two threads), the sidecar's
    wave against the prompt's length, and the target's slowdown while a wave runs."""
    prompts = [target.prompt_ids(r) for r in requests]
    middle = sorted(prompts, key=len)[len(prompts) // 2]
    own = {cores.target_core} if cores.pinned else None
    both = {cores.target_core, cores.sidecar_core} if cores.pinned else None
    per_token, rounds = {}, {}
    for width, where in ((1, own), (2, both)):
        with placed(where, width * threads):
            per_token[width] = min(Prefill.measure(verifier, middle).seconds for _ in range(2)) / len(middle)
            rounds[width] = statistics.median(_round_seconds(verifier, middle, nodes, ROUND_REPEATS))
    waves = []
    for request, prompt in zip(requests, prompts):
        service.wait_idle()
        started = time.monotonic()
        ticket = service.submit(request)
        result = ticket.wait()
        waves.append((len(prompt), time.monotonic() - started if result.error is None else None))
    with placed(own, threads):
        beside = _round_seconds(verifier, middle, nodes, 50, busy=lambda: not service.idle,
                                after_prefill=lambda: service.submit(requests[0]))
    service.wait_idle()
    contention = max(1.0, statistics.median(beside) / rounds[1]) if beside else 1.0
    prefill_slow, wave_slow, overlap = _prefill_beside_wave(verifier, middle, service, requests[0], own, threads,
                                                            per_token[1] * len(middle), waves[0][1])
    base, per = _fit([(n, s) for n, s in waves if s is not None])
    costs = WaveCosts(machine=_short(machine), target=target.name, prefill_token_s=round(per_token[1], 6),
                      prefill_2t_token_s=round(per_token[2], 6), round_s=round(rounds[1], 4),
                      round_2t_s=round(rounds[2], 4), wave_base_s=round(base, 4), wave_token_s=round(per, 6),
                      contention=round(contention, 3), prefill_contention=round(prefill_slow, 3),
                      wave_contention=round(wave_slow, 3), rounds=round(DEV_ROUNDS, 2), hint_saved=DEV_HINT_SAVED)
    measured = {"prefill_prompt_tokens": len(middle), "nodes": nodes, "waves": waves,
                "rounds_beside_a_wave": len(beside), "prefill_and_wave_overlap_s": round(overlap, 3)}
    return Calibration(costs, machine, measured)


def _prefill_beside_wave(verifier: TreeVerifier, prompt: list[int], service: Any, request: Request,
                         where: set[int] | None, threads: int, alone_prefill: float,
                         alone_wave: float | None) -> tuple[float, float, float]:
    """How much a narrow prefill and a wave slow each other (the elastic schedule's first seconds): a
    wave submitted as the prefill starts, both timed, each slowdown read from the seconds they
    overlapped (`_slowdown`). Returns (prefill's, wave's, overlap seconds); 1.0 where the wave failed."""
    service.wait_idle()
    with placed(where, threads):
        started = time.monotonic()
        ticket = service.submit(request)
        prefill_s = Prefill.measure(verifier, prompt).seconds
        result = ticket.wait()
        wave_s = time.monotonic() - started
    if result.error is not None or alone_wave is None:
        return 1.0, 1.0, 0.0
    overlap = min(prefill_s, wave_s)
    return _slowdown(prefill_s, alone_prefill, overlap), _slowdown(wave_s, alone_wave, overlap), overlap


def _slowdown(beside: float, alone: float, overlap: float) -> float:
    """``s`` such that work of ``alone`` seconds took ``beside``: ``s`` times slower for the
    ``overlap`` seconds, full speed after (``alone = overlap / s + beside - overlap``); at least 1."""
    during = alone - (beside - overlap)  # seconds of work (at full speed) done during the overlap
    if alone <= 0:
        return 1.0
    if overlap <= 0 or during <= 0:
        return max(1.0, beside / alone)
    return max(1.0, overlap / during)


def _fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``seconds = base + per * tokens`` (both >= 0); one point or one length: all base."""
    if not points:
        raise RuntimeError("no sidecar wave answered: the wave costs cannot be measured")
    xs, ys = [float(n) for n, _ in points], [s for _, s in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    per = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread) if spread else 0.0
    return max(0.0, mean_y - per * mean_x), per


def _short(machine: dict[str, Any]) -> str:
    from ooospec.models.arithmetic import Arithmetic

    label = Arithmetic.from_dict({"requested": machine.get("dtype"), "torch": "", **machine}).kernels_label()
    return f"{machine.get('cores')}-core {label}, {machine.get('dtype')}"


def wave_costs(target: Any, verifier: TreeVerifier, service: Any, requests: list[Request], nodes: int,
               cores: CorePlan, threads: int, arithmetic: dict[str, Any],
               path: Path | None = None) -> Calibration:
    """The target's calibration on this machine: the file's if it was measured here, else measured
    now (a file from elsewhere refused with one line) and written."""
    path = path or costs_path(target.name)
    machine = machine_of(arithmetic)
    found, why_not = usable(path, target.name, machine)
    if found is not None:
        return found
    if why_not:
        print(why_not)
    calibration = measure(target, verifier, service, requests[:WAVE_REQUESTS], nodes, cores, threads, machine)
    path.write_text(json.dumps(calibration.to_dict(), indent=1) + "\n")
    return calibration
