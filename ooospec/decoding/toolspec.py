"""ToolSpec (Xia et al. 2026): schema FSM + call retrieval, with prompt lookup as general fallback.

One composite source so that the merge policy lives in one place, in priority order:

1. FSM scaffold drafts (the schema fixes them, so they are the likeliest);
2. the best scaffold draft continued by retrieval (the value an earlier call put after the same
   key, or the rest of that call), placed right after it;
3. retrieved continuations of the committed text (values and whole calls seen earlier in the run);
4. prompt lookup, only in rounds where none of the above has anything (ToolSpec's own fallback is
   a token-recycling tree; PLD plays that role here without extra model state);
5. the FSM's bets that an open string value ends right here.

The tree builder then cuts the merged list to the node budget and depth limit, dropping the
later (lower-priority) drafts first.
"""

from __future__ import annotations

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.pld import PromptLookup
from ooospec.decoding.retrieval import CallRetrieval
from ooospec.decoding.schema_fsm import SchemaFSMSource

PLD_MODES = ("fallback", "always", "off")


class ToolSpec(DraftSource):
    name = "toolspec"

    def __init__(
        self,
        fsm: SchemaFSMSource | None = None,
        retrieval: CallRetrieval | None = None,
        pld: PromptLookup | None = None,
        pld_mode: str = "fallback",
        chain: bool = True,
    ):
        if pld_mode not in PLD_MODES:
            raise ValueError(f"pld_mode must be one of {PLD_MODES}, got {pld_mode!r}")
        self.fsm = fsm or SchemaFSMSource()
        self.retrieval = retrieval or CallRetrieval()
        self.pld = pld or PromptLookup()
        self.pld_mode = pld_mode
        self.chain = chain

    @property
    def children(self) -> list[DraftSource]:
        return [self.fsm, self.retrieval] + ([self.pld] if self.pld_mode != "off" else [])

    def begin(self, ctx: DecodeContext) -> None:
        for child in self.children:
            child.begin(ctx)

    def propose(self, state: DecodeState) -> list[Draft]:
        scaffold, guesses = self.fsm.propose_split(state)
        drafts = list(scaffold)
        if self.chain and scaffold:
            drafts[1:1] = self._chained(scaffold[0])
        drafts += self.retrieval.propose(state)
        if self.pld_mode == "always" or (self.pld_mode == "fallback" and not drafts):
            drafts += self.pld.propose(state)
        return drafts + guesses

    def _chained(self, scaffold: Draft) -> list[Draft]:
        """The best scaffold draft continued by what followed the same text in an earlier call
        (the value after a key, the rest of a call): the FSM stops at every free value, retrieval
        alone would need the scaffold committed first to match it."""
        conts = self.retrieval.continuations(self.retrieval.tail + scaffold.tokens, limit=1)
        return [Draft(scaffold.tokens + cont, "retrieval") for cont in conts]

    def observe(self, state: DecodeState, accepted: list[int]) -> None:
        for child in self.children:
            child.observe(state, accepted)

    def end(self, state: DecodeState, result) -> None:
        for child in self.children:
            child.end(state, result)
