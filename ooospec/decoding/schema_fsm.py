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

The match runs over the frozen rendering and its bare-object variant at once
(`ooospec.decoding.variants`): a target that drops its fence or indentation is still followed.
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
from ooospec.decoding.variants import json_variants
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
class Variant:
    """One rendering the FSM follows: its scaffold pieces and the function/key texts in it."""

    surface: str
    scaffold: Scaffold
    functions: tuple[FunctionSpec, ...]


@dataclass(frozen=True)
class CompiledSchema:
    variants: tuple[Variant, ...]  # the target's frozen rendering first

    @property
    def scaffold(self) -> Scaffold:
        return self.variants[0].scaffold

    @property
    def functions(self) -> tuple[FunctionSpec, ...]:
        return self.variants[0].functions


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


def _compile_variant(tools: list[dict[str, Any]], surface: SurfaceFormat) -> Variant:
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
    return Variant(surface.name, scaffold, tuple(functions))


def compile_schema(tools: list[dict[str, Any]], surface: SurfaceFormat | None,
                   variants: bool = True) -> CompiledSchema:
    """Compile ``tools`` (OpenAI-style function specs) for ``surface`` (plus its looser JSON
    variants, see `ooospec.decoding.variants`) or raise `SchemaCompileError`."""
    if surface is None:
        raise SchemaCompileError("no surface format for this target")
    if not tools:
        raise SchemaCompileError("the request offers no tools")
    compiled = [_compile_variant(tools, surface)]
    for extra in json_variants(surface) if variants else []:
        try:
            compiled.append(_compile_variant(tools, extra))
        except SchemaCompileError:
            continue  # a variant is optional; the frozen rendering compiled
    return CompiledSchema(tuple(compiled))


# ---- matcher configurations -------------------------------------------------------------------
# A node is where a piece of fixed text leads, always tagged with its variant v:
# ("names", v), ("keys", v, fn, used, last), ("value", v, fn, param, used) or ("after", v).


class Lit(NamedTuple):
    """Inside fixed text ``text`` at ``offset``; ``then`` is entered when it is fully read."""

    text: str
    offset: int
    then: tuple
    phase: str


class Before(NamedTuple):
    """Free text before a call (prose); any character may start a call opener."""


class After(NamedTuple):
    """A complete call of variant ``v`` has been read."""

    v: int


class FreeKey(NamedTuple):
    """Inside an argument key the schema does not declare (models do invent keys); it ends at the
    key-value separator, and the call is followed again from its value on."""

    v: int
    fn: int
    used: frozenset[int]
    last: int
    text: str


MAX_FREE_KEY = 64  # characters; a longer "key" means the text is not a call any more


@dataclass
class InValue:
    v: int
    fn: int
    param: int
    used: frozenset[int]
    scanner: JsonValueScanner

    def key(self) -> tuple:
        s = self.scanner
        return ("value", self.v, self.fn, self.param, self.used, s.kind, s.text, s.in_string, s.escaped,
                tuple(s.stack), s.closed)


Config = Lit | Before | After | InValue | FreeKey


def _config_key(config: Config) -> tuple:
    return config.key() if isinstance(config, InValue) else (type(config).__name__,) + tuple(config)


class Proposal(NamedTuple):
    text: str
    eos: bool
    rank: tuple[int, ...]
    guess: bool = False  # bets that an open string ends here (ranked after retrieval and PLD)


class SchemaFSM:
    """Live match of the committed text against a compiled schema."""

    def __init__(self, compiled: CompiledSchema, max_choices: int = 8, guess_value_end: bool = True):
        self.compiled = compiled
        self.variants = compiled.variants
        self.max_choices = max_choices
        self.guess_value_end = guess_value_end
        self.reset()

    def reset(self) -> None:
        self.configs: list[Config] = [Before()]
        self.fed = ""

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

    def _opener(self, v: int, after_call: bool = False) -> Lit:
        sc = self.variants[v].scaffold
        text = (sc.call_sep or "") + sc.call_open if after_call else sc.call_open
        return Lit(text, 0, ("names", v), "prefix")

    def _enter(self, node: tuple) -> list[Config]:
        kind, v = node[0], node[1]
        variant = self.variants[v]
        sc = variant.scaffold
        if kind == "names":
            out: list[Config] = []
            for fi, fn in enumerate(variant.functions):
                # arguments are followed even for a function that declares none (models add some)
                out.append(Lit(fn.name_text + sc.args_open, 0, ("keys", v, fi, frozenset(), -1), "name"))
                out.append(Lit(fn.name_text + sc.noargs_close, 0, ("after", v), "name"))
            return out
        if kind == "keys":
            _, _, fi, used, last = node
            known: list[Config] = [
                Lit(p.key_text + sc.kv_sep, 0, ("value", v, fi, pi, used | {pi}), "key")
                for pi, p in enumerate(variant.functions[fi].params)
                if pi not in used
            ]
            return known + [FreeKey(v, fi, used, last, "")]
        if kind == "value":
            _, _, fi, pi, used = node
            return [InValue(v, fi, pi, used, JsonValueScanner())]
        return [After(v)]

    def _step(self, config: Config, ch: str) -> list[Config]:
        if isinstance(config, Before):  # kept last, so configurations that read more rank first
            out: list[Config] = []
            for v in range(len(self.variants)):
                out.extend(self._step(self._opener(v), ch))
            return out + [config]
        if isinstance(config, Lit):
            if config.text[config.offset] != ch:
                return []
            if config.offset + 1 == len(config.text):
                return self._enter(config.then)
            return [config._replace(offset=config.offset + 1)]
        if isinstance(config, FreeKey):
            text = config.text + ch
            kv_sep = self.variants[config.v].scaffold.kv_sep
            if text.endswith(kv_sep) and len(text) > len(kv_sep):
                key = text[: -len(kv_sep)]
                if any(p.key_text == key for p in self.variants[config.v].functions[config.fn].params):
                    return []  # a declared key: its own configuration follows it
                return [InValue(config.v, config.fn, FREE_PARAM, config.used, JsonValueScanner())]
            return [config._replace(text=text)] if len(text) <= MAX_FREE_KEY else []
        if isinstance(config, InValue):
            scanner = config.scanner.copy()
            verdict = scanner.feed(ch)
            if verdict == "value":
                return [InValue(config.v, config.fn, config.param, config.used, scanner)]
            if verdict == "error":
                return []
            out = []
            for lit in self._after_value(config):
                out.extend(self._step(lit, ch))
            return out
        if self.variants[config.v].scaffold.call_sep is not None:  # After: another call may follow
            return self._step(self._opener(config.v, after_call=True), ch)
        return []

    def _after_value(self, config: InValue) -> list[Lit]:
        """The two ways out of a finished value: more keys, or the end of the call; the likelier
        first (more keys while a required parameter is still missing)."""
        sc = self.variants[config.v].scaffold
        params = self.variants[config.v].functions[config.fn].params
        last = config.param if config.param != FREE_PARAM else max(config.used, default=-1)
        more = Lit(sc.between, 0, ("keys", config.v, config.fn, config.used, last), "close")
        done = Lit(sc.args_close, 0, ("after", config.v), "close")
        if len(config.used) == len(params):
            return [done, more]  # every declared key given: only an undeclared one could follow
        missing_required = any(p.required and i not in config.used for i, p in enumerate(params))
        return [more, done] if missing_required else [done, more]

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
            if self.fed:
                return []  # prose: a call opener is proposed once its first character appears
            out = []
            for v in range(len(self.variants)):  # the frozen rendering first
                for prop in self._prefixed(self._opener(v).text, self._expand_node(("names", v))):
                    out.append(prop._replace(rank=(v,) + prop.rank))
            return out
        if isinstance(config, Lit):
            return self._prefixed(config.text[config.offset :], self._expand_node(config.then))
        if isinstance(config, After):
            return self._expand_node(("after", config.v))
        if isinstance(config, FreeKey):
            return []
        return self._expand_value(config)

    def _expand_value(self, config: InValue) -> list[Proposal]:
        params = self.variants[config.v].functions[config.fn].params
        param = params[config.param] if config.param != FREE_PARAM else UNDECLARED
        scanner = config.scanner
        if scanner.complete:
            # closed string, literal or container: the scaffold after it is fixed. A number may
            # still grow, but numbers are short, so its end ranks with the scaffold, not the guesses
            return self._after_value_text(config, "")
        if scanner.kind == "string" and len(scanner.text) > 1 and not scanner.escaped and self.guess_value_end:
            # an open string may end at any point: bet on the closing quote plus what follows
            return [prop._replace(guess=True) for prop in self._after_value_text(config, '"')[:1]]
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

    def _after_value_text(self, config: InValue, closer: str) -> list[Proposal]:
        out: list[Proposal] = []
        for rank, lit in enumerate(self._after_value(config)):
            for prop in self._prefixed(closer + lit.text, self._expand_node(lit.then)):
                out.append(prop._replace(rank=(rank,) + prop.rank))
        return out

    def _expand_node(self, node: tuple) -> list[Proposal]:
        kind, v = node[0], node[1]
        variant = self.variants[v]
        sc = variant.scaffold
        if kind == "names":
            out: list[Proposal] = []
            for fi, fn in enumerate(variant.functions[: self.max_choices]):
                if fn.params:
                    head = fn.name_text + sc.args_open
                    for prop in self._prefixed(head, self._expand_node(("keys", v, fi, frozenset(), -1))):
                        out.append(prop._replace(rank=(fi,) + prop.rank))
                tail = self._prefixed(fn.name_text + sc.noargs_close, self._expand_node(("after", v)))
                for prop in tail:  # an empty argument map is the unlikely way for a function with params
                    out.append(prop._replace(rank=(fi, len(fn.params) + 1 if fn.params else 0) + prop.rank))
            return out
        if kind == "keys":
            _, _, fi, used, last = node
            params = variant.functions[fi].params
            order = [i for i in range(last + 1, len(params)) if i not in used]
            order += [i for i in range(0, last + 1) if i not in used]
            out = []
            for rank, pi in enumerate(order[: self.max_choices]):
                head = params[pi].key_text + sc.kv_sep
                for prop in self._prefixed(head, self._expand_node(("value", v, fi, pi, used | {pi}))):
                    out.append(prop._replace(rank=(rank,) + prop.rank))
            return out
        if kind == "after":
            out = [Proposal("", True, (0,))]
            if sc.call_sep is not None:  # models rarely chain calls: rank it low
                out.append(Proposal(self._opener(v, after_call=True).text, False, (3,)))
            return out
        _, _, fi, pi, used = node
        return self._expand_value(InValue(v, fi, pi, used, JsonValueScanner())) or [Proposal("", False, ())]

    @staticmethod
    def _prefixed(head: str, tails: list[Proposal]) -> list[Proposal]:
        return [t._replace(text=head + t.text) for t in tails] or [Proposal(head, False, ())]


class SchemaFSMSource(DraftSource):
    """`SchemaFSM` as a draft source: scaffold text -> target tokens (+ EOS after a full call)."""

    name = "fsm"

    def __init__(self, max_drafts: int = 6, max_choices: int = 8, guess_value_end: bool = True,
                 variants: bool = True):
        self.max_drafts = max_drafts
        self.max_choices = max_choices
        self.guess_value_end = guess_value_end
        self.variants = variants
        self.fsm: SchemaFSM | None = None
        self._eos: int | None = None
        self._tokenizer: Any = None

    def begin(self, ctx: DecodeContext) -> None:
        self._tokenizer = ctx.tokenizer
        self._eos = ctx.eos_token_ids[0] if ctx.eos_token_ids else None
        try:
            compiled = compile_schema(ctx.request.tools, ctx.surface, self.variants)
            self.fsm = SchemaFSM(compiled, self.max_choices, self.guess_value_end)
        except SchemaCompileError as err:
            self.fsm = None
            ctx.trace.emit("fsm_fallback", reason=str(err), request=ctx.request.id)

    def propose_split(self, state: DecodeState) -> tuple[list[Draft], list[Draft]]:
        """(scaffold drafts, guesses that an open value ends here), each best first."""
        if self.fsm is None:
            return [], []
        self.fsm.sync(state.text)
        fixed: list[Draft] = []
        guesses: list[Draft] = []
        for prop in self.fsm.proposals(self.max_drafts):
            tokens = tokens_continuing(self._tokenizer, state.output_ids, prop.text)
            if prop.eos and self._eos is not None:
                tokens = tokens + [self._eos]
            if tokens:
                (guesses if prop.guess else fixed).append(Draft(tokens, "fsm"))
        return fixed, guesses

    def propose(self, state: DecodeState) -> list[Draft]:
        fixed, guesses = self.propose_split(state)
        return fixed + guesses
