"""Schema FSM vs xgrammar vs llguidance: forced continuations on the bench requests' gold calls.

Read-only use of the repository (ooospec on sys.path); needs its own venv with xgrammar==0.2.9 and llguidance==1.9.1 (see README.md here). Run with one core:
    OMP_NUM_THREADS=1 RAYON_NUM_THREADS=1 taskset -c 0 venv/bin/python compare.py [--n 30]

For every (target, benchmark) the first --n requests of the bench's seeded sample (seed 0, only
requests with gold calls) are rendered in the target's frozen surface (`surface.for_request`),
tokenized with the target tokenizer, and followed by EOS. Configurations:

  ours              SchemaFSMSource.propose (all drafts: scaffold + guesses, max 6)
  ours-top1         its first draft only (a single draft, like a library's forced string)
  xgr-native        xgrammar: JSON Schema of the whole call (anyOf over tools: name const +
                    argument schema), json.dumps-style layout via indent/separators, fence and
                    call separator via Grammar.concat/union
  llg-native        llguidance: lark `%json{...}` of the same schema, x-guidance separators;
                    no indent option, so the fenced surface uses flexible whitespace
  xgr-layout        the surface's own scaffold (derive_scaffold) as an exact grammar around
  llg-layout        per-parameter value schemas (keys in schema order, optional keys skippable)

Per position (pass A): the proposal made after committing gold[:i], scored by its common
prefix with gold[i:]. Per round (pass B): greedy speculative rounds, accepted = longest common
prefix over the drafts, then the target's own token (+1). Library drafts: forced text ->
tokens with the same `tokens_continuing` our FSM uses, + EOS when the matcher would then be
accepting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import jsonschema  # noqa: E402
import llguidance as llg  # noqa: E402
import llguidance.hf  # noqa: E402
import xgrammar as xgr  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from ooospec.bench.sampling import sample_requests  # noqa: E402
from ooospec.decoding.tree import shared_prefix as common_prefix  # noqa: E402
from ooospec.data.request import Call, read_requests  # noqa: E402
from ooospec.decoding.base import DecodeContext, DecodeState  # noqa: E402
from ooospec.decoding.scaffold import derive_scaffold, function_text, key_text  # noqa: E402
from ooospec.decoding.schema_fsm import SchemaFSMSource  # noqa: E402
from ooospec.decoding.text_drafts import tokens_continuing  # noqa: E402
from ooospec.models.formats import get_surface  # noqa: E402

MAIN = Path(__file__).resolve().parents[2]
TARGETS = {
    "qwen2.5-coder-0.5b": ("qwen2.5-coder-0.5b-instruct", "qwen_fenced_json", "<|im_end|>"),
    "smollm2-135m-tool": ("smollm2-135m-instruct", "llama_json", "<|im_end|>"),
}
BENCHMARKS = ("apibank", "bfcl", "toolalpaca")
MAX_CALLS = 4  # calls a library grammar allows in one answer (unrolled for xgrammar)


# ---------------------------------------------------------------- grammar pieces


def args_key(surface) -> str:
    return "arguments" if '"arguments"' in surface.render([Call("f", {"a": 1})]) else "parameters"


def strict(schema: Any) -> Any:
    """Argument object schema with additionalProperties false unless the tool says otherwise
    (xgrammar's strict_mode does this everywhere; done here so both libraries see the same)."""
    s = dict(schema) if isinstance(schema, dict) else {"type": "object"}
    s.setdefault("type", "object")
    s.setdefault("properties", {})
    s.setdefault("additionalProperties", False)
    return s


def call_schema(tools: list[dict], akey: str) -> dict:
    cases = [
        {"type": "object", "properties": {"name": {"const": t["name"]}, akey: strict(t.get("parameters"))},
         "required": ["name", akey], "additionalProperties": False}
        for t in tools
    ]
    return cases[0] if len(cases) == 1 else {"anyOf": cases}


def layout_of(surface) -> dict:
    """The surface's style: the text around the call object and json.dumps-like options."""
    text = surface.render([Call("f", {"a": 1, "b": [1, 2]})])
    start, end = text.find("{"), text.rfind("}")
    body = text[start : end + 1]
    indent = None
    if body.startswith("{\n"):
        indent = len(body.split("\n")[1]) - len(body.split("\n")[1].lstrip(" "))
    sc = derive_scaffold(surface)
    return {"pre": text[:start], "post": text[end + 1 :], "indent": indent, "call_sep": sc.call_sep}


# AST for the layout grammar: ("lit", text) | ("val", schema) | ("seq", [..]) | ("alt", [..])


def layout_ast(tools: list[dict], surface) -> tuple:
    sc = derive_scaffold(surface)
    calls = []
    for t in tools:
        params = (t.get("parameters") or {}).get("properties") or {}
        required = set((t.get("parameters") or {}).get("required") or [])
        fn = function_text(surface, sc, t["name"])
        names = list(params)
        kv = [(key_text(surface, sc, k) + sc.kv_sep, params[k] if isinstance(params[k], dict) else {}) for k in names]
        # A[i]: keys i.. after at least one key; B[i]: keys i.. with none written yet (non-empty)
        A: dict[int, tuple] = {len(names): ("seq", [])}
        B: dict[int, tuple | None] = {len(names): None}
        for i in range(len(names) - 1, -1, -1):
            item = ("seq", [("lit", sc.between + kv[i][0]), ("val", kv[i][1])])
            first = ("seq", [("lit", kv[i][0]), ("val", kv[i][1]), A[i + 1]])
            if names[i] in required:
                A[i] = ("seq", [item, A[i + 1]])
                B[i] = first
            else:
                A[i] = ("alt", [("seq", [item, A[i + 1]]), A[i + 1]])
                B[i] = ("alt", [first, B[i + 1]]) if B[i + 1] is not None else first
        # an empty argument map only where the schema allows it (a library cannot rank it low)
        alts = [] if required & set(names) else [("lit", fn + sc.noargs_close)]
        if B[0] is not None:
            alts.insert(0, ("seq", [("lit", fn + sc.args_open), B[0], ("lit", sc.args_close)]))
        calls.append(("alt", alts))
    one = ("seq", [("lit", sc.call_open), ("alt", calls)])
    return one, sc.call_sep


def _lark_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def lark_from_ast(one: tuple, call_sep: str | None, value_opts: dict) -> str:
    rules: list[str] = []

    def emit(node) -> str:
        kind, body = node
        if kind == "lit":
            return _lark_str(body) if body else '""'
        if kind == "val":
            name = f"v{len(rules)}"
            rules.append(f"{name}: %json {json.dumps({**body, 'x-guidance': value_opts})}")
            return name
        parts = [emit(x) for x in body]
        if kind == "seq":
            return "(" + " ".join(parts) + ")" if parts else '""'
        return "(" + " | ".join(parts) + ")"

    call = emit(one)
    rules.insert(0, f"call: {call}")
    sep = f"({_lark_str(call_sep)} call)*" if call_sep is not None else ""
    return f"start: call {sep}\n" + "\n".join(rules) + "\n"


def xgr_from_ast(one: tuple, call_sep: str | None, value_kw: dict) -> "xgr.Grammar":
    def lit(text: str):
        return xgr.Grammar.from_ebnf(f"root ::= {_lark_str(text)}")

    def emit(node):
        kind, body = node
        if kind == "lit":
            return lit(body)
        if kind == "val":
            return xgr.Grammar.from_json_schema(json.dumps(body), **value_kw)
        parts = [emit(x) for x in body]
        if not parts:
            return lit("")
        if len(parts) == 1:
            return parts[0]
        return xgr.Grammar.concat(*parts) if kind == "seq" else xgr.Grammar.union(*parts)

    return unroll_calls(emit(one), call_sep, lit)


def unroll_calls(one, call_sep, lit):
    if call_sep is None:
        return one
    g = one
    for _ in range(MAX_CALLS - 1):
        g = xgr.Grammar.concat(one, xgr.Grammar.union(lit(""), xgr.Grammar.concat(lit(call_sep), g)))
    return g


# ---------------------------------------------------------------- proposers


class Proposer:
    name = "?"
    advance_timed = True  # ours: advancing = the loop's commit (decode); its sync is in propose

    def begin(self, request, surface) -> float: ...
    def advance(self, ids: list[int]) -> None: ...
    def propose(self, committed: list[int]) -> list[list[int]]: ...


class Ours(Proposer):
    def __init__(self, tok, eos, top1=False):
        self.tok, self.eos, self.top1 = tok, eos, top1
        self.name = "ours-top1" if top1 else "ours"
        self.advance_timed = False

    def begin(self, request, surface):
        t0 = time.perf_counter()
        self.src = SchemaFSMSource()
        ctx = DecodeContext(request, self.tok, surface, [], [self.eos])
        self.src.begin(ctx)
        dt = time.perf_counter() - t0
        self.state = DecodeState(ctx)
        self.error = None if self.src.fsm is not None else ctx.trace.of_kind("fsm_fallback")[0]["reason"]
        return dt

    def advance(self, ids):
        self.state.commit(list(ids))
        self.state.text  # decode of the committed ids: the loop's job, not timed

    def propose(self, committed):
        drafts = [d.tokens for d in self.src.propose(self.state)]  # scaffold drafts, then guesses
        return drafts[:1] if self.top1 else drafts


class Library(Proposer):
    """Common part: forced text -> tokens (tokens_continuing, as our FSM) + EOS if accepting."""

    def __init__(self, tok, eos):
        self.tok, self.eos = tok, eos
        self.dead_at: int | None = None

    def draft(self, committed: list[int], forced: str, accepting_after) -> list[list[int]]:
        toks = tokens_continuing(self.tok, committed, forced) if forced else []
        if accepting_after(forced, toks):
            toks = toks + [self.eos]
        return [toks] if toks else []


class XGr(Library):
    def __init__(self, tok, eos, vocab_size, mode):
        super().__init__(tok, eos)
        self.mode = mode
        self.name = f"xgr-{mode}"
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)

    def grammar(self, request, surface):
        lay = layout_of(surface)
        lit = lambda s: xgr.Grammar.from_ebnf(f"root ::= {_lark_str(s)}")  # noqa: E731
        if self.mode == "native":
            kw = dict(any_whitespace=False, indent=lay["indent"],
                      separators=(",", ": ") if lay["indent"] is not None else (", ", ": "))
            body = xgr.Grammar.from_json_schema(json.dumps(call_schema(request.tools, args_key(surface))), **kw)
            parts = [p for p in (lay["pre"] and lit(lay["pre"]), body, lay["post"] and lit(lay["post"])) if p]
            one = xgr.Grammar.concat(*parts) if len(parts) > 1 else body
            return unroll_calls(one, lay["call_sep"], lit)
        one, sep = layout_ast(request.tools, surface)
        if lay["indent"] is not None:  # values nest at depth >= 2: no indent option fits, any whitespace
            value_kw = dict(any_whitespace=True)
        else:
            value_kw = dict(any_whitespace=False, separators=(", ", ": "))
        return xgr_from_ast(one, sep, value_kw)

    def begin(self, request, surface):
        self.dead_at, self.fed = None, 0
        t0 = time.perf_counter()
        try:
            cg = self.compiler.compile_grammar(self.grammar(request, surface))
            self.m = xgr.GrammarMatcher(cg, terminate_without_stop_token=True)
            self.error = None
        except Exception as err:  # noqa: BLE001
            self.m, self.error = None, f"{type(err).__name__}: {err}"[:300]
        return time.perf_counter() - t0

    def advance(self, ids):
        if self.m is None or self.dead_at is not None:
            return
        for i in ids:
            if i == self.eos:
                continue
            if not self.m.accept_token(i):
                self.dead_at, self.dead_pos = i, self.fed
                return
            self.fed += 1

    def propose(self, committed):
        if self.m is None or self.dead_at is not None:
            return []
        forced = self.m.find_jump_forward_string()

        def accepting_after(text, toks):
            if not text:
                return self.m.is_completed()
            fork = self.m.fork()
            return fork.accept_string(text) and fork.is_completed()

        return self.draft(committed, forced, accepting_after)


class LLg(Library):
    def __init__(self, tok, eos, mode):
        super().__init__(tok, eos)
        self.mode = mode
        self.name = f"llg-{mode}"
        self.lt = llguidance.hf.from_tokenizer(tok, eos_token=eos)

    def grammar(self, request, surface):
        lay = layout_of(surface)
        if lay["indent"] is not None:  # llguidance has no indent option
            opts = {"whitespace_flexible": True, "item_separator": ",", "key_separator": ": ", "lenient": True}
        else:
            opts = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}
        if self.mode == "native":
            schema = {**call_schema(request.tools, args_key(surface)), "x-guidance": opts}
            pre = _lark_str(lay["pre"]) if lay["pre"] else ""
            post = _lark_str(lay["post"]) if lay["post"] else ""
            sep = f"({_lark_str(lay['call_sep'])} call)*" if lay["call_sep"] is not None else ""
            return f"start: call {sep}\ncall: {pre} body {post}\nbody: %json {json.dumps(schema)}\n"
        one, sep = layout_ast(request.tools, surface)
        return lark_from_ast(one, sep, opts)

    def begin(self, request, surface):
        self.dead_at, self.fed = None, 0
        t0 = time.perf_counter()
        self.m = llg.LLMatcher(self.lt, self.grammar(request, surface), log_level=0)
        dt = time.perf_counter() - t0
        self.error = self.m.get_error()[:300] if self.m.is_error() else None
        if self.error:
            self.m = None
        return dt

    def advance(self, ids):
        if self.m is None or self.dead_at is not None:
            return
        for i in ids:
            if i == self.eos:
                continue
            if not self.m.consume_token(i):
                self.dead_at, self.dead_pos = i, self.fed
                return
            self.fed += 1

    def propose(self, committed):
        if self.m is None or self.dead_at is not None:
            return []
        forced = self.m.compute_ff_bytes().decode("utf-8", errors="ignore")

        def accepting_after(text, toks):
            if not text:
                return self.m.is_accepting()
            fork = self.m.deep_copy()
            return fork.consume_tokens(toks) and fork.is_accepting()

        return self.draft(committed, forced, accepting_after)


# ---------------------------------------------------------------- measurement


@dataclass
class Tally:
    positions: int = 0
    covered: int = 0  # positions whose proposal's first token is the gold token
    prefix_sum: int = 0  # sum over positions of the matched prefix length
    accepted: int = 0  # pass B: tokens accepted in greedy rounds
    rounds: int = 0
    compile_s: list[float] = field(default_factory=list)
    query_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    per_request: dict = field(default_factory=dict)
    dead: list[str] = field(default_factory=list)


def walk(p: Proposer, request, surface, gold: list[int], t: Tally) -> None:
    # pass A: every position
    t.compile_s.append(p.begin(request, surface))
    if getattr(p, "error", None):
        t.errors.append(f"{request.id}: {p.error}")
    for i in range(len(gold)):
        a0 = time.perf_counter()
        if i:
            p.advance(gold[i - 1 : i])
        a1 = time.perf_counter()
        drafts = p.propose(gold[:i])
        q = time.perf_counter() - a1
        t.query_s.append(q + (a1 - a0 if p.advance_timed else 0.0))
        best = max((common_prefix(d, gold[i:]) for d in drafts), default=0)
        t.positions += 1
        t.covered += best > 0
        t.prefix_sum += best
    if isinstance(p, Library) and p.dead_at is not None:
        t.dead.append(f"{request.id} @ {p.tok.decode(gold[:p.dead_pos])[-40:]!r} + {p.tok.decode([p.dead_at])!r}")
    # pass B: greedy rounds
    p.begin(request, surface)
    pos, acc0, r0 = 0, t.accepted, t.rounds
    while pos < len(gold):
        drafts = p.propose(gold[:pos])
        acc = max((common_prefix(d, gold[pos:]) for d in drafts), default=0)
        t.accepted += acc
        t.rounds += 1
        step = gold[pos : pos + acc + 1]
        pos += len(step)
        p.advance(step)
    t.per_request[request.id] = (t.accepted - acc0, t.rounds - r0, len(gold))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    args = ap.parse_args()
    data = MAIN / "artifacts" / "data"
    results: dict[str, Any] = {"n": args.n, "versions": {
        "xgrammar": xgr.__version__ if hasattr(xgr, "__version__") else "?", "llguidance": llg.get_version() if hasattr(llg, "get_version") else "?"}}
    rows = []
    for target, (model, surface_name, eos_text) in TARGETS.items():
        tok = AutoTokenizer.from_pretrained(MAIN / "artifacts" / "models" / model)
        eos = tok.convert_tokens_to_ids(eos_text)
        vocab = json.loads((MAIN / "artifacts" / "models" / model / "config.json").read_text())["vocab_size"]
        base = get_surface(surface_name)
        proposers = [Ours(tok, eos), Ours(tok, eos, top1=True), XGr(tok, eos, vocab, "native"),
                     LLg(tok, eos, "native"), XGr(tok, eos, vocab, "layout"), LLg(tok, eos, "layout")]
        for bench in BENCHMARKS:
            reqs = [r for r in read_requests(data / f"eval_{bench}.jsonl") if r.gold]
            reqs = sample_requests(reqs, args.n, 0, bench)
            tallies = {p.name: Tally() for p in proposers}
            invalid = out_of_order = 0
            for r in reqs:
                surface = base.for_request(r)
                calls = [Call(c.name, c.arguments) for c in r.gold]
                text = surface.render(calls)
                gold = list(tok.encode(text, add_special_tokens=False)) + [eos]
                by_name = {t["name"]: t for t in r.tools}
                for c in calls:  # gold that the tool schema itself rejects
                    tool = by_name.get(c.name)
                    try:
                        if tool is None:
                            raise jsonschema.ValidationError("unknown function")
                        jsonschema.validate(c.arguments, strict(tool.get("parameters")))
                    except jsonschema.ValidationError:
                        invalid += 1
                        break
                    except jsonschema.SchemaError:
                        invalid += 1
                        break
                for c in calls:
                    props = list(((by_name.get(c.name) or {}).get("parameters") or {}).get("properties") or {})
                    keys = [k for k in c.arguments if k in props]
                    if keys != sorted(keys, key=props.index):
                        out_of_order += 1
                        break
                for p in proposers:
                    walk(p, r, surface, gold, tallies[p.name])
            for name, t in tallies.items():
                rows.append({
                    "target": target, "benchmark": bench, "config": name, "requests": len(reqs),
                    "gold_invalid_vs_schema": invalid, "gold_keys_not_in_schema_order": out_of_order, "positions": t.positions, "covered": t.covered,
                    "prefix_sum": t.prefix_sum, "accepted": t.accepted, "rounds": t.rounds,
                    "compile_ms_median": 1e3 * statistics.median(t.compile_s),
                    "query_us_median": 1e6 * statistics.median(t.query_s),
                    "query_us_p90": 1e6 * sorted(t.query_s)[int(0.9 * len(t.query_s))],
                    "errors": t.errors, "dead": t.dead, "per_request": t.per_request,
                })
                print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("errors", "dead", "per_request")}),
                      "errors", len(t.errors), "dead", len(t.dead), flush=True)
    results["rows"] = rows
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__" and not {"--explain", "--tables"} & set(sys.argv):
    main()


def explain(n: int) -> dict:
    """Where ours and the best library wrapping (llg-layout) differ, per position, by the FSM's
    phase at that position (pass A prefixes), over requests whose library matcher never died."""
    data = MAIN / "artifacts" / "data"
    out: dict[str, Any] = {}
    for target, (model, surface_name, eos_text) in TARGETS.items():
        tok = AutoTokenizer.from_pretrained(MAIN / "artifacts" / "models" / model)
        eos = tok.convert_tokens_to_ids(eos_text)
        base = get_surface(surface_name)
        ours, lib = Ours(tok, eos), LLg(tok, eos, "layout")
        gain: dict[str, list[int]] = {}
        for bench in BENCHMARKS:
            reqs = sample_requests([r for r in read_requests(data / f"eval_{bench}.jsonl") if r.gold], n, 0, bench)
            for r in reqs:
                surface = base.for_request(r)
                gold = list(tok.encode(surface.render(list(r.gold)), add_special_tokens=False)) + [eos]
                ours.begin(r, surface)
                lib.begin(r, surface)
                rows = []
                for i in range(len(gold)):
                    if i:
                        ours.advance(gold[i - 1 : i])
                        lib.advance(gold[i - 1 : i])
                    phase = ours.src.fsm.position() if ours.src.fsm else "none"
                    po = max((common_prefix(d, gold[i:]) for d in ours.propose(gold[:i])), default=0)
                    pl = max((common_prefix(d, gold[i:]) for d in lib.propose(gold[:i])), default=0)
                    rows.append((phase, po, pl))
                if lib.dead_at is not None:
                    continue
                for phase, po, pl in rows:
                    g = gain.setdefault(phase, [0, 0, 0, 0])
                    g[0] += 1
                    g[1] += po > pl
                    g[2] += pl > po
                    g[3] += (po > 0) - (pl > 0)
        out[target] = {k: dict(zip(("positions", "ours_longer", "lib_longer", "covered_diff"), v)) for k, v in gain.items()}
        print(target, json.dumps(out[target]), flush=True)
    return out


if __name__ == "__main__" and "--explain" in sys.argv:
    Path(__file__).with_name("explain.json").write_text(json.dumps(explain(30), indent=1))


def tables(path: str = str(Path(__file__).with_name("results.json"))) -> str:
    """Markdown tables of results.json (used for REPORT.md)."""
    rows = json.loads(Path(path).read_text())["rows"]
    configs = list(dict.fromkeys(r["config"] for r in rows))
    lines = ["| target | config | gold tokens | accepted (rounds sim.) | rounds | positions covered | "
             "matchers dead | compile ms (median) | query µs (median / p90) | est. µs per round |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for target in dict.fromkeys(r["target"] for r in rows):
        for c in configs:
            rs = [r for r in rows if r["target"] == target and r["config"] == c]
            pos = sum(r["positions"] for r in rs)
            acc = sum(r["accepted"] for r in rs)
            rnd = sum(r["rounds"] for r in rs)
            cov = sum(r["covered"] for r in rs)
            nreq = sum(r["requests"] for r in rs)
            dead = sum(len(r["dead"]) for r in rs)
            comp = statistics.median(r["compile_ms_median"] for r in rs)
            q = statistics.median(r["query_us_median"] for r in rs)
            q90 = statistics.median(r["query_us_p90"] for r in rs)
            per_round = 1e3 * sum(r["compile_ms_median"] * r["requests"] for r in rs) / rnd + \
                sum(r["query_us_median"] * r["rounds"] for r in rs) / rnd
            lines.append(f"| {target} | {c} | {pos} | {acc} | {rnd} | {cov} | {dead}/{nreq} | {comp:.2f} | "
                         f"{q:.0f} / {q90:.0f} | {per_round:.0f} |")
    lines += ["", "| target | benchmark | " + " | ".join(configs) + " |", "|---|---|" + "---|" * len(configs)]
    for target in dict.fromkeys(r["target"] for r in rows):
        for b in BENCHMARKS:
            cells = []
            for c in configs:
                r = next(r for r in rows if r["target"] == target and r["benchmark"] == b and r["config"] == c)
                cells.append(f"{r['accepted']} / {r['rounds']}")
            lines.append(f"| {target} | {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__" and "--tables" in sys.argv:
    print(tables())
