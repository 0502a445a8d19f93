"""What lossless bf16 costs: a target's one-row step and verify forwards as served (fp32 deciding logits,
`ooospec.models.fp32_logits`, and row-invariant forwards, `ooospec.models.row_invariant`) against its own
bf16 head on torch's kernels (the arithmetic before either), paired forward by forward.

The arithmetic study (`forward_cost.arithmetic_study`) measures each variant in its own block of
forwards, so a burst of load on a shared machine can land on one of them only: one run there had
SmolLM2's bf16 head slower on two threads than on one. Here every arm runs on the same loaded model,
over the same cache and the same trees, alternating forward by forward (the order turns round every
pair), and each cost is the ratio of summed times with a bootstrap interval over those pairs
(`ooospec.report.intervals.paired_speedup`). Arms: *served*; *fp32 logits* on torch's kernels (where
the model is row-invariant, what fp32 logits alone cost); *bf16 head* on torch's kernels. The check
the served arithmetic answers to: the step and a verify of the tree budget a bench chooses at most 5%
dearer than the bf16 head's.

``python -m ooospec.studies.logits_cost [--pairs 40] [--commit]`` (a few minutes on 2 cores);
``--commit`` writes ``artifacts/committed/logits-cost/<CPU kind>.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from ooospec.bench.verify_cost import random_tree_drafts, timed_forward
from ooospec.data import load_split
from ooospec.decoding.tree import TreeBudget, build_tree
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import machine_kind, running_arithmetic
from ooospec.models.fp32_logits import own_head, uses_fp32_logits
from ooospec.models.row_invariant import plain_rows
from ooospec.paths import artifacts_dir, shown
from ooospec.provenance import code_commit
from ooospec.report.intervals import paired_speedup
from ooospec.studies.target_cache import _split_name, cached_target, torch_threads

TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
# draft nodes per verify: 0 is the one-row step; the rest cover every budget a machine's bench picks
NODES = (0, 4, 8, 16)
ARMS = ("served", "fp32 logits", "bf16 head")
ALLOWED = 1.05  # the check: the served arithmetic at most 5% dearer than the bf16 head


@dataclass(frozen=True)
class LogitsCost:
    """One target x thread count x forward size: each arm's median forward and the paired costs."""

    target: str
    threads: int
    rows: int  # 1: the one-row step; 1 + nodes for a verify
    pairs: int
    served_ms: float  # median forward as served (fp32 logits, row-invariant where the profile asks)
    fp32_ms: float  # median forward with fp32 logits on torch's kernels
    bf16_ms: float  # median forward with the model's own bf16 head on torch's kernels
    cost: float  # summed served time / summed bf16-head time over the pairs
    low: float
    high: float
    fp32_cost: float  # summed fp32-logits time / summed bf16-head time (fp32 logits alone)

    @property
    def within(self) -> bool:
        """Whether the interval's upper end is inside the allowance."""
        return self.high <= ALLOWED


@contextmanager
def arm(model: Any, name: str) -> Iterator[None]:
    """The model as the arm ``name`` runs it (`ARMS`), as loaded again afterwards."""
    if name == "served":
        yield
        return
    with plain_rows(model), own_head(model) if name == "bf16 head" else nullcontext():
        yield


def paired_times(target: Any, prompt: list[int], nodes: tuple[int, ...], pairs: int,
                 seed: int = 0) -> dict[int, dict[str, list[float]]]:
    """Per forward size, each arm's forward times, ``pairs`` of each, the arms alternating forward by
    forward over one prefilled cache (rolled back after each forward); a first round warms up."""
    verifier = TreeVerifier.for_target(target)
    rng = random.Random(seed)
    state, _ = verifier.prefill(prompt)
    vocab = verifier.config.get_text_config().vocab_size
    trees = {n: build_tree(random_tree_drafts(n, vocab, rng), TreeBudget(max_nodes=n, max_depth=n)) for n in nodes}
    times: dict[int, dict[str, list[float]]] = {n: {a: [] for a in ARMS} for n in nodes}
    for pair in range(pairs + 1):
        for n, tree in trees.items():
            for name in (ARMS if pair % 2 else ARMS[::-1]):
                with arm(target.model, name):
                    elapsed = timed_forward(verifier, state, tree)
                if pair:
                    times[n][name].append(elapsed)
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
            for n, by_arm in times.items():
                interval = paired_speedup(by_arm["served"], by_arm["bf16 head"])
                fp32_alone = paired_speedup(by_arm["fp32 logits"], by_arm["bf16 head"])
                medians = {a: 1000 * statistics.median(by_arm[a]) for a in ARMS}
                rows.append(LogitsCost(name, count, 1 + n, pairs, medians["served"], medians["fp32 logits"],
                                       medians["bf16 head"], interval.point, interval.low, interval.high,
                                       fp32_alone.point))
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
        table = pd.DataFrame(study["rows"]).rename(columns={
            "served_ms": "served ms", "fp32_ms": "fp32 logits ms", "bf16_ms": "bf16 head ms", "fp32_cost": "fp32 logits cost"})
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
