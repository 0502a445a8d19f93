"""A target model as the decoding engine sees it: weights, tokenizer, surface format, prompt, EOS.

Everything target-specific is bundled here so that the engine, the teacher and the bench stay
target-agnostic: a new target family is a profile entry plus (at most) a surface format module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ooospec.data.request import Request
from ooospec.models.formats import get_surface
from ooospec.models.fp32_logits import use_fp32_logits
from ooospec.models.lean_decoder import use_lean_decoder
from ooospec.models.row_invariant import use_row_invariance
from ooospec.models.loading import load_model
from ooospec.models.prompts import prompt_ids, prompt_text
from ooospec.models.registry import Profile, RoleSpec, resolve_profile
from ooospec.models.surface import SurfaceFormat

TOOL_ADAPTER_STAGE = "make sidecar"


class AdapterMissing(FileNotFoundError):
    """A target whose LoRA adapter has not been trained yet."""


@dataclass
class CompileReport:
    """What compiling a decoding model did (`ooospec.decoding.compiled`), for the provenance of a run."""

    mode: str | None  # "inductor", or None for the eager model
    seconds: float  # compile + warm-up time, outside every timed region
    fallback: str | None = None  # why the eager model runs instead (None when compiled as asked)
    graphs: int = 0  # graphs compiled in this process once warm: later ones were compiled inside a decode


@dataclass
class TargetModel:
    name: str
    model: Any
    tokenizer: Any
    surface: SurfaceFormat
    eos_token_ids: list[int]
    prompt_style: str = "chat_template_tools"
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    compile_mode: str | None = None  # the profile's wish (``compile: inductor``); the decoding layer acts on it
    compiled: CompileReport = field(default_factory=lambda: CompileReport(None, 0.0))  # what it did (eager until then)

    def surface_for(self, request: Request) -> SurfaceFormat:
        """The frozen rendering this target uses for ``request`` (see `SurfaceFormat.for_request`)."""
        return self.surface.for_request(request)

    def prompt_text(self, request: Request) -> str:
        return prompt_text(self.tokenizer, request, self.prompt_style, self.chat_template_kwargs)

    def prompt_ids(self, request: Request) -> list[int]:
        return prompt_ids(self.tokenizer, request, self.prompt_style, self.chat_template_kwargs)


def eos_token_ids(tokenizer: Any, role: RoleSpec, profile: Profile) -> list[int]:
    """The profile's end-of-turn tokens as ids; an unknown token is a profile error."""
    ids: list[int] = []
    vocab = tokenizer.get_vocab()
    for token in role.eos_tokens:
        if token not in vocab:
            raise ValueError(f"{profile.path}: roles {role.name}.eos_tokens: {token!r} is not in the tokenizer's vocabulary")
        ids.append(vocab[token])
    return ids


def tool_adapter_dir(profile: Profile) -> Path:
    """The trained tool-calling LoRA of the SmolLM2 target (produced by the sidecar stage)."""
    try:
        from ooospec.models.adapters import tool_adapter_path
    except ImportError as err:
        raise AdapterMissing(
            f"the tool-calling LoRA must be trained first ({TOOL_ADAPTER_STAGE}); "
            f"ooospec.models.adapters.tool_adapter_path is not available ({err})"
        ) from err
    return Path(tool_adapter_path(profile))


def merge_adapter(model: Any, adapter_dir: Path) -> Any:
    """Merge a frozen adapter into the weights, refusing one whose files fail their sha256."""
    from ooospec.models.adapters import load_frozen_adapter

    return load_frozen_adapter(model, adapter_dir, merge=True).eval()


def load_target(name: str, profile: str | Profile = "cpu") -> TargetModel:
    """A target of the profile, its adapter (if any) merged into the weights; eager. A decoding run
    compiles it as the profile asks at its entry point (`ooospec.decoding.compiled.compile_target`)."""
    prof = resolve_profile(profile)
    prof.target(name)  # unknown target -> error listing the known ones
    return load_role(name, prof)


def load_role(name: str, profile: str | Profile = "cpu") -> TargetModel:
    """A target or the teacher role as a `TargetModel` (both answer requests in a surface format)."""
    prof = resolve_profile(profile)
    role = prof.role(name)
    if role.surface is None:
        raise ValueError(f"{prof.path}: role {name!r} has no surface format: it does not answer requests")
    adapter_dir = tool_adapter_dir(prof) if role.adapter == "tool_lora" else None
    model, tokenizer = load_model(role.model, prof)
    if adapter_dir is not None:
        model = merge_adapter(model, adapter_dir)
    if prof.model(role.model).logits == "float32":
        use_fp32_logits(model, where=f"{prof.path}: models.{role.model}")
    if prof.model(role.model).rows == "invariant":
        use_row_invariance(model)  # after the fp32 head, whose products it sets too
    if prof.model(role.model).forward == "lean":
        use_lean_decoder(model, where=f"{prof.path}: models.{role.model}")  # last: its head screens with its product
    return _role_target(name, prof, role, model, tokenizer)


def load_role_frame(name: str, profile: str | Profile = "cpu") -> TargetModel:
    """A target or role without weights (``model`` is None): tokenizer, surface, prompt and EOS,
    all that replaying its known outputs needs (`ooospec.studies.hint_replay`)."""
    prof = resolve_profile(profile)
    return _role_target(name, prof, prof.role(name), None, load_tokenizer(name, prof))


def _role_target(name: str, prof: Profile, role: RoleSpec, model: Any, tokenizer: Any) -> TargetModel:
    return TargetModel(
        name=name,
        model=model,
        tokenizer=tokenizer,
        surface=get_surface(role.surface or ""),
        eos_token_ids=eos_token_ids(tokenizer, role, prof),
        prompt_style=role.prompt or "chat_template_tools",
        chat_template_kwargs=dict(role.chat_template_kwargs),
        compile_mode=prof.model(role.model).compile,
    )


def load_tokenizer(name: str, profile: str | Profile = "cpu") -> Any:
    """Only the tokenizer of a target or role (for reading records without loading weights)."""
    from transformers import AutoTokenizer

    from ooospec.models.loading import checkpoint_location

    prof = resolve_profile(profile)
    role = prof.role(name, missing_ok=True)
    location, kwargs = checkpoint_location(prof.model(role.model if role is not None else name))
    return AutoTokenizer.from_pretrained(location, **kwargs)
