"""Build every request file the pipeline reads: ``python -m ooospec.data.build``.

Outputs (``artifacts/data/<config key>/`` via :class:`ooospec.stage.Stage`, mirrored to
``artifacts/data/`` so later stages and people find them at fixed paths):
``eval_apibank.jsonl``, ``eval_toolalpaca.jsonl``, ``eval_bfcl.jsonl``,
``eval_bfcl_irrelevance.jsonl``, ``train.jsonl``, ``dev.jsonl``, ``card.json``.
A rerun with the same config (same raw-data manifest, same optional training files present, same
loader version) is skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import time
from typing import Any

from ooospec.data import apibank, bfcl, glaive, nestful, openfunctions, sealtools, toolalpaca, toolrl
from ooospec.data.card import build_card
from ooospec.data.loading import SourceLoad, flag_schema_warnings
from ooospec.data.raw import load_manifest, optional_files_state
from ooospec.data.request import read_requests, write_requests, Request
from ooospec.data.splits import DEFAULT_DEV_FRACTION, split_training
from ooospec.paths import artifacts_dir
from ooospec.progress import progress_bar
from ooospec.stage import Stage

DATA_VERSION = 4  # bump when a loader's output changes, so old builds are not reused
SPLIT_FILES = ("eval_apibank", "eval_toolalpaca", "eval_bfcl", "eval_bfcl_irrelevance", "train", "dev")


def data_config(include_live: bool = False, dev_fraction: float = DEFAULT_DEV_FRACTION,
                decontaminate: bool = True) -> dict[str, Any]:
    manifest = "".join(f"{e.relpath}{e.sha256}" for e in load_manifest().values())
    return {
        "version": DATA_VERSION,
        "include_live": include_live,
        "dev_fraction": round(dev_fraction, 8),
        "decontaminate": decontaminate,
        "raw_manifest": hashlib.sha256(manifest.encode()).hexdigest()[:16],
        "optional_files": optional_files_state(),
    }


def data_stage(include_live: bool = False, **kwargs: Any) -> Stage:
    return Stage("data", data_config(include_live, **kwargs))


def _collect(jobs: list[tuple[str, Any]]) -> list[SourceLoad]:
    loads: list[SourceLoad] = []
    for _, job in progress_bar(jobs, desc="loading sources", leave=False):
        result = job()
        loads.extend(result if isinstance(result, list) else [result])
    return loads


def flag_repeated_prompts(loads: list[SourceLoad]) -> None:
    """Evaluation sets keep upstream repeats (API-Bank asks the same call twice on one dialogue
    prefix); they are flagged so that a retrieval-based method's numbers can be read with that
    in mind."""
    seen: set[str] = set()
    for load in loads:
        for request in load.requests:
            if request.prompt_hash in seen:
                load.flag("repeated_prompt", request.id)
            seen.add(request.prompt_hash)


def load_everything(include_live: bool, dev_fraction: float, decontaminate: bool) -> tuple[
        list[SourceLoad], list[SourceLoad], list[SourceLoad], dict[str, list[Request]]]:
    eval_loads = _collect([
        ("apibank-1", lambda: apibank.load_eval(1)),
        ("apibank-2", lambda: apibank.load_eval(2)),
        ("toolalpaca-sim", lambda: toolalpaca.load_eval("simulated")),
        ("toolalpaca-real", lambda: toolalpaca.load_eval("real")),
        ("bfcl", lambda: bfcl.load_eval(include_live=include_live)),
    ])
    irrelevance = bfcl.load_irrelevance(include_live=include_live)
    flag_repeated_prompts(eval_loads + irrelevance)
    train_loads = _collect([
        ("apibank", apibank.load_train),
        ("toolalpaca", toolalpaca.load_train),
        ("sealtools", sealtools.load),
        ("toolrl", toolrl.load),
        ("nestful", nestful.load),
        ("glaive", glaive.load),
        ("openfunctions", openfunctions.load),
    ])
    eval_requests = [r for load in eval_loads + irrelevance for r in load.requests]
    split = split_training(train_loads, eval_requests, toolalpaca.eval_api_names(),
                           dev_fraction=dev_fraction, decontaminate=decontaminate)
    for load in eval_loads + irrelevance + train_loads:  # the kept requests, after the split's drops
        flag_schema_warnings(load)  # recorded on the request and counted in the card, never dropped
    by_benchmark = {
        "eval_apibank": [r for load in eval_loads if load.source.startswith("apibank") for r in load.requests],
        "eval_toolalpaca": [r for load in eval_loads if load.source.startswith("toolalpaca") for r in load.requests],
        "eval_bfcl": [r for load in eval_loads if load.source.startswith("bfcl") for r in load.requests],
        "eval_bfcl_irrelevance": [r for load in irrelevance for r in load.requests],
        "train": split.train,
        "dev": split.dev,
    }
    return eval_loads, irrelevance, train_loads, by_benchmark


def _mirror(stage: Stage) -> None:
    """Copy the stage's files to ``artifacts/data/`` (the fixed paths later stages read)."""
    top = artifacts_dir() / "data"
    for name in SPLIT_FILES:
        shutil.copyfile(stage.path(f"{name}.jsonl"), top / f"{name}.jsonl")
    shutil.copyfile(stage.path("card.json"), top / "card.json")


def build_data(include_live: bool = False, force: bool = False, dev_fraction: float = DEFAULT_DEV_FRACTION,
               decontaminate: bool = True) -> dict[str, Any]:
    """Build (or reuse) the request files; returns the data card."""
    stage = data_stage(include_live, dev_fraction=dev_fraction, decontaminate=decontaminate)
    if stage.done and not force:
        card = json.loads(stage.path("card.json").read_text())
        top_card = artifacts_dir() / "data" / "card.json"
        if not top_card.exists() or json.loads(top_card.read_text()).get("config") != card["config"]:
            _mirror(stage)
        return card
    started = time.perf_counter()
    eval_loads, irrelevance, train_loads, files = load_everything(include_live, dev_fraction, decontaminate)
    outputs = {name: write_requests(stage.path(f"{name}.jsonl"), requests) for name, requests in files.items()}
    card = build_card(eval_loads + irrelevance, train_loads, stage.config, outputs)
    card["build_seconds"] = round(time.perf_counter() - started, 2)
    stage.path("card.json").write_text(json.dumps(card, indent=1, ensure_ascii=False))
    stage.mark_done(outputs=outputs)
    _mirror(stage)
    return card


def load_split(name: str, include_live: bool = False) -> list[Request]:
    """Requests of one output file (``eval_apibank`` ... ``train``/``dev``); builds when missing."""
    if name not in SPLIT_FILES:
        raise ValueError(f"unknown split {name!r}; expected one of {SPLIT_FILES}")
    stage = data_stage(include_live)
    if not stage.done:
        build_data(include_live=include_live)
    return list(read_requests(stage.path(f"{name}.jsonl")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include-live", action="store_true", help="add BFCL live_* categories")
    parser.add_argument("--force", action="store_true", help="rebuild even if the outputs exist")
    args = parser.parse_args(argv)
    card = build_data(include_live=args.include_live, force=args.force)
    for name, count in card["outputs"].items():
        print(f"{name:24s} {count:6d}")
    print("totals:", card["totals"], "paper:", {k: card["paper"][k] for k in card["totals"]})
    for line in schema_warning_summary(card):
        print(line)


def schema_warning_summary(card: dict[str, Any], examples: int = 3) -> list[str]:
    """Lines for the build's summary: requests whose tool schemas break the metaschema, per source,
    with a few of the warnings (all of them are in each request's ``meta["schema_warnings"]``)."""
    flagged = [s for s in card["sources"] if s.get("tool_schema_warnings")]
    if not flagged:
        return ["tool schema warnings: none (every tool schema is valid JSON Schema)"]
    lines = [f"tool schema warnings: {sum(s['tool_schema_warnings'] for s in flagged)} requests"]
    for source in flagged:
        lines.append(f"  {source['source']}: {source['tool_schema_warnings']} requests")
        lines.extend(f"    {text}" for text in source.get("schema_warning_examples", [])[:examples])
    return lines


if __name__ == "__main__":
    main()
