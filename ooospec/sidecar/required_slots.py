"""Does forbidding null for schema-required slots repair the sidecar's calls? Measured on dev.

The committed sidecar (135M, 200 training calls) learned that most argument rows answer null:
every candidate function's parameters are asked, and only the chosen function's are filled. It
then answers null for the chosen function's parameters too, and its calls arrive with empty
arguments: a hint that supplies the function name and nothing else. The schema knows better: a
parameter marked required is filled whenever its function is called. `SlotPredictor` with
``required_values=True`` (the runtime's default) may not start such a row with null. This module
sets the two side by side on the same dev requests, reusing the adapter's stored dev waves for the
raw side, so the notebook shows what the option buys and what it costs in wave latency.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ooospec.data.request import Call, Request
from ooospec.sidecar.metrics import score_wave, summarize
from ooospec.sidecar.predictor import SlotPredictor, WaveResult

KEYS = ("function_index_accuracy", "argument_value_exact_match", "null_recall", "whole_call_exact_match",
        "calls_produced", "mean_payload_bytes", "median_wave_latency_s")


def stored_dev_waves(adapter_dir: Path) -> list[dict[str, Any]]:
    """The dev waves written when the adapter was evaluated (next to its ``adapter/`` folder)."""
    path = Path(adapter_dir).parent / "dev_predictions.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no stored dev waves for the adapter {adapter_dir}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def compare_required_values(predictor: SlotPredictor, adapter_dir: Path, requests: dict[str, Request],
                            limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(summary rows, per-request rows) of the raw sidecar vs ``required_values`` on ``limit`` dev waves."""
    if not predictor.required_values:
        raise ValueError("compare_required_values needs a predictor built with required_values=True")
    raw_scores, req_scores, per_request = [], [], []
    for record in stored_dev_waves(adapter_dir)[:limit]:
        request = requests[record["request_id"]]
        reference = Call.from_dict(record["reference"])
        raw = WaveResult.from_dict(record)
        fixed = predictor.predict_wave(request)
        raw_scores.append(score_wave(request, reference, raw))
        req_scores.append(score_wave(request, reference, fixed))
        per_request.append({"request": request.id, "reference": json.dumps(reference.to_dict()),
                            "raw sidecar": raw.payload, "required slots filled": fixed.payload})
    summary = [{"sidecar": name, **{k: s[k] for k in KEYS}}
               for name, s in (("raw (as trained)", summarize(raw_scores)),
                               ("required slots filled", summarize(req_scores)))]
    return summary, per_request
