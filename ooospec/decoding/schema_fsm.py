"""Schema FSM: where the committed text is inside a tool call, and the scaffold that must follow.

Compiled per request from the tools' JSON Schemas and the target's surface format (scaffold
pieces come from `ooospec.decoding.scaffold`, so nothing about the format is hard-coded). The
committed output text is matched, character by character, against every call the schema allows:

    before --call_open--> name --name+args_open--> key --key+kv_sep--> value --between--> key ...
                                                                       value --args_close--> after
                         name --name+noargs_close--> after            after --call_sep--> name

The match is nondeterministic (several function names share a prefix, a number may or may not be
over) so the FSM keeps every live configuration. At each boundary it proposes, from each live
configuration, the fixed text up to the next free value: the rest of the format prefix, function
names (several candidates = several drafts), the arguments opener, parameter names (next in
schema order first, then the remaining ones), separators, closers and, after a complete call,
the end of the reply (an EOS token). Inside a value it proposes only what the schema fixes: the
opening quote of a string, or the rest of an ``enum`` / boolean value.

Inside an open string it bets, after the other sources, that the string ends right there (the
closing quote plus the scaffold after it): a wrong bet costs a few tree nodes, a right one saves
the forwards that would emit the closers one by one.

The match runs over the frozen rendering and its bare-object layout at once
(`ooospec.decoding.layouts`): a target that drops its fence or indentation is still followed.
A schema it cannot compile (``anyOf`` at the top, missing ``properties``, an irregular surface)
gives no FSM drafts for that request and a ``fsm_fallback`` trace event with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from ooospec.decoding.base import DecodeContext, DecodeState, Draft, DraftSource
from ooospec.decoding.json_value import JsonValueScanner
from ooospec.decoding.scaffold import Scaffold, ScaffoldError, derive_scaffold, function_text, key_text
from ooospec.decoding.text_drafts import tokens_continuing
from ooospec.decoding.layouts import json_layouts
from ooospec.models.surface import SurfaceFormat

UNSUPPORTED_COMBINATORS = ("anyOf", "oneOf", "allOf", "$ref", "not")
FREE_PARAM = -1  # parameter index of a value under an undeclared key


class SchemaCompileError(ValueError):
    """The request's tool schemas (or the surface) cannot be compiled into an FSM."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    key_text: str
    is_string: bool  # the schema says the value is a JSON string (its opening quote is scaffold)
    choices: tuple[str, ...]  # JSON texts of the values the schema allows (enum, boolean), if fixed
    required: bool


UNDECLARED = ParamSpec("", "", is_string=False, choices=(), required=False)


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    name_text: str
    params: tuple[ParamSpec, ...]


@dataclass(frozen=True)
class LayoutSchema:
    """One rendering the FSM follows: its scaffold pieces and the function/key texts in it."""

    surface: str
    scaffold: Scaffold
    functions: tuple[FunctionSpec, ...]


@dataclass(frozen=True)
class CompiledSchema:
    layouts: tuple[LayoutSchema, ...]  # the target's frozen rendering first

    @property
    def scaffold(self) -> Scaffold:
        return self.layouts[0].scaffold

    @property
    def functions(self) -> tuple[FunctionSpec, ...]:
        return self.layouts[0].functions


def _param_spec(surface: SurfaceFormat, scaffold: Scaffold, tool: str, name: str, schema: Any,
                required: bool) -> ParamSpec:
    if not isinstance(schema, dict):
        raise SchemaCompileError(f"tool {tool!r}: parameter {name!r} schema is not an object")
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    concrete = [t for t in types if t != "null"]
    choices: tuple[str, ...] = ()
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        choices = tuple(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    elif concrete == ["boolean"]:
        choices = ("true", "false")
    return ParamSpec(name, key_text(surface, scaffold, name), concrete == ["string"], choices, required)


def _compile_layout(tools: list[dict[str, Any]], surface: SurfaceFormat) -> LayoutSchema:
    try:
        scaffold = derive_scaffold(surface)
        functions = []
        for index, tool in enumerate(tools):
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str) or not name:
                raise SchemaCompileError(f"tool #{index} has no name")
            params = tool.get("parameters")
            if not isinstance(params, dict):
                raise SchemaCompileError(f"tool {name!r}: parameters is not a JSON Schema object")
            combinators = [key for key in UNSUPPORTED_COMBINATORS if key in params]
            if combinators:
                raise SchemaCompileError(f"tool {name!r}: parameters use {', '.join(combinators)}")
            properties = params.get("properties")
            if not isinstance(properties, dict):
                raise SchemaCompileError(f"tool {name!r}: parameters have no properties map")
            required = set(params.get("required") or [])
            specs = tuple(
                _param_spec(surface, scaffold, name, key, schema, key in required)
                for key, schema in properties.items()
            )
            functions.append(FunctionSpec(name, function_text(surface, scaffold, name), specs))
    except ScaffoldError as err:
        raise SchemaCompileError(f"surface {surface.name!r}: {err}") from err
    return LayoutSchema(surface.name, scaffold, tuple(functions))


def compile_schema(tools: list[dict[str, Any]], surface: SurfaceFormat | None,
                   layouts: bool = True) -> CompiledSchema:
    """Compile ``tools`` (OpenAI-style function specs) for ``surface`` (plus its looser JSON
    layouts, see `ooospec.decoding.layouts`) or raise `SchemaCompileError`."""
    if surface is None:
        raise SchemaCompileError("no surface format for this target")
    if not tools:
        raise SchemaCompileError("the request offers no tools")
    compiled = [_compile_layout(tools, surface)]
    for extra in json_layouts(surface) if layouts else []:
        try:
            compiled.append(_compile_layout(tools, extra))
        except SchemaCompileError:
            continue  # a looser layout is optional; the frozen rendering compiled
    return CompiledSchema(tuple(compiled))


# ---- the call grammar ---------------------------------------------------------------------------
# A node is a point in a call where a piece of fixed text ends: a choice among fixed texts
# (function names, argument keys) or a stretch of free text (prose before a call, a value, the
# end of the call). Every node but `Start` carries its layout ``v``: each rendering is its own
# grammar. What fixed text leaves each node is said in one place, `SchemaFSM._grammar`.


@dataclass(frozen=True)
class Start:
    """Before any call: prose, until a call opener of some layout begins."""


@dataclass(frozen=True)
class Names:
    """Right after a call opener of layout ``v``: a function name follows."""

    v: int


@dataclass(frozen=True)
class Keys:
    """An argument key of function ``fn`` follows. ``used``: the parameters given so far;
    ``last``: the latest of them (drafts propose the key after it in schema order first)."""

    v: int
    fn: int
    used: frozenset[int]
    last: int


@dataclass(frozen=True)
class Value:
    """The value of parameter ``param`` of ``fn`` (`FREE_PARAM` under an undeclared key), which
    ``used`` already counts: free text, then more keys or the end of the call."""

    v: int
    fn: int
    param: int
    used: frozenset[int]


@dataclass(frozen=True)
class End:
    """A complete call of layout ``v``: the reply may end, or (where the surface chains calls)
    another call follow."""

    v: int


Node = Start | Names | Keys | Value | End


@dataclass(frozen=True)
class Edge:
    """A piece of fixed text out of a node, and the node entered once it is read.

    The matcher follows every edge, since targets write unlikely calls too. Drafts are choosier:
    ``drafted`` is false for an edge they never propose (beyond ``max_choices`` alternatives, or
    arguments for a function that declares none), and ``draft_through`` false for one whose
    draft stops at its own text (a second call's opener: which function is anyone's guess)."""

    text: str
    then: Node
    phase: str  # what `SchemaFSM.position` reports while inside the text
    rank: tuple[int, ...]  # its place among the node's drafts, likeliest first
    drafted: bool = True
    draft_through: bool = True


# ---- matcher configurations -------------------------------------------------------------------


class Lit(NamedTuple):
    """Inside fixed text ``text`` at ``offset``; ``then`` is entered when it is fully read."""

    text: str
    offset: int
    then: Node
    phase: str

    @staticmethod
    def of(edge: Edge) -> "Lit":
        return Lit(edge.text, 0, edge.then, edge.phase)


class Before(NamedTuple):
    """Free text before a call (prose), at `Start`; any character may start a call opener."""


class After(NamedTuple):
    """A complete call has been read: at ``node``."""

    node: End


class FreeKey(NamedTuple):
    """Inside an argument key the schema does not declare (models do invent keys), at ``node``;
    it ends at the key-value separator, and the call is followed again from its value on."""

    node: Keys
    text: str


MAX_FREE_KEY = 64  # characters; a longer "key" means the text is not a call any more


@dataclass
class InValue:
    """Inside the value at ``node``; ``scanner`` has read it so far."""

    node: Value
    scanner: JsonValueScanner

    def key(self) -> tuple:
        s = self.scanner
        return ("value", self.node, s.kind, s.text, s.in_string, s.escaped, tuple(s.stack), s.closed)


Config = Lit | Before | After | InValue | FreeKey


def _config_key(config: Config) -> tuple:
    return config.key() if isinstance(config, InValue) else (type(config).__name__,) + tuple(config)


class Proposal(NamedTuple):
    text: str
    eos: bool
    rank: tuple[int, ...]
    guess: bool = False  # bets that an open string ends here (ranked after retrieval and PLD)


class SchemaFSM:
    """Live match of the committed text against a compiled schema.

    Reading text (`sync`) and proposing (`proposals`) both walk the grammar through `_edges`
    (`_grammar`, memoized): `_enter` turns a node into live configurations, `_expand` into drafts."""

    def __init__(self, compiled: CompiledSchema, max_choices: int = 8, guess_value_end: bool = True):
        self.compiled = compiled
        self.layouts = compiled.layouts
        self.max_choices = max_choices
        self.guess_value_end = guess_value_end
        # both depend on the node alone: computed once per node and request (read-only lists)
        self._edge_memo: dict[Node, list[Edge]] = {}
        self._draft_memo: dict[Node, list[Proposal]] = {}
        self.reset()

    def reset(self) -> None:
        self.configs: list[Config] = [Before()]
        self.fed = ""

    # -- the grammar --

    def _edges(self, node: Node) -> list[Edge]:
        """`_grammar` of ``node``, once per node."""
        edges = self._edge_memo.get(node)
        if edges is None:
            edges = self._edge_memo[node] = self._grammar(node)
        return edges

    def _grammar(self, node: Node) -> list[Edge]:
        """The one interpreter of the node grammar: the fixed texts out of ``node``, in the order
        the matcher tries them (drafts reorder them by rank)."""
        if isinstance(node, Start):  # any layout's opener, the frozen rendering first
            return [Edge(x.scaffold.call_open, Names(v), "prefix", (v,)) for v, x in enumerate(self.layouts)]
        sc = self.layouts[node.v].scaffold
        if isinstance(node, Names):
            return self._name_edges(node, sc)
        if isinstance(node, Keys):
            return self._key_edges(node, sc)
        if isinstance(node, Value):
            return self._value_exits(node, sc)
        if sc.call_sep is None:  # End, in a surface that writes one call per reply
            return []
        # models rarely chain calls: rank the next opener low
        return [Edge(sc.call_sep + sc.call_open, Names(node.v), "prefix", (3,), draft_through=False)]

    def _name_edges(self, node: Names, sc: Scaffold) -> list[Edge]:
        """Each function with its arguments opened, or with none (ranked low for a function that
        has parameters). Arguments are followed even for a function that declares none (models
        add some), but not drafted."""
        out = []
        for fi, fn in enumerate(self.layouts[node.v].functions):
            listed = fi < self.max_choices
            keys = Keys(node.v, fi, frozenset(), -1)
            out.append(Edge(fn.name_text + sc.args_open, keys, "name", (fi,), listed and bool(fn.params)))
            no_args_rank = (fi, len(fn.params) + 1 if fn.params else 0)
            out.append(Edge(fn.name_text + sc.noargs_close, End(node.v), "name", no_args_rank, listed))
        return out

    def _key_edges(self, node: Keys, sc: Scaffold) -> list[Edge]:
        """Every parameter not given yet. Calls mostly follow the schema's order, so drafts rank
        the parameters after the latest given one first, then wrap around."""
        params = self.layouts[node.v].functions[node.fn].params
        free = [pi for pi in range(len(params)) if pi not in node.used]
        order = [pi for pi in free if pi > node.last] + [pi for pi in free if pi <= node.last]
        place = {pi: rank for rank, pi in enumerate(order)}
        return [
            Edge(params[pi].key_text + sc.kv_sep, Value(node.v, node.fn, pi, node.used | {pi}), "key",
                 (place[pi],), place[pi] < self.max_choices)
            for pi in free
        ]

    def _value_exits(self, node: Value, sc: Scaffold) -> list[Edge]:
        """The two ways out of a finished value: more keys, or the end of the call; the likelier
        first (more keys while a required parameter is still missing)."""
        params = self.layouts[node.v].functions[node.fn].params
        last = node.param if node.param != FREE_PARAM else max(node.used, default=-1)
        more = (sc.between, Keys(node.v, node.fn, node.used, last))
        done = (sc.args_close, End(node.v))
        missing_required = any(p.required and pi not in node.used for pi, p in enumerate(params))
        exits = [more, done] if missing_required else [done, more]
        return [Edge(text, then, "close", (rank,)) for rank, (text, then) in enumerate(exits)]

    # -- reading committed text --

    def sync(self, text: str) -> None:
        """Bring the match up to ``text`` (the whole committed output so far)."""
        while text.endswith("\ufffd"):  # a partial multi-byte character: wait for the rest
            text = text[:-1]
        if not text.startswith(self.fed):
            self.reset()  # committed text is never rewritten except a completed partial character
        for ch in text[len(self.fed) :]:
            self._feed(ch)
        self.fed = text

    def _feed(self, ch: str) -> None:
        seen: set[tuple] = set()
        nxt: list[Config] = []
        for config in self.configs:
            for out in self._step(config, ch):
                key = _config_key(out)
                if key not in seen:
                    seen.add(key)
                    nxt.append(out)
        if any(not isinstance(c, Lit) or c.phase != "prefix" for c in nxt if not isinstance(c, Before)):
            nxt = [c for c in nxt if not isinstance(c, Before)]  # a call has begun: no more prose
        # of several partial matches of one opener ("`" inside "```"), the longest is the real one
        longest: dict[str, int] = {}
        for c in nxt:
            if isinstance(c, Lit) and c.phase == "prefix":
                longest[c.text] = max(longest.get(c.text, -1), c.offset)
        self.configs = [
            c for c in nxt if not (isinstance(c, Lit) and c.phase == "prefix" and c.offset < longest[c.text])
        ] or [Before()]  # the text left every allowed call: wait for a new call to start

    def _enter(self, node: Node) -> list[Config]:
        """The live configurations once the text leading to ``node`` is read. Free text (a value,
        whatever follows a call) is one configuration that reads it and tries the node's edges
        after it; a choice of fixed texts (names, keys) is one configuration per text, so that
        each ranks by its own place among the live ones."""
        if isinstance(node, Value):
            return [InValue(node, JsonValueScanner())]
        if isinstance(node, End):
            return [After(node)]
        lits: list[Config] = [Lit.of(edge) for edge in self._edges(node)]
        return lits + [FreeKey(node, "")] if isinstance(node, Keys) else lits

    def _step(self, config: Config, ch: str) -> list[Config]:
        if isinstance(config, Before):  # kept last, so configurations that read more rank first
            return self._step_edges(Start(), ch) + [config]
        if isinstance(config, Lit):
            if config.text[config.offset] != ch:
                return []
            if config.offset + 1 == len(config.text):
                return self._enter(config.then)
            return [config._replace(offset=config.offset + 1)]
        if isinstance(config, FreeKey):
            return self._step_free_key(config, ch)
        if isinstance(config, InValue):
            scanner = config.scanner.copy()
            verdict = scanner.feed(ch)
            if verdict == "value":
                return [InValue(config.node, scanner)]
            if verdict == "error":
                return []
            return self._step_edges(config.node, ch)  # the value ended before ``ch``
        return self._step_edges(config.node, ch)  # After: another call may follow

    def _step_edges(self, node: Node, ch: str) -> list[Config]:
        out: list[Config] = []
        for edge in self._edges(node):
            out.extend(self._step(Lit.of(edge), ch))
        return out

    def _step_free_key(self, config: FreeKey, ch: str) -> list[Config]:
        node, text = config.node, config.text + ch
        kv_sep = self.layouts[node.v].scaffold.kv_sep
        if text.endswith(kv_sep) and len(text) > len(kv_sep):
            key = text[: -len(kv_sep)]
            if any(p.key_text == key for p in self.layouts[node.v].functions[node.fn].params):
                return []  # a declared key: its own configuration follows it
            return [InValue(Value(node.v, node.fn, FREE_PARAM, node.used), JsonValueScanner())]
        return [config._replace(text=text)] if len(text) <= MAX_FREE_KEY else []

    # -- where are we --

    def position(self) -> str:
        """Phase of the likeliest live configuration: before (also after the text left every
        call the schema allows: a later call may still start), prefix, name, key, value, close or
        after."""
        for config in self.configs:
            if isinstance(config, Lit):
                return config.phase
            if isinstance(config, InValue):
                return "value"
            if isinstance(config, After):
                return "after"
            if isinstance(config, FreeKey):
                return "key"
        return "before"

    def call_functions(self) -> frozenset[str]:
        """Names of the functions whose call the committed text may be writing right now: one
        once its name is written, several while a name is half written, none in prose, in a
        call's opener or after a finished call."""
        names: set[str] = set()
        for config in self.configs:
            node = config.node if isinstance(config, (InValue, FreeKey)) else getattr(config, "then", None)
            if isinstance(node, (Keys, Value)):
                names.add(self.layouts[node.v].functions[node.fn].name)
        return frozenset(names)

    # -- proposing --

    def proposals(self, max_drafts: int = 6) -> list[Proposal]:
        """Scaffold continuations of the committed text, best first, without duplicates."""
        found: list[tuple[tuple, Proposal]] = []
        for ci, config in enumerate(self.configs):
            for prop in self._expand_config(config):
                found.append(((prop.guess, sum(prop.rank), ci) + prop.rank, prop))
        found.sort(key=lambda item: item[0])
        out: list[Proposal] = []
        seen: set[tuple[str, bool]] = set()
        for _, prop in found:
            if (prop.text or prop.eos) and (prop.text, prop.eos) not in seen:
                seen.add((prop.text, prop.eos))
                out.append(prop)
                if len(out) >= max_drafts:
                    break
        return out

    def _expand_config(self, config: Config) -> list[Proposal]:
        if isinstance(config, Before):
            # prose: a call opener is proposed once its first character appears
            return [] if self.fed else self._expand_edges(Start())
        if isinstance(config, Lit):
            return self._prefixed(config.text[config.offset :], self._expand(config.then))
        if isinstance(config, After):
            return self._expand(config.node)
        if isinstance(config, FreeKey):
            return []
        return self._expand_value(config)

    def _expand(self, node: Node) -> list[Proposal]:
        """Drafts from the moment ``node`` is reached, each up to the next free text."""
        drafts = self._draft_memo.get(node)
        if drafts is None:
            drafts = self._draft_memo[node] = self._drafts_at(node)
        return drafts

    def _drafts_at(self, node: Node) -> list[Proposal]:
        if isinstance(node, Value):  # a value begins: only what the schema fixes about it
            return self._expand_value(InValue(node, JsonValueScanner())) or [Proposal("", False, ())]
        end = [Proposal("", True, (0,))] if isinstance(node, End) else []  # the reply may end here
        return end + self._expand_edges(node)

    def _expand_edges(self, node: Node) -> list[Proposal]:
        """The drafted edges out of ``node``, likeliest first, each continued by what follows it."""
        out: list[Proposal] = []
        for edge in sorted((e for e in self._edges(node) if e.drafted), key=lambda e: e.rank):
            tails = self._expand(edge.then) if edge.draft_through else []
            for prop in self._prefixed(edge.text, tails):
                out.append(prop._replace(rank=edge.rank + prop.rank))
        return out

    def _expand_value(self, config: InValue) -> list[Proposal]:
        node, scanner = config.node, config.scanner
        params = self.layouts[node.v].functions[node.fn].params
        param = params[node.param] if node.param != FREE_PARAM else UNDECLARED
        if scanner.complete:
            # closed string, literal or container: the scaffold after it is fixed. A number may
            # still grow, but numbers are short, so its end ranks with the scaffold, not the guesses
            return self._expand_edges(node)
        if scanner.kind == "string" and len(scanner.text) > 1 and not scanner.escaped and self.guess_value_end:
            # an open string may end at any point: bet on the closing quote plus what follows
            return [prop._replace(text='"' + prop.text, guess=True) for prop in self._expand_edges(node)[:1]]
        typed = scanner.text.lstrip()
        if param.choices:
            return [
                Proposal(choice[len(typed) :], False, (rank,))
                for rank, choice in enumerate(param.choices)
                if choice.startswith(typed) and len(choice) > len(typed)
            ]
        if not scanner.started and param.is_string:
            return [Proposal('"', False, ())]
        return []

    @staticmethod
    def _prefixed(head: str, tails: list[Proposal]) -> list[Proposal]:
        return [t._replace(text=head + t.text) for t in tails] or [Proposal(head, False, ())]


class SchemaFSMSource(DraftSource):
    """`SchemaFSM` as a draft source: scaffold text -> target tokens (+ EOS after a full call)."""

    name = "fsm"

    def __init__(self, max_drafts: int = 6, max_choices: int = 8, guess_value_end: bool = True,
                 layouts: bool = True):
        self.max_drafts = max_drafts
        self.max_choices = max_choices
        self.guess_value_end = guess_value_end
        self.layouts = layouts
        self.fsm: SchemaFSM | None = None
        self._eos: int | None = None
        self._tokenizer: Any = None

    def begin(self, ctx: DecodeContext) -> None:
        self._tokenizer = ctx.tokenizer
        self._eos = ctx.eos_token_ids[0] if ctx.eos_token_ids else None
        try:
            compiled = compile_schema(ctx.request.tools, ctx.surface, self.layouts)
            self.fsm = SchemaFSM(compiled, self.max_choices, self.guess_value_end)
        except SchemaCompileError as err:
            self.fsm = None
            ctx.trace.emit("fsm_fallback", reason=str(err), request=ctx.request.id)

    def propose(self, state: DecodeState) -> list[Draft]:
        """Scaffold drafts best first, then the guesses that an open value ends here (``guess``)."""
        if self.fsm is None:
            return []
        self.fsm.sync(state.text)
        fixed: list[Draft] = []
        guesses: list[Draft] = []
        for prop in self.fsm.proposals(self.max_drafts):
            tokens = tokens_continuing(self._tokenizer, state.output_ids, prop.text)
            if prop.eos and self._eos is not None:
                tokens = tokens + [self._eos]
            if tokens:
                (guesses if prop.guess else fixed).append(Draft(tokens, "fsm", guess=prop.guess))
        return fixed + guesses
