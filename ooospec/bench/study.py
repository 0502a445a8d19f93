"""The ToolSpec study of ``notebooks/03_toolspec.ipynb``: AR / PLD / ToolSpec on benchmark slices,
the verify-cost curve, and a tree-budget sweep, each a resumable stage keyed by its settings.

A slice is one (target, benchmark) pair: a seeded sample of the benchmark's evaluation requests,
in file order, decoded by every method with sources kept across the slice (call retrieval learns
from earlier calls of the same run). A finished slice is read back; an interrupted one is redone
from its start, because its retrieval memory must be rebuilt in order.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

import pandas as pd
import torch

from ooospec.bench.methods import MethodSpec, default_budget
from ooospec.data import load_split
from ooospec.bench.verify_cost import verify_cost_curve
from ooospec.bench.compare import MethodRun, compare_methods, select_slice
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.verifier import TreeVerifier
from ooospec.stage import Stage, code_fingerprint, read_jsonl

# the package source the study's records depend on: its hash is part of every stage key here
STUDY_CODE = ("bench/study.py", "bench/compare.py", "bench/methods.py", "bench/verify_cost.py",
              "decoding", "models")
DEFAULT_RUNS = (MethodRun("pld", MethodSpec("pld")), MethodRun("toolspec", MethodSpec("toolspec")))


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
    from ooospec.decoding.compiled import load_for_decoding

    return load_for_decoding(name, profile)


def available_target(name: str, profile: str) -> tuple[Any | None, str | None]:
    """The target, or None and the reason it cannot run yet (e.g. its adapter is not trained)."""
    try:
        return cached_target(name, profile), None
    except FileNotFoundError as err:  # missing weights (ModelSourceMissing) or adapter (AdapterMissing)
        return None, f"{name}: {err}"


def _split_name(benchmark: str) -> str:
    return benchmark if benchmark.startswith("eval_") or benchmark == "dev" else f"eval_{benchmark}"


def _budget_dict(budget: TreeBudget) -> dict[str, int]:
    return {"max_nodes": budget.max_nodes, "max_depth": budget.max_depth}


def method_slice(target_name: str, benchmark: str, *, profile: str = "cpu", requests: int = 8, seed: int = 0,
                 max_new_tokens: int = 128, threads: int = 1, budget: TreeBudget | None = None,
                 runs: tuple[MethodRun, ...] = DEFAULT_RUNS, progress: bool = True) -> list[dict[str, Any]]:
    """Records of AR and ``runs`` on one slice (read back when the stage is done)."""
    budget = budget or default_budget(target_name)
    config = {
        "code": code_fingerprint(*STUDY_CODE), "profile": profile, "target": target_name, "benchmark": _split_name(benchmark),
        "requests": requests, "seed": seed, "max_new_tokens": max_new_tokens, "threads": threads,
        "budget": _budget_dict(budget),
        # "options" stays in the key (always empty) so that finished slices keep their directory
        "runs": [{"label": r.label, "method": r.spec.name, "options": {},
                  "budget": _budget_dict(r.budget) if r.budget else None} for r in runs],
    }
    stage = Stage("toolspec_study", config)
    records_path = stage.path("records.jsonl")
    if stage.done:
        return list(read_jsonl(records_path))
    target = cached_target(target_name, profile)
    chosen = select_slice(load_split(_split_name(benchmark)), requests, seed)
    with torch_threads(threads):
        records = compare_methods(target, chosen, list(runs), max_new_tokens, budget, progress=progress)
    tmp = records_path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(records_path)
    stage.mark_done(records=len(records))
    return records


def cost_curve(target_name: str, *, profile: str = "cpu", benchmark: str = "apibank", sizes: tuple[int, ...] = (
        0, 1, 2, 4, 8, 16, 24, 32, 48, 64), repeats: int = 5, threads: int = 1) -> list[dict[str, Any]]:
    """The verify-cost curve of a target on the first request of ``benchmark`` (one prompt)."""
    config = {"code": code_fingerprint(*STUDY_CODE), "profile": profile, "target": target_name,
              "benchmark": _split_name(benchmark), "sizes": list(sizes), "repeats": repeats, "threads": threads}
    stage = Stage("toolspec_cost", config)
    path = stage.path("curve.json")
    if stage.done:
        return json.loads(path.read_text())
    target = cached_target(target_name, profile)
    request = load_split(_split_name(benchmark))[0]
    with torch_threads(threads):
        points = verify_cost_curve(TreeVerifier.for_target(target), target.prompt_ids(request),
                                   tuple(sizes), repeats)
    rows = [{"target": target_name, "prompt_tokens": len(target.prompt_ids(request)), **vars(p)} for p in points]
    path.write_text(json.dumps(rows, indent=1))
    stage.mark_done(points=len(rows))
    return rows


def budget_runs(budgets: list[int]) -> tuple[MethodRun, ...]:
    """ToolSpec at several node budgets (depth limit = node budget)."""
    return tuple(MethodRun(f"toolspec@{b}", MethodSpec("toolspec"), budget=TreeBudget(b, b)) for b in budgets)


ARITHMETIC_OPTIONS = (  # (profile, attention): fp32, bf16 (the cpu default), bf16 with eager attention
    ("cpu-fp32", "sdpa"), ("cpu", "sdpa"), ("cpu", "eager"),
)


def machine_options(options: tuple[tuple[str, str], ...], runs_in: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The options that differ on this machine: a profile whose wish the machine cannot run (bf16
    without bf16 kernels falls back to fp32) would repeat another option's measurement, so each
    (arithmetic that runs, attention) pair is measured once, under the first profile that gives it.
    ``runs_in``: profile -> the dtype it runs in here."""
    seen, kept = set(), []
    for profile, attention in options:
        if (runs_in[profile], attention) not in seen:
            seen.add((runs_in[profile], attention))
            kept.append((profile, attention))
    return tuple(kept)


def arithmetic_study(target_names: tuple[str, ...], *, options: tuple[tuple[str, str], ...] = ARITHMETIC_OPTIONS,
                     threads: tuple[int, ...] = (1, 2), benchmark: str = "apibank", repeats: int = 5,
                     rows: tuple[int, ...] = (1, 2, 4, 8, 16, 17, 32, 33, 48, 64, 65)) -> list[dict[str, Any]]:
    """Step cost, prefill and verify curve per target x arithmetic option x thread count.

    The options differ only in numerics or kernels; whether one may be used is decided by the
    lossless audit (every method identical to AR in the same arithmetic), not here."""
    from ooospec.bench.verify_cost import measure_arithmetic
    from ooospec.models.arithmetic import profile_arithmetic

    options = machine_options(options, {p: profile_arithmetic(p).dtype for p, _ in options})
    config = {"code": code_fingerprint(*STUDY_CODE), "targets": list(target_names), "options": [list(o) for o in options],
              "threads": list(threads), "benchmark": _split_name(benchmark), "repeats": repeats, "rows": list(rows)}
    stage = Stage("arithmetic_study", config)
    path = stage.path("points.json")
    if stage.done:
        return json.loads(path.read_text())
    request = load_split(_split_name(benchmark))[0]
    points = []
    for name in target_names:
        for profile in dict.fromkeys(p for p, _ in options):
            target = cached_target(name, profile)
            prompt = target.prompt_ids(request)
            for attention in [a for p, a in options if p == profile]:
                if target.compiled.mode and attention != "sdpa":
                    raise ValueError(f"arithmetic_study: {profile} compiles the sdpa model; {attention!r} attention "
                                     "would recompile inside the timings")
                target.model.set_attn_implementation(attention)
                for count in threads:
                    with torch_threads(count):
                        point = measure_arithmetic(TreeVerifier.for_target(target), prompt,
                                                   target=name, profile=profile, threads=count,
                                                   attention=attention, rows=rows, repeats=repeats,
                                                   compile=target.compiled.mode, compile_s=target.compiled.seconds)
                    points.append(vars(point))
            target.model.set_attn_implementation("sdpa")
            cached_target.cache_clear()
    path.write_text(json.dumps(points, indent=1))
    stage.mark_done(points=len(points))
    return points


def lossless_audit(target_name: str, *, profile: str = "cpu", per_benchmark: int = 20, seed: int = 7,
                   max_new_tokens: int = 96, runs: tuple[MethodRun, ...] = DEFAULT_RUNS,
                   progress: bool = True) -> list[dict[str, Any]]:
    """Every method against AR in the profile's own arithmetic on ``per_benchmark`` evaluation
    requests of each benchmark; records carry the AR top-2 gap at any first mismatch."""
    config = {"code": code_fingerprint(*STUDY_CODE), "profile": profile, "target": target_name, "per_benchmark": per_benchmark,
              "seed": seed, "max_new_tokens": max_new_tokens,
              "runs": [{"label": r.label, "method": r.spec.name} for r in runs]}
    stage = Stage("lossless_audit", config)
    path = stage.path("records.jsonl")
    if stage.done:
        return list(read_jsonl(path))
    target = cached_target(target_name, profile)
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    requests = [r for b in ("apibank", "toolalpaca", "bfcl")
                for r in select_slice(load_split(_split_name(b)), per_benchmark, seed)]
    with torch_threads(1):
        records = compare_methods(target, requests, list(runs), max_new_tokens, default_budget(target_name),
                                  progress=progress)
    for record in records:
        record.update(profile=profile, dtype=dtype)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
    stage.mark_done(records=len(records))
    return records


def committed_audit() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The committed lossless audit of the bf16 arithmetic (`lossless_audit`, 60 evaluation requests
    per target, PLD and ToolSpec against AR): a summary per target x method and every mismatch with
    AR's top-2 logit gap there. Committed because it costs ~25 minutes of one core."""
    from ooospec.paths import artifacts_dir

    folder = artifacts_dir() / "committed" / "lossless-audit"
    records = [r for path in sorted(folder.glob("*.jsonl")) for r in read_jsonl(path)]
    checked = pd.DataFrame([r for r in records if r["method"] != "ar"])
    if checked.empty:
        return pd.DataFrame(), pd.DataFrame()
    summary = checked.groupby(["target", "dtype", "method"]).agg(
        decodes=("id", "size"), identical=("identical_to_ar", "sum"), near_ties=("near_tie", "sum"),
        largest_gap_at_mismatch=("ar_gap_at_mismatch", "max")).reset_index()
    mismatches = checked[~checked.identical_to_ar][["target", "method", "benchmark", "id", "mismatch_at",
                                                    "ar_gap_at_mismatch", "near_tie"]]
    return summary, mismatches.reset_index(drop=True)


def open_final_turn_probe() -> tuple[pd.DataFrame, dict[str, Any]]:
    """The committed probe of an open last assistant turn (`tools/probe_open_final_turn.py`): on
    API-Bank requests that end with the AI's own words, does the Qwen target write a call when a
    new assistant turn is opened (the committed prompt) or when that last turn is left open for it
    to complete? One row per rendering (requests, outputs that parse as a call, and how many were
    empty), and the probe's provenance; empty when the probe is absent."""
    from ooospec.paths import artifacts_dir

    folder = artifacts_dir() / "committed" / "probes" / "apibank-open-final-turn"
    if not (folder / "outputs.jsonl").exists():
        return pd.DataFrame(), {}
    rows = pd.DataFrame(list(read_jsonl(folder / "outputs.jsonl")))
    rows["empty"] = rows.output.str.strip() == ""
    table = rows.groupby("rendering", sort=False).agg(requests=("request_id", "size"), parse_as_call=("parsed", "sum"),
                                                      empty_output=("empty", "sum"))
    return table, json.loads((folder / "provenance.json").read_text())


def arithmetic_table(points: list[dict[str, Any]], rows: tuple[int, ...] = (2, 8, 17, 33, 65)) -> pd.DataFrame:
    """`arithmetic_study` as a readable table: step (ms), prefill (s), cost of r rows / one row."""
    table = pd.DataFrame([{
        "target": p["target"], "arithmetic": p["dtype"] + (f" + {p['compile']}" if p.get("compile") else ""),
        "attention": p["attention"], "threads": p["threads"],
        "step ms": round(p["step_ms"]), "prefill s": round(p["prefill_s"], 2),
        **{f"{r} rows": p["ratios"].get(str(r), p["ratios"].get(r)) for r in rows
           if str(r) in p["ratios"] or r in p["ratios"]},
    } for p in points])
    return table.set_index(["target", "arithmetic", "attention", "threads"])
