"""Where an artifact came from: the code commit that made it and the sha256 of its files.

One place for both, so every committed artifact (teacher traces, adapters, studies, the tree-budget
acceptance) records its provenance the same way; a digest here equals ``sha256sum`` of the file.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Iterable

from ooospec.paths import REPO_ROOT

_CHUNK = 1 << 20  # read files in 1 MiB blocks: model weights do not fit in memory twice


def code_commit(short: bool = False) -> str | None:
    """The git commit of the code that made an artifact (``short``: git's abbreviated form); None
    outside a checkout or without git."""
    try:
        out = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def files_sha256(paths: Iterable[Path]) -> str:
    """sha256 of the files' bytes concatenated in order (one file: its ``sha256sum``)."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def bytes_sha256(data: bytes) -> str:
    """sha256 of bytes held in memory (a file about to be written: equals its ``sha256sum``)."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of one file's bytes."""
    return files_sha256([path])


def file_sha256_or_none(path: Path) -> str | None:
    """`file_sha256`, or None where the file does not exist (an input a run may lack)."""
    return file_sha256(path) if path.exists() else None
