"""One module per tool-call surface format; `get_surface(name)` is the only lookup.

Formats: ``qwen_fenced_json`` (Qwen2.5-Coder's observed ```json block), ``llama_json`` (our
Llama-3.1-style ``{"name", "parameters"}`` line, the SmolLM2 tool target) and ``hermes_tool_call``
(``<tool_call>`` tags as the Qwen2.5/Qwen3 chat templates render calls; the paper profile).
"""

from __future__ import annotations

from ooospec.models.surface import SurfaceFormat


def _formats() -> dict[str, type[SurfaceFormat]]:
    from ooospec.models.formats.hermes_tool_call import HermesToolCall
    from ooospec.models.formats.llama_json import LlamaJson
    from ooospec.models.formats.qwen_fenced_json import QwenFencedJson

    return {cls.name: cls for cls in (QwenFencedJson, LlamaJson, HermesToolCall)}


def surface_names() -> list[str]:
    return sorted(_formats())


def get_surface(name: str) -> SurfaceFormat:
    formats = _formats()
    if name not in formats:
        raise KeyError(f"unknown surface format {name!r}; known: {sorted(formats)}")
    return formats[name]()


__all__ = ["SurfaceFormat", "get_surface", "surface_names"]
