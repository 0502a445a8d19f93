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
        from_fsm = self.fsm.propose(state)
        scaffold = [d for d in from_fsm if not d.guess]
        drafts = list(scaffold)
        if self.chain and scaffold:
            drafts[1:1] = self._chained(state, scaffold[0])
        drafts += self.retrieval.propose(state)
        if self.pld_mode == "always" or (self.pld_mode == "fallback" and not drafts):
            drafts += self.pld.propose(state)
        return drafts + [d for d in from_fsm if d.guess]

    def _chained(self, state: DecodeState, scaffold: Draft) -> list[Draft]:
        """The best scaffold draft continued by what followed the same text in an earlier call
        (the value after a key, the rest of a call): the FSM stops at every free value, retrieval
        alone would need the scaffold committed first to match it, so it is asked on the state
        with the scaffold committed (`DecodeState.ahead`)."""
        found = self.retrieval.propose(state.ahead(scaffold.tokens))[:1]
        return [Draft(scaffold.tokens + d.tokens, "retrieval") for d in found]

    def observe(self, state: DecodeState, accepted: list[int]) -> None:
        for child in self.children:
            child.observe(state, accepted)

    def end(self, state: DecodeState, result) -> None:
        for child in self.children:
            child.end(state, result)
