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


def shown(path: Path | str) -> str:
    """A path as a reader of the book should see it: relative to the repository (or to the
    artifacts root when that lives elsewhere), never the build machine's absolute path."""
    path = Path(path).resolve()
    for root, prefix in ((REPO_ROOT, ""), (artifacts_dir(), "$OOOSPEC_ARTIFACTS/")):
        try:
            return prefix + str(path.relative_to(root))
        except ValueError:
            continue
    return path.name
