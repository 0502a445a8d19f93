"""The wave gate: no sidecar wave for a request while the sidecar's recent waves all came too late.

A wave costs the target even when its hint never arrives: on a CPU the two processes share the
memory system, and a sidecar as large as its target (SmolLM2-135M beside the SmolLM2 target) runs
beside the target's whole prefill and decode and finishes after the request does. "A late hint
costs nothing" then holds only if a wave that cannot arrive in time is not started. Whether it
can is not known before the request runs, so the gate reads what the same run has seen: after
``late_run`` waves in a row that were still out when their requests finished, it skips the next
``first_skip`` requests' waves and then submits one as a probe; each late probe doubles the gap
(exponential back-off), and any wave that arrives in time opens the gate again. A target whose
sidecar is in time (the Qwen target's wave ends inside its prefill) never meets a closed gate.

The gate sees only the run's own earlier requests, in order, as call retrieval does; nothing is
tuned on them. ``ooospec:every_wave`` submits every wave (the control that removes the gate).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WaveGate:
    """Per run (one target, benchmark and method): submit this request's wave or skip it."""

    late_run: int = 2  # consecutive late waves that close the gate
    first_skip: int = 2  # requests skipped when it first closes; doubled after each late probe
    late_streak: int = field(default=0, init=False)
    skips_left: int = field(default=0, init=False)
    next_skip: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.late_run < 1 or self.first_skip < 1:
            raise ValueError(f"WaveGate needs late_run >= 1 and first_skip >= 1, got {self.late_run}, {self.first_skip}")
        self.next_skip = self.first_skip

    def submit(self) -> bool:
        """Whether this request's wave is submitted (a skip is counted off here)."""
        if self.skips_left:
            self.skips_left -= 1
            return False
        return True

    def record(self, in_time: bool) -> None:
        """A submitted wave's outcome: its result was read before its request finished, or not."""
        if in_time:
            self.late_streak, self.next_skip = 0, self.first_skip
            return
        self.late_streak += 1
        if self.late_streak >= self.late_run:
            self.skips_left, self.next_skip = self.next_skip, 2 * self.next_skip

    @property
    def why_closed(self) -> str:
        return f"wave skipped: the last {self.late_streak} waves were still out when their requests finished"
