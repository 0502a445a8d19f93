"""Model profiles, loading (hub id, local dir, GGUF shipped in a package), surface formats, targets.

Entry points: `load_profile(name)`, `load_model(name, profile)` -> (model, tokenizer),
`load_target(name, profile)` -> `TargetModel`, `get_surface(name)`. They are imported lazily, so
that reading a profile does not import torch and ``python -m ooospec.models.loading`` runs cleanly.
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import Any

# peft (0.21) calls transformers' deprecated `is_gradient_checkpointing` on every adapter load and
# LoRA setup; the warning concerns their APIs, not ours, and would be printed into every chapter
warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)

_EXPORTS = {
    "Profile": "ooospec.models.registry",
    "ProfileError": "ooospec.models.registry",
    "load_profile": "ooospec.models.registry",
    "get_surface": "ooospec.models.formats",
    "surface_names": "ooospec.models.formats",
    "load_model": "ooospec.models.loading",
    "TargetModel": "ooospec.models.target",
    "load_target": "ooospec.models.target",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ooospec.models' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
