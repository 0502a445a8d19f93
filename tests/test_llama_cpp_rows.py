"""The sidecar's wave on llama.cpp answers as on torch: the served sidecar converted to GGUF (f32)
gives torch's logits, and every wave mode gives torch's payloads and forwards on real dev requests;
a converted sidecar that picks other tokens is refused; a missing runtime falls back in one line."""

import json
import re

import pytest
import torch

from ooospec.sidecar import llama_cpp_rows
from ooospec.sidecar import gguf_export
from ooospec.sidecar.gguf_export import (AgreementCheck, ConvertedSidecarRefused, export_stage, exported_sidecar,
                                         permute_rotary)
from ooospec.sidecar.gguf_export import load_runtime
from ooospec.sidecar.predictor import SlotPredictor
from ooospec.sidecar.span_drafts import SpanDraftSettings
from ooospec.studies.wave_profile import dev_requests, served_adapter

torch.set_num_threads(1)


def plain():
    """The served sidecar with plain products, as a conversion reads it."""
    return SlotPredictor.from_frozen(served_adapter(), packed=False)


@pytest.fixture(scope="module")
def predictor():
    predictor = SlotPredictor.from_frozen(served_adapter(), packed=False)
    if next(predictor.model.parameters()).dtype != torch.float32:
        pytest.skip("the f32 conversion is compared with an fp32 torch sidecar (this CPU runs it in bf16)")
    return predictor


@pytest.fixture(scope="module")
def runtime(predictor):
    return load_runtime("llama.cpp:f32", served_adapter(), "cpu", plain)


def test_the_f32_conversion_gives_torchs_logits(runtime):
    check = export_stage(served_adapter(), "cpu", "f32").summary()["check"]
    assert check["positions"] > 50 and check["differing"] == 0 and check["within_allowance"] == 0
    assert check["max_abs_diff"] < 1e-3  # the same weights; only the order of fp32 sums differs


@pytest.mark.parametrize("mode", ["wave", "chosen_wave", "progressive_wave", "two_waves", "sequential",
                                  "wave_no_prefix_share", "span drafts"])
def test_every_wave_mode_answers_as_on_torch(predictor, runtime, mode):
    for item in dev_requests(3):
        waves = []
        for on in (None, runtime):
            predictor.runtime = on
            predictor.span_drafts = SpanDraftSettings() if mode == "span drafts" else None
            early = [] if mode == "progressive_wave" else None
            wave = predictor.predict(item.request, "wave" if mode == "span drafts" else mode,
                                     early=None if early is None else early.append)
            waves.append((wave.payload, wave.forwards, [r.done_after for r in wave.rows],
                          [(f.kind, f.rows, f.tokens) for f in wave.timeline], early and early[0].payload))
        predictor.runtime, predictor.span_drafts = None, None
        assert waves[0] == waves[1], item.request.id
        assert waves[0][0] is not None


def test_a_converted_sidecar_that_picks_other_tokens_is_refused(tmp_path, monkeypatch):
    adapter = served_adapter()  # the committed one; the stage's output goes to a scratch artifacts folder
    monkeypatch.setenv("OOOSPEC_ARTIFACTS", str(tmp_path))
    stage = export_stage(adapter, "cpu", "q8_0")
    bad = AgreementCheck("q8_0", 100, 2, 0, 3.5, 1.0)
    stage.mark_done(check=bad.__dict__)
    with pytest.raises(ConvertedSidecarRefused, match=r"sidecar\.gguf.*q8_0.*2 of 100 probe positions"):
        exported_sidecar(adapter, "cpu", "q8_0", plain)
    assert json.loads(stage.path("DONE.json").read_text())["check"]["differing"] == 2


def test_a_missing_runtime_falls_back_to_torch_in_one_line(monkeypatch, capsys):
    def missing():
        raise llama_cpp_rows.RuntimeMissing("the llama.cpp runtime needs llama-cpp-python (test)")

    monkeypatch.setattr(gguf_export, "llama_cpp", missing)
    assert load_runtime("llama.cpp:q8_0", served_adapter(), "cpu", plain) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "llama.cpp:q8_0" in said[0] and "runs on torch" in said[0]
    assert load_runtime("torch", served_adapter(), "cpu", plain) is None
    with pytest.raises(ValueError, match=re.escape("torch, or llama.cpp:<f32|bf16|q8_0>")):
        load_runtime("llama.cpp:q4", served_adapter(), "cpu", plain)


def test_the_rotary_permutation_interleaves_each_heads_halves():
    heads, dim = 2, 4  # rows per head: 4, as two halves of 2
    weight = torch.arange(heads * dim, dtype=torch.float32).unsqueeze(1)
    assert permute_rotary(weight, heads).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
