"""Greedy teacher traces: the first valid call of a frozen teacher on every training request.

The sidecar learns from the teacher's calls, not from the datasets' gold calls (as in the paper):
the teacher answers each request greedily, its first call that parses and names one of the
request's functions becomes strict JSON (name + argument map only), and a request without such a
call keeps the reason. Traces are expensive on CPU (seconds per request for the 0.5B teacher,
days for the whole training split on the slower kind of machine), so the committed traces
(``artifacts/committed/teacher/``) are frozen assets, as the paper's offline teacher is: they are
reused record by record whatever arithmetic the local CPU runs (their own arithmetic is stated in
their config), and a request without one stops the stage (`FrozenAssetMissing`) unless the caller
asks to re-derive on purpose (``rederive=True``), which traces in the local arithmetic into a stage
of its own (resumable: append JSONL, skip done ids).

A request whose prompt does not fit the teacher's context is not decoded: its record keeps
``call=None`` and the reason (``prompt_too_long: <prompt> + <max_new_tokens> > <context>``), like
a call that did not parse, and the stage goes on. One that fits but leaves less than
``max_new_tokens`` is decoded with the budget capped to the room, recorded as ``capped_to``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ooospec.data.request import Call, Request
from ooospec.models.context import PROMPT_TOO_LONG, PromptTooLong, fit_budget, model_context
from ooospec.decoding.compiled import compile_target
from ooospec.decoding.loop import decode
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.models.formats import get_surface
from ooospec.models.registry import load_profile
from ooospec.models.surface import SurfaceFormat
from ooospec.models.target import TargetModel, load_role
from ooospec.paths import artifacts_dir
from ooospec.provenance import code_commit, file_sha256
from ooospec.stage import FrozenAssetMissing, Stage, append_jsonl, canonical_json, done_ids, read_jsonl
from ooospec.progress import progress_bar

TRACES_FILE = "traces.jsonl"
DEFAULT_LIMIT = 48  # requests per split in the 30-minute cpu budget; committed traces cover more
DEFAULT_MAX_NEW_TOKENS = 160
DEFAULT_BATCH_SIZE = 4  # left-padded batches: ~1.5x faster on CPU, same text on every request checked


@dataclass
class TeacherRecord:
    """One request's teacher answer: raw text, first valid call (or why there is none), cost."""

    id: str
    source: str
    benchmark: str
    prompt_hash: str
    raw_text: str
    call: dict[str, Any] | None
    reason: str | None
    calls_parsed: int
    syntax: str | None
    prompt_tokens: int
    new_tokens: int
    stopped_on_eos: bool
    seconds: float
    origin: str = "generated"  # or "committed:<name>" when reused
    capped_to: int | None = None  # the new-token budget where the context left less than max_new_tokens

    def to_dict(self) -> dict[str, Any]:
        """The record as stored; ``capped_to`` only where the context capped the budget, so an
        ordinary record reads exactly as the committed ones do."""
        data = asdict(self)
        if data["capped_to"] is None:
            del data["capped_to"]
        return data


@dataclass
class Generation:
    text: str
    new_tokens: int
    stopped_on_eos: bool


@dataclass
class Verdict:
    """The first valid call of an answer, or why there is none."""

    call: dict[str, Any] | None
    reason: str | None
    calls_parsed: int
    syntax: str | None  # "surface" (the teacher's own format) or "apibank" (API-Request: [...])


_API_REQUEST = re.compile(r"API-Request:\s*(.*?)(?:->|\n|$)")


def apibank_syntax_calls(text: str, request: Request) -> list[Call]:
    """Calls written in API-Bank's ``API-Request: [Name(k='v')]`` syntax.

    In API-Bank dialogues the earlier assistant turns hold such lines, and the teacher often
    continues in that syntax instead of its own format. The call is no less the teacher's call,
    so it is parsed (and typed against the schema) exactly as the data layer parses gold calls.
    """
    from ooospec.data.apibank import parse_api_request, typed_call
    from ooospec.data.pycall import CallParseError

    calls = []
    for segment in _API_REQUEST.findall(text):
        try:
            parsed = parse_api_request(segment)
        except (CallParseError, ValueError, SyntaxError):
            continue
        calls += [typed_call(name, args, request.tool(name)) for name, args in parsed]
    return calls


def first_valid_call(text: str, request: Request, surface: SurfaceFormat, stopped_on_eos: bool = True) -> Verdict:
    """Valid = parses and names a function of the request; the surface format first, then API-Bank syntax."""
    known = {tool["name"] for tool in request.tools}
    seen: list[Call] = []
    for syntax, calls in (("surface", surface.parse(text)), ("apibank", None)):
        if calls is None:
            calls = apibank_syntax_calls(text, request)
        seen += calls
        for call in calls:
            if call.name in known:
                # round-trip through JSON: strict JSON values only, key order kept
                strict = {"name": call.name, "arguments": json.loads(json.dumps(call.arguments))}
                return Verdict(strict, None, len(seen), syntax)
    if seen:
        return Verdict(None, "unknown_function: " + ", ".join(sorted({c.name for c in seen}))[:200], len(seen), None)
    return Verdict(None, "no_call_parsed" if stopped_on_eos else "no_call_parsed_truncated", 0, None)


def judged(record: dict[str, Any], request: Request, surface: SurfaceFormat) -> dict[str, Any]:
    """A record's call fields re-derived from its raw text with the current rules (cheap; the
    raw text is the expensive part), so a reused record never carries a stale verdict. A request
    refused for its length has no text to judge and keeps its reason."""
    if str(record.get("reason") or "").startswith(PROMPT_TOO_LONG):
        return record
    verdict = first_valid_call(record["raw_text"], request, surface, record["stopped_on_eos"])
    return {**record, "call": verdict.call, "reason": verdict.reason, "calls_parsed": verdict.calls_parsed,
            "syntax": verdict.syntax}


def generate_greedy(teacher: TargetModel, prompts: list[list[int]], max_new_tokens: int) -> list[Generation]:
    """Greedy answers for a batch of prompts (left padding), each cut at its first EOS token."""
    tokenizer = teacher.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else teacher.eos_token_ids[0]
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = teacher.model.generate(
            input_ids, attention_mask=attention, do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=teacher.eos_token_ids, pad_token_id=pad,
        )
    generations = []
    for row in out[:, width:].tolist():
        stop = next((i for i, t in enumerate(row) if t in teacher.eos_token_ids), None)
        new = row if stop is None else row[:stop]
        generations.append(Generation(tokenizer.decode(new, skip_special_tokens=False), len(new), stop is not None))
    return generations


# ToolSpec's default tree budget on both cpu targets: the budget changes the teacher's speed only,
# never its text (the engine is lossless), so it is not part of the trace settings
TRACE_BUDGET = TreeBudget(max_nodes=16, max_depth=16)


def trace_with_engine(teacher: TargetModel, sources: list[Any], request: Request, max_new_tokens: int) -> Generation:
    """The teacher's greedy answer through the lossless engine (ToolSpec drafts, batch 1).

    Identical to plain greedy decoding in fp32, and up to near-ties of the logits in bf16 (the
    engine's tested property; a test re-derives committed traces with AR), only faster: tool-call
    scaffolds and repeated calls are verified several tokens per forward. ``sources`` persist
    across requests, so call retrieval learns from the teacher's earlier calls."""
    result = decode(teacher, sources, request, max_new_tokens, TRACE_BUDGET)
    ids = list(result.output_ids)
    stopped = bool(ids) and ids[-1] in teacher.eos_token_ids
    new = ids[:-1] if stopped else ids
    return Generation(teacher.tokenizer.decode(new, skip_special_tokens=False), len(new), stopped)


def teacher_budgets(teacher: TargetModel, requests: list[Request], prompts: dict[str, list[int]],
                    max_new_tokens: int) -> tuple[dict[str, int], dict[str, PromptTooLong]]:
    """Each request's new-token budget in the teacher's context (`fit_budget`), and the requests
    whose prompt leaves no room (refused, never decoded). Nothing to trace: no teacher needed."""
    if not requests:
        return {}, {}
    context = model_context(teacher.model)
    budgets: dict[str, int] = {}
    refused: dict[str, PromptTooLong] = {}
    for request in requests:
        try:
            budgets[request.id] = fit_budget(len(prompts[request.id]), max_new_tokens, context, request.id)
        except PromptTooLong as err:
            refused[request.id] = err
    return budgets, refused


def answer_batch(teacher: TargetModel, sources: list[Any] | None, batch: list[Request], prompts: dict[str, list[int]],
                 budgets: dict[str, int], max_new_tokens: int) -> dict[str, Generation]:
    """The teacher's answers to the decodable requests of ``batch``, by id. With HF ``generate``
    the requests with the full budget share one left-padded batch and a capped one runs alone
    with its own budget, so no row is cut short by another's context."""
    todo = [r for r in batch if r.id in budgets]
    if sources is not None:
        return {r.id: trace_with_engine(teacher, sources, r, budgets[r.id]) for r in todo}
    full = [r for r in todo if budgets[r.id] == max_new_tokens]
    out: dict[str, Generation] = {}
    if full:
        out.update(zip([r.id for r in full], generate_greedy(teacher, [prompts[r.id] for r in full], max_new_tokens)))
    for request in todo:
        if request.id not in out:
            out[request.id] = generate_greedy(teacher, [prompts[request.id]], budgets[request.id])[0]
    return out


def subset(requests: list[Request], limit: int | None) -> list[Request]:
    """A deterministic subset, ordered by prompt hash: nested (limit n is a prefix of limit m > n)."""
    ordered = sorted(requests, key=lambda r: (r.prompt_hash, r.id))
    return ordered if limit is None else ordered[:limit]


def length_windows(requests: list[Request], length: Callable[[Request], int], window: int) -> list[Request]:
    """Sort by prompt length within consecutive windows: batches pad less, yet an interrupted run
    still covers a prefix of the subset order (so a partial trace set is itself a nested subset)."""
    if window <= 1:
        return list(requests)
    return [r for start in range(0, len(requests), window)
            for r in sorted(requests[start:start + window], key=length)]


def requests_digest(requests: Iterable[Request]) -> str:
    return hashlib.sha256(canonical_json([[r.id, r.prompt_hash] for r in requests]).encode()).hexdigest()[:16]


DECODERS = ("toolspec", "generate")  # our lossless engine (batch 1), or HF generate (left-padded batches)
DEFAULT_DECODER = "toolspec"


def generation_settings(teacher: str, model_pin: str, surface: str, prompt_style: str,
                        chat_template_kwargs: dict[str, Any], dtype: str, max_new_tokens: int,
                        batch_size: int, decoder: str = DEFAULT_DECODER) -> dict[str, Any]:
    """Everything that determines a trace's text: committed traces are reused only when it matches.

    ``prompts`` versions the way requests become prompts (the data layer's version): traces of
    an older rendering of the same dialogue are never mixed with new ones."""
    from ooospec.data.build import DATA_VERSION

    if decoder not in DECODERS:
        raise ValueError(f"unknown teacher decoder {decoder!r}; known: {list(DECODERS)}")
    return {"teacher": teacher, "model_pin": model_pin, "surface": surface, "prompt_style": prompt_style,
            "chat_template_kwargs": dict(chat_template_kwargs), "max_new_tokens": max_new_tokens,
            "batch_size": 1 if decoder == "toolspec" else batch_size, "dtype": dtype, "decoder": decoder,
            "prompts": f"data-v{DATA_VERSION}"}


def profile_teacher_settings(profile: str, max_new_tokens: int, batch_size: int,
                             decoder: str = DEFAULT_DECODER) -> dict[str, Any]:
    """`generation_settings` of a profile's teacher role, read from the profile (no model load)."""
    from ooospec.models.loading import runtime_placement

    prof = load_profile(profile)
    role, spec = prof.teacher, prof.model("teacher")
    pin = spec.source.sha256 or f"{spec.source.repo}@{spec.source.revision or 'main'}"
    dtype, _ = runtime_placement(spec)
    return generation_settings(spec.name, pin, role.surface or "", role.prompt or "", role.chat_template_kwargs,
                               dtype, max_new_tokens, batch_size, decoder)


def model_teacher_settings(teacher: TargetModel, model_pin: str, max_new_tokens: int, batch_size: int,
                           decoder: str = DEFAULT_DECODER) -> dict[str, Any]:
    """`generation_settings` of an already loaded teacher (tests inject a tiny one)."""
    dtype = str(next(teacher.model.parameters()).dtype).replace("torch.", "")
    return generation_settings(teacher.name, model_pin, teacher.surface.name, teacher.prompt_style,
                               teacher.chat_template_kwargs, dtype, max_new_tokens, batch_size, decoder)


ARITHMETIC_SETTING = "dtype"  # the one generation setting that says how a trace was computed, not what was asked


def same_teacher(settings: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two generation settings ask the same teacher the same prompts in the same way, in any
    arithmetic: a committed trace made in bf16 answers an fp32 machine's request for it (its
    arithmetic is reported, never re-derived as a side effect of a missing CPU feature)."""
    def asked(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in values.items() if k != ARITHMETIC_SETTING}

    return asked(settings) == asked(other)


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / "teacher"


def committed_records(settings: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Committed trace records of the same teacher and prompts (`same_teacher`: any arithmetic),
    keyed by (id, prompt_hash); each carries its set's ``arithmetic``. Where sets in several
    arithmetics hold a request, the one in ``settings``' arithmetic wins.

    A committed set whose traces file does not match its recorded sha256 is refused.
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}
    root = committed_dir()
    if not root.exists():
        return found
    configs = [(f, json.loads(f.read_text())) for f in sorted(root.glob("*/config.json"))]
    own = settings.get(ARITHMETIC_SETTING)
    configs.sort(key=lambda fc: fc[1].get("generation", {}).get(ARITHMETIC_SETTING) != own)  # stable
    for config_file, config in configs:
        if not same_teacher(config.get("generation", {}), settings):
            continue
        arithmetic = config["generation"].get(ARITHMETIC_SETTING)
        traces = config_file.parent / TRACES_FILE
        expected = json.loads((config_file.parent / "provenance.json").read_text())["sha256"]
        actual = file_sha256(traces)
        if actual != expected:
            raise ValueError(f"{traces}: sha256 {actual} does not match provenance.json ({expected}); "
                             f"restore it with git (git checkout -- {traces}) or delete the directory")
        for record in read_jsonl(traces):
            found.setdefault((record["id"], record["prompt_hash"]),
                             {**record, "origin": f"committed:{config_file.parent.name}", "arithmetic": arithmetic})
    return found


def stage_records(settings: dict[str, Any], exclude: Path | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    """Records already traced here by other teacher stages with the same generation settings.

    A different subset size is a different stage key, yet its records are the same greedy answers;
    reusing them lets a small default run pick up a larger run in progress. A torn last line of a
    file that is still being written is ignored.
    """
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for config_file in sorted((artifacts_dir() / "teacher").glob("*/config.json")):
        traces = config_file.parent / TRACES_FILE
        if config_file.parent == exclude or not traces.exists():
            continue
        if json.loads(config_file.read_text()).get("generation") != settings:
            continue
        with open(traces, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                if record.get("origin", "generated") == "generated":
                    found.setdefault((record["id"], record["prompt_hash"]),
                                     {**record, "origin": f"stage:{config_file.parent.name}"})
    return found


def trace_files(stage: Stage) -> list[Path]:
    """The stage's trace file and the per-shard files of a multi-process run."""
    return [p for p in [stage.path(TRACES_FILE), *sorted(stage.dir.glob("traces.shard*.jsonl"))] if p.exists()]


def judged_records(traces: Path | list[Path], requests: list[Request], surface: SurfaceFormat) -> list[dict[str, Any]]:
    """The records of trace files for ``requests`` (in their order), verdicts re-derived."""
    paths = [traces] if isinstance(traces, Path) else traces
    by_id = {r["id"]: r for path in paths if path.exists() for r in read_jsonl(path)}
    return [judged(by_id[r.id], r, surface.for_request(r)) for r in requests if r.id in by_id]


@lru_cache(maxsize=1)
def profile_teacher(profile: str) -> TargetModel:
    """The profile's teacher, loaded once per process (a notebook traces train and dev in turn)."""
    return compile_target(load_role("teacher", profile))


@dataclass(frozen=True)
class TeacherSettings:
    """What a teacher run is asked (`run_teacher`): which split and subset, the generation settings
    and how the work is shared. One object, so the CLI, the notebook and the tests ask the same
    way, and a new option is one field, not another parameter threaded through every caller."""

    split: str
    profile: str = "cpu"
    limit: int | None = DEFAULT_LIMIT
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    batch_size: int = DEFAULT_BATCH_SIZE
    reuse: bool = True  # committed traces and other local stages with the same settings
    model_pin: str | None = None  # the pin of an injected teacher (None: "unpinned")
    threads: int | None = None  # torch threads (None: leave as is)
    decoder: str = DEFAULT_DECODER
    shard: tuple[int, int] = (0, 1)  # (k, n): this process traces every n-th request from k
    trace_missing: bool = False  # trace requests no committed trace holds (the tracing CLI)
    rederive: bool = False  # ignore the committed traces: trace every request here


@dataclass
class TeacherRun:
    """What `run_teacher` did: the stage, its records and the measured throughput."""

    stage: Stage
    records: list[dict[str, Any]]
    generated: int
    reused: int
    generate_seconds: float
    generated_tokens: int
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def traces_path(self) -> Path:
        return self.stage.path(TRACES_FILE)


def run_teacher(requests: list[Request], cfg: TeacherSettings, *, teacher: TargetModel | None = None,
                on_batch: Callable[[int], None] | None = None) -> TeacherRun:
    """Trace ``requests`` (the ``cfg.limit`` subset) with the profile's teacher; resumable and keyed by config.

    ``teacher`` (with ``cfg.model_pin``) injects a model (tests use a tiny random one); by default the profile's
    teacher role is used, pinned by its source sha256 (or hub id), and loaded only when some
    request is neither traced nor committed. ``on_batch`` is called after each written batch (a
    hook for progress reporting and interruption tests). ``cfg.shard=(k, n)`` traces every n-th
    request of the subset starting at k (those not yet traced) into its own file, so n processes (one per core) share a stage;
    the stage is done when the files together cover the subset.

    The committed traces are frozen assets: a request that none of them (nor an earlier local run)
    holds raises `FrozenAssetMissing` when the profile's teacher would have to trace it, unless
    ``trace_missing`` (the tracing CLI that makes new chunks) says so. With ``rederive`` the
    committed traces are ignored and every request is traced here, in the local arithmetic, into a
    stage of its own (hours per thousand requests on 2 cores).
    """
    index, shards = cfg.shard
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} of {shards} does not exist")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    chosen = subset(requests, cfg.limit)
    if teacher is None:
        settings = profile_teacher_settings(cfg.profile, cfg.max_new_tokens, cfg.batch_size, cfg.decoder)
    else:
        settings = model_teacher_settings(teacher, cfg.model_pin or "unpinned", cfg.max_new_tokens, cfg.batch_size,
                                          cfg.decoder)
    config = {"split": cfg.split, "limit": cfg.limit, "requests": requests_digest(chosen), "profile": cfg.profile,
              "generation": settings, "traces": "rederived" if cfg.rederive else "committed or earlier runs"}
    stage = Stage("teacher", config)
    out = stage.path(TRACES_FILE if shards == 1 else f"traces.shard{index}of{shards}.jsonl")
    done = done_ids(out) | {i for path in trace_files(stage) if path != out for i in done_ids(path, repair=False)}
    todo = [r for r in chosen[index::shards] if r.id not in done]
    known = {}
    if cfg.reuse:
        known = stage_records(settings, exclude=stage.dir)
        if not cfg.rederive:
            known = {**known, **committed_records(settings)}
    surface = get_surface(settings["surface"])
    reused = [judged(known[(r.id, r.prompt_hash)], r, surface.for_request(r)) for r in todo
              if (r.id, r.prompt_hash) in known]
    append_jsonl(out, reused)
    reused_ids = {r["id"] for r in reused}
    todo = [r for r in todo if r.id not in reused_ids]
    if todo and teacher is None and not (cfg.trace_missing or cfg.rederive):
        raise FrozenAssetMissing(
            f"teacher {cfg.split}: {len(todo)} of {len(chosen)} requests have no committed trace (first: {todo[0].id}, "
            f"prompt {todo[0].prompt_hash}); the traces under {committed_dir()} are frozen. To re-derive them on "
            f"purpose, in this machine's arithmetic: `make retrace` (hours per thousand requests on 2 cores) or "
            f"papermill notebooks/01_teacher.ipynb ... -p rederive True")
    if todo and teacher is None:
        teacher = profile_teacher(cfg.profile)
    prompts = {r.id: teacher.prompt_ids(r) for r in todo}
    budgets, refused = teacher_budgets(teacher, todo, prompts, cfg.max_new_tokens)
    todo = length_windows(todo, lambda r: len(prompts[r.id]), window=8 * cfg.batch_size)
    generated, tokens, seconds = 0, 0, 0.0
    step = settings["batch_size"]
    sources = [ToolSpec()] if todo and cfg.decoder == "toolspec" else None
    bar = progress_bar(total=len(todo), desc=f"teacher {cfg.split}", unit="req")
    for start in range(0, len(todo), step):
        batch = todo[start:start + step]
        began = time.perf_counter()
        answers = answer_batch(teacher, sources, batch, prompts, budgets, cfg.max_new_tokens)
        elapsed = time.perf_counter() - began
        records = []
        for request in batch:
            gen = answers.get(request.id, Generation("", 0, False))  # a refused request has no answer
            budget = budgets.get(request.id, cfg.max_new_tokens)
            if request.id in refused:
                verdict = Verdict(None, refused[request.id].reason, 0, None)
            else:
                verdict = first_valid_call(gen.text, request, teacher.surface_for(request), gen.stopped_on_eos)
            records.append(TeacherRecord(
                id=request.id, source=request.source, benchmark=request.benchmark, prompt_hash=request.prompt_hash,
                raw_text=gen.text, call=verdict.call, reason=verdict.reason, calls_parsed=verdict.calls_parsed,
                syntax=verdict.syntax,
                prompt_tokens=len(prompts[request.id]), new_tokens=gen.new_tokens,
                stopped_on_eos=gen.stopped_on_eos, seconds=round(elapsed / len(batch), 3),
                capped_to=budget if budget < cfg.max_new_tokens else None,
            ).to_dict())
        append_jsonl(out, records)
        generated += len(batch)
        tokens += sum(g.new_tokens for g in answers.values())
        seconds += elapsed
        bar.update(len(batch))
        bar.set_postfix(s_per_req=f"{seconds / generated:.1f}")
        if on_batch is not None:
            on_batch(generated)
    bar.close()
    records = judged_records(trace_files(stage), chosen, surface)
    summary = {"requests": len(records), "valid": sum(r["call"] is not None for r in records),
               "generated_now": generated, "reused_committed_now": len(reused),
               "generate_seconds_now": round(seconds, 1), "generated_tokens_now": tokens,
               "validity_by_source": validity_by_source(records)}
    if len(records) == len(chosen):
        stage.mark_done(**summary)
    return TeacherRun(stage, records, generated, len(reused), seconds, tokens, summary)


def validity_by_source(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per training source: requests, valid first calls, rate and the reasons for the rest."""
    table: dict[str, dict[str, Any]] = defaultdict(lambda: {"requests": 0, "valid": 0, "reasons": Counter()})
    for record in records:
        row = table[record["source"]]
        row["requests"] += 1
        if record["call"] is not None:
            row["valid"] += 1
        else:
            row["reasons"][record["reason"].split(":")[0]] += 1
    return {
        source: {"requests": row["requests"], "valid": row["valid"],
                 "valid_rate": round(row["valid"] / row["requests"], 4), "reasons": dict(row["reasons"])}
        for source, row in sorted(table.items())
    }


def throughput(records: list[dict[str, Any]]) -> dict[str, float]:
    """Measured cost of the generated (not reused) records: seconds per request, tokens per second."""
    own = [r for r in records if r.get("origin", "generated") == "generated"] or records
    seconds = sum(r["seconds"] for r in own)
    return {"requests": len(own), "seconds_per_request": round(seconds / max(len(own), 1), 2),
            "new_tokens_per_second": round(sum(r["new_tokens"] for r in own) / max(seconds, 1e-9), 2),
            "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in own) / max(len(own), 1), 1)}


def commit_traces(records: list[dict[str, Any]], name: str, config: dict[str, Any],
                  provenance: dict[str, Any]) -> Path:
    """Write trace records under ``artifacts/committed/teacher/<name>/`` with their config and sha256."""
    target = committed_dir() / name
    target.mkdir(parents=True, exist_ok=True)
    with open(target / TRACES_FILE, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({**record, "origin": "generated"}, ensure_ascii=False) + "\n")
    digest = file_sha256(target / TRACES_FILE)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (target / "provenance.json").write_text(json.dumps({
        **provenance, "sha256": digest, "records": len(records),
        "valid": sum(r["call"] is not None for r in records),
        "code_commit": code_commit(), "prompts": requests_digest(
            [Request(r["id"], "", "", [], [], None, prompt_hash=r["prompt_hash"]) for r in records]),
        "throughput": throughput(records), "validity_by_source": validity_by_source(records),
        "torch": torch.__version__, "transformers": __import__("transformers").__version__,
        "machine": _machine(config),
    }, indent=2))
    return target


def _machine(config: dict[str, Any]) -> dict[str, Any]:
    """The arithmetic and CPU that traced (a committed set is read on other machines)."""
    from ooospec.models.arithmetic import arithmetic_of

    profile = load_profile(config.get("profile", "cpu"))
    return arithmetic_of(profile.model("teacher")).to_dict()


def main(argv: list[str] | None = None) -> None:
    """CLI: trace a split (resumable), optionally committing the traces afterwards."""
    import argparse

    from ooospec.data import load_split

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--split", default="train")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="-1 = every request of the split")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--decoder", choices=DECODERS, default=DEFAULT_DECODER)
    parser.add_argument("--shard", default="0/1", help="k/n: this process traces every n-th missing request from k")
    parser.add_argument("--new-only", action="store_true",
                        help="with --commit: commit only records not already in a committed trace set (a chunk)")
    parser.add_argument("--commit", metavar="NAME", help="copy the traces to artifacts/committed/teacher/NAME")
    parser.add_argument("--commit-only", action="store_true", help="commit what is traced so far, trace nothing")
    parser.add_argument("--rederive", action="store_true",
                        help="ignore the committed traces: re-trace every request in this machine's arithmetic")
    args = parser.parse_args(argv)
    limit = None if args.limit < 0 else args.limit
    requests = load_split(args.split)
    index, _, shards = args.shard.partition("/")
    settings = profile_teacher_settings(args.profile, args.max_new_tokens, args.batch_size, args.decoder)
    if args.commit_only:
        chosen = subset(requests, limit)
        stage = Stage("teacher", {"split": args.split, "limit": limit, "requests": requests_digest(chosen),
                                  "profile": args.profile, "generation": settings})
        records = judged_records(trace_files(stage), chosen, get_surface(settings["surface"]))
    else:
        run = run_teacher(requests, TeacherSettings(
            split=args.split, profile=args.profile, limit=limit, max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size, threads=args.threads, decoder=args.decoder,
            shard=(int(index), int(shards or 1)), trace_missing=True, rederive=args.rederive))
        stage, records = run.stage, run.records
        print(json.dumps(run.summary, indent=2))
    if args.commit and args.new_only:
        committed = committed_records(settings)
        records = [r for r in records if (r["id"], r["prompt_hash"]) not in committed]
    if args.commit and records:
        config = json.loads(stage.path("config.json").read_text())
        where = commit_traces(records, args.commit, config, {
            "made_by": f"python -m ooospec.training.teacher {' '.join(argv or __import__('sys').argv[1:])}",
            "stage_dir": str(stage.dir.relative_to(artifacts_dir())),
            "complete": stage.done,
        })
        print(f"committed {where}")


def arithmetic_sentence(records: list[dict[str, Any]], profile: str) -> str:
    """Which arithmetic made these trace records, beside what this machine would run the teacher in:
    the committed traces are frozen, so the two may differ (bf16 traces read on an fp32 machine)."""
    from ooospec.models.arithmetic import arithmetic_of, short_name

    unrecorded = profile_teacher_settings(profile, DEFAULT_MAX_NEW_TOKENS, DEFAULT_BATCH_SIZE)[ARITHMETIC_SETTING]
    made = Counter(short_name(r.get("arithmetic") or unrecorded)
                   for r in records if str(r.get("origin", "")).startswith("committed"))
    here = arithmetic_of(load_profile(profile).model("teacher")).sentence()
    used = ", ".join(f"{n:,} in {a}" for a, n in made.most_common()) or "none"
    traced = sum(not str(r.get("origin", "")).startswith("committed") for r in records)
    return (f"Committed traces read: {used} (frozen: made on an avx512_bf16 CPU, see each set's provenance). "
            f"Traced here, or by an earlier local run: {traced}. This machine would run the teacher in {here}.")


if __name__ == "__main__":
    main()
