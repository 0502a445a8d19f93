"""What fp32 logits cost: a target's one-row step and verify forwards with its deciding logits in fp32
(`ooospec.models.fp32_logits`) against its own bf16 head, paired forward by forward.

The arithmetic study (`forward_cost.arithmetic_study`) measures each head in its own block of
forwards, so a burst of load on a shared machine can land on one of them only: one run there had
SmolLM2's bf16 head slower on two threads than on one. Here both heads run on the same loaded
model, over the same cache and the same trees, alternating forward by forward (which head goes
first alternates too), and the cost is the ratio of their summed times with a bootstrap interval
over those pairs (`ooospec.report.intervals.paired_speedup`). The check it serves: fp32 logits may
make the step and a verify of the tree budget a bench chooses at most 5% dearer.

``python -m ooospec.studies.logits_cost [--pairs 40] [--commit]`` (a few minutes on 2 cores);
``--commit`` writes ``artifacts/committed/logits-cost/<CPU kind>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ooospec.bench.verify_cost import random_tree_drafts, timed_forward
from ooospec.data import load_split
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import machine_kind, running_arithmetic
from ooospec.models.fp32_logits import own_head, uses_fp32_logits
from ooospec.paths import artifacts_dir, shown
from ooospec.provenance import code_commit
from ooospec.report.intervals import paired_speedup
from ooospec.studies.target_cache import _split_name, cached_target, torch_threads

TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
# draft nodes per verify: 0 is the one-row step; the rest cover every budget a machine's bench picks
NODES = (0, 4, 8, 16)
HEADS = ("fp32 logits", "bf16 head")
ALLOWED = 1.05  # the check: fp32 logits at most 5% dearer


@dataclass(frozen=True)
class LogitsCost:
    """One target x thread count x forward size: both heads' median forward and the paired cost."""

    target: str
    threads: int
    rows: int  # 1: the one-row step; 1 + nodes for a verify
    pairs: int
    fp32_ms: float  # median forward with fp32 logits
    bf16_ms: float  # median forward with the model's own bf16 head
    cost: float  # summed fp32 time / summed bf16 time over the pairs
    low: float
    high: float

    @property
    def within(self) -> bool:
        """Whether the interval's upper end is inside the allowance."""
        return self.high <= ALLOWED


def paired_times(target: Any, prompt: list[int], nodes: tuple[int, ...], pairs: int,
                 seed: int = 0) -> dict[int, dict[str, list[float]]]:
    """Per forward size, each head's forward times, ``pairs`` of each, the heads alternating forward by
    forward over one prefilled cache (rolled back after each forward); a first round warms up."""
    verifier = TreeVerifier.for_target(target)
    rng = random.Random(seed)
    state, _ = verifier.prefill(prompt)
    vocab = verifier.config.get_text_config().vocab_size
    trees = {n: build_tree(random_tree_drafts(n, vocab, rng), TreeBudget(max_nodes=n, max_depth=n)) for n in nodes}
    times: dict[int, dict[str, list[float]]] = {n: {h: [] for h in HEADS} for n in nodes}
    for pair in range(pairs + 1):
        for n, tree in trees.items():
            for head in (HEADS if pair % 2 else HEADS[::-1]):
                with own_head(target.model) if head == "bf16 head" else nullcontext():
                    elapsed = timed_forward(verifier, state, tree)
                if pair:
                    times[n][head].append(elapsed)
    return times


def measure(target_names: tuple[str, ...] = TARGETS, threads: tuple[int, ...] = (1, 2), pairs: int = 40,
            profile: str = "cpu", benchmark: str = "apibank") -> tuple[list[LogitsCost], str]:
    """Every target x thread count x forward size of `NODES` on the benchmark's first request (the
    arithmetic study's prompt), and the arithmetic they ran in; a target loaded without fp32 logits
    (an fp32 machine) has nothing to compare and is refused."""
    prompt_request = load_split(_split_name(benchmark))[0]
    rows, arithmetic = [], ""
    for name in target_names:
        target = cached_target(name, profile)
        if not uses_fp32_logits(target.model):
            raise ValueError(f"{name} runs in {running_arithmetic(target.model).sentence()}: no fp32 logits "
                             "to compare with its own head (a bf16 CPU's cpu profile has them)")
        prompt = target.prompt_ids(prompt_request)
        arithmetic = running_arithmetic(target.model).sentence()
        for count in threads:
            with torch_threads(count):
                times = paired_times(target, prompt, NODES, pairs)
            for n, by_head in times.items():
                interval = paired_speedup(by_head["fp32 logits"], by_head["bf16 head"])
                rows.append(LogitsCost(name, count, 1 + n, pairs, 1000 * statistics.median(by_head["fp32 logits"]),
                                       1000 * statistics.median(by_head["bf16 head"]), interval.point, interval.low,
                                       interval.high))
        cached_target.cache_clear()
    return rows, arithmetic


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / "logits-cost"


def committed_tables() -> list[tuple[str, "Any"]]:
    """Each committed study (one per CPU kind): a caption naming the machine, and its table."""
    import pandas as pd

    out = []
    for path in sorted(committed_dir().glob("*.json")):
        study = json.loads(path.read_text())
        caption = (f"{path.stem}: {study['arithmetic']}; {study['pairs']} pairs per point, code {study['code_commit']}")
        table = pd.DataFrame(study["rows"]).rename(columns={"fp32_ms": "fp32 logits ms", "bf16_ms": "bf16 head ms"})
        out.append((caption, table.set_index(["target", "threads", "rows"])))
    return out


def main(argv: list[str] | None = None) -> None:
    import pandas as pd

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--commit", action="store_true", help="write artifacts/committed/logits-cost/<CPU kind>.json")
    args = parser.parse_args(argv)
    rows, arithmetic = measure(tuple(args.targets), pairs=args.pairs)
    print(pd.DataFrame([{**asdict(r), "within 5%": r.within} for r in rows]).round(3).to_string(index=False))
    if args.commit:
        out = committed_dir() / f"{machine_kind()}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"arithmetic": arithmetic, "pairs": args.pairs,
                                   "code_commit": code_commit(short=True), "allowed": ALLOWED,
                                   "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
        print(f"wrote {shown(out)}")


if __name__ == "__main__":
    main()
