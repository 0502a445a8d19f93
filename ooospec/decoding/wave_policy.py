"""When a request's sidecar wave runs: during the target's prefill, right after it, or not at all.

On a CPU the target's prefill dominates a request's time and gains most from a second core (a
prompt of 1,341 tokens: 20 s on one thread, 10 s on two), while a one-row decode step barely gains
and a verify round gains about 1.4x. A wave placed inside the prefill (the paper's schedule, and
elastic OoO-Spec's default) therefore takes the second core where it is worth most. The method is
free to decide when its sidecar computes: the claim is that the hint arrives *out of order*, not
that it is computed during the prefill. Three schedules:

* ``prefill``: the wave is submitted at arrival; the target prefills narrow until it is done, then
  wide (elastic placement); the hint is usable from the first verify round.
* ``deferred``: the target prefills on both cores; the wave is submitted right after the prefill and
  runs on the second core while the target decodes narrow on the first; the hint is used from the
  round it arrives (alignment works mid-call).
* ``none``: no wave; the target runs ToolSpec on both cores.

`WavePolicy.choose` models each schedule's end-to-end seconds from what is known at arrival (the
request's prompt tokens) and this machine's calibrated costs (`WaveCosts`), and takes the least. The model, stated so a reader can check it:

* prefill: ``P1 = p1 * n`` on one thread, ``P2 = p2 * n`` on two; the wave takes ``W = w0 + w1 * n``
  seconds alone (the sidecar's prompt renders the same dialogue and tools, so its length follows the
  target's ``n``). Beside each other a narrow prefill and a wave both slow down (shared caches and
  memory bandwidth; on a 2-core AVX2 guest the elastic wave cost several times what a model without
  it predicted): the prefill by ``sp`` (``P1' = sp * P1``), the wave by ``sw`` (``W' = sw * W``);
* decode: ``R`` verify rounds without a hint (``r1`` / ``r2`` seconds each on one / two threads); a
  hint arriving after ``k`` rounds saves ``G(k)`` of them, interpolated between the points the hint
  replay measured on dev (`ooospec.studies.hint_replay --arrivals`: the real loop, a stored hint
  answering at the k-th round), and none once the request would be done (``k >= R``);
* ``none = P2 + R * r2``;
* ``prefill``: the part of the prompt done while the wave runs is ``f = W' / P1'``; if ``f < 1``
  it is ``W' + (1 - f) * P2 + (R - G(0)) * r2``, else the whole prefill runs narrow and the rest of
  the wave (``W - P1' / sw`` of its time alone) falls into the decode as in ``deferred``;
* ``deferred = P2 + W + (R - k - G(k)) * r2`` with ``k = W / (c * r1)`` rounds run narrow while the
  wave is out; if ``k >= R`` the hint comes after the request is done: ``P2 + R * c * r1``.

``R`` and ``G`` are constants measured on dev (rounds of ToolSpec per request, rounds the hint saved),
never on evaluation requests. Every decision is recorded with the three modelled times, so a reader
sees why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SCHEDULES = ("prefill", "deferred", "none")


@dataclass(frozen=True)
class WaveCosts:
    """One machine's costs for one target and its sidecar (seconds), and the dev constants."""

    machine: str  # the CPU capability and arithmetic they were measured in, e.g. "AVX512/fp32"
    target: str
    prefill_token_s: float  # one thread
    prefill_2t_token_s: float  # two threads
    round_s: float  # one verify round at the chosen tree budget, one thread
    round_2t_s: float
    wave_base_s: float  # the sidecar's wave: fixed part
    wave_token_s: float  # ... plus this per prompt token of the request
    contention: float = 1.0  # the target's verify rounds' slowdown while a wave runs beside them (>= 1)
    prefill_contention: float = 1.0  # the target's narrow prefill's slowdown beside a wave (>= 1)
    wave_contention: float = 1.0  # the wave's slowdown beside the target's narrow prefill (>= 1)
    rounds: float = 10.4  # R: verify rounds of a request without a hint (dev mean)
    # G(k): (rounds late, rounds the hint then saves), dev means; between points interpolated
    hint_saved: tuple[tuple[float, float], ...] = ((0.0, 3.0),)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, float) and value < 0:
                raise ValueError(f"WaveCosts.{name} must be >= 0, got {value}")
        for name in ("contention", "prefill_contention", "wave_contention"):
            if getattr(self, name) < 1.0:
                raise ValueError(f"WaveCosts.{name} must be >= 1, got {getattr(self, name)}")
        points = tuple((float(k), float(g)) for k, g in self.hint_saved)
        if not points or points[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(points, points[1:])):
            raise ValueError(f"WaveCosts.hint_saved must start at 0 rounds late and increase, got {self.hint_saved}")
        if any(g < 0 for _, g in points):
            raise ValueError(f"WaveCosts.hint_saved: rounds saved must be >= 0, got {self.hint_saved}")
        object.__setattr__(self, "hint_saved", points)  # JSON gives lists: one form

    def saved(self, late: float) -> float:
        """G(k): rounds a hint arriving ``late`` rounds after the first saves (0 at and after R)."""
        points = [*self.hint_saved, (max(self.rounds, self.hint_saved[-1][0]), 0.0)]
        if late >= points[-1][0]:
            return 0.0
        for (k0, g0), (k1, g1) in zip(points, points[1:]):
            if k0 <= late < k1:
                return g0 + (g1 - g0) * (late - k0) / (k1 - k0)
        return 0.0

    def wave_s(self, prompt_tokens: int) -> float:
        return self.wave_base_s + self.wave_token_s * prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hint_saved": [list(p) for p in self.hint_saved]}


@dataclass(frozen=True)
class WaveDecision:
    """The schedule a request ran, and why: the modelled end-to-end seconds of each schedule."""

    schedule: str
    expected_s: dict[str, float]
    why: str

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown wave schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")

    @property
    def has_wave(self) -> bool:
        return self.schedule != "none"

    def to_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "expected_s": self.expected_s, "why": self.why}

    @classmethod
    def fixed(cls, schedule: str) -> "WaveDecision":
        """A schedule named by the method, not chosen per request."""
        return cls(schedule, {}, f"fixed by the method ({schedule})")


def _deferred_decode(costs: WaveCosts, wave_s: float) -> float:
    """Decode seconds when the wave runs for ``wave_s`` beside a narrow decode, the hint used after."""
    narrow_round = costs.contention * costs.round_s
    k = wave_s / narrow_round if narrow_round else 0.0
    if k >= costs.rounds:
        return costs.rounds * narrow_round
    return wave_s + max(0.0, costs.rounds - k - costs.saved(k)) * costs.round_2t_s


def expected_seconds(costs: WaveCosts, prompt_tokens: int) -> dict[str, float]:
    """Each schedule's modelled end-to-end seconds for one request (the model in the module docstring)."""
    wide_prefill = costs.prefill_2t_token_s * prompt_tokens
    narrow_prefill = costs.prefill_contention * costs.prefill_token_s * prompt_tokens
    wave = costs.wave_s(prompt_tokens)
    wave_beside = costs.wave_contention * wave  # the wave while the narrow prefill runs beside it
    none = wide_prefill + costs.rounds * costs.round_2t_s
    deferred = wide_prefill + _deferred_decode(costs, wave)
    if narrow_prefill and wave_beside < narrow_prefill:
        done = wave_beside / narrow_prefill
        during = wave_beside + (1 - done) * wide_prefill + max(0.0, costs.rounds - costs.saved(0)) * costs.round_2t_s
    else:
        during = narrow_prefill + _deferred_decode(costs, wave - narrow_prefill / costs.wave_contention)
    return {"prefill": round(during, 4), "deferred": round(deferred, 4), "none": round(none, 4)}


@dataclass(frozen=True)
class WavePolicy:
    """Per request: the schedule with the least modelled end-to-end time (ties: the earlier in
    `SCHEDULES`, so a wave is preferred to none at equal cost)."""

    costs: WaveCosts

    def choose(self, prompt_tokens: int) -> WaveDecision:
        expected = expected_seconds(self.costs, prompt_tokens)
        best = min(SCHEDULES, key=lambda s: (expected[s], SCHEDULES.index(s)))
        why = f"least modelled time: {best} {expected[best]:.2f} s (prompt {prompt_tokens} tokens)"
        return WaveDecision(best, expected, why)
