"""The decoding engine: one lossless tree verifier and loop, and the draft sources of each method.

AR is the loop with no sources; PLD, ToolSpec (`toolspec.ToolSpec`) and OoO-Spec (ToolSpec plus
the hint bank, `out_of_order.ooospec_sources`) differ only in the `DraftSource` list they pass.
Read one OoO-Spec step as: `loop.decode` -> `hint.HintBank.propose` (polls the sidecar) and
`toolspec.ToolSpec.propose` -> `tree.build_tree` -> `verifier.TreeVerifier.step` -> commit.
Naming methods and choosing budgets is the benchmark's job (`ooospec.bench.methods`).
"""

from ooospec.decoding.base import CREDITS, DRAFT_SOURCES, DecodeContext, DecodeState, Draft, DraftSource, EventTrace
from ooospec.decoding.loop import DecodeResult, Prefill, decode, make_context
from ooospec.decoding.tree import DraftTree, TreeBudget, build_tree
from ooospec.decoding.verifier import Round, TreeVerifier, VerifierState

__all__ = [
    "CREDITS", "DRAFT_SOURCES", "DecodeContext", "DecodeResult", "DecodeState", "Draft", "DraftSource", "DraftTree",
    "EventTrace", "Prefill", "Round", "TreeBudget", "TreeVerifier", "VerifierState", "build_tree", "decode",
    "make_context",
]
