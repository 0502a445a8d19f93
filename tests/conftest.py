"""Fixtures several test files need, kept once here instead of a copy per file.

``artifacts``: a private artifacts root per test (``OOOSPEC_ARTIFACTS``), so stages, committed
copies and slices a test writes never touch the checkout's ``artifacts/``.
``tiny_teacher``: a random 2-layer Llama with a byte-level tokenizer in the Qwen teacher's surface,
standing in for the profile's teacher (no downloaded weights; seconds per run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ooospec.models.formats import get_surface
from ooospec.models.target import TargetModel
from ooospec.models.tiny import tiny_model_and_tokenizer


@pytest.fixture()
def artifacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def tiny_teacher() -> TargetModel:
    model, tokenizer = tiny_model_and_tokenizer(seed=1)
    return TargetModel("tiny-teacher", model, tokenizer, get_surface("qwen_fenced_json"),
                       [tokenizer.eos_token_id], prompt_style="system_tools_json")
