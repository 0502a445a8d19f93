"""The oracle sidecar's answers, filled in while the bench runs.

The oracle hint of the ablations is "the teacher's call rendered": on the cpu profile the teacher
*is* the Qwen target, so its call is the target's own greedy call, which the bench only knows once
AR has decoded the request. The sidecar process is started once per target, before any request,
so it cannot be handed those calls up front. `CallDirectory` is the bridge: a read-only mapping
(what `ooospec.sidecar.oracle.OraclePredictor` looks calls up in) backed by one small JSON file
per request, which the bench writes right after AR's decode of that request and before any
OoO-Spec decode of it. It pickles as its path, so it crosses into the sidecar process unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


class CallDirectory(Mapping):
    """request id -> call dict, one ``<sha1(id)>.json`` file per request under ``root``."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def _file(self, request_id: str) -> Path:
        return self.root / (hashlib.sha1(request_id.encode()).hexdigest() + ".json")

    def __getitem__(self, request_id: str) -> dict[str, Any]:
        path = self._file(request_id)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KeyError(request_id) from None
        if record.get("id") != request_id:
            raise KeyError(request_id)
        return record["call"]

    def __iter__(self) -> Iterator[str]:
        if not self.root.exists():
            return iter(())
        return iter(json.loads(p.read_text(encoding="utf-8"))["id"] for p in sorted(self.root.glob("*.json")))

    def __len__(self) -> int:
        return len(list(self.root.glob("*.json"))) if self.root.exists() else 0

    def put(self, request_id: str, call: dict[str, Any] | None) -> None:
        """Store (or, for ``None``: forget) the call of one request; atomic for the reader."""
        path = self._file(request_id)
        if call is None:
            path.unlink(missing_ok=True)
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": request_id, "call": call}, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)


def first_call(surface: Any, text: str) -> dict[str, Any] | None:
    """The first call a target's surface format parses out of its output text, as a dict."""
    try:
        calls = surface.parse(text)
    except (ValueError, KeyError, TypeError):
        return None
    return calls[0].to_dict() if calls else None
