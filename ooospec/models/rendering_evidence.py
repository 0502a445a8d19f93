"""Derive and check a target's frozen rendering from its own greedy outputs.

The surface format must render a call byte for byte as the target writes it, or hints and
retrieved calls never line up with the target's tokens. So the rendering is not guessed: the
target answers a few requests greedily, each answer is parsed and re-rendered, and the re-rendered
text must equal what the target wrote (up to EOS). The answers are stored as evidence next to the
rendering parameters (``configs/renderings/<format>.json``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ooospec.data.request import Request
from ooospec.models.surface import SurfaceFormat
from ooospec.models.target import TargetModel
from ooospec.progress import progress_bar


def greedy_text(target: TargetModel, request: Request, max_new_tokens: int) -> tuple[str, bool]:
    """The target's greedy answer (special tokens dropped) and whether it ended with an EOS token."""
    ids = torch.tensor([target.prompt_ids(request)])
    with torch.no_grad():
        out = target.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=target.eos_token_ids, pad_token_id=target.tokenizer.pad_token_id,
        )
    new = out[0, ids.shape[1]:].tolist()
    stopped = bool(new) and new[-1] in target.eos_token_ids
    if stopped:
        new = new[:-1]
    return target.tokenizer.decode(new, skip_special_tokens=False), stopped


def matching_layouts(raw_text: str, layouts: dict[str, SurfaceFormat]) -> list[str]:
    """The layouts whose rendering of the parsed calls reproduces ``raw_text`` byte for byte."""
    first = next(iter(layouts.values()))
    calls = first.parse(raw_text)
    if not calls:
        return []
    return [name for name, surface in layouts.items() if surface.render(calls) == raw_text]


def observe_layouts(target: TargetModel, requests: list[Request], layouts: dict[str, SurfaceFormat],
                    max_new_tokens: int = 200) -> list[dict[str, Any]]:
    """Greedy answers of ``target`` on ``requests`` (training/dev requests only: the rendering must
    not be fitted on the evaluation requests it is then used on), each with the layouts that
    reproduce it byte for byte; `layout_choice` turns them into the frozen choice."""
    rows = []
    for request in progress_bar(requests, desc=f"rendering evidence {target.name}"):
        raw, stopped = greedy_text(target, request, max_new_tokens)
        rows.append(observation(request.id, request.benchmark, request.source, raw, stopped, layouts))
    return rows


def observation(request_id: str, benchmark: str, source: str, raw_text: str, stopped_on_eos: bool,
                layouts: dict[str, SurfaceFormat]) -> dict[str, Any]:
    """One stored answer: its text, the layouts that reproduce it, the calls parsed from it."""
    return {"request_id": request_id, "benchmark": benchmark, "source": source, "raw_text": raw_text,
            "stopped_on_eos": stopped_on_eos, "variants": matching_layouts(raw_text, layouts),
            "calls": [c.to_dict() for c in next(iter(layouts.values())).parse(raw_text)]}


def layout_choice(rows: list[dict[str, Any]], layouts: dict[str, SurfaceFormat]) -> dict[str, str]:
    """``{"*": majority layout, benchmark: its own majority where it differs}`` over observations."""
    from collections import Counter

    overall = Counter(v for row in rows for v in row["variants"])
    default = overall.most_common(1)[0][0] if overall else next(iter(layouts))
    choice = {"*": default}
    for benchmark in sorted({row["benchmark"] for row in rows}):
        counter = Counter(v for row in rows if row["benchmark"] == benchmark for v in row["variants"])
        if counter and counter[default] < counter.most_common(1)[0][1]:
            choice[benchmark] = counter.most_common(1)[0][0]
    return choice


def qwen_layouts() -> dict[str, SurfaceFormat]:
    """Every frozen layout of the Qwen surface, by name."""
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson, frozen_rendering

    return {name: QwenFencedJson(name) for name in frozen_rendering()["variants"]}


def store_qwen_evidence(rows: list[dict[str, Any]], note: str) -> dict[str, Any]:
    """Write the observations and the majority layout per benchmark into the frozen rendering
    (`configs/renderings/qwen_fenced_json.json`); the layouts themselves stay as they are."""
    import json

    from ooospec.models.formats.qwen_fenced_json import RENDERING_FILE, frozen_rendering
    from ooospec.paths import configs_dir

    layouts = qwen_layouts()
    path = configs_dir() / "renderings" / RENDERING_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    data.pop("exact_matches_of_call_only_answers", None)
    data.update({
        "observed_at": time.strftime("%Y-%m-%d"),
        "variant_by_benchmark": layout_choice(rows, layouts),
        "evidence_source": note,
        "observed": {"answers": len(rows),
                     "in a frozen variant": sum(bool(r["variants"]) for r in rows),
                     **{f"variant {v}": sum(v in r["variants"] for r in rows) for v in layouts},
                     "calls parsed but no variant reproduces them": sum(bool(r["calls"]) and not r["variants"] for r in rows),
                     "no call": sum(not r["calls"] for r in rows)},
        "observations": rows,
    })
    frozen_rendering.cache_clear()
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return data


def rederive_qwen_rendering(per_benchmark: int = 12, profile: str = "cpu", seed: int = 0,
                            max_new_tokens: int = 200) -> dict[str, Any]:
    """Re-derive the Qwen rendering's layout choice by decoding ``per_benchmark`` dev requests
    per dev benchmark (seeded); no evaluation request is observed."""
    import random

    from ooospec.data import load_split
    from ooospec.models.target import load_target

    target = load_target("qwen2.5-coder-0.5b", profile)
    dev = load_split("dev")
    chosen = []
    for benchmark in sorted({r.benchmark for r in dev}):
        pool = [r for r in dev if r.benchmark == benchmark]
        chosen += random.Random(seed).sample(pool, min(per_benchmark, len(pool)))
    rows = observe_layouts(target, chosen, qwen_layouts(), max_new_tokens)
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    return store_qwen_evidence(rows, (
        f"greedy answers of the target ({dtype}, profile {profile!r}) on {len(chosen)} dev requests "
        f"({per_benchmark} per dev benchmark, seed {seed}), max_new_tokens={max_new_tokens}; no evaluation "
        "request was observed. Re-derive with `python -m ooospec.models.rendering_evidence`."))


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=rederive_qwen_rendering.__doc__)
    parser.add_argument("--per-benchmark", type=int, default=12)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
    print(json.dumps(rederive_qwen_rendering(args.per_benchmark, args.profile)["observed"], indent=1))
