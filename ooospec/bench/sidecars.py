"""The bench's sidecar processes: one started `SidecarService` per distinct sidecar configuration
of a target, placed on its core, reused across requests and stopped at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ooospec.bench.config import BenchConfig
from ooospec.bench.methods import MethodSpec
from ooospec.bench.oracle_calls import CallDirectory
from ooospec.bench.placement import CorePlan
from ooospec.bench.plan import BenchPlan


@dataclass(frozen=True)
class SidecarKey:
    kind: str
    placement: str
    delay_s: float
    required_values: bool  # off only for the ``nullable`` ablation


def sidecar_key(spec: MethodSpec, default_kind: str) -> SidecarKey:
    """The sidecar ``spec`` decodes with (``default_kind``: the bench's); methods with equal keys share
    one started sidecar, so a slice starts as many as it has distinct keys."""
    return SidecarKey(spec.sidecar or default_kind, spec.placement, spec.delay_s, required_values=not spec.nullable)


class SidecarPool:
    """One started `SidecarService` per distinct (kind, placement, delay), for one target."""

    def __init__(self, cfg: BenchConfig, plan: BenchPlan, cores: CorePlan, oracle_calls: CallDirectory,
                 gold_calls: dict[str, dict[str, Any]]):
        self.cfg, self.plan, self.cores = cfg, plan, cores
        self.oracle_calls, self.gold_calls = oracle_calls, gold_calls
        self.services: dict[SidecarKey, Any] = {}

    def key(self, spec: MethodSpec) -> SidecarKey:
        return sidecar_key(spec, self.plan.sidecar)

    def service(self, spec: MethodSpec) -> Any:
        if not spec.uses_sidecar:
            return None
        key = self.key(spec)
        if key not in self.services:
            self.services[key] = self._start(key)
        return self.services[key]

    def _start(self, key: SidecarKey) -> Any:
        from ooospec.sidecar.service import SidecarService
        from ooospec.sidecar.specs import oracle_sidecar, slot_sidecar

        if key.kind in ("slot", "base_only"):
            spec = slot_sidecar(self.plan.adapter, self.cfg.profile, base_only=key.kind == "base_only",
                                required_values=key.required_values, runtime=self.cfg.sidecar_runtime)
        elif key.kind == "oracle":
            spec = oracle_sidecar(self.oracle_calls, wave_s=self.cfg.oracle_wave_s)
        elif key.kind == "gold":
            spec = oracle_sidecar(self.gold_calls, wave_s=self.cfg.oracle_wave_s)
        else:
            raise ValueError(f"unknown sidecar kind {key.kind!r}")
        placement = "thread" if key.placement == "in_process" else "process"
        core = self.cores.target_core if key.placement == "shared_core" else self.cores.sidecar_core
        return SidecarService(spec, placement=placement, threads=self.cfg.sidecar_threads,
                              cpu_affinity=None if core is None else [core], delay_s=key.delay_s).start()

    def close(self) -> None:
        for service in self.services.values():
            service.stop()
        self.services.clear()
