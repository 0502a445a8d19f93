"""Predictors that need no sidecar model: the oracle hint and deliberate faults.

The *oracle* returns a known call (the teacher's, i.e. the target's own greedy call on the cpu
profile, or the gold call) after an optional simulated wave time: the ablation's upper bound on
what a perfect sidecar could give, and a way to sweep injected latency without a model in the
loop. The *faulty* predictor crashes the process, hangs, or returns garbage, so the tests can show
that none of these changes the decoded output.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from ooospec.data.request import Request
from ooospec.sidecar.protocol import Prediction

FAULTS = ("crash", "hang", "garbage", "unknown_function", "raise")


class OraclePredictor:
    """Answers each request with a fixed call looked up by request id. With ``early_s`` (the
    progressive delivery's tests), the call is also handed over through ``early`` after that many
    seconds, and the final answer, after ``wave_s`` in all, is ``final`` where it names one."""

    def __init__(self, calls: Mapping[str, Any], wave_s: float = 0.0, early_s: float | None = None,
                 final: Mapping[str, Any] | None = None):
        self.calls, self.wave_s, self.early_s, self.final = calls, wave_s, early_s, final or {}

    def predict(self, request: Request, mode: str, early: Any = None) -> Prediction:
        call = self.calls.get(request.id)
        waited = 0.0
        if self.early_s is not None and early is not None and call is not None:
            time.sleep(self.early_s)
            waited = self.early_s
            early(Prediction(call=call, rows=0, detail={"oracle": True, "early": True}))
        if self.wave_s > waited:
            time.sleep(self.wave_s - waited)
        call = self.final.get(request.id, call)
        return Prediction(call=call, rows=0, detail={"oracle": call is not None})


class FaultyPredictor:
    """Misbehaves on purpose, after an optional delay."""

    def __init__(self, fault: str, after_s: float = 0.0):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {FAULTS}")
        self.fault, self.after_s = fault, after_s

    def predict(self, request: Request, mode: str, early: Any = None) -> Prediction:
        time.sleep(self.after_s)
        if self.fault == "crash":
            os._exit(3)  # the whole sidecar process dies mid-request
        if self.fault == "hang":
            time.sleep(3600)
        if self.fault == "raise":
            raise RuntimeError("injected predictor failure")
        if self.fault == "garbage":
            return Prediction(call='{"name": "f", "arguments": {"x": ', detail={"fault": "garbage"})
        return Prediction(call={"name": "no_such_function_anywhere", "arguments": {}}, detail={"fault": "unknown"})


class DiesWhileStarting:
    """A sidecar whose process ends before it is ready: with ``exit_code`` after writing
    ``message`` to stderr, or killed by ``signal`` (the startup fault tests)."""

    def __init__(self, exit_code: int = 7, message: str = "", signal: int | None = None):
        import sys

        if message:
            print(message, file=sys.stderr, flush=True)
        if signal is not None:
            os.kill(os.getpid(), signal)
            time.sleep(60)
        os._exit(exit_code)
