"""A prompt against the model's context: refused when it leaves no room, its budget capped when it
leaves less than asked.

A model has a fixed number of positions (``max_position_embeddings``). A prompt that fills them
cannot be answered at all, and decoding it anyway runs minutes of forwards at positions the model
never saw; a prompt that leaves some room but less than ``max_new_tokens`` is decoded with the
budget cut to that room. Every decode (all methods, the teacher) goes through `fit_budget` before
its prefill, so no method ever decodes past the context; a model whose config names no context
is not checked.
"""

from __future__ import annotations

from typing import Any

PROMPT_TOO_LONG = "prompt_too_long"  # the reason's first word, as trace records and verdicts write it


class PromptTooLong(ValueError):
    """A prompt that leaves no position of the model's context for a single new token."""

    def __init__(self, request_id: str, prompt_tokens: int, max_new_tokens: int, context: int):
        self.request_id, self.prompt_tokens = request_id, prompt_tokens
        self.max_new_tokens, self.context = max_new_tokens, context
        super().__init__(f"request {request_id}: prompt of {prompt_tokens} tokens does not fit the model's context "
                         f"of {context} positions (max_new_tokens {max_new_tokens}); refused before any prefill")

    @property
    def reason(self) -> str:
        """The one-line reason a record keeps (``prompt_too_long: 12000 + 160 > 8192``)."""
        return f"{PROMPT_TOO_LONG}: {self.prompt_tokens} + {self.max_new_tokens} > {self.context}"


def model_context(model: Any) -> int | None:
    """The model's number of positions (its text config's ``max_position_embeddings``), or None
    where the config names none (then nothing is checked)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    context = getattr(text, "max_position_embeddings", None)
    return int(context) if isinstance(context, int) and context > 0 else None


def fit_budget(prompt_tokens: int, max_new_tokens: int, context: int | None, request_id: str = "?") -> int:
    """The new-token budget ``prompt_tokens`` leaves in ``context``: ``max_new_tokens`` when it fits,
    the room that is left when that is less, and `PromptTooLong` when no room is left.

    Room counts the prompt's positions plus one per new token; the last new token is never fed
    back, so every position a decode uses stays below ``context``.
    """
    if context is None:
        return max_new_tokens
    room = context - prompt_tokens
    if room < 1:
        raise PromptTooLong(request_id, prompt_tokens, max_new_tokens, context)
    return min(max_new_tokens, room)


def positions_left(context: int | None, root_position: int) -> int | None:
    """Tree depth that fits after the root at ``root_position``: a node at depth d is fed at
    ``root_position + d``, which must stay below ``context`` (None: no limit)."""
    return None if context is None else context - 1 - root_position


__all__ = ["PROMPT_TOO_LONG", "PromptTooLong", "fit_budget", "model_context", "positions_left"]
