"""Fixtures several test files need, kept once here instead of a copy per file.

``artifacts``: a private artifacts root per test (``OOOSPEC_ARTIFACTS``), so stages, committed
copies and slices a test writes never touch the checkout's ``artifacts/``.
``tiny_teacher``: a random 2-layer Llama with a byte-level tokenizer in the Qwen teacher's surface,
standing in for the profile's teacher (no downloaded weights; seconds per run).
``tokenizer`` / ``tiny``: SmolLM2's real tokenizer and a tiny random Llama over its vocabulary (the
hint aligns on text, so the hint-bank tests need a real tokenizer; a module may define its own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from ooospec.models.loading import checkpoint_location
    from ooospec.models.registry import load_profile

    location, kwargs = checkpoint_location(load_profile("cpu").model("smollm2-135m-instruct"))
    return AutoTokenizer.from_pretrained(location, **kwargs)


@pytest.fixture(scope="module")
def tiny(tokenizer):
    from ooospec.models.tiny import tiny_causal_lm

    torch.manual_seed(0)
    return tiny_causal_lm("llama", seed=3, vocab_size=len(tokenizer), hidden=64)
