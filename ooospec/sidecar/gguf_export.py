"""The served sidecar converted for llama.cpp: a stage that writes it as one GGUF file, with provenance.

The sidecar the bench serves is a base model from a package-shipped GGUF, dequantized, cut to the
adapter's layers, with its LoRA adapter merged (`SlotPredictor.from_frozen`). llama.cpp reads
GGUF, so this stage writes those merged weights back: the source GGUF's metadata (architecture
settings and tokenizer) copied, the block count set to the kept layers, and every tensor from the
merged torch model under llama.cpp's names, the query and key projections permuted back to the
interleaved rotary layout llama.cpp's Llama expects (transformers undoes that permutation when it
reads a GGUF). Weights are written as ``f32`` (the merged weights exactly), ``bf16`` or ``q8_0``
(8-bit blocks of 32 with one scale each), quantized here by the ``gguf`` package.

A converted sidecar must answer as the torch one does: `check_agreement` reads probe rows (API-
disjoint dev requests, each row's question followed by the torch sidecar's own greedy answer) in
both runtimes, and the stage refuses the file, naming it, if llama.cpp's next token differs from
torch's at any position where torch's top-2 logits are further apart than the weights' allowance
(`ALLOWANCE`). The file and its check stay under ``artifacts/sidecar-gguf/<key>/``; no weights are
committed. `load_runtime` loads it for the wave (`ooospec.sidecar.llama_cpp_rows`), converting on
first use; the caller hands over how to load the torch sidecar the conversion reads (``plain``), so
this module needs nothing of the predictor's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ooospec.paths import shown
from ooospec.sidecar.llama_cpp_rows import KV_TYPES, LlamaCppSidecar, RuntimeMissing, llama_cpp
from ooospec.sidecar.slots import encode, online_questions
from ooospec.stage import Stage, code_fingerprint

# the adapter's torch sidecar with plain products (`SlotPredictor.from_frozen(..., packed=False)`):
# what a conversion writes and is checked against
PlainSidecar = Callable[[], Any]

STAGE_NAME = "sidecar-gguf"
WEIGHTS = ("f32", "bf16", "q8_0")
# The top-2 gap (in logits) under which the two runtimes may pick different next tokens: fp32
# products summed in another order (f32), or the rounding of bf16 weights or 8-bit blocks. f32 takes
# fp32's near-tie gap; the others bf16's (four ulps of a logit in [32, 64), `ooospec.models.arithmetic`).
ALLOWANCE = {"f32": 1e-3, "bf16": 1.0, "q8_0": 1.0}
PROBE_REQUESTS = 4
# transformers' Llama module names -> llama.cpp's tensor names, per decoder layer
LAYER_TENSORS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
# metadata the writer sets itself, or that describes the source file's own quantization
OWN_KEYS = ("GGUF.", "general.architecture", "general.file_type", "general.quantization_version",
            "llama.block_count")


class ConvertedSidecarRefused(ValueError):
    """A converted sidecar whose next tokens differ from the torch sidecar's beyond the allowance."""


@dataclass(frozen=True)
class AgreementCheck:
    """Probe positions read by both runtimes: how many, how many outside the allowance differ."""

    weights: str
    positions: int
    differing: int  # argmax differs where torch's top-2 gap exceeds the allowance
    within_allowance: int  # argmax differs at a gap inside the allowance (allowed)
    max_abs_diff: float  # largest logit difference at any probe position
    allowance: float

    @property
    def passed(self) -> bool:
        return self.differing == 0


def permute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' half-split rotary layout of a q/k projection -> llama.cpp's interleaved one."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The merged model's weights under llama.cpp's Llama names (tied embeddings: no output tensor)."""
    config = model.config
    if config.model_type != "llama":
        raise ValueError(f"the llama.cpp sidecar is written for Llama models; this base is {config.model_type!r}")
    if not config.tie_word_embeddings:
        raise ValueError("the llama.cpp sidecar is written for a base with tied embeddings (SmolLM2's)")
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"]}
    for layer in range(config.num_hidden_layers):
        for ours, theirs in LAYER_TENSORS.items():
            weight = state[f"model.layers.{layer}.{ours}.weight"]
            if ours == "self_attn.q_proj":
                weight = permute_rotary(weight, config.num_attention_heads)
            elif ours == "self_attn.k_proj":
                weight = permute_rotary(weight, config.num_key_value_heads)
            out[f"blk.{layer}.{theirs}.weight"] = weight
    out["output_norm.weight"] = state["model.norm.weight"]
    return out


def write_gguf(model: torch.nn.Module, source: Path, weights: str, path: Path) -> None:
    """``model`` as one GGUF file: ``source``'s metadata, ``weights``' type for every matrix
    (norms stay f32, as llama.cpp expects)."""
    import gguf
    import numpy as np

    if weights not in WEIGHTS:
        raise ValueError(f"weights {weights!r}: one of {', '.join(WEIGHTS)}")
    kind = {"f32": gguf.GGMLQuantizationType.F32, "bf16": gguf.GGMLQuantizationType.BF16,
            "q8_0": gguf.GGMLQuantizationType.Q8_0}[weights]
    reader = gguf.GGUFReader(source)
    if reader.fields["general.architecture"].contents() != "llama":
        raise ValueError(f"{source}: not a Llama GGUF")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, field in reader.fields.items():
        if key.startswith(OWN_KEYS):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    writer.add_block_count(model.config.num_hidden_layers)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "bf16": gguf.LlamaFileType.MOSTLY_BF16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[weights])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, tensor in gguf_tensors(model).items():
        array = np.ascontiguousarray(tensor.numpy(), dtype=np.float32)
        if array.ndim == 2 and kind != gguf.GGMLQuantizationType.F32:
            data = gguf.quants.quantize(array, kind)
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def source_gguf(profile: str) -> tuple[Path, str]:
    """The package-shipped GGUF of the profile's sidecar base (checked against its pin), and its sha256."""
    from ooospec.models.loading import package_gguf_files
    from ooospec.models.registry import resolve_profile

    prof = resolve_profile(profile)
    spec = prof.model("sidecar_base")
    if spec.source.kind != "pypi_gguf" or len(spec.source.files) != 1:
        raise ValueError(f"profile {profile!r}: the sidecar base {spec.name!r} is not one package-shipped GGUF file")
    return package_gguf_files(spec)[0], spec.source.sha256 or ""


def export_stage(adapter_dir: Path, profile: str, weights: str) -> Stage:
    """Keyed by the adapter, the source file, the weights' type, this code and the writer's version."""
    from importlib.metadata import version

    from ooospec.models.adapters import read_frozen

    return Stage(STAGE_NAME, {"adapter_sha256": read_frozen(adapter_dir)["sha256"], "profile": profile,
                              "source_sha256": source_gguf(profile)[1], "weights": weights,
                              "gguf": version("gguf"), "code": code_fingerprint("sidecar/gguf_export.py")})


def exported_sidecar(adapter_dir: Path, profile: str, weights: str, plain: PlainSidecar) -> Path:
    """The adapter's sidecar as a GGUF file, written (and checked) on first use."""
    stage = export_stage(adapter_dir, profile, weights)
    path = stage.path("sidecar.gguf")
    if stage.done:
        check = stage.summary()["check"]
        if not check["differing"] == 0:
            raise ConvertedSidecarRefused(refusal(path, AgreementCheck(**check)))
        return path
    predictor = plain()
    partial = path.with_suffix(".partial")
    write_gguf(predictor.model, source_gguf(profile)[0], weights, partial)
    check = check_agreement(predictor, partial, weights)
    partial.replace(path)
    stage.mark_done(check=asdict(check), adapter=str(shown(adapter_dir)), bytes=path.stat().st_size)
    if not check.passed:
        raise ConvertedSidecarRefused(refusal(path, check))
    return path


def refusal(path: Path, check: AgreementCheck) -> str:
    return (f"{shown(path)}: the converted sidecar ({check.weights}) picks another next token than the torch "
            f"sidecar at {check.differing} of {check.positions} probe positions where torch's top-2 logits are "
            f"more than {check.allowance} apart; refused")


def probe_rows(predictor: Any, requests: int = PROBE_REQUESTS) -> list[tuple[list[int], list[int]]]:
    """(prefix, question + torch's greedy answer) of every row of the first API-disjoint dev requests
    that offer tools (dev data: the check chooses nothing on evaluation data)."""
    from ooospec.data.api_disjoint import load_api_disjoint

    rows = []
    for request in [r for r in load_api_disjoint().dev if online_questions(r)][:requests]:
        prefix = predictor.prefix_ids(request)
        questions = [encode(predictor.tokenizer, q) for _, q in online_questions(request)]
        answers = predictor.generate_rows(prefix, questions)
        for question, text in zip(questions, answers.texts):
            answer = encode(predictor.tokenizer, text) if text else []
            rows.append((prefix, question + answer))
    return rows


@torch.no_grad()
def check_agreement(predictor: Any, path: Path, weights: str) -> AgreementCheck:
    """Both runtimes' next-token logits at every position of the probe rows after the prefix's last
    token (the question's and the answer's tokens, and the end after them)."""
    from ooospec.models.arithmetic import model_near_tie_gap

    runtime = LlamaCppSidecar(path, weights)
    allowance = max(ALLOWANCE[weights], model_near_tie_gap(predictor.model))  # a bf16 torch sidecar ties wider
    positions = differing = within = 0
    largest = 0.0
    for prefix, tail in probe_rows(predictor):
        ours = predictor.model(input_ids=torch.tensor([prefix + tail])).logits[0, len(prefix) - 1:]
        theirs = runtime.sequence_logits(prefix, tail)
        top = ours.topk(2, dim=-1).values
        gap = top[:, 0] - top[:, 1]
        flips = ours.argmax(-1) != theirs.argmax(-1)
        positions += len(ours)
        differing += int((flips & (gap > allowance)).sum())
        within += int((flips & (gap <= allowance)).sum())
        largest = max(largest, float((ours - theirs).abs().max()))
    return AgreementCheck(weights, positions, differing, within, round(largest, 5), allowance)


RUNTIME_PREFIX = "llama.cpp:"  # a runtime name: ``llama.cpp:<weights>``, ``torch`` otherwise


def load_runtime(name: str, adapter_dir: Path, profile: str, plain: PlainSidecar) -> LlamaCppSidecar | None:
    """The runtime ``name`` serving ``adapter_dir``'s sidecar: None for ``torch``; for
    ``llama.cpp:<weights>`` its converted sidecar (`exported_sidecar`, written from ``plain`` and
    checked on first use), or None, said in one line, where llama-cpp-python is not installed."""
    if name == "torch":
        return None
    if not name.startswith(RUNTIME_PREFIX) or name.removeprefix(RUNTIME_PREFIX) not in KV_TYPES:
        raise ValueError(f"sidecar runtime {name!r}: torch, or {RUNTIME_PREFIX}<{'|'.join(KV_TYPES)}>")
    weights = name.removeprefix(RUNTIME_PREFIX)
    try:
        llama_cpp()
    except RuntimeMissing as err:
        print(f"sidecar runtime {name}: {err}; the wave runs on torch")
        return None
    return LlamaCppSidecar(exported_sidecar(adapter_dir, profile, weights, plain), weights)
