"""Model profiles: which model plays which role (teacher, sidecar base, targets) and where it comes from.

A profile is one YAML file under ``configs/`` (``cpu`` runs offline here, ``paper`` names the
paper's hub models). Every field is checked when the profile loads, and every error names the file
and the dotted field, because a typo in a profile otherwise surfaces minutes later as a confusing
failure deep inside a model load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ooospec.paths import configs_dir

SOURCE_KINDS = ("hub", "local", "pypi_gguf")
DTYPES = ("float32", "bfloat16", "float16")
LOGITS = ("float32",)  # what a profile may ask of a decoding model's logits (see ooospec.models.fp32_logits)
ROWS = ("invariant", "plain")  # how a decoding model's forward treats its rows (see ooospec.models.row_invariant)
FORWARDS = ("transformers", "lean")  # which forward decodes (see ooospec.models.lean_decoder)
COMPILE_MODES = ("inductor",)  # torch.compile backends a profile may ask for (see ooospec.decoding.compiled)
DEVICE_PATTERN = re.compile(r"cpu|cuda(:[0-9]+)?")
ADAPTER_KINDS = ("tool_lora",)
PROMPT_STYLES = ("chat_template_tools", "system_tools_json")


class ProfileError(ValueError):
    """A profile file that does not validate; the message names the file and the field."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from.

    ``hub``: ``repo`` (+ optional ``revision``). ``local``: ``path`` to a HF checkpoint directory
    (relative paths are relative to the repository root). ``pypi_gguf``: ``files`` inside installed
    packages (``package_dir/relative/path``, concatenated in order) pinned by ``sha256`` of the
    concatenation; ``distributions`` are the pip pins that ship them (for error messages).
    """

    kind: str
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    files: tuple[str, ...] = ()
    distributions: tuple[str, ...] = ()
    sha256: str | None = None
    upstream: str | None = None
    license: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model and the arithmetic it runs in.

    ``dtype`` is the runtime arithmetic (weights and activations); a package-shipped checkpoint is
    always dequantized to float32 once and cast at load, so switching a profile between fp32 and
    bf16 never rebuilds it. ``device`` is where the weights live (``cpu``, ``cuda``, ``cuda:N``).
    ``compile`` (None or ``inductor``) compiles the forward of a *decoding* model (a target or the
    teacher; never a LoRA training run) with `torch.compile`: see `ooospec.decoding.compiled`.
    ``logits`` (None or ``float32``): where the model decodes greedily (a target, the teacher) in a
    lower precision, its final norm and deciding logits run in fp32 (`ooospec.models.fp32_logits`).
    ``rows`` (None / ``plain`` or ``invariant``): where such a model runs eager in bf16 on the CPU, each
    row of a forward comes out as if it ran alone (`ooospec.models.row_invariant`); not with ``compile``
    (the compiled kernels are the compiler's).
    ``forward`` (None / ``transformers`` or ``lean``): which forward runs a decoding model's decode and
    verify forwards; ``lean`` is `ooospec.models.lean_decoder` (the prefill stays transformers').
    """

    name: str
    source: ModelSource
    dtype: str = "float32"
    device: str = "cpu"
    compile: str | None = None
    logits: str | None = None
    rows: str | None = None
    forward: str | None = None


@dataclass(frozen=True)
class RoleSpec:
    """One role (teacher, sidecar base, or a target) bound to a model of the profile."""

    name: str
    model: str
    surface: str | None = None
    prompt: str | None = None
    eos_tokens: tuple[str, ...] = ()
    adapter: str | None = None
    num_layers: int | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    description: str
    models: dict[str, ModelSpec]
    teacher: RoleSpec
    sidecar_base: RoleSpec
    targets: dict[str, RoleSpec]
    extends: tuple[str, ...] = ()  # the profiles this one is derived from, nearest first

    @property
    def lineage(self) -> tuple[str, ...]:
        """This profile and its ancestors: an adapter trained under any of them fits (a derived
        profile changes only arithmetic or placement, never the weights an adapter was trained on)."""
        return (self.name, *self.extends)

    def model(self, name: str) -> ModelSpec:
        """A model by its own name or by a role name (``teacher``, ``sidecar_base``, a target)."""
        if name in self.models:
            return self.models[name]
        role = self.role(name, missing_ok=True)
        if role is not None:
            return self.models[role.model]
        raise KeyError(
            f"profile {self.name!r} ({self.path}): unknown model {name!r}; known models: "
            f"{sorted(self.models)}; roles: {['teacher', 'sidecar_base', *sorted(self.targets)]}"
        )

    def role(self, name: str, missing_ok: bool = False) -> RoleSpec | None:
        if name == "teacher":
            return self.teacher
        if name == "sidecar_base":
            return self.sidecar_base
        if name in self.targets:
            return self.targets[name]
        if missing_ok:
            return None
        raise KeyError(f"profile {self.name!r} ({self.path}): unknown role {name!r}; known: {self.role_names()}")

    def target(self, name: str) -> RoleSpec:
        if name not in self.targets:
            raise KeyError(
                f"profile {self.name!r} ({self.path}): unknown target {name!r}; known targets: {sorted(self.targets)}"
            )
        return self.targets[name]

    def role_names(self) -> list[str]:
        return ["teacher", "sidecar_base", *sorted(self.targets)]


def profile_path(name_or_path: str | Path) -> Path:
    """``cpu`` -> ``configs/cpu.yaml``; an existing path is taken as is."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate
    path = configs_dir() / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in configs_dir().glob("*.yaml"))
        raise ProfileError(f"unknown profile {name_or_path!r}: no {path}; known profiles: {known}")
    return path


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ProfileError(f"{path}: profile file not found") from err
    except yaml.YAMLError as err:
        raise ProfileError(f"{path}: not valid YAML ({err})") from err


def _merge(base: Any, override: Any) -> Any:
    """``override`` laid over ``base``: mappings merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    return override


def _resolve_extends(path: Path, raw: Any, seen: tuple[Path, ...] = ()) -> tuple[Any, tuple[str, ...]]:
    """A profile may say ``extends: cpu`` and list only what differs (e.g. ``dtype: bfloat16``).
    Returns the merged raw profile and the names it extends, nearest first."""
    if not isinstance(raw, dict) or "extends" not in raw:
        return raw, ()
    parent_name = raw["extends"]
    if not isinstance(parent_name, str) or not parent_name:
        raise ProfileError(f"{path}: extends: expected a profile name, got {parent_name!r}")
    parent_path = profile_path(parent_name).resolve()
    if parent_path in seen or parent_path == path.resolve():
        raise ProfileError(f"{path}: extends: cycle through {parent_path}")
    parent, ancestors = _resolve_extends(parent_path, _read_yaml(parent_path), seen + (path.resolve(),))
    child = {k: v for k, v in raw.items() if k != "extends"}
    for model, value in (child.get("models") or {}).items():
        if not isinstance(parent.get("models"), dict) or model not in parent["models"]:
            raise ProfileError(f"{path}: models.{model}: not a model of the extended profile {parent_name!r}")
    return _merge(parent, child), (parent_name, *ancestors)


def load_profile(name_or_path: str | Path = "cpu") -> Profile:
    """Read and validate a profile; raises `ProfileError` naming the file and the bad field."""
    path = profile_path(name_or_path)
    raw, ancestors = _resolve_extends(path, _read_yaml(path))
    return replace(_Validator(path).profile(raw), extends=ancestors)


def resolve_profile(profile: "str | Path | Profile") -> Profile:
    """``profile`` itself when it is already resolved, else `load_profile` of its name or path: a
    caller that holds a `Profile` (a bench plan) passes it down instead of having the YAML re-read."""
    return profile if isinstance(profile, Profile) else load_profile(profile)


class _Validator:
    """Turns the raw YAML into dataclasses, naming ``file: field`` in every error."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, message: str) -> ProfileError:
        return ProfileError(f"{self.path}: {where}: {message}")

    def mapping(self, value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        for key in required:
            if key not in value:
                raise self.fail(where, f"missing required field {key!r}")
        unknown = sorted(set(value) - set(required) - set(optional))
        if unknown:
            raise self.fail(where, f"unknown field(s) {unknown}; allowed: {sorted(required + optional)}")
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, f"expected a non-empty string, got {value!r}")
        return value

    def choice(self, value: Any, where: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(where, f"{value!r} is not one of {list(choices)}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(where, f"expected a list of non-empty strings, got {value!r}")
        return tuple(value)

    def profile(self, raw: Any) -> Profile:
        raw = self.mapping(raw, "<top level>", ("profile", "models", "roles"), ("description",))
        name = self.string(raw["profile"], "profile")
        if not isinstance(raw["models"], dict) or not raw["models"]:
            raise self.fail("models", "expected a non-empty mapping of model name -> model")
        models = {self.string(k, "models"): self.model_spec(k, v) for k, v in raw["models"].items()}
        roles = self.mapping(raw["roles"], "roles", ("teacher", "sidecar_base", "targets"), ())
        teacher = self.role("teacher", roles["teacher"], "roles.teacher", models, target=True)
        sidecar = self.role("sidecar_base", roles["sidecar_base"], "roles.sidecar_base", models, target=False)
        if not isinstance(roles["targets"], dict) or not roles["targets"]:
            raise self.fail("roles.targets", "expected a non-empty mapping of target name -> target")
        targets = {
            k: self.role(k, v, f"roles.targets.{k}", models, target=True) for k, v in roles["targets"].items()
        }
        return Profile(name, self.path, str(raw.get("description", "")), models, teacher, sidecar, targets)

    def model_spec(self, name: str, raw: Any) -> ModelSpec:
        where = f"models.{name}"
        raw = self.mapping(raw, where, ("source",), ("dtype", "device", "compile", "logits", "rows", "forward"))
        dtype = self.choice(raw.get("dtype", "float32"), f"{where}.dtype", DTYPES)
        device = raw.get("device", "cpu")
        if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
            raise self.fail(f"{where}.device", f"{device!r} is not 'cpu', 'cuda' or 'cuda:N'")
        compile_mode = raw.get("compile")
        if compile_mode is not None:
            compile_mode = self.choice(compile_mode, f"{where}.compile", COMPILE_MODES)
        logits = raw.get("logits")
        if logits is not None:
            logits = self.choice(logits, f"{where}.logits", LOGITS)
        rows, forward = raw.get("rows"), raw.get("forward")
        rows = None if rows is None else self.choice(rows, f"{where}.rows", ROWS)
        forward = None if forward is None else self.choice(forward, f"{where}.forward", FORWARDS)
        # an eager kernel choice and a compiler cannot both decide how a model sums
        for key, value, eager, other in (("rows", rows, "invariant", "rows: plain"),
                                         ("forward", forward, "lean", "forward: transformers")):
            if value == eager and compile_mode is not None:
                raise self.fail(f"{where}.{key}", f"{key}: {eager} needs the eager kernels; a compiled model "
                                f"(compile: inductor) sums as its compiler chose: say {other}")
        return ModelSpec(name, self.source(raw["source"], f"{where}.source"), dtype, device, compile_mode, logits,
                         rows, forward)

    def source(self, raw: Any, where: str) -> ModelSource:
        common = ("upstream", "license")
        if not isinstance(raw, dict):
            raise self.fail(where, f"expected a mapping, got {type(raw).__name__}")
        kind = self.choice(raw.get("kind"), f"{where}.kind", SOURCE_KINDS)
        if kind == "hub":
            raw = self.mapping(raw, where, ("kind", "repo"), ("revision", *common))
            return ModelSource(kind, repo=self.string(raw["repo"], f"{where}.repo"),
                               revision=raw.get("revision"), upstream=raw.get("upstream"), license=raw.get("license"))
        if kind == "local":
            raw = self.mapping(raw, where, ("kind", "path"), common)
            return ModelSource(kind, path=self.string(raw["path"], f"{where}.path"),
                               upstream=raw.get("upstream"), license=raw.get("license"))
        raw = self.mapping(raw, where, ("kind", "files", "sha256"), ("distributions", *common))
        files = self.strings(raw["files"], f"{where}.files")
        if not files:
            raise self.fail(f"{where}.files", "needs at least one package-relative file")
        for file in files:
            if "/" not in file or file.startswith("/") or ".." in Path(file).parts:
                raise self.fail(f"{where}.files", f"{file!r} is not 'package_dir/relative/path'")
        sha = raw["sha256"]
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise self.fail(f"{where}.sha256", f"expected 64 lowercase hex digits, got {sha!r}")
        return ModelSource(kind, files=files, sha256=sha,
                           distributions=self.strings(raw.get("distributions", []), f"{where}.distributions"),
                           upstream=raw.get("upstream"), license=raw.get("license"))

    def role(self, name: str, raw: Any, where: str, models: dict[str, ModelSpec], target: bool) -> RoleSpec:
        from ooospec.models.formats import surface_names  # late: formats import nothing from here

        if target:
            raw = self.mapping(raw, where, ("model", "surface", "prompt", "eos_tokens"),
                               ("adapter", "chat_template_kwargs"))
        else:
            raw = self.mapping(raw, where, ("model",), ("num_layers",))
        model = self.string(raw["model"], f"{where}.model")
        if model not in models:
            raise self.fail(f"{where}.model", f"{model!r} is not a model of this profile; known: {sorted(models)}")
        num_layers = raw.get("num_layers")
        if num_layers is not None and (not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1):
            raise self.fail(f"{where}.num_layers", f"expected null or a positive integer, got {num_layers!r}")
        if not target:
            return RoleSpec(name, model, num_layers=num_layers)
        surface = self.choice(raw["surface"], f"{where}.surface", tuple(surface_names()))
        prompt = self.choice(raw["prompt"], f"{where}.prompt", PROMPT_STYLES)
        eos = self.strings(raw["eos_tokens"], f"{where}.eos_tokens")
        if not eos:
            raise self.fail(f"{where}.eos_tokens", "needs at least one end-of-turn token")
        adapter = raw.get("adapter")
        if adapter is not None:
            self.choice(adapter, f"{where}.adapter", ADAPTER_KINDS)
        kwargs = raw.get("chat_template_kwargs", {}) or {}
        if not isinstance(kwargs, dict):
            raise self.fail(f"{where}.chat_template_kwargs", f"expected a mapping, got {kwargs!r}")
        return RoleSpec(name, model, surface=surface, prompt=prompt, eos_tokens=eos, adapter=adapter,
                        chat_template_kwargs=dict(kwargs))
