"""Resumable, config-keyed pipeline stages.

Each stage writes into ``artifacts/<stage>/<key>/`` where ``key`` is a short hash of the stage's
config, and marks completion with a ``DONE.json`` file written last. A rerun with the same config
finds the marker and skips the work; a different config gets its own directory, so a smoke run
with tiny parameters never clobbers a full run. Long stages that produce records one by one
append to a JSONL file and skip the ids already there, so an interrupted stage resumes.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from ooospec.paths import artifacts_dir


class FrozenAssetMissing(RuntimeError):
    """A stage would have to re-derive a committed (frozen) asset: teacher traces, a sidecar or tool
    adapter. It stops instead of silently spending hours; the message names what is missing or
    differs and how to re-derive it on purpose."""


def canonical_json(obj: Any) -> str:
    """Compact JSON with sorted keys: the form that is hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def config_key(config: dict[str, Any], length: int = 12) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:length]


PACKAGE_ROOT = Path(__file__).resolve().parent


def code_fingerprint(*parts: str, length: int = 12) -> str:
    """A hash of the package source a stage runs (``parts``: subpackages such as ``"decoding"`` or
    files such as ``"bench/runner.py"``, relative to ``ooospec/``). Put into a stage's config, it
    makes a code change re-run what it affects, with no hand-bumped version number to forget."""
    files: set[Path] = set()
    for part in parts:
        path = PACKAGE_ROOT / part
        if path.is_dir():
            files.update(path.rglob("*.py"))
        elif path.is_file():
            files.add(path)
        else:
            raise FileNotFoundError(f"code_fingerprint: no package source {part!r} under {PACKAGE_ROOT.name}/")
    digest = hashlib.sha256()
    for file in sorted(files):
        digest.update(file.relative_to(PACKAGE_ROOT).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:length]


@dataclass
class Stage:
    """One keyed output directory of one pipeline stage."""

    name: str
    config: dict[str, Any]

    @property
    def key(self) -> str:
        return config_key(self.config)

    @property
    def dir(self) -> Path:
        path = artifacts_dir() / self.name / self.key
        path.mkdir(parents=True, exist_ok=True)
        config_file = path / "config.json"
        if not config_file.exists():
            config_file.write_text(json.dumps(self.config, indent=2, sort_keys=True, default=str))
        return path

    def path(self, filename: str) -> Path:
        return self.dir / filename

    @property
    def done(self) -> bool:
        return (self.dir / "DONE.json").exists()

    def mark_done(self, **summary: Any) -> None:
        summary = {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **summary}
        (self.dir / "DONE.json").write_text(json.dumps(summary, indent=2, default=str))

    def summary(self) -> dict[str, Any]:
        return json.loads((self.dir / "DONE.json").read_text())


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Read a JSONL file, naming the file and line of a malformed record."""
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                # a torn last line is what an interrupted append leaves behind
                raise ValueError(f"{path}:{lineno}: malformed JSON record ({err.msg})") from err


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write ``records`` as JSON lines atomically (a reader never sees half a file); the count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    tmp.replace(path)
    return count


def append_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()


def done_ids(path: Path, field: str = "id", repair: bool = True) -> set[str]:
    """Ids already written to a resumable JSONL output (a torn last line is dropped, and cut off
    the file when ``repair``: never repair a file another process may be appending to)."""
    if not path.exists():
        return set()
    ids: set[str] = set()
    good_bytes = 0
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                ids.add(json.loads(raw)[field])
                good_bytes += len(raw)
            except (json.JSONDecodeError, KeyError):
                break
    if repair and good_bytes != path.stat().st_size:  # truncate a partial line left by an interruption
        with open(path, "r+b") as handle:
            handle.truncate(good_bytes)
    return ids
