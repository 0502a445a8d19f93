"""Model profiles, loading (hub id, local dir, GGUF shipped in a package), surface formats, targets.

Entry points: `load_profile(name)`, `load_model(name, profile)` -> (model, tokenizer),
`load_target(name, profile)` -> `TargetModel`, `get_surface(name)`.
"""

from ooospec.models.formats import get_surface, surface_names
from ooospec.models.loading import load_model
from ooospec.models.registry import Profile, ProfileError, load_profile
from ooospec.models.target import TargetModel, load_target

__all__ = [
    "Profile",
    "ProfileError",
    "TargetModel",
    "get_surface",
    "load_model",
    "load_profile",
    "load_target",
    "surface_names",
]
