"""Dev metrics of the sidecar, scored against the reference call (the teacher's, or gold).

Row level, on the online rows only: function-index accuracy; argument exact match over every
argument row (a ``null`` answered ``null`` counts) and over the rows whose reference is a value;
``null`` precision/recall (is "this slot is unused" predicted reliably?). Request level: whole-call
exact match of the joined call, payload bytes and wave latency. Values are compared by their
compact JSON, so ``1`` and ``true`` and ``1.0`` stay different.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any, Iterable

from ooospec.data.request import Call, Request
from ooospec.sidecar.join import parse_value
from ooospec.sidecar.predictor import WaveResult
from ooospec.sidecar.slots import ARGUMENT, FUNCTION_INDEX, NULL, RowKey, compact_json, expand_call, reference_call


def canonical_answer(text: str) -> str | None:
    """The compact JSON of an answer, or None when it is not one JSON value."""
    value, why = parse_value(text)
    if why is not None:
        return None
    return compact_json(value)


def reference_answers(request: Request, call: Call) -> dict[RowKey, str]:
    """The target of every online row for the reference call (the training targets, stripped)."""
    answers = {}
    for row in expand_call(request, call):
        if row.kind in (FUNCTION_INDEX, ARGUMENT):
            answers[RowKey(row.kind, row.function, row.parameter)] = row.target.strip()
    return answers


@dataclass
class RequestScore:
    request_id: str
    function_correct: bool
    argument_rows: int
    argument_correct: int
    value_rows: int  # argument rows whose reference is a value (not null)
    value_correct: int
    null_true_pos: int  # predicted null, reference null
    null_predicted: int
    null_reference: int
    call_exact: bool
    invalid_answers: int
    latency_s: float
    payload_bytes: int
    rows: int


def score_wave(request: Request, reference: Call, result: WaveResult) -> RequestScore:
    want = reference_answers(request, reference)
    got = {row.key: row for row in result.rows}
    fi = got.get(RowKey(FUNCTION_INDEX))
    function_correct = fi is not None and not fi.truncated and fi.text.strip() == want[RowKey(FUNCTION_INDEX)]
    counts = dict(argument_rows=0, argument_correct=0, value_rows=0, value_correct=0,
                  null_true_pos=0, null_predicted=0, null_reference=0, invalid_answers=0)
    for key, target in want.items():
        if key.kind != ARGUMENT or key not in got:
            continue
        row = got[key]
        answer = None if row.truncated else canonical_answer(row.text)
        counts["argument_rows"] += 1
        counts["invalid_answers"] += answer is None
        correct = answer == target
        counts["argument_correct"] += correct
        if target == NULL:
            counts["null_reference"] += 1
            counts["null_true_pos"] += answer == NULL
        else:
            counts["value_rows"] += 1
            counts["value_correct"] += correct
        counts["null_predicted"] += answer == NULL
    expected = reference_call(request, reference)
    call_exact = result.call is not None and result.call.name == expected.name and \
        compact_json(result.call.arguments) == compact_json(expected.arguments)
    return RequestScore(request.id, function_correct, call_exact=call_exact, latency_s=result.latency_s,
                        payload_bytes=result.payload_bytes, rows=len(result.rows), **counts)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 4) if den else None


def summarize(scores: Iterable[RequestScore]) -> dict[str, Any]:
    scores = list(scores)
    total = lambda field: sum(getattr(s, field) for s in scores)  # noqa: E731
    latencies = [s.latency_s for s in scores]
    payloads = [s.payload_bytes for s in scores if s.payload_bytes > 0]  # requests that produced a call
    return {
        "requests": len(scores),
        "function_index_accuracy": _ratio(sum(s.function_correct for s in scores), len(scores)),
        "argument_exact_match": _ratio(total("argument_correct"), total("argument_rows")),
        "argument_value_exact_match": _ratio(total("value_correct"), total("value_rows")),
        "null_precision": _ratio(total("null_true_pos"), total("null_predicted")),
        "null_recall": _ratio(total("null_true_pos"), total("null_reference")),
        "whole_call_exact_match": _ratio(sum(s.call_exact for s in scores), len(scores)),
        "invalid_answer_rate": _ratio(total("invalid_answers"), total("argument_rows")),
        "argument_rows": total("argument_rows"),
        "mean_rows_per_wave": round(statistics.mean(s.rows for s in scores), 2) if scores else None,
        "calls_produced": sum(s.payload_bytes > 0 for s in scores),
        "mean_payload_bytes": round(statistics.mean(payloads), 1) if payloads else None,
        "median_wave_latency_s": round(statistics.median(latencies), 4) if scores else None,
        "mean_wave_latency_s": round(statistics.mean(latencies), 4) if scores else None,
    }


def score_to_dict(score: RequestScore) -> dict[str, Any]:
    return json.loads(json.dumps(score.__dict__))


def rescore(predictions: Iterable[dict[str, Any]], requests: dict[str, Request],
            references: dict[str, Call]) -> dict[str, Any]:
    """Stored dev waves (``dev_predictions.jsonl`` records) scored against other reference calls,
    without running the sidecar again: the committed adapter is scored against the target's own
    calls (what decides acceptance) and against gold from the same predictions. Requests without a
    reference call are left out (counted in ``requests``)."""
    scores = [score_wave(requests[p["request_id"]], references[p["request_id"]], WaveResult.from_dict(p))
              for p in predictions if p["request_id"] in references]
    return summarize(scores)
