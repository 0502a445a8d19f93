"""Frozen LoRA adapters on disk: freezing with a sha256, verifying, loading; the tool target's adapter.

Training (``ooospec.training``) writes adapters and inference (the SmolLM2 tool target in
``ooospec.models.target``, the sidecar's predictor) reads them, so the file format sits here,
below both: an adapter directory holds peft's files, ``adapter.sha256`` (sha256 over every
other file) and ``FROZEN.json`` (config, dev metrics, provenance). `read_frozen` refuses a
directory whose files no longer match their hash, so a stale or edited adapter is never used.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import torch

from ooospec.paths import artifact_path, artifacts_dir

if TYPE_CHECKING:
    from ooospec.models.registry import Profile

ADAPTER_HASH_FILE = "adapter.sha256"
FROZEN_FILE = "FROZEN.json"


def directory_sha256(path: Path, exclude: Iterable[str] = (ADAPTER_HASH_FILE, FROZEN_FILE)) -> str:
    """sha256 over the sorted (name, bytes) of every file in an adapter directory."""
    digest = hashlib.sha256()
    skip = set(exclude)
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name not in skip):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def freeze_adapter(model: torch.nn.Module, out_dir: Path, record: dict[str, Any]) -> str:
    """Save the adapter, its sha256 and a record (config, dev metrics, provenance); return the hash."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    sha = directory_sha256(out_dir)
    (out_dir / ADAPTER_HASH_FILE).write_text(sha + "\n")
    (out_dir / FROZEN_FILE).write_text(json.dumps({**record, "sha256": sha}, indent=2, default=str))
    return sha


def update_frozen_record(adapter_dir: Path, **fields: Any) -> dict[str, Any]:
    """Add fields (e.g. dev metrics measured after freezing) to the record; the hashed files stay."""
    record = read_frozen(adapter_dir)
    record.update(fields)
    (adapter_dir / FROZEN_FILE).write_text(json.dumps(record, indent=2, default=str))
    return record


def read_frozen(adapter_dir: Path) -> dict[str, Any]:
    """The freeze record of an adapter, after checking its files against the stored sha256."""
    hash_file = adapter_dir / ADAPTER_HASH_FILE
    if not hash_file.exists():
        raise FileNotFoundError(f"{adapter_dir}: no {ADAPTER_HASH_FILE}; not a frozen adapter")
    expected = hash_file.read_text().strip()
    actual = directory_sha256(adapter_dir)
    if actual != expected:
        raise ValueError(f"{adapter_dir}: adapter files changed since freezing "
                         f"(sha256 {actual} != recorded {expected}); retrain or restore them")
    return json.loads((adapter_dir / FROZEN_FILE).read_text())


def load_frozen_adapter(base: torch.nn.Module, adapter_dir: Path, merge: bool = False) -> torch.nn.Module:
    """Attach a verified frozen adapter to ``base`` (optionally merged into the weights)."""
    from peft import PeftModel

    read_frozen(adapter_dir)
    model = PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()
    return model.merge_and_unload() if merge else model


# ---------------------------------------------------------------- the tool target's adapter

TOOL_TARGET = "smollm2-135m-tool"
TOOL_ADAPTER_HOW = ("train it first: run notebooks/02_sidecar.ipynb (`make notebooks`), "
                    "or `python -m ooospec.training.tool_lora --preset full` (budget: `--preset budget`)")


def tool_adapter_committed_dir() -> Path:
    return artifacts_dir() / "committed" / "adapters" / TOOL_TARGET / "adapter"


def tool_adapter_pointer(profile: str) -> Path:
    """A file naming the adapter the last tool-LoRA training of ``profile`` produced."""
    return artifact_path("tool_lora", f"latest-{profile}.json")


def tool_adapter_path(profile: str | Profile = "cpu") -> Path:
    """The frozen tool-calling adapter of the SmolLM2 target: the latest trained here, else the committed one.

    Raises `FileNotFoundError` naming the stage that makes it when neither exists; an adapter
    whose files do not match its sha256 is refused by `read_frozen`.
    """
    from ooospec.models.registry import resolve_profile

    prof = resolve_profile(profile)
    profile = prof.name
    pointer = tool_adapter_pointer(profile)
    candidates = []
    if pointer.exists():
        candidates.append(Path(json.loads(pointer.read_text())["adapter"]))
    candidates.append(tool_adapter_committed_dir())
    for path in candidates:
        if (path / ADAPTER_HASH_FILE).exists():
            record = read_frozen(path)
            if record.get("profile", profile) in prof.lineage:  # cpu-fp32 uses cpu's adapter
                return path
    raise FileNotFoundError(f"no tool-calling adapter for {TOOL_TARGET!r} (profile {profile!r}) under "
                            f"{[str(c) for c in candidates]}; {TOOL_ADAPTER_HOW}")
