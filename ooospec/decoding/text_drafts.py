"""Text -> target tokens for drafts that are produced as text (schema scaffold, sidecar hints).

The committed output already ends in fixed tokens, and a tokenizer would often merge their last
characters with the draft's first ones (``"`` + ``name`` is one token in context, two when the
``"`` was already emitted). So the draft is tokenized *together with* a few committed tail tokens
and only accepted when that joint tokenization reproduces the tail exactly; the tokens after the
tail are the draft. When no tail length reproduces (the boundary merges), the draft text is
tokenized on its own, which is what a model that already committed the tail most likely emits.
Either way a wrong guess costs only rejected nodes, never a changed output.
"""

from __future__ import annotations

from typing import Any


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def tokens_continuing(
    tokenizer: Any, committed_ids: list[int], text: str, max_tail_tokens: int = 4
) -> list[int]:
    """Target token ids that continue ``committed_ids`` with ``text``."""
    if not text:
        return []
    for k in range(min(max_tail_tokens, len(committed_ids)), 0, -1):
        tail = list(committed_ids[-k:])
        tail_text = tokenizer.decode(tail, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in tail_text:  # a split multi-byte character does not round-trip
            continue
        joint = _encode(tokenizer, tail_text + text)
        if joint[:k] == tail and len(joint) > k:
            return joint[k:]
    return _encode(tokenizer, text)
