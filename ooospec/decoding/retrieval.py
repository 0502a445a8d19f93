"""Call retrieval: drafts copied from the calls this run has already produced (ToolSpec's memory).

Requests of one benchmark reuse a few APIs, so an earlier call of the same function predicts this
one's scaffold and often its values. The memory holds the target's own output ids of earlier
requests (never a gold answer, and never the current request's output, which is only added by
`end`), each preceded by the last few prompt tokens so that a tail spanning the start of the reply
(the assistant header) matches too. Each round, the committed tail is matched as an n-gram
(longest first) against the memory, and up to ``len(lengths)`` distinct continuations are taken,
of lengths ``lengths`` (ToolSpec: 32/16/8/8).

"Nearest first": ToolSpec ranks memory by the similarity of question hidden states; here entries
whose calls use a tool offered to the current request rank before the others, and more recent
before older within each group (cheap, and no extra forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.pld import SEPARATOR, ngram_continuations


@dataclass
class MemoryEntry:
    request_id: str
    ids: list[int]  # prompt tail + output ids
    tools_called: frozenset[str]


class CallRetrieval(DraftSource):
    name = "retrieval"

    def __init__(
        self,
        max_ngram: int = 8,
        min_ngram: int = 2,
        lengths: tuple[int, ...] = (32, 16, 8, 8),
        context_tokens: int = 8,
        max_entries: int = 64,
    ):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.lengths = lengths
        self.context_tokens = context_tokens
        self.max_entries = max_entries
        self.memory: list[MemoryEntry] = []
        self._haystack = np.zeros(0, dtype=np.int64)

    def begin(self, ctx: DecodeContext) -> None:
        offered = {tool["name"] for tool in ctx.request.tools}
        ranked = sorted(
            enumerate(self.memory),
            key=lambda item: (bool(item[1].tools_called & offered), item[0]),
        )  # best last: the search takes the latest occurrence first
        chunks: list[int] = []
        for _, entry in ranked:
            chunks.extend(entry.ids)
            chunks.append(SEPARATOR)
        self._haystack = np.asarray(chunks, dtype=np.int64)

    def propose(self, state: DecodeState) -> list[Draft]:
        """Continuations of the committed tail (prompt tail + output ids), longest match first."""
        tail = list(state.ctx.prompt_ids[-self.max_ngram :]) + state.output_ids[-self.max_ngram :]
        return [Draft(cont, "retrieval") for cont in self.continuations(tail)]

    def continuations(self, tail_ids: list[int], limit: int | None = None) -> list[list[int]]:
        """Distinct continuations of ``tail_ids`` found in the memory, longest n-gram match first
        (``limit`` of them at most; by default as many as ``lengths`` has entries)."""
        if not len(self._haystack):
            return []
        lengths = self.lengths[: limit or len(self.lengths)]
        tail = np.asarray(tail_ids[-self.max_ngram :], dtype=np.int64)
        found: list[list[int]] = []
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            for cont in ngram_continuations(self._haystack, tail[-n:], max(lengths), len(lengths)):
                if len(found) == len(lengths):
                    break
                cont = cont[: lengths[len(found)]]
                if not any(prev[: len(cont)] == cont or cont[: len(prev)] == prev for prev in found):
                    found.append(cont)
            if len(found) == len(lengths):
                break
        return found

    def end(self, state: DecodeState, result) -> None:
        tools_called = frozenset(self._called_names(state))
        context = list(state.ctx.prompt_ids[-self.context_tokens :])
        self.memory.append(MemoryEntry(state.ctx.request.id, context + list(result.output_ids), tools_called))
        del self.memory[: -self.max_entries]

    @staticmethod
    def _called_names(state: DecodeState) -> list[str]:
        surface = state.ctx.surface
        if surface is None:
            return []
        try:
            return [call.name for call in surface.parse(state.text)]
        except (ValueError, KeyError, TypeError):
            return []
