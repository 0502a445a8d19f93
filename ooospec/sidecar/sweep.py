"""How deep must the sidecar be? Accuracy vs cost over the number of kept decoder layers k.

Each k trains its own adapter with otherwise identical config (each run is an ordinary keyed
sidecar stage, so a finished k is never retrained) and records dev metrics, training throughput
and wave latency. The sweep's table is committed next to the adapters and shown by the sidecar
chapter; it is the evidence for the default k.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ooospec.data.request import Request
from ooospec.sidecar.training import (SidecarConfig, committed_adapters_dir, load_requests, rows_to_examples, subset,
                                      train_sidecar)
from ooospec.slots import SlotPromptConfig, build_rows, calls_from_gold

SWEEP_FILE = "sidecar-layer-sweep.json"


def sweep_row(cfg: SidecarConfig) -> dict[str, Any]:
    run = train_sidecar(cfg)
    dev, train = run.dev_metrics, run.record["train"]
    return {
        "num_layers": run.record["num_layers"], "train_requests": run.record["row_counts"]["train"]["requests"],
        "dev_requests": dev["requests"], "function_index_accuracy": dev["function_index_accuracy"],
        "argument_exact_match": dev["argument_exact_match"], "argument_value_exact_match": dev["argument_value_exact_match"],
        "null_precision": dev["null_precision"], "null_recall": dev["null_recall"],
        "whole_call_exact_match": dev["whole_call_exact_match"], "median_wave_latency_s": dev["median_wave_latency_s"],
        "train_tokens_per_s": train["tokens_per_s"], "train_s": train["seconds"], "final_loss": train["final_loss"],
        "completion_nll": dev.get("completion_nll"), "config_key": run.record["config_key"],
    }


def untrained_nll_by_layers(layers: list[int], requests: list[Request] | None = None, n_requests: int = 6,
                            profile: str = "cpu", seed: int = 0) -> list[dict[str, Any]]:
    """Completion NLL of the *untrained* cut base on a few requests' slot rows, per k.

    Cutting layers leaves the final norm and LM head reading an intermediate layer; this measures
    how far from calibrated that is before any adapter training (cheap: forward passes only).
    """
    from ooospec.sidecar.base import load_sidecar_base
    from ooospec.train import mean_completion_nll

    requests = requests if requests is not None else load_requests("train")
    rows = build_rows(requests, subset(calls_from_gold(requests), n_requests, seed), SlotPromptConfig())
    out = []
    for k in layers:
        model, tokenizer = load_sidecar_base(profile, k)
        examples = rows_to_examples(rows, tokenizer, tokenizer.eos_token_id)
        out.append({"num_layers": model.config.num_hidden_layers, "requests": n_requests,
                    "untrained_completion_nll": round(mean_completion_nll(model, examples, tokenizer.pad_token_id), 3)})
    return out


def run_layer_sweep(base: SidecarConfig, layers: list[int | None]) -> list[dict[str, Any]]:
    return [sweep_row(replace(base, num_layers=k)) for k in layers]


def write_sweep(rows: list[dict[str, Any]], base: SidecarConfig, untrained: list[dict[str, Any]],
                path: Path | None = None) -> Path:
    path = path or committed_adapters_dir() / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"base_config": asdict(base), "rows": rows, "untrained": untrained}, indent=2))
    return path


def read_sweep(path: Path | None = None) -> dict[str, Any] | None:
    path = path or committed_adapters_dir() / SWEEP_FILE
    return json.loads(path.read_text()) if path.exists() else None
