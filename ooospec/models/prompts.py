"""How a request's dialogue and tools become a target's prompt (one function per prompt style).

``chat_template_tools``: the model's own chat template with ``tools=`` (Qwen, Llama-3.1), so the
target sees tools exactly as it was trained to. ``system_tools_json``: our own system prompt that
lists the tools as compact JSON, for models whose template ignores ``tools=`` (SmolLM2); the tool
LoRA is trained on this prompt, so training and decoding must both come through here.
"""

from __future__ import annotations

import json
from typing import Any

from ooospec.data.request import Request

TOOLS_SYSTEM_PROMPT = (
    "You are a function-calling assistant. You can call these functions (JSON schemas):\n"
    "{tools}\n"
    'Reply with exactly one function call as JSON: {{"name": <function name>, "parameters": '
    "{{<argument name>: <value>, ...}}}}."
)


def openai_tools(request: Request) -> list[dict[str, Any]]:
    """Tools in the ``{"type": "function", "function": {...}}`` form chat templates expect."""
    return [{"type": "function", "function": tool} for tool in request.tools]


def tools_system_prompt(request: Request) -> str:
    listing = "\n".join(json.dumps(tool, ensure_ascii=False, separators=(",", ":")) for tool in request.tools)
    return TOOLS_SYSTEM_PROMPT.format(tools=listing)


def json_call_history(message: dict[str, Any]) -> dict[str, Any]:
    """A structured history turn in our JSON form, for templates that know no tool roles: an
    assistant ``tool_calls`` turn becomes the calls written as the target is asked to write them
    (``{"name": ..., "parameters": {...}}``, one per line), a ``tool`` turn keeps its role."""
    if message.get("role") != "assistant" or not message.get("tool_calls"):
        return {"role": message["role"], "content": str(message.get("content") or "")}
    calls = []
    for tool_call in message["tool_calls"]:
        function = tool_call.get("function", tool_call)
        calls.append(json.dumps({"name": function["name"], "parameters": function.get("arguments") or {}},
                                ensure_ascii=False))
    text = str(message.get("content") or "").strip()
    return {"role": "assistant", "content": "\n".join(([text] if text else []) + calls)}


def _messages_with_tool_system(request: Request) -> list[dict[str, Any]]:
    """Our tool system prompt first; an original system message is appended to it, not dropped."""
    system = tools_system_prompt(request)
    rest = list(request.messages)
    if rest and rest[0].get("role") == "system":
        system = system + "\n\n" + str(rest[0].get("content", ""))
        rest = rest[1:]
    return [{"role": "system", "content": system}, *(json_call_history(m) for m in rest)]


def prompt_text(tokenizer: Any, request: Request, style: str, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt string up to and including the assistant header (generation prompt).

    An empty dialogue (no messages, or no user message with text) is refused for every style,
    naming the request: Qwen's template refuses it on its own, but our SmolLM2 prompt would
    accept a bare system prompt and the model would invent a call for a question nobody asked.
    """
    if not any(isinstance(m, dict) and m.get("role") == "user" and str(m.get("content") or "").strip()
               for m in request.messages or []):
        raise ValueError(f"request {request.id}: empty dialogue ({len(request.messages or [])} messages, "
                         f"no user message with text); refused for prompt style {style!r}")
    kwargs = dict(chat_template_kwargs or {})
    try:
        if style == "chat_template_tools":
            return tokenizer.apply_chat_template(
                request.messages, tools=openai_tools(request), add_generation_prompt=True, tokenize=False, **kwargs
            )
        if style == "system_tools_json":
            return tokenizer.apply_chat_template(
                _messages_with_tool_system(request), add_generation_prompt=True, tokenize=False, **kwargs
            )
    except Exception as err:  # a template error is a data problem: name the request
        raise ValueError(f"request {request.id}: chat template failed for prompt style {style!r}: {err}") from err
    raise ValueError(f"unknown prompt style {style!r}; known: chat_template_tools, system_tools_json")


def prompt_ids(tokenizer: Any, request: Request, style: str, chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `prompt_text`; the template already holds every special token."""
    text = prompt_text(tokenizer, request, style, chat_template_kwargs)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
