"""How far each target's decode forward runs above this machine's floor, side by side in one run.

The floor of a one-row step is the bytes it must read (every linear weight and the head, once) over the
machine's read bandwidth, measured here on one thread. Beside it, for transformers' forward as the
``cpu`` profile serves it and for the lean decoder (`ooospec.models.lean_decoder`) over the same loaded
model: the one-row step and the k-row verify forwards in steps (random trees, the verifier's own
forward, rolled back: `ooospec.bench.verify_cost`), and the prefill per token. Both forwards read the
same cache, so the two rows of a target differ only in the forward. A third row is what a reader's own
runtime does with the model as shipped: llama.cpp (llama-cpp-python, built by `make setup`) on the
package's GGUF (Qwen's Q4_K_M, SmolLM2's Q4_1: fewer bytes than bf16, so its floor is lower), the same
prompt, a one-token step and k-token forwards with every row's logits (what a verifier reads).

    python -m ooospec.studies.forward_floor [--targets ...] [--sizes 0 4 8 16 32] [--json PATH]
    python -m ooospec.studies.forward_floor --against-records RECORDS

The second form sets a bench run's decode phase beside llama.cpp's plain AR on the same requests and
the same tokens (`llama_cpp_same_work`): the question a reader who already runs llama.cpp asks.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
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


def shipped_gguf(name: str, profile: str = "cpu") -> Path:
    """The target's package-shipped GGUF as one file (a split one is joined once, beside the models)."""
    from ooospec.models.loading import join_files, models_dir, package_gguf_files
    from ooospec.models.registry import resolve_profile

    prof = resolve_profile(profile)
    spec = prof.model(prof.target(name).model)
    parts = package_gguf_files(spec)
    if len(parts) == 1:
        return parts[0]
    joined = models_dir() / f"{spec.name}.shipped.gguf"
    if not joined.exists() or joined.stat().st_size != sum(p.stat().st_size for p in parts):
        partial = joined.with_suffix(".partial")
        join_files(parts, partial)
        partial.rename(joined)
    return joined


def gguf_file_type(path: Path) -> str:
    """The GGUF's weight type as llama.cpp names it (``Q4_K_M``), from its ``general.file_type``."""
    from gguf import GGUFReader, LlamaFileType

    field = GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return "type unrecorded"
    return LlamaFileType(int(field.parts[field.data[0]][0])).name.removeprefix("MOSTLY_")


def llama_cpp_row(name: str, prompt_ids: list[int], bandwidth: float, sizes: tuple[int, ...], repeats: int,
                  threads: int, profile: str = "cpu") -> FloorRow:
    """llama.cpp on the shipped GGUF: prefill, one-token step and k-token forwards (all rows' logits),
    each rolled back to the prompt; the minimum over ``repeats``. Its floor: the GGUF's bytes."""
    from llama_cpp import Llama

    path = shipped_gguf(name, profile)
    model = Llama(str(path), n_ctx=len(prompt_ids) + max(sizes) + 8, n_batch=max(512, max(sizes) + 1),
                  n_threads=threads, n_threads_batch=threads, logits_all=True, verbose=False)
    start = time.perf_counter()
    model.eval(prompt_ids)
    prefill = (time.perf_counter() - start) / len(prompt_ids)
    timed = {}
    for nodes in (0, *[s for s in sizes if s]):
        best = float("inf")
        for _ in range(repeats):
            model.n_tokens = len(prompt_ids)
            start = time.perf_counter()
            model.eval(prompt_ids[-1:] * (nodes + 1))
            best = min(best, time.perf_counter() - start)
        timed[nodes] = best
    step = timed[0]
    floor_ms = path.stat().st_size / bandwidth * 1e3
    return FloorRow(name, f"llama.cpp ({gguf_file_type(path)})", step * 1e3, floor_ms, step * 1e3 / floor_ms,
                    {n: round(t / step, 2) for n, t in timed.items() if n}, prefill * 1e3, len(prompt_ids))


def llama_cpp_ar_decode(model: Any, prompt: list[int], output: list[int]) -> float:
    """Seconds llama.cpp takes to decode ``output`` after ``prompt`` as AR does: the prompt prefilled
    (not timed), then one single-token forward for every output token after the first (the first
    comes from the prefill), fed the very tokens the bench's AR wrote, so the work is the same."""
    model.reset()
    model.eval(prompt)
    start = time.perf_counter()
    for token in output[:-1]:
        model.eval([token])
    return time.perf_counter() - start


def llama_cpp_same_work(records: list[dict[str, Any]], methods: tuple[str, ...] = ("ar", "toolspec", "ooospec:static"),
                        threads: int = 1, profile: str = "cpu") -> pd.DataFrame:
    """Per target x benchmark: each method's decode time per output token over the requests where it
    wrote AR's tokens, llama.cpp's plain AR on the shipped GGUF over the same requests and tokens, and
    each method over llama.cpp as a ratio of summed times with its paired bootstrap 95% interval."""
    from llama_cpp import Llama

    from ooospec.bench.sampling import load_benchmark
    from ooospec.models.target import load_role_frame
    from ooospec.report.intervals import paired_speedup

    rows = []
    for target in sorted({r["target"] for r in records}):
        frame = load_role_frame(target, profile)
        path = shipped_gguf(target, profile)
        longest = max(r["prompt_tokens"] + r["tokens"] for r in records if r["target"] == target)
        # the prefill is not timed: it runs on every core; the timed single-token forwards on ``threads``
        model = Llama(str(path), n_ctx=longest + 16, n_batch=512, n_threads=threads,
                      n_threads_batch=max(threads, os.cpu_count() or 1), verbose=False)
        for benchmark in sorted({r["benchmark"] for r in records if r["target"] == target}):
            cell = [r for r in records if r["target"] == target and r["benchmark"] == benchmark]
            requests = {q.id: q for q in load_benchmark(benchmark)}
            ar = {r["request_id"]: r for r in cell if r["method"] == "ar" and r["tokens"] > 1}
            with torch_threads(threads):
                llama = {rid: llama_cpp_ar_decode(model, frame.prompt_ids(requests[rid]), r["output_ids"])
                         for rid, r in ar.items()}
            for method in methods:
                same = [r for r in cell if r["method"] == method and r["request_id"] in ar
                        and r["output_ids"] == ar[r["request_id"]]["output_ids"]]
                if not same:
                    continue
                tokens = sum(r["tokens"] - 1 for r in same)
                ours = [r["decode_s"] for r in same]
                theirs = [llama[r["request_id"]] for r in same]
                ratio = paired_speedup(theirs, ours)
                rows.append({"target": target, "benchmark": benchmark, "method": method, "n": len(same),
                             "ms / token": 1e3 * sum(ours) / tokens, "llama.cpp weights": gguf_file_type(path),
                             "llama.cpp ms / token": 1e3 * sum(theirs) / tokens,
                             "x llama.cpp [95%]": f"{ratio.point:.2f}x [{ratio.low:.2f}, {ratio.high:.2f}]"})
    return pd.DataFrame(rows)


def measure(name: str, bandwidth: float, sizes: tuple[int, ...] = SIZES, repeats: int = 5,
            profile: str = "cpu", llama_cpp: bool = True) -> list[FloorRow]:
    """Both forwards of one target over the first API-Bank test request (one loaded model), and
    llama.cpp on the shipped GGUF over the same prompt."""
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
    if llama_cpp:
        rows.append(llama_cpp_row(name, ids, bandwidth, tuple(sizes), repeats, torch.get_num_threads(), profile))
    return rows


def floor_study(targets: list[str], profile: str = "cpu", sizes: tuple[int, ...] = SIZES, repeats: int = 5,
                threads: int = 1, llama_cpp: bool = True) -> tuple[float, pd.DataFrame]:
    """The read bandwidth (bytes a second) and the floor table, one row per target and forward."""
    with torch_threads(threads):
        bandwidth = read_bandwidth()
        rows = [row for name in targets for row in measure(name, bandwidth, sizes, repeats, profile, llama_cpp)]
    sizes = [s for s in sizes if s]
    frame = pd.DataFrame([{"target": r.target, "forward": r.forward, "step ms": round(r.step_ms, 1),
                           "floor ms": round(r.floor_ms, 1), "x floor": round(r.step_over_floor, 2),
                           f"steps at {' / '.join(map(str, sizes))} nodes":
                               " / ".join(f"{r.k_rows_in_steps[k]:.2f}" for k in sizes),
                           "prefill ms / token": round(r.prefill_ms_per_token, 2)} for r in rows])
    return bandwidth, frame.set_index(["target", "forward"])


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
    parser.add_argument("--against-records", type=Path, metavar="RECORDS",
                        help="a bench run (records .jsonl, bench stage or canonical directory): set its decode "
                             "phase beside llama.cpp's AR on the same requests instead")
    args = parser.parse_args(argv)
    if args.against_records:
        from ooospec.report.headline import read_records

        same_work = llama_cpp_same_work(read_records(args.against_records), threads=args.threads)
        print(f"{cpu_model()} ({machine_kind()}), {args.threads} thread(s)\n")
        print(same_work.round(2).to_string(index=False))
        if args.json:
            args.json.write_text(same_work.to_json(orient="records", indent=1))
        return
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
