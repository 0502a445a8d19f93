"""A two-tool request and a tiny random sidecar with varied answers, shared by the sidecar tests."""

from __future__ import annotations

import torch

from ooospec.data.request import Call, Request
from ooospec.models.tiny import tiny_model_and_tokenizer
from ooospec.sidecar.predictor import SlotPredictor

TOOLS = [
    {"name": "get_weather", "description": "Get the weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"]}},
    {"name": "get_time", "description": "Get the time",
     "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
]


def request(rid: str = "r1", city: str = "Paris", text: str | None = None) -> Request:
    return Request(rid, "test", "train", [{"role": "user", "content": text or f"weather in {city}?"}], TOOLS,
                   [Call("get_weather", {"city": city})])


def sharp_predictor() -> SlotPredictor:
    """A tiny random sidecar with sharper logits than the default init: distinct, varied greedy answers."""
    model, tokenizer = tiny_model_and_tokenizer(seed=5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    return SlotPredictor(model, tokenizer, max_new_tokens=6, required_values=False)
