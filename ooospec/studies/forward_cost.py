"""What a forward costs on this machine, as resumable stages: the verify-cost curve that sizes the
trees (chapter 03), and step, prefill and verify cost per arithmetic and thread count (chapter 08)."""

from __future__ import annotations

import json
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import pandas as pd

from ooospec.studies.target_cache import STUDY_CODE, _split_name, cached_target, torch_threads
from ooospec.bench.verify_cost import verify_cost_curve
from ooospec.data import load_split
from ooospec.decoding.verifier import TreeVerifier
from ooospec.models.fp32_logits import own_head, uses_fp32_logits
from ooospec.models.row_invariant import ATTENTION, plain_rows, uses_row_invariance
from ooospec.models.packed_linear import pack_linears, unpack_linears, uses_packed_linears
from ooospec.stage import Stage, code_fingerprint


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


STUDY_ROWS = (1, 2, 4, 8, 16, 17, 32, 33, 48, 64, 65)  # rows of the verify-cost curve per arithmetic
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


def study_measurements(runs_in: dict[str, str],
                       options: tuple[tuple[str, str], ...] = ARITHMETIC_OPTIONS) -> list[tuple[str, str]]:
    """The (profile, dtype) of every measurement `arithmetic_study` makes per target and thread
    count on a machine whose profiles run in ``runs_in``: an fp32 model packs its products, so it is
    measured twice (packed, and plain as the control), and so is a bf16 one with fp32 logits (with
    them, and with its own bf16 head)."""
    return [(profile, runs_in[profile])
            for profile, _ in machine_options(options, runs_in)
            for _ in range(2 if runs_in[profile] == "float32" or _asks_fp32_logits(profile) else 1)]


def _asks_fp32_logits(profile: str) -> bool:
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    return prof.model(next(iter(prof.targets))).logits == "float32"


def arithmetic_study(target_names: tuple[str, ...], *, options: tuple[tuple[str, str], ...] = ARITHMETIC_OPTIONS,
                     threads: tuple[int, ...] = (1, 2), benchmark: str = "apibank", repeats: int = 5,
                     rows: tuple[int, ...] = STUDY_ROWS) -> list[dict[str, Any]]:
    """Step cost, prefill and verify curve per target x arithmetic option x thread count.

    The options differ only in numerics or kernels; whether one may be used is decided by the
    lossless audit (every method identical to AR in the same arithmetic), not here."""
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
            # a model with packed multi-row products is measured with them and, as the control, with
            # torch's plain linear layers on the same weights; one with fp32 logits, as served (with them
            # and row-invariant forwards where the profile asks) and with its own bf16 head on torch's
            # kernels (the control of `ooospec.models.fp32_logits` and `ooospec.models.row_invariant`)
            packed, fp32_logits = uses_packed_linears(target.model), uses_fp32_logits(target.model)
            variants = ("packed", "plain") if packed else ("fp32 logits", "bf16 head") if fp32_logits else (None,)
            for kernels in variants:
                if kernels == "plain":
                    unpack_linears(target.model)
                with _bf16_head_on_torchs_kernels(target.model) if kernels == "bf16 head" else nullcontext():
                    points += _measure_options(target, name, profile, prompt, options, threads, rows, repeats, kernels)
            if packed:
                pack_linears(target.model)
            cached_target.cache_clear()
    path.write_text(json.dumps(points, indent=1))
    stage.mark_done(points=len(points))
    return points


@contextmanager
def _bf16_head_on_torchs_kernels(model: Any) -> Iterator[None]:
    with plain_rows(model), own_head(model):
        yield


def _served_attention(model: Any, attention: str) -> str:
    """The attention a study option names: ``sdpa`` is the row-invariant one where the model has it."""
    return ATTENTION if attention == "sdpa" and uses_row_invariance(model) else attention


def _measure_options(target: Any, name: str, profile: str, prompt: list[int], options: tuple[tuple[str, str], ...],
                     threads: tuple[int, ...], rows: tuple[int, ...], repeats: int, kernels: str | None) -> list[dict[str, Any]]:
    """One target as it is now loaded: every attention option of ``profile`` x thread count."""
    from ooospec.bench.verify_cost import measure_arithmetic

    points = []
    for attention in [a for p, a in options if p == profile]:
        if target.compiled.mode and attention != "sdpa":
            raise ValueError(f"arithmetic_study: {profile} compiles the sdpa model; {attention!r} "
                             "attention would recompile inside the timings")
        target.model.set_attn_implementation(_served_attention(target.model, attention))
        for count in threads:
            with torch_threads(count):
                point = measure_arithmetic(TreeVerifier.for_target(target), prompt,
                                           target=name, profile=profile, threads=count,
                                           attention=attention, rows=rows, repeats=repeats,
                                           compile=target.compiled.mode, compile_s=target.compiled.seconds)
            points.append({**vars(point), "kernels": kernels})
    target.model.set_attn_implementation(_served_attention(target.model, "sdpa"))
    return points


def arithmetic_table(points: list[dict[str, Any]], rows: tuple[int, ...] = (2, 8, 17, 33, 65)) -> pd.DataFrame:
    """`arithmetic_study` as a readable table: step (ms), prefill (s), cost of r rows / one row."""
    table = pd.DataFrame([{
        "target": p["target"], "arithmetic": p["dtype"] + (f" + {p['compile']}" if p.get("compile") else "")
        + (f" ({p['kernels']})" if p.get("kernels") else ""),
        "attention": p["attention"], "threads": p["threads"],
        "step ms": round(p["step_ms"]), "prefill s": round(p["prefill_s"], 2),
        **{f"{r} rows": p["ratios"].get(str(r), p["ratios"].get(r)) for r in rows
           if str(r) in p["ratios"] or r in p["ratios"]},
    } for p in points])
    return table.set_index(["target", "arithmetic", "attention", "threads"])
