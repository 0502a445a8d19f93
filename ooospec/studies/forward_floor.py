"""How far each target's decode forward runs above this machine's floor, side by side in one run.

The floor of a one-row step is the bytes it must read (every linear weight and the head, once) over the
machine's read bandwidth, measured here on one thread. Beside it, for transformers' forward as the
``cpu`` profile serves it and for the lean decoder (`ooospec.models.lean_decoder`) over the same loaded
model: the one-row step and the k-row verify forwards in steps (random trees, the verifier's own
forward, rolled back: `ooospec.bench.verify_cost`), and the prefill per token. Both forwards read the
same cache, so the two rows of a target differ only in the forward.

    python -m ooospec.studies.forward_floor [--targets ...] [--sizes 0 4 8 16 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ooospec.bench.verify_cost import verify_cost_curve
from ooospec.data import load_split
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.arithmetic import cpu_model, machine_kind
from ooospec.models.lean_decoder import check_against_transformers, lean_decoder_of, use_lean_decoder
from ooospec.studies.target_cache import torch_threads

TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")
SIZES = (0, 4, 8, 16, 32)


@dataclass
class FloorRow:
    """One forward of one target on this machine."""

    target: str
    forward: str  # "transformers" (the cpu profile as served) or "lean"
    step_ms: float
    floor_ms: float
    step_over_floor: float
    k_rows_in_steps: dict[int, float]  # tree nodes -> forward time / step time (min over repeats)
    prefill_ms_per_token: float
    prompt_tokens: int


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes a second one thread reads: the fastest of ``repeats`` sums over ``gib`` GiB of fp32."""
    data = torch.ones(int(gib * 2 ** 30) // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def step_bytes(model: Any) -> int:
    """Bytes a one-row step must read: every decoder layer's linear weights and biases, and the head."""
    total = sum(p.numel() * p.element_size() for name, p in model.model.layers.named_parameters()
                if "proj" in name)
    return total + model.get_output_embeddings().weight.numel() * model.get_output_embeddings().weight.element_size()


def measure(name: str, bandwidth: float, sizes: tuple[int, ...] = SIZES, repeats: int = 5,
            profile: str = "cpu") -> list[FloorRow]:
    """Both forwards of one target over the first API-Bank test request (one loaded model)."""
    from ooospec.models.target import load_target

    target = load_target(name, profile)
    if lean_decoder_of(target.model) is None:
        use_lean_decoder(target.model, where=name)
    request = load_split("eval_apibank")[0]
    ids = target.prompt_ids(request)
    floor_ms = step_bytes(target.model) / bandwidth * 1e3
    rows = []
    for forward in ("transformers", "lean"):
        verifier = TreeVerifier.for_target(target)
        if forward == "transformers":
            verifier.decoder = target.model
        start = time.perf_counter()
        state, _ = verifier.prefill(ids)
        prefill = (time.perf_counter() - start) / len(ids)
        if forward == "lean":
            check_against_transformers(target.model, state.cache, [state.root], f"{name}/{request.id}")
        points = verify_cost_curve(verifier, ids, tuple(sizes), repeats)
        step = next(p.min_s for p in points if p.nodes == 0)
        rows.append(FloorRow(name, forward, step * 1e3, floor_ms, step * 1e3 / floor_ms,
                             {p.nodes: round(p.min_ratio, 2) for p in points if p.nodes}, prefill * 1e3, len(ids)))
    return rows


def table(rows: list[FloorRow]) -> str:
    sizes = sorted(rows[0].k_rows_in_steps)
    head = ("| target | forward | step ms | floor ms | step / floor | k-row forward in steps ("
            + " / ".join(map(str, sizes)) + " nodes) | prefill ms / token |")
    lines = [head, "|" + "---|" * 7]
    for r in rows:
        curve = " / ".join(f"{r.k_rows_in_steps[s]:.2f}" for s in sizes)
        lines.append(f"| {r.target} | {r.forward} | {r.step_ms:.1f} | {r.floor_ms:.1f} | {r.step_over_floor:.2f}x "
                     f"| {curve} | {r.prefill_ms_per_token:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS))
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the rows and the machine here")
    args = parser.parse_args(argv)
    with torch_threads(args.threads):
        bandwidth = read_bandwidth()
        rows = [row for name in args.targets for row in measure(name, bandwidth, tuple(args.sizes), args.repeats)]
    machine = f"{cpu_model()} ({machine_kind()}), {args.threads} thread(s), torch {torch.__version__}"
    print(f"{machine}; read bandwidth {bandwidth / 1e9:.1f} GB/s\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "bandwidth_gbs": bandwidth / 1e9,
                                         "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
