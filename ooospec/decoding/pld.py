"""Prompt lookup decoding (PLD): copy what followed an earlier occurrence of the current tail.

The model-free baseline: the last n committed tokens (n from ``max_ngram`` down to ``min_ngram``)
are searched in the prompt and the committed output; the tokens that followed a match become a
draft. Tool calls copy a lot from their prompt (parameter names from the tool schema, values from
the user turn), which is why PLD is a fair baseline and a useful fallback inside ToolSpec.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource

SEPARATOR = -1  # between documents in one haystack; never a token id


def ngram_continuations(
    haystack: np.ndarray,
    tail: np.ndarray,
    length: int,
    limit: int,
    search_end: int | None = None,
) -> list[list[int]]:
    """Up to ``limit`` distinct continuations (``length`` tokens at most) of the places where
    ``tail`` occurs in ``haystack[:search_end]``, latest occurrence first; a continuation that is a
    prefix of one already taken is skipped. Negative ids separate documents: a continuation stops
    before one."""
    n = len(tail)
    end = len(haystack) if search_end is None else search_end
    if n == 0 or end - n < 1:
        return []
    windows = sliding_window_view(haystack[:end], n)
    # a match must leave at least one token after it inside the haystack
    hits = np.flatnonzero((windows[: end - n] == tail).all(axis=1))
    found: list[list[int]] = []
    for start in hits[::-1]:
        cont = haystack[start + n : start + n + length].tolist()
        if SEPARATOR in cont:
            cont = cont[: cont.index(SEPARATOR)]
        if not cont or any(prev[: len(cont)] == cont for prev in found):
            continue
        found.append(cont)
        if len(found) >= limit:
            break
    return found


class PromptLookup(DraftSource):
    """Drafts from n-gram matches in prompt + committed output."""

    name = "pld"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, draft_len: int = 10, max_drafts: int = 2):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.draft_len = draft_len
        self.max_drafts = max_drafts
        self._ids = np.zeros(0, dtype=np.int64)
        self._len = 0

    def begin(self, ctx: DecodeContext) -> None:
        self._ids = np.zeros(len(ctx.prompt_ids) + 1024, dtype=np.int64)
        self._ids[: len(ctx.prompt_ids)] = ctx.prompt_ids
        self._len = len(ctx.prompt_ids)

    def observe(self, state: DecodeState, accepted: list[int]) -> None:
        need = self._len + len(accepted)
        if need > len(self._ids):
            self._ids = np.concatenate([self._ids, np.zeros(max(need, 2 * len(self._ids)), dtype=np.int64)])
        self._ids[self._len : need] = accepted
        self._len = need

    def propose(self, state: DecodeState) -> list[Draft]:
        ids = self._ids[: self._len]
        drafts: list[Draft] = []
        for n in range(min(self.max_ngram, self._len - 1), self.min_ngram - 1, -1):
            conts = ngram_continuations(ids, ids[-n:], self.draft_len, self.max_drafts - len(drafts))
            for cont in conts:
                if not any(d.tokens[: len(cont)] == cont for d in drafts):
                    drafts.append(Draft(cont, "pld"))
            if len(drafts) >= self.max_drafts:
                break
        return drafts
