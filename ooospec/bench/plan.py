"""A bench config resolved against what exists: the profile, the targets' weights, the sidecar
adapter, the methods that can run, and the stage key that decides when finished slices are reused.

The profile is read once, by `plan_bench`, and carried by the plan (`BenchPlan.profile`): every part
of a run asks the plan, so one run sees one profile even if its YAML changes on disk meanwhile."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ooospec.bench.config import BenchConfig
from ooospec.bench.methods import MethodSpec, parse_methods
from ooospec.models.arithmetic import profile_arithmetic
from ooospec.models.registry import Profile, load_profile, resolve_profile
from ooospec.stage import code_fingerprint, config_key


# the package source a slice's records depend on: its hash is part of the stage key
BENCH_CODE = ("bench/config.py", "bench/sampling.py", "bench/plan.py", "bench/sidecars.py", "bench/records.py",
              "bench/slices.py", "bench/runner.py", "bench/methods.py", "bench/oracle_calls.py", "bench/tree_budget.py",
              "bench/placement.py", "decoding", "sidecar", "models", "data/request.py")


class TargetProvider(Protocol):
    def fingerprint(self, name: str) -> str:
        """Identity of the target's weights; raises FileNotFoundError when they are missing."""

    def load(self, name: str) -> Any:
        """A loaded `ooospec.models.target.TargetModel`."""


class ProfileTargets:
    """The profile's targets; a target whose adapter is not trained yet raises FileNotFoundError."""

    def __init__(self, profile: str | Profile):
        self.profile = resolve_profile(profile)

    def fingerprint(self, name: str) -> str:
        role = self.profile.target(name)
        source = self.profile.model(role.model).source
        pin = {"pypi_gguf": source.sha256, "hub": f"{source.repo}@{source.revision}", "local": source.path}
        parts = [str(pin.get(source.kind))]
        if role.adapter == "tool_lora":
            from ooospec.models.adapters import ADAPTER_HASH_FILE, tool_adapter_path

            parts.append((Path(tool_adapter_path(self.profile)) / ADAPTER_HASH_FILE).read_text().strip())
        return config_key({"target": name, "weights": parts}, 8)

    def load(self, name: str) -> Any:
        from ooospec.decoding.compiled import compile_target
        from ooospec.models.target import load_target

        return compile_target(load_target(name, self.profile))


def targets_sharing_teacher(profile: str | Profile, targets: list[str]) -> list[str]:
    """Targets that run the teacher's own model (on the cpu profile: the Qwen target), whose
    greedy calls are therefore exactly what the sidecar was trained to predict."""
    prof = resolve_profile(profile)
    return [t for t in targets if t in prof.targets and prof.targets[t].model == prof.teacher.model]


def find_sidecar_adapter(profile: str | Profile) -> Path | None:
    """The frozen sidecar adapter of ``profile``: the full preset's (the committed one), else the
    budget preset's; for a derived profile (``cpu-fp32``, ``cpu-compiled``: same weights, other
    arithmetic or kernels) the nearest ancestor's. Other sidecar stages (layer sweeps, experiments)
    are never picked up silently; pass ``BenchConfig.sidecar_adapter`` to bench one of them."""
    from ooospec.training.sidecar import find_finished, sidecar_config

    for name in resolve_profile(profile).lineage:
        for preset in ("full", "budget"):
            found = find_finished(sidecar_config(preset, name))
            if found is not None:
                return Path(found.adapter_dir)
    return None


@dataclass
class BenchPlan:
    """A config resolved against what exists: the sidecar that runs, the methods that can run."""

    sidecar: str  # slot | oracle | gold
    adapter: Path | None
    methods: list[MethodSpec]
    skipped_methods: dict[str, str]
    notes: list[str]
    # the run's profile, resolved once (None: a plan without one, e.g. `decode_requests` on injected targets)
    profile: Profile | None = field(default=None, repr=False, compare=False)

    def resolved_profile(self, cfg: BenchConfig) -> Profile:
        """The plan's profile; a plan made without one reads ``cfg.profile``."""
        return self.profile if self.profile is not None else load_profile(cfg.profile)

    def key_config(self, cfg: BenchConfig) -> dict[str, Any]:
        """What decides a slice's records (targets and benchmarks only pick slices)."""
        config = {k: v for k, v in asdict(cfg).items() if k not in ("targets", "benchmarks", "sidecar_adapter")}
        config.update(code=code_fingerprint(*BENCH_CODE), sidecar=self.sidecar, methods=[m.name for m in self.methods],
                      sidecar_adapter_sha256=_adapter_sha(self.adapter),
                      # what this machine runs the profile in: slices of another arithmetic never mix
                      arithmetic=profile_arithmetic(self.resolved_profile(cfg)).dtype)
        return config


def requested_dtype(profile: str | Profile, target: str) -> str | None:
    """The profile's dtype for a target (None for an injected test target it does not name)."""
    prof = resolve_profile(profile)
    return prof.model(prof.target(target).model).dtype if target in prof.targets else None


def _adapter_sha(adapter: Path | None) -> str | None:
    if adapter is None:
        return None
    from ooospec.models.adapters import ADAPTER_HASH_FILE

    return (adapter / ADAPTER_HASH_FILE).read_text().strip()


def plan_bench(cfg: BenchConfig) -> BenchPlan:
    """Read the profile (once for the whole run), resolve ``sidecar="auto"`` and drop (with the
    reason) methods whose sidecar is missing."""
    profile = load_profile(cfg.profile)
    notes: list[str] = []
    adapter = Path(cfg.sidecar_adapter) if cfg.sidecar_adapter else find_sidecar_adapter(profile)
    if adapter is not None:
        from ooospec.models.adapters import read_frozen

        read_frozen(adapter)  # refuses an adapter whose files changed since freezing
    sidecar = cfg.sidecar
    if sidecar == "auto":
        sidecar = "slot" if adapter is not None else "oracle"
        if adapter is None:
            notes.append("no trained sidecar adapter found: OoO-Spec runs with the ORACLE sidecar "
                         "(the target's own greedy call), an upper bound, not the paper's sidecar")
    methods, skipped = [], {}
    for spec in parse_methods(list(cfg.methods)):
        kind = spec.sidecar or sidecar
        if spec.uses_sidecar and kind in ("slot", "base_only") and adapter is None:
            skipped[spec.name] = (f"needs the trained sidecar adapter (none found for profile {cfg.profile!r}; "
                                  "train it with notebooks/02_sidecar.ipynb)")
            continue
        methods.append(spec)
    return BenchPlan(sidecar, adapter, methods, skipped, notes, profile)
