"""What the sidecar service and the predictors agree on, and nothing else.

The service (`ooospec.sidecar.service`) runs a predictor in its own process and knows it only
through this module: a `PredictorSpec` (a picklable recipe the worker builds its predictor from
after start-up), the `Predictor` protocol it then calls, and the `Prediction` it gets back. Which
predictors exist, and how their specs are written, is `ooospec.sidecar.specs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from ooospec.data.request import Request

# How a predictor answers a request's slot rows: one batched wave (the paper's design), the wave
# without the shared request prefix, one row at a time, function index first, then arguments, the
# wave whose other functions' rows stop once the function row has answered, or the whole wave with
# the chosen call handed over first (`Predictor.predict`'s ``early``).
MODES = ("wave", "wave_no_prefix_share", "sequential", "two_waves", "chosen_wave", "progressive_wave")


@dataclass
class Prediction:
    """What a predictor returns for one request: the semantic call (or None) and wave details.

    ``call`` may be raw text: the hint bank validates whatever crosses the process boundary."""

    call: dict[str, Any] | str | None
    rows: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


class Predictor(Protocol):
    def predict(self, request: Request, mode: str,
                early: Callable[[Prediction], None] | None = None) -> Prediction:
        """``request``'s prediction in ``mode``. A predictor may hand part of it over before it
        returns, through ``early`` (the progressive wave's chosen call); others ignore ``early``."""
        ...


@dataclass
class PredictorSpec:
    """A picklable recipe: ``factory(**options)`` builds the predictor inside the worker.

    ``factory`` is a module-level class or function (pickled by its name), so the heavy model
    load happens in the sidecar process, once per run, and never in the decode loop's process.
    """

    factory: Callable[..., Predictor]
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Predictor:
        return self.factory(**self.options)
