"""Draft sources: text -> tokens at token boundaries, JSON value ends, scaffold derivation, the
schema FSM (positions, proposals, bad-schema fallback), prompt lookup and call retrieval."""

from __future__ import annotations

import json
import random

import pytest

from ooospec.data.request import Call, Request
from ooospec.decoding.base import DecodeContext, DecodeState, Draft, EventTrace
from ooospec.decoding.json_value import JsonValueScanner
from ooospec.decoding.pld import PromptLookup
from ooospec.decoding.retrieval import CallRetrieval
from ooospec.decoding.scaffold import derive_scaffold
from ooospec.decoding.schema_fsm import (
    End, Keys, Names, SchemaCompileError, SchemaFSM, SchemaFSMSource, Start, Value, compile_schema,
)
from ooospec.decoding.text_drafts import tokens_continuing
from ooospec.decoding.layouts import BareJsonCall, json_layouts
from ooospec.models.formats import get_surface, surface_names
from ooospec.models.tiny import tiny_tokenizer

TOOLS = [
    {"name": "get_weather", "description": "Weather now.", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer"}}, "required": ["city"]}},
    {"name": "get_time", "description": "Time now.", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string"}, "exact": {"type": "boolean"}}, "required": []}},
    {"name": "ping", "description": "No arguments.", "parameters": {"type": "object", "properties": {}}},
]
CALLS = [
    Call("get_weather", {"city": "Paris", "unit": "c"}),
    Call("get_weather", {"city": "São Paulo, \"BR\"", "days": 3}),
    Call("get_time", {"exact": True, "zone": "UTC"}),
    Call("get_weather", {"city": "Oslo", "days": -2.5e3, "unit": "f"}),
    Call("ping", {}),
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def request(tools=TOOLS, rid="r0"):
    return Request(id=rid, benchmark="test", split="test", messages=[{"role": "user", "content": "hi"}],
                   tools=tools, gold=None)


def context(tokenizer, surface, tools=TOOLS, prompt="user: weather in Paris?", rid="r0"):
    return DecodeContext(request(tools, rid), tokenizer, surface,
                         tokenizer.encode(prompt, add_special_tokens=False), [tokenizer.eos_token_id],
                         EventTrace())


# ---- text -> tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_tokens_continuing_round_trips_text(tokenizer, seed):
    text = get_surface("qwen_fenced_json").render([CALLS[seed % len(CALLS)]])
    cut = random.Random(seed).randrange(1, len(text) - 1)
    committed = tokenizer.encode(text[:cut], add_special_tokens=False)
    draft = tokens_continuing(tokenizer, committed, text[cut:])
    assert tokenizer.decode(committed + draft) == text
    joint = tokenizer.encode(text, add_special_tokens=False)
    if joint[: len(committed)] == committed:  # no merge across the cut: the canonical tokens
        assert draft == joint[len(committed) :]


def test_tokens_continuing_when_the_tail_merges(tokenizer):
    # the committed text ends in '"' that the joint text would merge with the draft's ':' ('":')
    joint = tokenizer.encode('"name": "x"', add_special_tokens=False)
    committed = tokenizer.encode('"name"', add_special_tokens=False)
    assert joint[: len(committed)] != committed
    draft = tokens_continuing(tokenizer, committed, ': "x"')
    assert tokenizer.decode(committed + draft) == '"name": "x"'
    assert draft == tokenizer.encode(': "x"', add_special_tokens=False)
    assert tokens_continuing(tokenizer, committed, "") == []


# ---- JSON value ends -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ['"a\\"b,}"', "12", "-2.5e3", "true", "null", '{"a": [1, {"b": "]"}]}', "[]"])
def test_scanner_finds_the_end_of_a_value(value):
    scanner = JsonValueScanner()
    for ch in value:
        assert scanner.feed(ch) == "value"
    assert scanner.complete
    assert scanner.feed(",") == "end"


def test_scanner_rejects_what_cannot_be_a_value():
    assert JsonValueScanner().feed("x") == "error"
    scanner = JsonValueScanner()
    scanner.feed("1")
    scanner.feed("2")
    assert scanner.complete and scanner.feed("}") == "end"
    partial = JsonValueScanner()
    for ch in '"abc':
        partial.feed(ch)
    assert not partial.complete


# ---- scaffold and FSM ------------------------------------------------------------------------


@pytest.mark.parametrize("surface_name", surface_names())
def test_scaffold_pieces_rebuild_the_rendering(surface_name):
    surface = get_surface(surface_name)
    sc = derive_scaffold(surface)
    call = Call("f", {"a": 1, "b": "x"})
    assert surface.render([call]) == sc.call_open + "f" + sc.args_open + "a" + sc.kv_sep + "1" + sc.between + \
        "b" + sc.kv_sep + '"x"' + sc.args_close


def _scaffold_mask(surface, call: Call) -> tuple[str, list[bool]]:
    """The rendered text and, per character, whether the schema fixes it (not inside a value that
    the schema leaves free)."""
    text = surface.render([call])
    fixed = [True] * len(text)
    spec = {t["name"]: t["parameters"]["properties"] for t in TOOLS}[call.name]
    pos = 0
    for key, value in call.arguments.items():
        value_text = json.dumps(value, ensure_ascii=False)
        start = text.index(value_text, pos)
        free_from = start + (1 if spec[key].get("type") == "string" and "enum" not in spec[key] else 0)
        if "enum" in spec[key] or spec[key].get("type") == "boolean":
            free_from = start + len(value_text)  # the schema fixes the whole value
        for i in range(free_from, start + len(value_text)):
            fixed[i] = False
        pos = start + len(value_text)
    return text, fixed


@pytest.mark.parametrize("surface_name", surface_names())
@pytest.mark.parametrize("written_as", ["frozen", "bare"])
@pytest.mark.parametrize("call", CALLS, ids=lambda c: c.name + str(len(c.arguments)))
def test_fsm_predicts_every_fixed_character(surface_name, written_as, call):
    """Walking through a rendered call (in the frozen rendering, or as the bare call object the
    FSM also follows): wherever the next character is fixed by the schema, one of the FSM's
    proposals is a correct continuation of the text, and after the call one is EOS."""
    surface = get_surface(surface_name)
    fsm = SchemaFSM(compile_schema(TOOLS, surface))
    writer = BareJsonCall(surface) if written_as == "bare" else surface
    text, fixed = _scaffold_mask(writer, call)
    covered = 0
    for cut in range(len(text) + 1):
        fsm.sync(text[:cut])
        assert fsm.position() != "lost", (cut, text[:cut])
        proposals = fsm.proposals(max_drafts=32)
        if cut == len(text):
            assert any(p.eos and p.text == "" for p in proposals)
        elif fixed[cut]:
            correct = [p.text for p in proposals if p.text and text[cut:].startswith(p.text)]
            assert correct, (cut, text[:cut], proposals[:3])
            covered = max(covered, cut + max(map(len, correct)))
    assert covered == len(text)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_fsm_positions():
    surface = get_surface("qwen_fenced_json")
    fsm = SchemaFSM(compile_schema(TOOLS, surface))
    text = surface.render([CALLS[0]])
    expectations = {0: "before", 3: "prefix", text.index("get_w") + 2: "name", text.index("city") + 1: "key",
                    text.index("Paris") + 1: "value", text.index("Paris") + 7: "close", len(text): "after"}
    for cut, phase in expectations.items():
        fsm.sync(text[:cut])
        assert fsm.position() == phase, (cut, text[:cut])
    fsm.sync(text + "\nthen prose")  # the text left the call: wait quietly for another one
    assert fsm.position() == "before" and fsm.proposals() == []
    fsm.sync(text + "\nthen prose\n``")
    assert fsm.proposals()[0].text.startswith("`json\n{")


def test_fsm_follows_undeclared_keys_to_the_closers():
    fsm = SchemaFSM(compile_schema(TOOLS, get_surface("llama_json")))
    fsm.sync('{"name": "get_weather", "parameters": {"town')
    assert fsm.position() == "key" and fsm.proposals() == []
    fsm.sync('{"name": "get_weather", "parameters": {"town": "Oslo"')
    texts = [p.text for p in fsm.proposals(max_drafts=8)]
    assert ', "city": "' in texts  # the required key is still missing
    fsm.sync('{"name": "get_weather", "parameters": {"town": "Oslo", "city": "Oslo"')
    assert "}}" in [p.text for p in fsm.proposals(max_drafts=8)]


def test_fsm_proposes_names_then_keys_in_schema_order():
    surface = get_surface("llama_json")
    fsm = SchemaFSM(compile_schema(TOOLS, surface))
    fsm.sync('{"name": "get_')
    first = fsm.proposals(max_drafts=3)
    assert first[0].text == 'weather", "parameters": {"city": "'
    assert {p.text.split('"')[0] for p in fsm.proposals(max_drafts=8)} == {"weather", "time"}
    fsm.sync('{"name": "get_weather", "parameters": {"city": "Paris"')
    nxt = [p.text for p in fsm.proposals(max_drafts=4)]
    # no required parameter is missing: closing the call first, then the other keys in schema order
    assert nxt == ["}}", ', "unit": "c"', ', "unit": "f"', ', "days": ']


def test_fsm_grammar_says_what_fixed_text_leaves_each_node():
    """The node grammar in one place: the matcher follows every edge in schema order, drafts
    only the ranked ones (at most ``max_choices`` per node, no arguments for a function that
    declares none, a chained call's opener alone)."""
    fsm = SchemaFSM(compile_schema(TOOLS, get_surface("llama_json")), max_choices=2)
    edges = fsm._edges

    def rows(node):
        return [(e.text, e.then, e.rank, e.drafted) for e in edges(node)]

    assert rows(Start()) == [('{"name": "', Names(0), (0,), True)]
    assert rows(Names(0))[2:] == [
        ('get_time", "parameters": {"', Keys(0, 1, frozenset(), -1), (1,), True),
        ('get_time", "parameters": {}}', End(0), (1, 3), True),  # empty arguments: ranked low
        ('ping", "parameters": {"', Keys(0, 2, frozenset(), -1), (2,), False),  # past max_choices
        ('ping", "parameters": {}}', End(0), (2, 0), False),
    ]
    # after "unit" (index 1): "days" ranks first, then "city" wraps around, past max_choices=1
    narrow = SchemaFSM(fsm.compiled, max_choices=1)
    assert [(e.text, e.then, e.rank, e.drafted) for e in narrow._edges(Keys(0, 0, frozenset({1}), 1))] == [
        ('city": ', Value(0, 0, 0, frozenset({0, 1})), (1,), False),
        ('days": ', Value(0, 0, 2, frozenset({1, 2})), (0,), True),
    ]
    # the required "city" is missing: more keys first; given, the end of the call first
    assert [e.then for e in edges(Value(0, 0, 1, frozenset({1})))] == [Keys(0, 0, frozenset({1}), 1), End(0)]
    assert [e.then for e in edges(Value(0, 0, 0, frozenset({0})))] == [End(0), Keys(0, 0, frozenset({0}), 0)]
    # after a call: the end of the reply, or (ranked low) the next call's opener and no further
    assert [(p.text, p.eos, p.rank) for p in fsm._expand(End(0))] == [
        ("", True, (0,)), ('\n{"name": "', False, (3,)),
    ]


def test_bare_layout_is_derived_only_where_it_differs():
    assert [v.name for v in json_layouts(get_surface("qwen_fenced_json"))] == ["qwen_fenced_json+bare"]
    assert json_layouts(get_surface("llama_json")) == []
    compiled = compile_schema(TOOLS, get_surface("qwen_fenced_json"))
    assert [v.surface for v in compiled.layouts] == ["qwen_fenced_json", "qwen_fenced_json+bare"]
    fsm = SchemaFSM(compiled)
    fsm.sync('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"')
    best = fsm.proposals(max_drafts=1)[0]
    assert (best.text, best.eos, best.guess) == ("}}", True, False)


def test_open_values_get_guessed_ends_after_the_scaffold():
    fsm = SchemaFSM(compile_schema(TOOLS, get_surface("llama_json")))
    fsm.sync('{"name": "get_weather", "parameters": {"city": "Par')
    guesses = fsm.proposals()
    assert [(p.text, p.eos, p.guess) for p in guesses] == [('"}}', True, True)]  # nothing required left
    fsm.sync('{"name": "get_weather", "parameters": {"days": 1')
    props = fsm.proposals(max_drafts=8)
    assert props and not any(p.guess for p in props)  # a number may still grow, but rarely does
    assert props[0].text.startswith(', "city": "')  # the required city is still missing
    cautious = SchemaFSM(fsm.compiled, guess_value_end=False)
    cautious.sync('{"name": "get_weather", "parameters": {"city": "Par')
    assert cautious.proposals() == []


@pytest.mark.parametrize("tools, reason", [
    ([{"name": "f", "parameters": {"anyOf": [{"type": "object"}]}}], "anyOf"),
    ([{"name": "f", "parameters": {"type": "object"}}], "no properties"),
    ([{"name": "f"}], "not a JSON Schema object"),
    ([{"parameters": {"type": "object", "properties": {}}}], "has no name"),
    ([{"name": "f", "parameters": {"type": "object", "properties": {"a": "string"}}}], "not an object"),
    ([], "no tools"),
])
def test_uncompilable_schema_falls_back_with_a_logged_reason(tokenizer, tools, reason):
    with pytest.raises(SchemaCompileError, match=reason):
        compile_schema(tools, get_surface("qwen_fenced_json"))
    ctx = context(tokenizer, get_surface("qwen_fenced_json"), tools)
    source = SchemaFSMSource()
    source.begin(ctx)
    state = DecodeState(ctx)
    state.commit(tokenizer.encode("```", add_special_tokens=False))
    assert source.propose(state) == []
    events = ctx.trace.of_kind("fsm_fallback")
    assert len(events) == 1 and reason in events[0]["reason"]


def test_fsm_source_appends_eos_after_a_complete_call(tokenizer):
    surface = get_surface("hermes_tool_call")
    ctx = context(tokenizer, surface)
    source = SchemaFSMSource()
    source.begin(ctx)
    text = surface.render([CALLS[0]])
    state = DecodeState(ctx)
    state.commit(tokenizer.encode(text[:-3], add_special_tokens=False))
    drafts = source.propose(state)
    assert drafts[0].source == "fsm" and drafts[0].tokens[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(state.output_ids + drafts[0].tokens[:-1]) == text


# ---- prompt lookup and retrieval -------------------------------------------------------------


def _committed(ctx, ids):
    state = DecodeState(ctx)
    state.commit(ids)
    return state


def test_prompt_lookup_copies_from_prompt_and_output(tokenizer):
    ctx = context(tokenizer, None)
    ctx.prompt_ids = [1, 2, 3, 4, 5, 1, 2, 6]
    pld = PromptLookup(max_ngram=2, min_ngram=1, draft_len=3, max_drafts=3)
    pld.begin(ctx)
    state = _committed(ctx, [9, 1, 2])
    pld.observe(state, [9, 1, 2])
    drafts = pld.propose(state)
    # the bigram (1, 2) matches twice (latest first); then the unigram (2,) adds nothing new
    assert [d.tokens for d in drafts] == [[6, 9, 1], [3, 4, 5]]
    assert all(d.source == "pld" for d in drafts)
    state.commit([7])
    pld.observe(state, [7])
    assert pld.propose(state) == []  # 7 never occurred before


def test_retrieval_uses_only_earlier_outputs_of_the_run(tokenizer):
    surface = get_surface("llama_json")
    retrieval = CallRetrieval(max_ngram=4, min_ngram=2)
    text = surface.render([CALLS[0]])
    ids = tokenizer.encode(text, add_special_tokens=False)

    ctx = context(tokenizer, surface, rid="first")
    retrieval.begin(ctx)
    state = _committed(ctx, ids[:6])
    retrieval.observe(state, ids[:6])
    assert retrieval.propose(state) == []  # empty memory: nothing, not even the current request

    class Result:
        output_ids = ids + [tokenizer.eos_token_id]

    state = _committed(ctx, Result.output_ids)
    retrieval.end(state, Result())
    assert retrieval.memory[0].tools_called == frozenset({"get_weather"})

    ctx2 = context(tokenizer, surface, rid="second")
    retrieval.begin(ctx2)
    state2 = _committed(ctx2, ids[:6])
    retrieval.observe(state2, ids[:6])
    drafts = retrieval.propose(state2)
    assert drafts and drafts[0].source == "retrieval"
    assert drafts[0].tokens == Result.output_ids[6 : 6 + len(drafts[0].tokens)]
    assert len(drafts) <= 4 and len(drafts[0].tokens) <= 32


def test_toolspec_chains_the_scaffold_with_a_retrieved_value(tokenizer):
    from ooospec.decoding.toolspec import ToolSpec

    surface = get_surface("llama_json")
    toolspec = ToolSpec(retrieval=CallRetrieval(max_ngram=6, min_ngram=3))
    earlier = tokenizer.encode(surface.render([CALLS[0]]), add_special_tokens=False) + [tokenizer.eos_token_id]

    class Result:
        output_ids = earlier

    ctx = context(tokenizer, surface, rid="earlier")
    toolspec.begin(ctx)
    toolspec.end(_committed(ctx, earlier), Result())

    ctx = context(tokenizer, surface, rid="now")
    toolspec.begin(ctx)
    head = tokenizer.encode('{"name": "get_weather", "parameters": {"', add_special_tokens=False)
    state = _committed(ctx, head)
    toolspec.observe(state, head)
    drafts = toolspec.propose(state)
    assert drafts[0].source == "fsm" and tokenizer.decode(drafts[0].tokens) == 'city": "'
    chained = drafts[1]  # right after the best scaffold: it, continued from the memory
    assert chained.source == "retrieval" and chained.tokens[: len(drafts[0].tokens)] == drafts[0].tokens
    assert tokenizer.decode(chained.tokens) == 'city": "Paris", "unit": "c"}}' + tokenizer.eos_token
    toolspec.chain = False
    assert toolspec.propose(state)[1] != chained


def test_toolspec_uses_its_children_only_through_propose(tokenizer):
    """The composite's merge (scaffold, chained retrieval, retrieval, PLD fallback, guesses) works on
    any children that only implement `DraftSource.propose`: no private call into the FSM or memory."""
    from ooospec.decoding.base import DraftSource
    from ooospec.decoding.toolspec import ToolSpec

    class Fixed(DraftSource):
        name = "fixed"

        def __init__(self, drafts, follow=None):
            self.drafts, self.follow, self.asked = drafts, follow or {}, []

        def propose(self, state):
            self.asked.append(list(state.output_ids))
            return self.follow.get(len(state.output_ids), self.drafts)

    surface = get_surface("llama_json")
    ctx = context(tokenizer, surface)
    state = _committed(ctx, [5, 6])
    fsm = Fixed([Draft([1, 2], "fsm"), Draft([3], "fsm", guess=True), Draft([4], "fsm")])
    retrieval = Fixed([Draft([7, 8], "retrieval")], follow={4: [Draft([9], "retrieval")]})
    pld = Fixed([Draft([11], "pld")])
    toolspec = ToolSpec(fsm=fsm, retrieval=retrieval, pld=pld)
    drafts = toolspec.propose(state)
    assert [(d.tokens, d.source) for d in drafts] == [
        ([1, 2], "fsm"), ([1, 2, 9], "retrieval"), ([4], "fsm"), ([7, 8], "retrieval"), ([3], "fsm")]
    assert retrieval.asked == [[5, 6, 1, 2], [5, 6]]  # asked ahead of the scaffold, then as committed
    assert state.output_ids == [5, 6] and pld.asked == []  # the view left the state alone; PLD only as fallback
