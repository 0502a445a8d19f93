"""Which arithmetic ran, on which machine: what every speed figure and near-tie depends on.

A profile's dtype is a wish; the machine decides (`ooospec.models.loading.runtime_placement`):
bf16 runs only where the CPU has native bf16 kernels (avx512_bf16 or AMX), else fp32. Machines of
the same kind differ here (an AVX2-only EPYC and an avx512_bf16 Xeon both appear as "2 cores"), and
on them a 17-row tree forward costs 3.8 or 1.3 one-row steps, so every ratio in the book is a
statement about one arithmetic on one CPU. `Arithmetic` records what ran, once per run, and
`Arithmetic.sentence` is how pages name it ("fp32 on a 2-core AVX2 CPU (AMD EPYC)").

The near-tie rule follows the arithmetic that ran (`near_tie_gap`): a speculative decode may
differ from AR only where AR's own top-2 logit gap is within that arithmetic's rounding, at the
position `first_difference` finds.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from ooospec.models.registry import Profile

# the largest top-2 logit gap that the arithmetic can flip between a tree forward and a one-row
# step: fp32 reorders sums (~1e-3 at most, measured). bf16 keeps 7 explicit mantissa bits (an ulp is
# 0.25 for a logit in [32, 64)), and each of the two logits may land up to two ulps away in the other
# computation, in opposite directions, so their gap moves by up to four ulps, 1.0. Measured (SmolLM2
# target, Xeon with amx_bf16, apibank-l1-QueryHistoryToday-Calculator-level-2-2-0, token 16): the
# one-row step gives 34.5 / 33.75 (gap 0.75), one forward over the same tokens 34.25 / 34.0 on one
# thread (the order flips) and 34.25 / 34.25 on two
NEAR_TIE_GAPS = {"float32": 1e-3, "bfloat16": 1.0, "float16": 0.05}
# the same with the logits in fp32 over a bf16 body (`ooospec.models.fp32_logits`): the head's rounding
# is gone, what is left is the body's (the residual stream already differs between a tree forward and
# a step). Measured (`ooospec.studies.logit_ties`, AMD EPYC without bf16 instructions, torch's bf16
# products, 1,986 positions of 60 dev requests read in one-row steps and in 9-row forwards): AR's
# top-2 gap moved by at most 0.26 (Qwen) and 0.35 (SmolLM2); the 6 flips left sat at gaps <= 0.083.
# On a CPU with avx512_bf16 (AMD EPYC, Zen 4; oneDNN's bf16 products; 2,043 positions of the same
# requests) it moved by at most 0.21 (Qwen) and 0.51 (SmolLM2), and the 10 flips left sat at gaps
# <= 0.068; re-derived there with torch's kernels (2,033 positions), at most 0.36 and 0.45, the 9
# flips left at gaps <= 0.15. The rule takes 0.75, half again the largest shift measured on either kind. Where the body
# is row-invariant too (`ooospec.models.row_invariant`, the cpu profile on a bf16 CPU), a tree forward
# and AR's step compute the same bits, so no decode should need the rule at all; it stays as the
# bound for a body that is not (tests/test_decoding_lossless.py allows no difference there)
FP32_LOGITS_GAPS = {"bfloat16": 0.75, "float16": 0.05}
SHORT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # a CPU's own bf16 instructions, in /proc/cpuinfo


def near_tie_gap(dtype: Any, logits: str | None = None) -> float:
    """The near-tie threshold of an arithmetic (a torch dtype or its name; ``logits="float32"``
    where its deciding logits are fp32, `ooospec.models.fp32_logits`)."""
    name = str(dtype).removeprefix("torch.")
    if logits == "float32" and name in FP32_LOGITS_GAPS:
        return FP32_LOGITS_GAPS[name]
    return NEAR_TIE_GAPS[name]


def model_near_tie_gap(model: Any) -> float:
    """The near-tie threshold of a loaded model, as it decodes (its dtype, its head)."""
    from ooospec.models.fp32_logits import uses_fp32_logits

    return near_tie_gap(next(model.parameters()).dtype, "float32" if uses_fp32_logits(model) else None)


def short_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return SHORT_NAMES.get(name, name)


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first position where two sequences differ (a length mismatch counts); None
    when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_bf16_flag() -> str:
    """The CPU's own bf16 instruction flag (``amx_bf16`` or ``avx512_bf16``, from ``/proc/cpuinfo``),
    or ``none``. oneDNN reports bf16 support on an AVX512 CPU without either (its avx512_core kernels
    convert in software), so that report alone does not say the CPU computes bf16 natively."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return next((flag for flag in BF16_FLAGS if flag in flags), "none")


def cpu_capability() -> str:
    """torch's CPU kernel level (``AVX2``, ``AVX512``, ...)."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return "unknown"


def machine_kind() -> str:
    """``amx_bf16`` / ``avx512_bf16`` where the CPU has the flag, else torch's kernel level (``avx2``):
    what tells apart the CPU kinds whose measurements are committed or chosen per kind."""
    flag = cpu_bf16_flag()
    return flag if flag not in ("none", "unknown") else cpu_capability().lower()


@dataclass(frozen=True)
class Arithmetic:
    """What a run computed in and on: recorded in bench records and stage provenance."""

    dtype: str  # what ran ("float32", "bfloat16")
    requested: str  # the profile's wish
    device: str
    cpu: str
    cpu_capability: str
    bf16_kernels: bool
    cores: int
    torch: str
    kernels: str | None = None  # a kernel choice beyond torch's defaults (`packed_linear`, `row_invariant`)
    bf16_flag: str = "unrecorded"  # the CPU's bf16 instructions (`cpu_bf16_flag`); older records lack it
    logits: str | None = None  # "float32": deciding logits in fp32 over a lower-precision body

    @property
    def short(self) -> str:
        return short_name(self.dtype)

    @property
    def fell_back(self) -> bool:
        return self.dtype != self.requested

    @property
    def near_tie_gap(self) -> float:
        return near_tie_gap(self.dtype, self.logits)

    def machine(self) -> str:
        """``a 2-core AVX2 CPU (AMD EPYC)``, or the CUDA device."""
        if self.device.startswith("cuda"):
            return f"a CUDA device ({self.device})"
        note = ""
        if self.bf16_kernels and self.bf16_flag == "none":
            note = "; bf16 in oneDNN's avx512_core kernels, without bf16 instructions"
        elif not self.bf16_kernels and self.bf16_flag in BF16_FLAGS:  # `make KERNELS=avx2`, at its own speed
            note = f"; kernels capped at {self.cpu_capability} on a CPU with {self.bf16_flag}"
        return f"a {self.cores}-core {self.kernels_label()} CPU ({self.cpu}{note})"

    def kernels_label(self) -> str:
        """``avx512_bf16`` / ``amx_bf16`` where the CPU has bf16 instructions, else its capability
        (``AVX512``, ``AVX2``; `machine` then says when oneDNN still runs bf16). Records from before
        the flag was kept say ``avx512_bf16`` for any CPU that oneDNN ran bf16 on."""
        if not self.bf16_kernels:
            return self.cpu_capability
        if self.bf16_flag in BF16_FLAGS:
            return self.bf16_flag
        return self.cpu_capability if self.bf16_flag in ("none", "unknown") else "avx512_bf16"

    def sentence(self) -> str:
        """``fp32 on a 2-core AVX2 CPU (AMD EPYC; the profile asks bf16, this CPU has no bf16 kernels)``."""
        notes = ""
        if self.fell_back:
            notes = f"; the profile asks {short_name(self.requested)}, which this machine cannot run natively"
        if self.kernels:
            notes += f"; {self.kernels}"
        if self.logits and self.logits != self.dtype:
            notes += f"; logits in {short_name(self.logits)}"
        text = f"{self.short} on {self.machine()}"
        return text[:-1] + notes + ")" if notes and text.endswith(")") else text + notes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Arithmetic":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})  # older records lack ``kernels``


def arithmetic_of(spec: Any) -> Arithmetic:
    """The arithmetic a model of this `ModelSpec` runs in on this machine (no model load)."""
    from ooospec.models.loading import runtime_placement

    dtype, device = runtime_placement(spec, quiet=True)
    arithmetic = _on_this_machine(dtype, spec.dtype, device)
    if getattr(spec, "logits", None) == "float32" and dtype != "float32":  # a decoding model's head (fp32_logits)
        arithmetic = replace(arithmetic, logits="float32")
    if getattr(spec, "rows", None) == "invariant" and dtype != "float32" and device == "cpu":
        from ooospec.models.row_invariant import ROW_INVARIANT_KERNELS

        arithmetic = replace(arithmetic, kernels=ROW_INVARIANT_KERNELS)
    if getattr(spec, "forward", None) == "lean" and device == "cpu":
        arithmetic = replace(arithmetic, kernels=_with_lean(arithmetic.kernels))
    return arithmetic


def _with_lean(kernels: str | None) -> str:
    """The kernels' name when decode forwards run the lean decoder (the prefill keeps ``kernels``)."""
    from ooospec.models.lean_decoder import LEAN_KERNELS

    return f"{LEAN_KERNELS}; prefill: {kernels}" if kernels else LEAN_KERNELS


def profile_arithmetic(profile: "str | Profile", role: str = "target") -> Arithmetic:
    """The arithmetic of a profile's role on this machine: for a target, its first target's."""
    from ooospec.models.registry import resolve_profile

    prof = resolve_profile(profile)
    if role == "target":
        spec = prof.model(next(iter(prof.targets)))
    else:
        spec = prof.model(role)
    arithmetic = arithmetic_of(spec)
    return replace(arithmetic, logits=None) if role == "sidecar_base" else arithmetic  # the sidecar's head is its own


def running_arithmetic(model: Any, requested: str | None = None) -> Arithmetic:
    """The arithmetic of an already loaded model (its parameters' dtype and device) on this machine;
    ``requested`` is the profile's wish where the caller knows it."""
    from ooospec.models.fp32_logits import uses_fp32_logits
    from ooospec.models.lean_decoder import lean_decoder_of
    from ooospec.models.packed_linear import PACKED_KERNELS, uses_packed_linears
    from ooospec.models.row_invariant import ROW_INVARIANT_KERNELS, uses_row_invariance

    parameter = next(model.parameters())
    dtype = str(parameter.dtype).removeprefix("torch.")
    arithmetic = _on_this_machine(dtype, requested or dtype, str(parameter.device))
    if uses_fp32_logits(model):
        arithmetic = replace(arithmetic, logits="float32")
    if uses_row_invariance(model):
        arithmetic = replace(arithmetic, kernels=ROW_INVARIANT_KERNELS)
    elif uses_packed_linears(model):
        arithmetic = replace(arithmetic, kernels=PACKED_KERNELS)
    if lean_decoder_of(model) is not None:
        arithmetic = replace(arithmetic, kernels=_with_lean(arithmetic.kernels))
    return arithmetic


def _on_this_machine(dtype: str, requested: str, device: str) -> Arithmetic:
    """An `Arithmetic` with this machine's CPU facts filled in."""
    import torch

    from ooospec.models.loading import bf16_supported_on_cpu

    return Arithmetic(dtype=dtype, requested=requested, device=device, cpu=cpu_model(),
                      cpu_capability=cpu_capability(), bf16_kernels=bf16_supported_on_cpu(),
                      cores=os.cpu_count() or 1, torch=torch.__version__, bf16_flag=cpu_bf16_flag())


def sentences(arithmetics: Any) -> str:
    """One phrase for the arithmetic(s) of a set of records (dicts or `Arithmetic`), e.g. the
    verdict's "fp32 on a 2-core AVX2 CPU (AMD EPYC)"; several are joined with "and"."""
    found = []
    for item in arithmetics:
        if item is None:
            continue
        text = (item if isinstance(item, Arithmetic) else Arithmetic.from_dict(item)).sentence()
        if text not in found:
            found.append(text)
    return " and ".join(found) or "an unrecorded arithmetic"
