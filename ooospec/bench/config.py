"""What a bench run is asked to do: targets, benchmarks, methods, sizes, cores (`BenchConfig`).

`ooospec.bench.runner` says how a run is laid out; `ooospec.bench.plan` resolves a config against
what exists on this machine (adapters, weights)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from ooospec.bench.methods import ablation_methods, parse_methods
from ooospec.paths import REPO_ROOT


DEFAULT_TARGETS = ("qwen2.5-coder-0.5b", "smollm2-135m-tool")


BENCHMARKS = ("apibank", "toolalpaca", "bfcl")


# requests a setting may be tuned on (the tree budget): the dev split of the training pool, never
# an evaluation file
TUNING_SPLITS = ("dev",)


# both claims by default: elastic OoO-Spec beside ToolSpec on both cores, the paper's placement beside ToolSpec on one
DEFAULT_METHODS = ("ar", "pld", "toolspec", "ooospec", "ooospec:static", "toolspec:both_cores")


SIDECAR_CHOICES = ("auto", "slot", "oracle", "gold")


# the only benchmark none of whose APIs the sidecar saw in training (see the data card)
HELD_OUT_BENCHMARKS = ("bfcl",)


TREE_BUDGET_CHOICES = ("machine", "fixed")


@dataclass
class BenchConfig:
    """Everything a bench run depends on; see the module docstring for the semantics."""

    profile: str = "cpu"
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    benchmarks: list[str] = field(default_factory=lambda: list(BENCHMARKS))
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    requests: int | None = 8  # per benchmark; None = the whole evaluation file
    seed: int = 0
    warmup: int = 2  # untimed warm-up requests per target (each through every method)
    max_new_tokens: int = 160
    sidecar: str = "auto"  # auto: the trained sidecar if an adapter exists, else the oracle
    sidecar_adapter: str | None = None  # explicit adapter dir; None: the sidecar stage's
    oracle_wave_s: float = 0.0  # simulated wave time of the oracle / gold sidecars
    threads: int = 1
    sidecar_threads: int = 1
    # which runtime runs the trained sidecar's wave: "served", the one the serving rule picked for this
    # CPU kind (`ooospec.sidecar.served_runtime`); "torch", its control; or "llama.cpp:<weights>"
    sidecar_runtime: str = "served"
    pin_cores: bool = True
    track_margins: bool = True
    # "machine": each target's node budget chosen at the start of its run from this machine's verify
    # cost and the committed dev acceptance (`ooospec.bench.tree_budget`); "fixed": the fixed default
    tree_budget: str = "machine"

    def __post_init__(self) -> None:
        if self.tree_budget not in TREE_BUDGET_CHOICES:
            raise ValueError(f"BenchConfig.tree_budget must be one of {TREE_BUDGET_CHOICES}, got {self.tree_budget!r}")
        if self.sidecar not in SIDECAR_CHOICES:
            raise ValueError(f"BenchConfig.sidecar must be one of {SIDECAR_CHOICES}, got {self.sidecar!r}")
        if self.sidecar_runtime not in ("served", "torch") and not self.sidecar_runtime.startswith("llama.cpp:"):
            raise ValueError(f"BenchConfig.sidecar_runtime must be served, torch or llama.cpp:<weights>, "
                             f"got {self.sidecar_runtime!r}")
        for name in self.benchmarks:
            if name not in BENCHMARKS + TUNING_SPLITS:
                raise ValueError(f"BenchConfig.benchmarks: unknown benchmark {name!r}; one of {BENCHMARKS} "
                                 f"(or {TUNING_SPLITS} to tune on)")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"BenchConfig.requests must be >= 1 or None, got {self.requests}")
        if self.max_new_tokens < 1:
            raise ValueError(f"BenchConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        parse_methods(list(self.methods))  # fail early on a misspelt method


# ---------------------------------------------------------------- configs from the notebooks


def notebook_parameters(notebook: str) -> dict[str, Any]:
    """The defaults of a notebook's ``parameters`` cell (literal assignments only)."""
    import nbformat

    path = REPO_ROOT / "notebooks" / f"{notebook}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    params = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            params[node.targets[0].id] = ast.literal_eval(node.value)
    return params


def notebook_config(notebook: str, overrides: dict[str, Any] | None = None, strict: bool = False) -> BenchConfig:
    """The `BenchConfig` the notebook builds from its parameters with ``overrides`` (as papermill's
    ``-p``/``-y``; keys the notebook lacks are ignored, as papermill's injection leaves them unused,
    unless ``strict``: a chapter reading another chapter's run refuses a misspelt override)."""
    params = notebook_parameters(notebook)
    unknown = sorted(set(overrides or {}) - set(params))
    if strict and unknown:
        raise ValueError(f"{notebook}: no parameter(s) {', '.join(map(repr, unknown))}; it has {', '.join(sorted(params))}")
    params.update({k: v for k, v in (overrides or {}).items() if k in params})
    if "methods" not in params:  # the ablations chapter
        params["methods"] = ablation_methods(params["ablations"], params["delays"])
    names = ("profile", "targets", "benchmarks", "methods", "requests", "seed", "warmup", "max_new_tokens",
             "sidecar", "threads")
    optional = ("sidecar_runtime",)  # parameters of the results chapter only; elsewhere the default
    return BenchConfig(**{k: params[k] for k in names}, **{k: params[k] for k in optional if k in params})
