"""The decoding engine: one lossless tree verifier and loop, and the draft sources of each method.

AR is the loop with no sources; PLD, ToolSpec (and OoO-Spec, which adds a hint source) differ only
in the `DraftSource` list they pass. See `loop.decode`.
"""

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource, EventTrace
from ooospec.decoding.loop import DecodeResult, Prefill, decode, make_context
from ooospec.decoding.methods import METHODS, build_sources, default_budget
from ooospec.decoding.tree import DraftTree, TreeBudget, build_tree
from ooospec.decoding.verifier import Round, TreeVerifier, VerifierState

__all__ = [
    "DecodeContext", "DecodeResult", "DecodeState", "Draft", "DraftSource", "DraftTree",
    "EventTrace", "METHODS", "Prefill", "Round", "TreeBudget", "TreeVerifier", "VerifierState",
    "build_sources", "build_tree", "decode", "default_budget", "make_context",
]
