"""Request-span drafts inside a sidecar wave: a row's continuation looked up in the request.

Most slot values are spans of the request (73% on dev), and a wave otherwise runs one forward per
token of its longest row. So at each step every row may carry, after its greedy token, a draft:
the tokens that follow the row's last few tokens where they occur in the request prefix (prompt
lookup over token ids). The sidecar verifies the drafts itself in the same forward and keeps the
longest prefix its own greedy choice agrees with (`ooospec.sidecar.predictor.SlotPredictor`), so a
row's answer is what greedy decoding writes, several tokens a forward where it copies. The rejected
positions stay in the cache, masked out of attention for good.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SpanDraftSettings:
    """``max_ngram`` .. 1 tokens of a row's end are looked up (longest match first); a draft holds
    at most ``max_tokens`` tokens."""

    max_ngram: int = 3
    max_tokens: int = 6

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SpanDrafter:
    """Prompt lookup over one request's token ids (``source``), never proposing an end token."""

    def __init__(self, source: list[int], settings: SpanDraftSettings, stop: set[int]):
        self.source, self.settings, self.stop = source, settings, stop
        # every n-gram's last occurrence: where its continuation starts
        self.follows: dict[tuple[int, ...], int] = {}
        for n in range(1, settings.max_ngram + 1):
            for end in range(n, len(source)):
                self.follows[tuple(source[end - n:end])] = end

    def propose(self, written: list[int], room: int) -> list[int]:
        """The draft after a row's ``written`` tokens, at most ``room`` tokens long."""
        limit = min(self.settings.max_tokens, room)
        if limit <= 0:
            return []
        for n in range(min(self.settings.max_ngram, len(written)), 0, -1):
            start = self.follows.get(tuple(written[-n:]))
            if start is not None:
                draft = []
                for token in self.source[start:start + limit]:
                    if token in self.stop:
                        break
                    draft.append(token)
                return draft
        return []
