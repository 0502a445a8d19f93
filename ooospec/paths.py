"""Where the artifact reads raw data and writes everything it produces.

Two settings, both environment variables so that notebooks, tests and the Makefile agree without
passing paths around: ``OOOSPEC_ARTIFACTS`` (default ``<repo>/artifacts``) and
``OOOSPEC_RAW_DATA`` (see :mod:`ooospec.data.raw` for its resolution order).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def artifacts_dir() -> Path:
    """Root of every produced file; created on first use."""
    root = Path(os.environ.get("OOOSPEC_ARTIFACTS", REPO_ROOT / "artifacts")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def artifact_path(*parts: str) -> Path:
    """A path under the artifacts root whose parent directory exists."""
    path = artifacts_dir().joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def configs_dir() -> Path:
    return REPO_ROOT / "configs"
