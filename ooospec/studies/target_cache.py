"""Targets loaded for the studies (chapters 03 and 08): one load per process and profile, a reason
instead of a target where its weights or adapter are missing, and torch threads set per block."""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

import torch

# the package source a study's records depend on: its hash is part of every study stage's key
STUDY_CODE = ("studies/target_cache.py", "bench/methods.py", "bench/verify_cost.py", "decoding", "models")


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """``count`` torch threads inside the block, the previous count after it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@lru_cache(maxsize=4)
def cached_target(name: str, profile: str) -> Any:
    """One load per process and target (loading dominates a small slice)."""
    from ooospec.decoding.compiled import compile_target
    from ooospec.models.target import load_target

    return compile_target(load_target(name, profile))


def available_target(name: str, profile: str) -> tuple[Any | None, str | None]:
    """The target, or None and the reason it cannot run yet (e.g. its adapter is not trained)."""
    try:
        return cached_target(name, profile), None
    except FileNotFoundError as err:  # missing weights (ModelSourceMissing) or adapter (AdapterMissing)
        return None, f"{name}: {err}"


def _split_name(benchmark: str) -> str:
    return benchmark if benchmark.startswith("eval_") or benchmark == "dev" else f"eval_{benchmark}"
