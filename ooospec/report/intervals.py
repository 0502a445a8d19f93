"""Speedups with their uncertainty: paired bootstrap intervals over requests.

Every speedup in the book is a ratio of two methods' times on the *same* requests, and its primary
form (`ooospec.report.speedups.speedup_intervals`) only on those where both wrote the same output: a
rounding near-tie that changes the output's length changes the work, not the speed. The primary
statistic is the ratio of total times (sum of baseline seconds / sum of method seconds, i.e. the
ratio of means): it weighs each request by its length, as a user waiting for all of them would, and
it is what the paper's "x-fold faster" means. The mean of per-request ratios is reported beside it
for readers who want every request to count alike; the two disagree when long and short requests
speed up differently.

The interval resamples *requests* (pairs of baseline and method times together), so the
correlation between the two methods on one request is kept; "faster" means the 95% interval
excludes 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
MIN_REQUESTS = 5  # fewer paired requests than this: the resamples repeat a handful of values
TOO_FEW = "too few requests"


@dataclass(frozen=True)
class RatioInterval:
    """A speedup (baseline time / method time) with its paired bootstrap interval."""

    point: float
    low: float
    high: float
    n: int
    statistic: str  # "ratio of totals" | "mean of ratios"

    @property
    def verdict(self) -> str:
        """'faster' / 'slower' only when the interval excludes 1, else 'no difference shown';
        below `MIN_REQUESTS` a bootstrap interval means nothing, and no verdict is given."""
        if self.n < MIN_REQUESTS:
            return TOO_FEW
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "no difference shown"

    @property
    def cell(self) -> str:
        """``1.57x [1.54, 1.61]``: the point and its interval, for a table cell."""
        return f"{self.point:.2f}x [{self.low:.2f}, {self.high:.2f}]"

    def __str__(self) -> str:
        return f"{self.cell} (n={self.n})"


def _statistic(base: np.ndarray, new: np.ndarray, statistic: str) -> np.ndarray:
    """The statistic along the last axis (one value per resample)."""
    if statistic == "ratio of totals":
        return base.sum(axis=-1) / new.sum(axis=-1)
    if statistic == "mean of ratios":
        return (base / new).mean(axis=-1)
    raise ValueError(f"unknown statistic {statistic!r}; use 'ratio of totals' or 'mean of ratios'")


def paired_speedup(baseline_s: Sequence[float], method_s: Sequence[float], *,
                   statistic: str = "ratio of totals", resamples: int = DEFAULT_RESAMPLES,
                   confidence: float = 0.95, seed: int = 0) -> RatioInterval:
    """Speedup of ``method`` over ``baseline`` on paired requests, with a percentile bootstrap
    interval (requests resampled with replacement, ``seed`` fixed so the book is reproducible)."""
    base = np.asarray(baseline_s, dtype=float)
    new = np.asarray(method_s, dtype=float)
    if base.shape != new.shape or base.ndim != 1:
        raise ValueError(f"paired times must be two equal-length lists, got {base.shape} and {new.shape}")
    if len(base) == 0:
        raise ValueError("no requests to compare")
    if (base <= 0).any() or (new <= 0).any():
        raise ValueError("times must be positive")
    point = float(_statistic(base, new, statistic))
    if len(base) == 1:
        return RatioInterval(point, point, point, 1, statistic)
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(base), size=(resamples, len(base)))
    values = _statistic(base[index], new[index], statistic)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return RatioInterval(point, float(low), float(high), len(base), statistic)


@dataclass(frozen=True)
class ShareDifference:
    """How much more often one choice is right than another on the same items (a share of one
    minus the other's), with its paired bootstrap interval; "higher" only when it excludes 0."""

    point: float
    low: float
    high: float
    n: int

    @property
    def verdict(self) -> str:
        if self.n < MIN_REQUESTS:
            return TOO_FEW
        if self.low > 0.0:
            return "higher"
        if self.high < 0.0:
            return "lower"
        return "no difference shown"

    @property
    def cell(self) -> str:
        """``+0.10 [+0.03, +0.17]``."""
        return f"{self.point:+.3f} [{self.low:+.3f}, {self.high:+.3f}]"

    def __str__(self) -> str:
        return f"{self.cell} (n={self.n})"


def paired_share_difference(reference: Sequence[bool], candidate: Sequence[bool], *,
                            resamples: int = DEFAULT_RESAMPLES, confidence: float = 0.95,
                            seed: int = 0) -> ShareDifference:
    """share(candidate) - share(reference) over the same items, items resampled in pairs (so an
    item both get right, or both wrong, moves neither), as `paired_speedup` resamples requests."""
    ref = np.asarray(reference, dtype=float)
    new = np.asarray(candidate, dtype=float)
    if ref.shape != new.shape or ref.ndim != 1:
        raise ValueError(f"paired outcomes must be two equal-length lists, got {ref.shape} and {new.shape}")
    if len(ref) == 0:
        raise ValueError("no items to compare")
    diff = new - ref
    point = float(diff.mean())
    rng = np.random.default_rng(seed)
    values = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=-1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return ShareDifference(point, float(low), float(high), len(diff))
