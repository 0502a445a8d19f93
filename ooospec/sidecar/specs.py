"""The one place that writes `PredictorSpec`s: the trained sidecar, the oracle, deliberate faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ooospec.sidecar.oracle import DiesWhileStarting, FaultyPredictor, OraclePredictor
from ooospec.sidecar.predictor import OPTIONAL_VALUES, REQUIRED_VALUES, SlotWavePredictor
from ooospec.sidecar.protocol import PredictorSpec
from ooospec.sidecar.served_runtime import SERVED_BY_RULE


def slot_sidecar(adapter_dir: Path | str, profile: str = "cpu", base_only: bool = False,
                 max_new_tokens: int = 32, required_values: bool = REQUIRED_VALUES,
                 optional_values: bool = OPTIONAL_VALUES, runtime: str = SERVED_BY_RULE) -> PredictorSpec:
    """The trained sidecar (or, for the ablation, its base without the adapter).

    ``required_values``: a slot the schema marks required is never answered null; ``optional_values``:
    nor an optional one (see `SlotPredictor`); ``required_values`` off, the sidecar's raw answers
    (the ``nullable`` ablation: optional slots may then be null too). ``runtime``: the one the serving
    rule picked for this CPU kind (`ooospec.sidecar.served_runtime`), ``torch`` (its control) or
    ``llama.cpp:<weights>``."""
    options = {"adapter_dir": str(adapter_dir), "profile": profile, "base_only": base_only,
               "max_new_tokens": max_new_tokens, "required_values": required_values,
               "optional_values": optional_values and required_values}
    if runtime != SERVED_BY_RULE:  # the served sidecar's options stay as they were (run keys hash them)
        options["runtime"] = runtime
    return PredictorSpec(SlotWavePredictor, options)


def oracle_sidecar(calls: Mapping[str, dict[str, Any]], wave_s: float = 0.0, early_s: float | None = None,
                   final: Mapping[str, Any] | None = None) -> PredictorSpec:
    """A sidecar that answers with known calls (the upper bound; latency sweeps); ``early_s``: it
    hands its call over first after that many seconds, then ``final`` (default: the same call)."""
    options: dict[str, Any] = {"calls": calls, "wave_s": wave_s}
    if early_s is not None:  # the options of the plain oracle stay as they were (run keys hash them)
        options.update(early_s=early_s, final=dict(final or {}))
    return PredictorSpec(OraclePredictor, options)


def faulty_sidecar(fault: str, after_s: float = 0.0) -> PredictorSpec:
    """A sidecar that crashes, hangs, raises or returns garbage (the fault tests)."""
    return PredictorSpec(FaultyPredictor, {"fault": fault, "after_s": after_s})


def dying_sidecar(exit_code: int = 7, message: str = "", signal: int | None = None) -> PredictorSpec:
    """A sidecar whose process dies before it says ready (the startup fault tests)."""
    return PredictorSpec(DiesWhileStarting, {"exit_code": exit_code, "message": message, "signal": signal})
