"""The sidecar's base model: the profile's ``sidecar_base`` role (or, for a size ablation, another
model of the profile) cut to its first k layers."""

from __future__ import annotations

from typing import Any

PROFILE_BASE = "profile"  # `SidecarConfig.base`: the profile's sidecar_base role
TINY_BASE = "tiny"  # `SidecarConfig.base`: a random 2-layer model (smoke runs)


def base_model_name(base: str = PROFILE_BASE) -> str:
    """The profile model (or role) a sidecar config's ``base`` names: ``sidecar_base`` for the
    profile's own, else the model itself (a size ablation, e.g. the 0.5B Qwen)."""
    if base == TINY_BASE:
        raise ValueError("the tiny sidecar base is built by ooospec.models.tiny, not loaded from a profile")
    return "sidecar_base" if base == PROFILE_BASE else base


def load_sidecar_base(profile: str = "cpu", num_layers: int | None = None,
                      dtype: str | None = None, base: str = PROFILE_BASE) -> tuple[Any, Any]:
    """(model, tokenizer) of the sidecar base; ``num_layers`` None keeps the profile's setting,
    ``dtype`` None the profile's arithmetic (training passes float32), ``base`` as
    `SidecarConfig.base` (an adapter's record says which base it was trained on)."""
    from ooospec.models.loading import load_model

    return load_model(base_model_name(base), profile, num_layers=num_layers, dtype=dtype)
