"""Comparing sequences (token ids, rendered text): where two of them part."""

from __future__ import annotations

from typing import Sequence


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first position where two sequences differ (a length mismatch counts); None
    when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
