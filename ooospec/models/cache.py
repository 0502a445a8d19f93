"""KV-cache plumbing shared by LoRA training and the sidecar's slot wave.

Both run one request prefix once and then many short branches (slot rows) as one batch over
that prefix's cache; `expand_cache` is the step between.
"""

from __future__ import annotations

from typing import Any


def expand_cache(cache: Any, batch: int) -> Any:
    """A new cache whose every layer repeats a batch-1 prefix ``batch`` times (views, no copy)."""
    from transformers import DynamicCache

    data = [(layer.keys.expand(batch, -1, -1, -1), layer.values.expand(batch, -1, -1, -1)) for layer in cache.layers]
    return DynamicCache(ddp_cache_data=data)
