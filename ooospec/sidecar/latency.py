"""Is the sidecar cheap next to the target? Wave latency vs the target's autoregressive latency.

In the paper the sidecar (0.6B) is an order of magnitude smaller than the targets (4B-32B), so
its wave finishes while the target is still early in decoding. Here both run on CPU, so the
ratio is measured on the same requests with the same thread count: the sidecar's whole slot
wave against the target's greedy decoding of the same request (prefill included, as the user
waits for it), plus the target's prefill alone (the wave should land before the first
candidate-construction boundary after it).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ooospec.data.request import Request
from ooospec.progress import progress_bar
from ooospec.sidecar.predictor import SlotPredictor


@dataclass
class LatencyRow:
    request_id: str
    source: str
    wave_s: float
    wave_rows: int
    prefix_tokens: int
    target_prompt_tokens: int
    target_prefill_s: float
    target_total_s: float
    target_new_tokens: int

    @property
    def ratio(self) -> float:
        return self.wave_s / self.target_total_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "wave_over_target": round(self.ratio, 4),
                "wave_over_prefill": round(self.wave_s / self.target_prefill_s, 4)}


@torch.no_grad()
def target_latency(target: Any, request: Request, max_new_tokens: int) -> tuple[int, float, float, int]:
    """(prompt tokens, prefill seconds, greedy decode seconds incl. prefill, new tokens)."""
    prompt = target.prompt_ids(request)
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    target.model(input_ids=ids, logits_to_keep=1)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                do_sample=False, eos_token_id=target.eos_token_ids,
                                pad_token_id=target.tokenizer.pad_token_id)
    total = time.perf_counter() - start
    return len(prompt), prefill, total, out.shape[1] - len(prompt)


def measure_latency(predictor: SlotPredictor, target: Any, requests: list[Request], threads: int = 1,
                    max_new_tokens: int = 160) -> list[LatencyRow]:
    """Wave and target latency per request, one warm-up request first (not recorded)."""
    torch.set_num_threads(threads)
    if requests:
        predictor.predict_wave(requests[0])
        target_latency(target, requests[0], 4)
    rows = []
    for request in progress_bar(requests, desc="sidecar vs target", unit="req"):
        wave = predictor.predict_wave(request)
        prompt_tokens, prefill, total, new = target_latency(target, request, max_new_tokens)
        rows.append(LatencyRow(request.id, request.source, round(wave.latency_s, 4), len(wave.rows),
                               wave.prefix_tokens, prompt_tokens, round(prefill, 4), round(total, 4), new))
    return rows


def latency_summary(rows: list[LatencyRow]) -> dict[str, Any]:
    if not rows:
        return {"requests": 0}
    return {
        "requests": len(rows),
        "median_wave_s": round(statistics.median(r.wave_s for r in rows), 4),
        "median_target_prefill_s": round(statistics.median(r.target_prefill_s for r in rows), 4),
        "median_target_total_s": round(statistics.median(r.target_total_s for r in rows), 4),
        "median_wave_over_target": round(statistics.median(r.ratio for r in rows), 4),
        "median_wave_over_prefill": round(statistics.median(r.wave_s / r.target_prefill_s for r in rows), 4),
        "ratio_of_totals": round(sum(r.wave_s for r in rows) / sum(r.target_total_s for r in rows), 4),
    }


def mode_latencies(predictor: SlotPredictor, requests: list[Request], modes: tuple[str, ...] = (
        "wave", "wave_no_prefix_share", "sequential", "two_waves")) -> list[dict[str, Any]]:
    """Per request and mode: latency, forwards and whether the joined call equals the wave's."""
    records = []
    for request in progress_bar(requests, desc="sidecar modes", unit="req"):
        reference = None
        for mode in modes:
            result = predictor.predict(request, mode)
            if mode == "wave":
                reference = result.payload
            records.append({"request_id": request.id, "mode": mode, "latency_s": round(result.latency_s, 4),
                            "forwards": result.forwards, "rows": len(result.rows), "payload_bytes": result.payload_bytes,
                            "same_call_as_wave": result.payload == reference})
    return records
