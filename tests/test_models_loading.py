"""Source resolution, sha256 pinning (with its cache) and layer truncation, on small fake files."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from ooospec.models import loading
from ooospec.models.loading import (
    ModelIntegrityError,
    ModelSourceMissing,
    load_model,
    package_gguf_files,
    sha256_of_files,
    truncate_layers,
)
from ooospec.models.registry import ModelSource, ModelSpec


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """An importable package ``fake_weights_pkg`` holding two model parts, and a private artifacts dir."""
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "artifacts"))
    package = tmp_path / "site" / "fake_weights_pkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "part01.bin").write_bytes(b"GGUF" + bytes(range(200)))
    (package / "data" / "part02.bin").write_bytes(b"tail" * 50)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = (package / "data" / "part01.bin").read_bytes() + (package / "data" / "part02.bin").read_bytes()
    spec = ModelSpec("fake", ModelSource(
        "pypi_gguf", files=("fake_weights_pkg/data/part01.bin", "fake_weights_pkg/data/part02.bin"),
        distributions=("fake-weights-pkg==1.0",), sha256=hashlib.sha256(whole).hexdigest()))
    return package, spec


def test_pinned_files_verify_and_the_hash_is_cached(fake_package):
    package, spec = fake_package
    paths = package_gguf_files(spec)
    assert [p.name for p in paths] == ["part01.bin", "part02.bin"]
    cache_file = loading.models_dir() / loading.HASH_CACHE
    assert cache_file.exists()
    assert sha256_of_files(paths) == spec.source.sha256


def test_corrupted_file_is_refused_with_expected_actual_and_fix(fake_package):
    package, spec = fake_package
    package_gguf_files(spec)  # verified and cached
    part = package / "data" / "part02.bin"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF  # same size: only the mtime tells the cache the file changed
    part.write_bytes(bytes(data))
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    actual = hashlib.sha256((package / "data" / "part01.bin").read_bytes() + bytes(data)).hexdigest()
    with pytest.raises(ModelIntegrityError) as err:
        package_gguf_files(spec)
    message = str(err.value)
    assert "part02.bin" in message
    assert spec.source.sha256 in message and actual in message
    assert "pip install --force-reinstall --no-deps fake-weights-pkg==1.0" in message


def test_missing_package_names_the_install_command(fake_package):
    _, spec = fake_package
    missing = ModelSpec("gone", ModelSource("pypi_gguf", files=("no_such_pkg_xyz/w.gguf",),
                                            distributions=("no-such-pkg==2",), sha256="0" * 64))
    with pytest.raises(ModelSourceMissing, match="pip install --no-deps no-such-pkg==2"):
        package_gguf_files(missing)


def test_unknown_model_name_lists_known_names():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        load_model("llama-70b", "cpu")


def test_local_source_and_truncation(tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path / "artifacts"))
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "ckpt")
    vocab = {f"t{i}": i for i in range(32)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), eos_token="t1")
    tok.save_pretrained(tmp_path / "ckpt")
    profile_file = tmp_path / "local.yaml"
    profile_file.write_text(f"""
profile: local
models:
  tiny: {{source: {{kind: local, path: {tmp_path / 'ckpt'}}}, dtype: float32}}
roles:
  teacher: {{model: tiny, surface: llama_json, prompt: system_tools_json, eos_tokens: [t1]}}
  sidecar_base: {{model: tiny, num_layers: 2}}
  targets:
    tiny: {{model: tiny, surface: llama_json, prompt: system_tools_json, eos_tokens: [t1]}}
""")
    full, tokenizer = load_model("tiny", str(profile_file))
    assert full.config.num_hidden_layers == 3 and tokenizer.pad_token == "t1"
    cut, _ = load_model("sidecar_base", str(profile_file))
    assert len(cut.model.layers) == 2 and cut.config.num_hidden_layers == 2
    ids = torch.tensor([[3, 4, 5]])
    assert cut(ids).logits.shape == (1, 3, 32)
    with pytest.raises(ValueError, match="has 2"):
        truncate_layers(cut, 5)


@pytest.mark.slow
def test_smollm2_gguf_dequantizes_once_and_reloads_fast(tmp_path, monkeypatch):
    """The real package-shipped GGUF: verified, dequantized into a plain checkpoint, then reused."""
    import json

    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    model, tokenizer = load_model("smollm2-135m-instruct", "cpu")
    stamp = json.loads((tmp_path / "models" / "smollm2-135m-instruct" / loading.DEQUANTIZED_STAMP).read_text())
    assert stamp["source_sha256"].startswith("b179c952") and stamp["probe_max_logit_gap"] <= 1e-4
    assert not hasattr(model.config, "quantization_config") or model.config.quantization_config is None
    monkeypatch.setattr(loading, "_dequantize", lambda *a: pytest.fail("dequantized twice"))
    again, _ = load_model("sidecar_base", "cpu", num_layers=4)
    assert len(again.model.layers) == 4
    ids = torch.tensor([tokenizer("Hello", add_special_tokens=False).input_ids])
    assert torch.equal(model.model.embed_tokens(ids), again.model.embed_tokens(ids))
