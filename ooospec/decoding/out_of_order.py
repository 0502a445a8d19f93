"""OoO-Spec as a method: ToolSpec's sources plus the hint bank, and the sidecar it polls.

The hint bank comes first in the source list, so its drafts come first in the merged candidate
list. By default it draws on ToolSpec's own budget, as in the paper (the hint bank enters ToolSpec's
candidate construction; "ToolSpec continues to control ... the candidate budget"): OoO-Spec's tree
is never bigger than ToolSpec's, and with no hint it is ToolSpec's node for node. Extra room that
only the hint chain may fill (`TreeBudget.hint_nodes`) is an ablation, ``ooospec:hint_room=N``,
shown next to a ToolSpec control with the same total nodes and depth.

How the hint is used: the merge keeps ToolSpec's best draft a share of the tree wherever the hint
disagrees with it (`HINT_SHARE`), and the bank proposes only at or inside a call, following the
function the target writes (`ooospec.decoding.hint.HintBank`). These were chosen on dev requests by
replay (`ooospec.studies.hint_replay`); ``plain_hint`` turns all three off (the earlier use, an ablation).
A wave that would come too late is not started while the run's recent waves all did
(`ooospec.decoding.wave_gate.WaveGate`); ``every_wave`` is its control.
"""

from __future__ import annotations

from typing import Any

from ooospec.decoding.base import DraftSource
from ooospec.decoding.hint import HintBank
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.wave_gate import WaveGate
from ooospec.decoding.wave_policy import WavePolicy
from ooospec.sidecar.service import SidecarService

DEFAULT_HINT_TOKENS = 32
# the share of the budget a hint may take past its first disagreement with ToolSpec's best draft:
# of 0.25 / 0.375 / 0.5 / 0.75 / 1, the fewest modelled seconds over 60 dev requests at 8 and 16
# nodes summed (the replay table is in the ablations chapter)
HINT_SHARE = 0.75


def ooospec_sources(service: SidecarService, *, mode: str = "wave", blocking: bool = False,
                    hint_tokens: int = DEFAULT_HINT_TOKENS, plain_hint: bool = False,
                    every_wave: bool = False, schedule: str = "prefill", policy: WavePolicy | None = None,
                    **toolspec_options: Any) -> list[DraftSource]:
    """Fresh sources for one run of OoO-Spec (the service outlives them: one model load per run).
    ``plain_hint``: the bank neither gated by the call's position nor following the target's function.
    ``every_wave``: every request's wave is submitted, however late the run's waves have been (the
    control of the `WaveGate`; a blocking bank waits for its hint, so it is never late and has none).
    ``schedule`` / ``policy``: when each request's wave runs (`ooospec.decoding.wave_policy`)."""
    bank = HintBank(service, mode=mode, blocking=blocking, max_tokens=hint_tokens,
                    gate=not plain_hint, follow=not plain_hint,
                    wave_gate=None if every_wave or blocking else WaveGate(), schedule=schedule, policy=policy)
    return [bank, ToolSpec(**toolspec_options)]


def ooospec_budget(toolspec_budget: TreeBudget, hint_room: int = 0, plain_hint: bool = False) -> TreeBudget:
    """ToolSpec's budget (the default), the hint's share of it bounded (`HINT_SHARE`; not with
    ``plain_hint``), plus ``hint_room`` nodes and depth only the hint may use."""
    return TreeBudget(max_nodes=toolspec_budget.max_nodes, max_depth=toolspec_budget.max_depth,
                      hint_nodes=hint_room, hint_depth=hint_room,
                      hint_share=None if plain_hint or hint_room else HINT_SHARE)
