"""The sidecar's base model: the profile's ``sidecar_base`` role cut to its first k layers."""

from __future__ import annotations

from typing import Any


def load_sidecar_base(profile: str = "cpu", num_layers: int | None = None,
                      dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) of the sidecar base; ``num_layers`` None keeps the profile's setting,
    ``dtype`` None the profile's arithmetic (training passes float32)."""
    from ooospec.models.loading import load_model

    return load_model("sidecar_base", profile, num_layers=num_layers, dtype=dtype)
