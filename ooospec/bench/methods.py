"""Methods by name: ``"ooospec:no_fsm"`` -> a `MethodSpec` -> fresh draft sources + budget.

The bench and the ablations name every method as a string, so a notebook parameter, a record's
``method`` field and a table row all speak the same language. Grammar: ``base[:option]*`` with
``base`` one of `BASES` and options

* ``no_fsm``, ``no_retrieval``, ``pld=off|always|fallback`` (toolspec, ooospec): ToolSpec's parts;
* ``blocking`` (ooospec): wait for the hint at the first boundary (ablation only);
* ``sequential``, ``two_waves``, ``no_prefix_share``, ``chosen_wave``, ``progressive`` (ooospec): how the
  sidecar decodes its slots (``chosen_wave``: the other functions' rows stop once the function row has
  answered; ``progressive``: the whole wave, its chosen call handed over first, the paper's single
  delivery being the default);
* ``slot``, ``base_only``, ``oracle``, ``gold`` (ooospec): which sidecar answers (default: the
  bench's ``sidecar`` setting);
* ``nullable`` (ooospec): the trained sidecar's raw answers, null allowed for any slot, required ones
  included (by default no slot may be null, see `ooospec.sidecar.predictor.SlotPredictor`);
* ``delay=S`` (ooospec): seconds of latency injected after each wave (the latency sweep);
* ``own_core``, ``shared_core``, ``in_process`` (ooospec): where the sidecar runs;
* ``static`` (ooospec): the paper's placement, the sidecar's core its own for the whole request. By
  default the placement is elastic: the target takes the sidecar's core whenever no sidecar job is in
  flight (`ooospec.bench.placement.ElasticCores`), so its equal-hardware control is ToolSpec on both
  cores, while ``ooospec:static`` is compared with ToolSpec on one core (the paper's comparison);
* ``prefill_chunk=N`` (ooospec, elastic): the target's own prefill in forwards of N tokens with a
  placement boundary between them while the wave is in flight, so the elastic target takes the
  sidecar's core inside the prefill once the wave is done, and runs the rest in one forward. Elastic
  OoO-Spec does this by default with `ELASTIC_PREFILL_CHUNK` tokens; ``prefill_chunk=0`` is one
  forward (the control);
* ``both_cores`` (ar, pld, toolspec): the equal-hardware control: the target decodes with two
  threads on both cores (OoO-Spec's target has one core and its sidecar the other), with its own
  prefill on both cores too;
* ``budget=N`` (pld, toolspec, ooospec): draft nodes per tree; ``depth=N``: its depth limit (the
  control with the total nodes and depth of ``ooospec:hint_room=32`` is ``toolspec:budget=48:depth=32``);
* ``hint_room=N`` (ooospec): N more nodes (and depth N) that only the hint may fill, on top of
  ToolSpec's budget (an ablation: by default the hint competes for ToolSpec's nodes, as in the paper);
* ``hint_tokens=N`` (ooospec): longest hint draft;
* ``plain_hint`` (ooospec): the hint used as before it was bounded, gated and made to follow the
  target's function (`ooospec.decoding.out_of_order`): an ablation;
* ``every_wave`` (ooospec): submit every request's wave, however late the run's waves have been (the
  control of `ooospec.decoding.wave_gate.WaveGate`, which skips waves while they keep coming too late);
* ``wave=prefill|deferred|none|policy`` (ooospec): when the wave runs (`ooospec.decoding.wave_policy`):
  at arrival, during the target's prefill (the paper's and the default); right after the prefill,
  which then runs on both cores; never (ToolSpec on the elastic placement: a control); or per request,
  the least modelled end-to-end time on this machine's calibrated costs.

`MethodSpec.name` is the canonical spelling (defaults left out, options in a fixed order), so
``"ooospec:delay=2.0"`` and ``"ooospec:delay=2"`` are one method.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.out_of_order import DEFAULT_HINT_TOKENS, ooospec_budget, ooospec_sources
from ooospec.decoding.pld import PromptLookup
from ooospec.decoding.retrieval import CallRetrieval
from ooospec.decoding.schema_fsm import SchemaFSMSource
from ooospec.decoding.toolspec import PLD_MODES, ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.wave_policy import SCHEDULES, WaveCosts, WavePolicy

BASES = ("ar", "pld", "toolspec", "ooospec")
SIDECAR_KINDS = ("slot", "base_only", "oracle", "gold")
SIDECAR_MODES = {"wave": "wave", "sequential": "sequential", "two_waves": "two_waves",
                 "no_prefix_share": "wave_no_prefix_share", "chosen_wave": "chosen_wave",
                 "progressive": "progressive_wave"}
PLACEMENTS = ("own_core", "shared_core", "in_process")
# Elastic OoO-Spec prefills in chunks of this many tokens while its sidecar's wave is in flight and
# takes the second core at the first chunk boundary after the wave (then the rest in one forward).
# Chosen on 10 dev requests (AVX2 machine, fp32, Qwen target): end to end over one forward 1.09x
# [1.02, 1.17] with 128, 1.06x [0.99, 1.14] with 64 (book/measured.md).
ELASTIC_PREFILL_CHUNK = 128

# The fixed budget, used where the machine's choice is not made (`BenchConfig.tree_budget="fixed"`,
# the studies, a target without committed dev acceptance); a bench run chooses per machine by
# `ooospec.bench.tree_budget`. The history of how 16 was picked is in the ToolSpec chapter.
DEFAULT_BUDGETS: dict[str, TreeBudget] = {
    "qwen2.5-coder-0.5b": TreeBudget(max_nodes=16, max_depth=16),
    "smollm2-135m-tool": TreeBudget(max_nodes=16, max_depth=16),
}


def default_budget(target_name: str | None = None) -> TreeBudget:
    return DEFAULT_BUDGETS.get(target_name or "", TreeBudget())


WAVES = (*SCHEDULES, "policy")
_TOOLSPEC_PARTS = ("toolspec", "ooospec")
_DRAFTING = ("pld", "toolspec", "ooospec")


@dataclass(frozen=True)
class MethodSpec:
    """One decoding method; every field but ``base`` defaults to the paper's setting."""

    base: str
    fsm: bool = True
    retrieval: bool = True
    pld_mode: str = "fallback"
    blocking: bool = False
    sidecar_mode: str = "wave"  # a `ooospec.sidecar.service.MODES` value
    sidecar: str | None = None  # None: the bench's sidecar
    nullable: bool = False  # the trained sidecar may answer null for required slots
    delay_s: float = 0.0
    placement: str = "own_core"
    static: bool = False  # the sidecar's core stays its own (the paper's placement); default: elastic
    prefill_chunk: int | None = None  # elastic: prefill chunk (None: ELASTIC_PREFILL_CHUNK; 0: one forward)
    both_cores: bool = False  # the equal-hardware control of a baseline
    budget: int | None = None  # draft nodes; None: the target's default
    depth: int | None = None  # depth limit; None: the target's default
    hint_room: int = 0  # nodes only the hint may fill, on top of the budget (ablation)
    hint_tokens: int = DEFAULT_HINT_TOKENS
    plain_hint: bool = False  # the earlier hint use (no share bound, no gate, no follow)
    every_wave: bool = False  # no wave gate: the sidecar gets every request, however late it runs
    wave: str = "prefill"  # when the wave runs: a `SCHEDULES` value, or "policy" (chosen per request)

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ValueError(f"unknown method base {self.base!r}; one of {BASES}")
        changed = {f.name for f in fields(self) if f.name != "base" and getattr(self, f.name) != f.default}
        allowed = _ALLOWED[self.base]
        if changed - allowed:
            raise ValueError(f"method base {self.base!r} takes no option(s) {sorted(changed - allowed)}")
        if self.static and self.placement != "own_core":
            raise ValueError("static is the own_core placement without lending; other placements never lend the core")
        if self.prefill_chunk is not None and not self.elastic:
            raise ValueError("prefill_chunk lets the elastic target switch cores inside its prefill: it needs elastic")
        if self.wave not in WAVES:
            raise ValueError(f"unknown wave schedule {self.wave!r}; one of {WAVES}")
        if self.wave != "prefill" and (self.blocking or self.delay_s):
            raise ValueError("wave=... moves or drops the wave; blocking and delay= measure the wave at arrival")
        if self.prefill_chunk == ELASTIC_PREFILL_CHUNK:  # the default spelt out: one method, one name
            object.__setattr__(self, "prefill_chunk", None)

    @classmethod
    def parse(cls, text: str) -> "MethodSpec":
        """``"ooospec:no_fsm:delay=2"`` -> MethodSpec; errors name the method and the option."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"method must be a non-empty string, got {text!r}")
        base, *options = [part.strip() for part in text.strip().split(":")]
        if base not in BASES:
            raise ValueError(f"method {text!r}: unknown base {base!r}; one of {BASES}")
        values: dict[str, Any] = {}
        for option in options:
            field_name, value = _parse_option(text, base, option)
            if field_name in values and values[field_name] != value:
                raise ValueError(f"method {text!r}: option {option!r} conflicts with an earlier option")
            values[field_name] = value
        try:
            return cls(base, **values)
        except ValueError as err:
            raise ValueError(f"method {text!r}: {err}") from err

    @property
    def name(self) -> str:
        """Canonical spelling: `parse(spec.name) == spec`."""
        parts = [self.base]
        if not self.fsm:
            parts.append("no_fsm")
        if not self.retrieval:
            parts.append("no_retrieval")
        if self.pld_mode != "fallback":
            parts.append(f"pld={self.pld_mode}")
        if self.blocking:
            parts.append("blocking")
        if self.sidecar_mode != "wave":
            parts.append(next(k for k, v in SIDECAR_MODES.items() if v == self.sidecar_mode))
        if self.sidecar is not None:
            parts.append(self.sidecar)
        if self.nullable:
            parts.append("nullable")
        if self.delay_s:
            parts.append(f"delay={self.delay_s:g}")
        if self.placement != "own_core":
            parts.append(self.placement)
        if self.static:
            parts.append("static")
        if self.prefill_chunk is not None:
            parts.append(f"prefill_chunk={self.prefill_chunk}")
        if self.both_cores:
            parts.append("both_cores")
        if self.budget is not None:
            parts.append(f"budget={self.budget}")
        if self.depth is not None:
            parts.append(f"depth={self.depth}")
        if self.hint_room:
            parts.append(f"hint_room={self.hint_room}")
        if self.hint_tokens != DEFAULT_HINT_TOKENS:
            parts.append(f"hint_tokens={self.hint_tokens}")
        if self.plain_hint:
            parts.append("plain_hint")
        if self.every_wave:
            parts.append("every_wave")
        if self.wave != "prefill":
            parts.append(f"wave={self.wave}")
        return ":".join(parts)

    @property
    def elastic(self) -> bool:
        """The target borrows its sidecar's core while the sidecar is idle: OoO-Spec on its own core,
        unless ``static``."""
        return self.base == "ooospec" and self.placement == "own_core" and not self.static

    @property
    def target_prefill_chunk(self) -> int | None:
        """Tokens per forward of the target's own prefill (None: the whole prompt in one)."""
        if not self.elastic:
            return None
        return ELASTIC_PREFILL_CHUNK if self.prefill_chunk is None else (self.prefill_chunk or None)

    @property
    def uses_sidecar(self) -> bool:
        return self.base == "ooospec"

    @property
    def shares_prefill(self) -> bool:
        """AR, PLD and ToolSpec may start from one measured prefill per request; OoO-Spec may
        not, because its sidecar works *during* the target's prefill (that overlap is the point),
        and neither may a method on both cores (its prefill is faster: part of what it buys)."""
        return self.base != "ooospec" and not self.both_cores


_ALLOWED: dict[str, set[str]] = {
    "ar": {"both_cores"},
    "pld": {"budget", "depth", "both_cores"},
    "toolspec": {"fsm", "retrieval", "pld_mode", "budget", "depth", "both_cores"},
    "ooospec": {f.name for f in fields(MethodSpec)} - {"base", "both_cores"},
}


def _parse_option(text: str, base: str, option: str) -> tuple[str, Any]:
    def need(bases: tuple[str, ...]) -> None:
        if base not in bases:
            raise ValueError(f"method {text!r}: option {option!r} applies only to {list(bases)}")

    key, _, value = option.partition("=")
    if not key:
        raise ValueError(f"method {text!r}: empty option")
    if key in ("no_fsm", "no_retrieval") and not value:
        need(_TOOLSPEC_PARTS)
        return ("fsm" if key == "no_fsm" else "retrieval"), False
    if key == "pld":
        need(_TOOLSPEC_PARTS)
        if value not in PLD_MODES:
            raise ValueError(f"method {text!r}: pld={value!r}; one of {PLD_MODES}")
        return "pld_mode", value
    if key == "blocking" and not value:
        need(("ooospec",))
        return "blocking", True
    if key in SIDECAR_MODES and not value:
        need(("ooospec",))
        return "sidecar_mode", SIDECAR_MODES[key]
    if key == "nullable" and not value:
        need(("ooospec",))
        return "nullable", True
    if key == "static" and not value:
        need(("ooospec",))
        return "static", True
    if key == "plain_hint" and not value:
        need(("ooospec",))
        return "plain_hint", True
    if key == "every_wave" and not value:
        need(("ooospec",))
        return "every_wave", True
    if key == "wave":
        need(("ooospec",))
        if value not in WAVES:
            raise ValueError(f"method {text!r}: wave={value!r}; one of {WAVES}")
        return "wave", value
    if key in SIDECAR_KINDS and not value:
        need(("ooospec",))
        return "sidecar", key
    if key == "both_cores" and not value:
        need(("ar", "pld", "toolspec"))
        return "both_cores", True
    if key in PLACEMENTS and not value:
        need(("ooospec",))
        return "placement", key
    if key == "delay":
        need(("ooospec",))
        return "delay_s", _number(text, option, value, float, minimum=0.0)
    if key == "budget":
        need(_DRAFTING)
        return "budget", _number(text, option, value, int, minimum=1)
    if key == "depth":
        need(_DRAFTING)
        return "depth", _number(text, option, value, int, minimum=1)
    if key == "prefill_chunk":
        need(("ooospec",))
        return "prefill_chunk", _number(text, option, value, int, minimum=0)
    if key == "hint_room":
        need(("ooospec",))
        return "hint_room", _number(text, option, value, int, minimum=1)
    if key == "hint_tokens":
        need(("ooospec",))
        return "hint_tokens", _number(text, option, value, int, minimum=1)
    raise ValueError(f"method {text!r}: unknown option {option!r}; see ooospec.bench.methods for the grammar")


def _number(text: str, option: str, value: str, kind: type, minimum: float) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"method {text!r}: option {option!r} needs a {kind.__name__} value") from None
    if number < minimum:
        raise ValueError(f"method {text!r}: option {option!r} must be >= {minimum}")
    return number


def parse_methods(names: list[str]) -> list[MethodSpec]:
    """Distinct specs in the given order, AR first (every record is compared with AR's output)."""
    specs: list[MethodSpec] = []
    for name in names:
        spec = MethodSpec.parse(name)
        if spec not in specs:
            specs.append(spec)
    ar = MethodSpec("ar")
    return [ar] + [s for s in specs if s != ar]


class FSMOff(SchemaFSMSource):
    """The FSM-off ablation: ToolSpec's schema FSM with no schema compiled, so every call the
    composite makes on it (whatever its API) finds nothing to propose."""

    def begin(self, ctx: DecodeContext) -> None:
        super().begin(ctx)
        self.fsm = None


class RetrievalOff(CallRetrieval):
    """The retrieval-off ablation: call retrieval that never remembers a call."""

    def propose(self, state: DecodeState) -> list[Draft]:
        return []

    def end(self, state: DecodeState, result: Any) -> None:
        return None


def method_sources(spec: MethodSpec, service: Any = None, wave_costs: WaveCosts | None = None) -> list[DraftSource]:
    """Fresh sources for one run of ``spec`` (kept across the run's requests: retrieval learns).

    With FSM and retrieval both silent in a round, ToolSpec's prompt-lookup fallback proposes,
    as it does in the full method. ``wave_costs``: this machine's calibrated costs, which
    ``wave=policy`` needs (`ooospec.decoding.wave_policy.WaveCosts`)."""
    if spec.base == "ar":
        return []
    if spec.base == "pld":
        return [PromptLookup()]
    options: dict[str, Any] = {"pld_mode": spec.pld_mode}
    if not spec.fsm:
        options["fsm"] = FSMOff()
    if not spec.retrieval:
        options["retrieval"] = RetrievalOff()
    if spec.base == "toolspec":
        return [ToolSpec(**options)]
    if service is None:
        raise ValueError(f"method {spec.name!r} needs a sidecar service")
    if spec.wave == "policy" and wave_costs is None:
        raise ValueError(f"method {spec.name!r} needs this machine's wave costs (a calibration)")
    policy = WavePolicy(wave_costs) if spec.wave == "policy" and wave_costs is not None else None
    return ooospec_sources(service, mode=spec.sidecar_mode, blocking=spec.blocking,
                           hint_tokens=spec.hint_tokens, plain_hint=spec.plain_hint, every_wave=spec.every_wave,
                           schedule="prefill" if policy else spec.wave, policy=policy, **options)


def method_budget(spec: MethodSpec, target_name: str, default: TreeBudget | None = None) -> TreeBudget:
    """The run's tree budget for the target (``default``: the machine's choice, see
    `ooospec.bench.tree_budget`; else the fixed default), resized by an explicit ``budget=N`` /
    ``depth=N``; OoO-Spec draws on the same budget, plus ``hint_room`` nodes only the hint may fill
    when that ablation asks."""
    budget = default or default_budget(target_name)
    budget = TreeBudget(max_nodes=spec.budget if spec.budget is not None else budget.max_nodes,
                        max_depth=spec.depth if spec.depth is not None else budget.max_depth)
    return ooospec_budget(budget, spec.hint_room, spec.plain_hint) if spec.base == "ooospec" else budget


def ablation_methods(ablations: list[str], delays: list[float]) -> list[str]:
    """The ablations chapter's method list: AR, ToolSpec and OoO-Spec, every ablation, the
    latency sweep and the reserved-room tree with its control. One definition, so notebook 06 and
    `ooospec.reproduce.ray_sweep` key the same bench stage (the key covers the method list)."""
    names = (["ar", "toolspec", "ooospec", PAPER_PLACEMENT] + list(ablations)
             + [f"{PAPER_PLACEMENT}:delay={d}" for d in delays] + [HINT_ROOM_ABLATION, HINT_ROOM_CONTROL])
    return [MethodSpec.parse(name).name for name in names]


def budget_methods(budgets: list[int]) -> list[str]:
    """The budget sweep of both methods on one core each (OoO-Spec in the paper's placement, so the
    budget is the only difference), on dev requests."""
    names = ["ar", "toolspec", PAPER_PLACEMENT] + [f"{base}:budget={n}" for base in ("toolspec", PAPER_PLACEMENT)
                                                   for n in budgets]
    return [MethodSpec.parse(name).name for name in names]


def wave_gate_methods() -> list[str]:
    """The wave gate beside its control (``every_wave``) in both placements, each with the ToolSpec
    it is compared with (one core for static, both cores for elastic), on dev requests."""
    names = ["ar", "toolspec", PAPER_PLACEMENT, f"{PAPER_PLACEMENT}:every_wave", "ooospec", "ooospec:every_wave",
             "toolspec:both_cores"]
    return [MethodSpec.parse(name).name for name in names]


# OoO-Spec in the paper's placement (the sidecar's core its own): what is compared with ToolSpec on one core
PAPER_PLACEMENT = "ooospec:static"

# the tree of earlier versions (ToolSpec's 16 nodes + 32 only the hint may fill, depth 32), and the
# ToolSpec control that gets the same total room
HINT_ROOM_ABLATION = "ooospec:static:hint_room=32"
HINT_ROOM_CONTROL = "toolspec:budget=48:depth=32"
