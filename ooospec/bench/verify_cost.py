"""The verify-cost curve: how much one target forward costs as the tree grows.

A tree of n draft nodes is verified by one forward over 1 + n rows. On a GPU that is nearly free
up to a few dozen rows; on CPU it is not (measured here: about 2.5x a one-token step for 16 nodes
on Qwen2.5-Coder-0.5B), which is what sizes the tree budget: a node pays off only if its
acceptance probability beats its share of the extra cost. The measured forward is the verifier's
own (`TreeVerifier.forward_tree`) on a random trie of the given size, rolled back after each
repeat so every measurement starts from the same cache. Sizes are interleaved and both the median
and the minimum are kept: the minimum is the better estimate when other processes share the cores.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from ooospec.decoding.base import Draft
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier, commit_kv


@dataclass
class CostPoint:
    nodes: int
    median_s: float
    min_s: float  # robust to other processes sharing the cores
    ratio: float  # median_s / median one-token step
    min_ratio: float  # min_s / min one-token step


def random_tree_drafts(nodes: int, vocab_size: int, rng: random.Random, branch_len: int = 8) -> list[Draft]:
    """Drafts whose trie has exactly ``nodes`` nodes: branches of up to ``branch_len`` tokens."""
    drafts, total = [], 0
    while total < nodes:
        length = min(branch_len, nodes - total)
        drafts.append(Draft([rng.randrange(vocab_size) for _ in range(length)], "pld"))
        total += length
    return drafts


def timed_forward(verifier: TreeVerifier, state: Any, tree: Any) -> float:
    """Seconds of one verify forward of ``tree`` over ``state``'s cache, the cache rolled back after
    it (nothing committed), so the next forward starts from the same cache."""
    prefix = state.cache_len
    start = time.perf_counter()
    verifier.forward_tree(state, tree)
    elapsed = time.perf_counter() - start
    commit_kv(state.cache, prefix, [], dense=verifier.dense_cache)
    return elapsed


def verify_cost_curve(
    verifier: TreeVerifier,
    prompt_ids: list[int],
    sizes: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 24, 32, 48, 64),
    repeats: int = 5,
    seed: int = 0,
) -> list[CostPoint]:
    """Median forward time per tree size (size 0 = a one-token AR step), after one prefill."""
    rng = random.Random(seed)
    state, _ = verifier.prefill(prompt_ids)
    vocab = verifier.config.get_text_config().vocab_size
    trees = {
        nodes: build_tree(random_tree_drafts(nodes, vocab, rng), TreeBudget(max_nodes=nodes, max_depth=nodes))
        for nodes in sizes
    }
    times: dict[int, list[float]] = {nodes: [] for nodes in sizes}
    # sizes interleaved within each repeat, so a burst of load from other processes hits all alike;
    # the first pass warms up the kernels of every shape and is not recorded
    for repeat in range(repeats + 1):
        for nodes, tree in trees.items():
            elapsed = timed_forward(verifier, state, tree)
            if repeat:
                times[nodes].append(elapsed)
    medians = {n: statistics.median(ts) for n, ts in times.items()}
    mins = {n: min(ts) for n, ts in times.items()}
    base = medians.get(0) or min(medians.values())
    base_min = mins.get(0) or min(mins.values())
    return [CostPoint(n, medians[n], mins[n], medians[n] / base, mins[n] / base_min) for n in sizes]


@dataclass
class ArithmeticPoint:
    """One arithmetic option on one target: the one-row step, the prefill and the verify curve."""

    target: str
    profile: str  # names the arithmetic (cpu = bf16, cpu-fp32 = fp32)
    dtype: str
    threads: int
    attention: str  # the model's attention implementation (sdpa | eager)
    prompt_tokens: int
    step_ms: float  # median one-row step
    prefill_s: float  # median prefill of the prompt
    ratios: dict[int, float]  # rows (1 + nodes) -> median forward / median one-row step
    min_ratios: dict[int, float]
    compile: str | None = None  # torch.compile backend of the target (None: eager)
    compile_s: float = 0.0  # its compile + warm-up time at load (never inside the timings above)


def measure_arithmetic(
    verifier: TreeVerifier,
    prompt_ids: list[int],
    *,
    target: str,
    profile: str,
    threads: int,
    attention: str,
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64),
    repeats: int = 5,
    prefill_repeats: int | None = None,
    compile: str | None = None,
    compile_s: float = 0.0,
) -> ArithmeticPoint:
    """The verify-cost curve in rows (a forward over r rows = root + r-1 nodes) plus the prefill."""
    prefill = []
    for _ in range(prefill_repeats or max(1, min(3, repeats))):
        start = time.perf_counter()
        verifier.prefill(prompt_ids)
        prefill.append(time.perf_counter() - start)
    points = verify_cost_curve(verifier, prompt_ids, tuple(r - 1 for r in rows), repeats)
    by_rows = {p.nodes + 1: p for p in points}
    return ArithmeticPoint(
        target=target, profile=profile, dtype=str(verifier.dtype).removeprefix("torch."), threads=threads,
        attention=attention, prompt_tokens=len(prompt_ids), step_ms=1000 * by_rows[1].median_s,
        prefill_s=statistics.median(prefill),
        ratios={r: round(p.ratio, 3) for r, p in by_rows.items()},
        min_ratios={r: round(p.min_ratio, 3) for r, p in by_rows.items()},
        compile=compile, compile_s=round(compile_s, 1),
    )
