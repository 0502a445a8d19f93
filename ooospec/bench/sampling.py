"""The requests a bench run decodes: a seeded sample of each benchmark's file, kept in file order,
and the untimed warm-up requests beside it."""

from __future__ import annotations

import random

from ooospec.bench.config import TUNING_SPLITS
from ooospec.data.request import Request, check_tool_names


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


def load_benchmark(name: str) -> list[Request]:
    """An evaluation file by benchmark name, or a tuning split (`TUNING_SPLITS`) by its own name."""
    from ooospec.data import load_split

    return load_split(name if name in TUNING_SPLITS else f"eval_{name}")
