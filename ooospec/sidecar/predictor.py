"""The model side of the sidecar: a request -> its slot wave -> one compact semantic call.

`SlotPredictor.predict_wave` runs every online row of a request (function index + argument rows
of every candidate function) as ONE batched greedy generation. The rows share the request
prefix, so its KV cache is computed once (batch 1) and expanded over the rows; the questions are
left-padded after it (attention mask + explicit positions keep each row's positions contiguous,
exactly as if it ran alone), and rows leave the batch as soon as they emit the end token (most
rows answer ``null`` in two tokens). The two ablations of the paper's design use the same
machinery: `predict_sequential` (rows one at a time, each with its own prefix) and
`predict_two_waves` (function index first, then only the chosen function's arguments). The
other functions' rows, whose longest one decides the wave's length on most requests, need not be
waited for (`ChosenRows`): the ``chosen_wave`` mode stops them as soon as the function row has
answered (the chosen call only, no alternatives); the ``progressive_wave`` mode runs them all but
hands the chosen call over first (`EarlyCall`), as soon as its rows are final.

`SlotWavePredictor` is this predictor behind the sidecar protocol (`ooospec.sidecar.protocol`):
what the service runs in its own process.

The prefix is clipped (`ooospec.sidecar.slots.request_prefix`), yet many tools can still make it
longer than the sidecar model's context: a wave whose prefix + longest question + answer budget
does not fit returns no call with the reason (``prompt_too_long: ...``) before any forward, rather
than answering from positions the model never saw.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ooospec.data.request import Call, Request
from ooospec.models.context import PROMPT_TOO_LONG, model_context
from ooospec.models.packed_linear import pack_linears
from ooospec.sidecar.base_model import PROFILE_BASE, TINY_BASE
from ooospec.sidecar.copy_values import CopySettings, SpanCopier, request_text, string_slot
from ooospec.sidecar.join import DroppedSlot, join_rows, parse_function_index
from ooospec.sidecar.protocol import MODES, Prediction
from ooospec.sidecar.row_forwards import ForwardTime, RowForwards, SidecarRuntime, TorchRowForwards
from ooospec.sidecar.span_drafts import SpanDrafter, SpanDraftSettings
from ooospec.sidecar.served_runtime import SERVED_BY_RULE, resolve_runtime
from ooospec.sidecar.slots import (RowKey, SlotPromptConfig, encode, online_questions, request_prefix,
                                   target_text, tool_properties, tool_required)


# The one default of ``required_values`` (every hop below passes it on): on, as the runtime serves
# the sidecar. Off is the sidecar's raw answer: the dev check "as trained" and the ``nullable`` ablation.
REQUIRED_VALUES = True
# And of ``optional_values`` (no slot answers null, optional ones included): on, as served since the
# API-disjoint dev chose it by the rule written beforehand (book: differences, "Choosing the served
# adapter on unseen APIs"): whole-call agreement with the target 0.473 -> 0.504 on 129 requests,
# median wave 3.89 -> 3.90 s side by side on 40 of them. Off with ``required_values`` off (raw answers).
OPTIONAL_VALUES = True


@dataclass
class RowPrediction:
    key: RowKey
    text: str
    new_tokens: int
    truncated: bool  # no end token: stopped at the token limit, or cut (`ChosenRows`)
    done_after: int = 0  # the wave's forwards when this row's answer was final (0: not recorded)


@dataclass(frozen=True)
class PrefixState:
    """A request prefix run once (`SlotPredictor.prefix_cache`): the runtime's forwards that hold it,
    its state there, and its forward's time."""

    run: RowForwards
    state: Any
    time: ForwardTime


@dataclass
class WaveResult:
    """One request's sidecar answer plus what it cost."""

    request_id: str
    mode: str
    call: Call | None
    payload: str | None  # what crosses to the target: ``call``'s compact JSON, or a list of it and the alternatives
    payload_bytes: int
    latency_s: float
    prefix_tokens: int
    rows: list[RowPrediction]
    forwards: int
    dropped: list[DroppedSlot] = field(default_factory=list)
    reason: str | None = None
    timeline: list[ForwardTime] = field(default_factory=list)  # every forward, in order

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["call"] = None if self.call is None else self.call.to_dict()
        data["rows"] = [{"kind": r.key.kind, "function": r.key.function, "parameter": r.key.parameter,
                         "text": r.text, "new_tokens": r.new_tokens, "truncated": r.truncated,
                         "done_after": r.done_after} for r in self.rows]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WaveResult":
        """Inverse of `to_dict` (a stored dev wave back into a result that can be scored)."""
        rows = [RowPrediction(RowKey(r["kind"], r["function"], r["parameter"]), r["text"], r["new_tokens"],
                              r["truncated"], r.get("done_after", 0)) for r in data["rows"]]
        call = None if data["call"] is None else Call.from_dict(data["call"])
        dropped = [DroppedSlot(**d) for d in data.get("dropped", [])]
        timeline = [ForwardTime(**f) for f in data.get("timeline", [])]
        return cls(data["request_id"], data["mode"], call, data["payload"], data["payload_bytes"], data["latency_s"],
                   data["prefix_tokens"], rows, data["forwards"], dropped, data.get("reason"), timeline)


@dataclass(frozen=True)
class EarlyCall:
    """A progressive wave's first delivery: the chosen call alone, before the alternatives."""

    call: Call
    payload: str
    latency_s: float


class AdapterPromptMismatch(ValueError):
    """A frozen adapter whose prompt config this service cannot render exactly as it was trained."""


def adapter_prompt(record: dict[str, Any], adapter_dir: Path | str) -> SlotPromptConfig:
    """The prompt an adapter was trained with, as this code renders it; refused (one line naming the
    adapter) when its record's prompt is not one `SlotPromptConfig` reproduces field for field, or
    differs from the prompt its training config names: never served with another prompt."""
    prompt = record.get("prompt")
    trained = (record.get("config") or {}).get("prompt", prompt)
    where = f"sidecar adapter {adapter_dir}"
    if not isinstance(prompt, dict):
        raise AdapterPromptMismatch(f"{where}: its record holds no prompt config")
    if trained != prompt:
        raise AdapterPromptMismatch(f"{where}: record prompt {prompt} differs from its training config's {trained}")
    try:
        config = SlotPromptConfig(**prompt)
    except (TypeError, ValueError) as err:
        raise AdapterPromptMismatch(f"{where}: prompt config {prompt} does not match this service's ({err})") from None
    if config.to_dict() != prompt:
        raise AdapterPromptMismatch(f"{where}: prompt config {prompt} would be served as {config.to_dict()}")
    return config


class AdapterBaseMissing(ValueError):
    """A frozen adapter trained on a base model the profile does not have."""


def adapter_base(record: dict[str, Any], adapter_dir: Path | str | None = None, profile: str | None = None) -> str:
    """Which base an adapter was trained on (`SidecarConfig.base`): its weights only fit that one,
    so the service loads what the record names (adapters from before the option: the profile's).
    With ``profile``, a base the profile lacks is refused in one line naming the adapter, before
    any weight is loaded."""
    base = (record.get("config") or {}).get("base", PROFILE_BASE)
    if profile is not None and base not in (PROFILE_BASE, TINY_BASE):
        from ooospec.models.registry import resolve_profile

        known = resolve_profile(profile).models
        if base not in known:
            raise AdapterBaseMissing(f"sidecar adapter {adapter_dir}: trained on base {base!r}, which profile "
                                     f"{profile!r} does not have (its models: {sorted(known)})")
    return base


@dataclass
class _Generation:
    texts: list[str]
    new_tokens: list[int]
    truncated: list[bool]
    forwards: int
    done_after: list[int]  # per row: ``forwards`` counted when its answer was final
    timeline: list[ForwardTime]


@dataclass
class ChosenRows:
    """What one wave does once its function row has answered (an instance serves one wave).

    ``functions``: per row, the function it asks about (None: the function row); ``names``: the
    request's tools in index order. ``cut``: the other functions' rows stop there (``chosen_wave``).
    ``on_complete``: called once, with the answers of the function row and of the chosen function's
    rows, as soon as they are all final while other rows still run (``progressive_wave``: the
    chosen call is sent before the alternatives). A function answer that names no tool changes
    nothing."""

    functions: list[str | None]
    names: list[str]
    cut: bool = True
    on_complete: Callable[[dict[int, str]], None] | None = None
    stopped: set[int] = field(default_factory=set)
    _mine: set[int] | None = None  # the function row and the chosen function's rows, once answered
    _announced: bool = False

    @property
    def function_row(self) -> int:
        return self.functions.index(None)

    def chosen(self, answer: str) -> str | None:
        """The tool a function row's ``answer`` names (None: it names none)."""
        index, _ = parse_function_index(answer, len(self.names))
        return None if index is None else self.names[index]

    def after_step(self, finished: list[bool], answers: Callable[[int], str]) -> set[int]:
        """The rows to stop after a step (``finished``: rows that have written their end token;
        ``answers(row)``: a row's answer so far)."""
        stop: set[int] = set()
        if self._mine is None and finished[self.function_row]:
            name = self.chosen(answers(self.function_row))
            self._mine = set() if name is None else {i for i, f in enumerate(self.functions) if f in (None, name)}
            if self.cut and name is not None:
                stop = {row for row in range(len(finished)) if row not in self._mine and not finished[row]}
                self.stopped |= stop
        if self._mine and not self._announced and self.on_complete is not None \
                and all(finished[row] for row in self._mine) \
                and any(not finished[row] and row not in self.stopped for row in range(len(finished))):
            self._announced = True
            self.on_complete({row: answers(row) for row in sorted(self._mine)})
        return stop


class NullBan:
    """Which tokens would make a row's JSON answer null, however the tokenizer spells null.

    Answers are compact JSON, where ``null`` is the only value that starts with ``n``. So while a
    row's answer is still blank (whitespace only, e.g. the answer's leading space), every token
    whose text, stripped on the left, starts with ``n`` is banned; once a non-blank character is
    written the answer can no longer become null. Banning only null's usual first token is not
    enough: ``" nu" + "ll"`` or ``" " + "null"`` reach the same value (seen on another CPU's
    arithmetic with the tiny test tokenizer)."""

    def __init__(self, tokenizer: Any, width: int):
        texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False)[:width]
        pad = [False] * (width - len(texts))  # logits wider than the tokenizer: ids no text decodes to
        self.starts_null = torch.tensor([t.lstrip().startswith("n") for t in texts] + pad)
        self.blank = torch.tensor([t.strip() == "" for t in texts] + pad)
        self._banned = self.starts_null.nonzero().squeeze(-1)  # column indices, computed once

    def apply(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``logits`` with null's openings banned on the flagged ``rows`` (a bool mask)."""
        if not bool(rows.any()):
            return logits
        logits = logits.clone()
        logits[rows.nonzero().squeeze(-1).unsqueeze(-1), self._banned] = float("-inf")
        return logits


def _accepted(logits: torch.Tensor, drafts: list[list[int]]) -> list[int]:
    """Per row, how many of its draft tokens greedy decoding writes: position j's argmax (the token
    after the row's token and j draft tokens) must be draft token j."""
    greedy = logits.argmax(-1).tolist()
    kept = []
    for row, draft in enumerate(drafts):
        k = 0
        while k < len(draft) and greedy[row][k] == draft[k]:
            k += 1
        kept.append(k)
    return kept


class SlotPredictor:
    """Sidecar base (+ frozen adapter, merged) answering slot rows greedily."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, prompt: SlotPromptConfig = SlotPromptConfig(),
                 max_new_tokens: int = 32, eos_token_ids: list[int] | None = None,
                 required_values: bool = REQUIRED_VALUES, copy_values: CopySettings | None = None,
                 optional_values: bool = OPTIONAL_VALUES):
        self.model = model.eval()
        # With ``copy_values`` a string slot's value stays a span of the request's text unless the
        # model is sure it is not (`ooospec.sidecar.copy_values`); None: plain argmax.
        self.copy_values = copy_values
        self._token_texts: list[str] | None = None
        # With ``required_values`` a row asking for a parameter its function's schema marks
        # required may not answer null (`NullBan`). A small sidecar trained on few calls learns
        # that most rows are null (every candidate function's parameters are asked) and then
        # answers null for the chosen function too; the schema already says those slots are
        # filled whenever that function is called.
        self.required_values = required_values
        # With ``optional_values`` no row of a function may answer null, optional parameters
        # included: the target fills optional parameters almost always (dev: 106 of 113), while
        # the sidecar answers null for most of them (chosen on the API-disjoint dev: OPTIONAL_VALUES).
        self.optional_values = optional_values
        # The rows' first forward hands the head each row's last position gathered into one
        # contiguous batch (`TorchRowForwards._last_position`); False slices it (the control the wave
        # study measures).
        self.gathered_head = True
        # Which runtime runs the wave's forwards: None, this torch model; else one that makes
        # `RowForwards` of its own copy of the sidecar (`ooospec.sidecar.llama_cpp_rows`).
        self.runtime: SidecarRuntime | None = None
        # With ``span_drafts`` every step also verifies request-span drafts (`ooospec.sidecar.span_drafts`)
        self.span_drafts: SpanDraftSettings | None = None
        self._null_ban: NullBan | None = None
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos_token_ids or [tokenizer.eos_token_id])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        # every target starts with a space; the generated tail is decoded after it
        self._answer_lead = target_text("")

    # ------------------------------------------------------------ greedy row generation

    def row_forwards(self) -> RowForwards:
        """The forwards of one wave, on the runtime that serves the sidecar (``runtime``)."""
        if self.runtime is not None:
            return self.runtime.row_forwards()
        return TorchRowForwards(self.model, self.pad_id, self.gathered_head)

    def prefix_cache(self, prefix_ids: list[int]) -> PrefixState:
        """The shared prefix's state (batch 1), timed; reusable by later waves, which never mutate it."""
        run = self.row_forwards()
        state, timed = run.prefix(prefix_ids)
        return PrefixState(run, state, timed)

    @torch.no_grad()
    def generate_rows(self, prefix_ids: list[int], questions: list[list[int]], share_prefix: bool = True,
                      prefix_cache: PrefixState | None = None, no_null: list[bool] | None = None,
                      copier: SpanCopier | None = None, chosen_rows: ChosenRows | None = None,
                      drafter: SpanDrafter | None = None) -> _Generation:
        """Greedy answers of ``questions`` after one prefix, as one shrinking batch.

        With ``share_prefix`` the prefix runs once (or not at all when ``prefix_cache``, the state
        `prefix_cache` returned, is given); without it, every row carries the whole prefix (the
        no-sharing ablation). Rows flagged in ``no_null`` may not start their answer with null;
        ``copier`` picks the tokens of the rows it constrains (copy-aware string slots); with
        ``chosen_rows``, the other functions' rows leave the batch, cut, once the function row has
        answered; with ``drafter``, each step verifies a request-span draft after every row's token
        (`_accepted`: a row keeps what greedy decoding writes). A row stops at its end token or at
        ``max_new_tokens`` tokens (truncated). Every forward is timed (`ForwardTime`); the forwards
        run on `row_forwards`' runtime.
        """
        batch = len(questions)
        run = self.row_forwards() if prefix_cache is None else prefix_cache.run
        logits, timeline = run.start(prefix_ids, questions, share_prefix,
                                     None if prefix_cache is None else prefix_cache.state)
        forwards = len(timeline)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        finished = [False] * batch
        done_after = [0] * batch
        cut = chosen_rows.stopped if chosen_rows is not None else set()  # rows it stopped
        active = list(range(batch))
        guard = torch.tensor(no_null, dtype=torch.bool) if no_null is not None and any(no_null) else None
        if guard is not None and self._null_ban is None:
            self._null_ban = NullBan(self.tokenizer, logits.shape[-1])
        for _ in range(self.max_new_tokens):  # every forward writes at least one token of every row
            if guard is not None:  # rows of ``active``, in order: flagged and still blank
                logits = self._null_ban.apply(logits, guard)
            chosen = logits.argmax(-1).tolist() if copier is None else copier.choose(logits, active, self.eos)
            still: list[int] = []
            for row_pos, row in enumerate(active):
                if chosen[row_pos] in self.eos:
                    finished[row], done_after[row] = True, forwards
                else:
                    tokens[row].append(chosen[row_pos])
                    if len(tokens[row]) < self.max_new_tokens:
                        still.append(row_pos)
                    else:  # at the token limit: truncated, final now
                        done_after[row] = forwards
            if chosen_rows is not None:
                stop = chosen_rows.after_step(finished, lambda row: self._decode(tokens[row]))
                for row in stop:
                    done_after[row] = forwards
                still = [row_pos for row_pos in still if active[row_pos] not in cut]
            if not still:
                break
            if guard is not None:
                guard = guard & self._null_ban.blank[torch.tensor(chosen)]
                if not bool(guard.any()):  # every flagged row has written a character: no more checks
                    guard = None
            if len(still) < len(active):
                if guard is not None:
                    guard = guard[torch.tensor(still)]
                run.keep(still)
                chosen = [chosen[i] for i in still]
                active = [active[i] for i in still]
            drafts = [[] if drafter is None or (guard is not None and bool(guard[pos]))  # no draft past a ban
                      else drafter.propose(tokens[row], self.max_new_tokens - len(tokens[row]) - 1)
                      for pos, row in enumerate(active)]
            out, step_time = run.step([[chosen[pos], *draft] for pos, draft in enumerate(drafts)])
            timeline.append(step_time)
            forwards += 1
            kept = _accepted(out, drafts) if step_time.tokens > 1 else [0] * len(active)
            run.accept(kept)
            for pos, row in enumerate(active):
                tokens[row].extend(drafts[pos][:kept[pos]])
            logits = out[torch.arange(len(active)), torch.tensor(kept)]
        # rows still running at the token limit were final at the last forward
        done_after = [d if f or row in cut else forwards for row, (d, f) in enumerate(zip(done_after, finished))]
        texts = [self._decode(t) for t in tokens]
        return _Generation(texts, [len(t) for t in tokens], [not f for f in finished], forwards, done_after,
                           timeline)

    def drafter(self, prefix: list[int]) -> SpanDrafter | None:
        """Request-span drafts over ``prefix`` (None: ``span_drafts`` off, or copy-aware decoding on)."""
        if self.span_drafts is None or self.copy_values is not None:
            return None
        return SpanDrafter(prefix, self.span_drafts, self.eos)

    def _decode(self, token_ids: list[int]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        return text[len(self._answer_lead):] if text.startswith(self._answer_lead) else text

    # ------------------------------------------------------------ request-level predictions

    def prefix_ids(self, request: Request) -> list[int]:
        return encode(self.tokenizer, request_prefix(request, self.prompt))

    def _no_null(self, request: Request, keys: list[RowKey]) -> list[bool] | None:
        """Which rows may not answer null: a required parameter's (``required_values``), every
        parameter's (``optional_values`` too); None for the raw answers (``required_values`` off)."""
        if not self.required_values:  # the raw answers: ``optional_values`` extends the required ban
            return None
        if self.optional_values:
            return [k.function is not None and k.parameter is not None for k in keys]
        required = {tool["name"]: tool_required(tool) for tool in request.tools}
        return [k.function is not None and k.parameter in required.get(k.function, ()) for k in keys]

    def token_texts(self) -> list[str]:
        """The text of every token id (decoded once, on first use)."""
        if self._token_texts is None:
            self._token_texts = self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))],
                                                            skip_special_tokens=False)
        return self._token_texts

    def copier(self, request: Request, keys: list[RowKey]) -> SpanCopier | None:
        """Copy-aware decoding of the string slots among ``keys`` (None when the option is off)."""
        if self.copy_values is None:
            return None
        schemas = {tool["name"]: tool_properties(tool) for tool in request.tools}
        rows = [k.function is not None and string_slot(schemas.get(k.function, {}).get(k.parameter)) for k in keys]
        return SpanCopier(self.token_texts(), request_text(request), rows, self.copy_values, self._answer_lead)

    def context_refusal(self, prefix: list[int], questions: list[list[int]]) -> str | None:
        """Why rows of ``questions`` after ``prefix`` do not fit the sidecar's context (None: they
        do): every row needs its prefix, its question and ``max_new_tokens`` positions."""
        context = model_context(self.model)
        longest = max((len(q) for q in questions), default=0)
        if context is None or len(prefix) + longest + self.max_new_tokens <= context:
            return None
        return (f"{PROMPT_TOO_LONG}: {len(prefix) + longest} + {self.max_new_tokens} > {context} "
                f"(sidecar: prefix {len(prefix)}, longest question {longest})")

    def _refused(self, request: Request, mode: str, reason: str, start: float, prefix_tokens: int) -> WaveResult:
        """The wave that did not run: no call, no rows, no forward, and why."""
        return WaveResult(request.id, mode, None, None, 0, time.perf_counter() - start, prefix_tokens, [], 0,
                          reason=reason)

    def _encoded_questions(self, request: Request) -> list[list[int]]:
        return [encode(self.tokenizer, q) for _, q in online_questions(request)]

    def _rows(self, keys: list[RowKey], gen: _Generation, before: int = 0) -> list[RowPrediction]:
        """The rows of one generation; ``before``: the request's forwards that ran before it."""
        return [RowPrediction(k, t, n, tr, before + d) for k, t, n, tr, d
                in zip(keys, gen.texts, gen.new_tokens, gen.truncated, gen.done_after)]

    def _result(self, request: Request, mode: str, rows: list[RowPrediction], latency: float,
                prefix_tokens: int, forwards: int, timeline: list[ForwardTime]) -> WaveResult:
        answers = {r.key: r.text for r in rows}
        truncated = frozenset(r.key for r in rows if r.truncated)
        joined = join_rows(request, answers, truncated, with_alternatives=mode != "chosen_wave")
        payload = joined.payload
        return WaveResult(request.id, mode, joined.call, payload, len(payload.encode()) if payload else 0,
                          latency, prefix_tokens, rows, forwards, joined.dropped, joined.reason, timeline)

    def predict_wave(self, request: Request, share_prefix: bool = True, chosen_only: bool = False,
                     early: Callable[[EarlyCall], None] | None = None) -> WaveResult:
        """Every online row of ``request`` in one batched greedy generation. ``chosen_only``: the
        ``chosen_wave`` mode (other functions' rows cut once the function row answers, no
        alternatives); ``early``: the ``progressive_wave`` mode (the whole wave, and ``early`` called
        with the chosen call as soon as its rows are final, if other rows still run then)."""
        start = time.perf_counter()
        mode = ("chosen_wave" if chosen_only else "progressive_wave" if early is not None
                else "wave" if share_prefix else "wave_no_prefix_share")
        prefix = self.prefix_ids(request)
        keys, questions = zip(*online_questions(request))
        encoded = [encode(self.tokenizer, q) for q in questions]
        refusal = self.context_refusal(prefix, encoded)
        if refusal is not None:
            return self._refused(request, mode, refusal, start, len(prefix))
        chosen = None
        if chosen_only or early is not None:
            announce = None if early is None else self._announcer(request, list(keys), start, early)
            chosen = ChosenRows([k.function for k in keys], [t["name"] for t in request.tools], cut=chosen_only,
                                on_complete=announce)
        gen = self.generate_rows(prefix, encoded, share_prefix, no_null=self._no_null(request, list(keys)),
                                 copier=self.copier(request, list(keys)), chosen_rows=chosen,
                                 drafter=self.drafter(prefix))
        latency = time.perf_counter() - start
        return self._result(request, mode, self._rows(list(keys), gen), latency, len(prefix), gen.forwards,
                            gen.timeline)

    @staticmethod
    def _announcer(request: Request, keys: list[RowKey], start: float,
                   early: Callable[[EarlyCall], None]) -> Callable[[dict[int, str]], None]:
        """What a progressive wave calls with its chosen rows' answers: their call, joined as the
        whole wave joins it, handed to ``early`` (not when the rows join into no call)."""
        def announce(answers: dict[int, str]) -> None:
            joined = join_rows(request, {keys[row]: text for row, text in answers.items()})
            if joined.call is not None:
                early(EarlyCall(joined.call, joined.payload, time.perf_counter() - start))
        return announce

    def predict_sequential(self, request: Request) -> WaveResult:
        """Ablation: the same rows one at a time (the prefix KV is still computed once).

        Against `predict_wave` this isolates batching; `wave_no_prefix_share` isolates prefix reuse.
        """
        start = time.perf_counter()
        prefix = self.prefix_ids(request)
        refusal = self.context_refusal(prefix, self._encoded_questions(request))
        if refusal is not None:
            return self._refused(request, "sequential", refusal, start, len(prefix))
        cache = self.prefix_cache(prefix)
        rows, forwards, timeline = [], 1, [cache.time]
        online = online_questions(request)
        flags = self._no_null(request, [key for key, _ in online])
        for i, (key, question) in enumerate(online):
            gen = self.generate_rows(prefix, [encode(self.tokenizer, question)], prefix_cache=cache,
                                     no_null=None if flags is None else [flags[i]])
            rows.extend(self._rows([key], gen, forwards))
            forwards += gen.forwards
            timeline += gen.timeline
        latency = time.perf_counter() - start
        return self._result(request, "sequential", rows, latency, len(prefix), forwards, timeline)

    def predict_two_waves(self, request: Request) -> WaveResult:
        """Ablation: function index alone, then a second wave with only that function's arguments."""
        start = time.perf_counter()
        prefix = self.prefix_ids(request)
        refusal = self.context_refusal(prefix, self._encoded_questions(request))
        if refusal is not None:
            return self._refused(request, "two_waves", refusal, start, len(prefix))
        cache = self.prefix_cache(prefix)
        prefix_time = cache.time
        index_key, index_question = online_questions(request, functions=[])[0]
        first = self.generate_rows(prefix, [encode(self.tokenizer, index_question)], prefix_cache=cache)
        rows = self._rows([index_key], first, 1)
        forwards, timeline = 1 + first.forwards, [prefix_time, *first.timeline]
        answer = first.texts[0].strip()
        if answer.isdigit() and int(answer) < len(request.tools) and not first.truncated[0]:
            chosen = request.tools[int(answer)]["name"]
            second = online_questions(request, functions=[chosen])[1:]
            if second:
                keys, questions = zip(*second)
                gen = self.generate_rows(prefix, [encode(self.tokenizer, q) for q in questions], prefix_cache=cache,
                                         no_null=self._no_null(request, list(keys)))
                rows.extend(self._rows(list(keys), gen, forwards))
                forwards += gen.forwards
                timeline += gen.timeline
        latency = time.perf_counter() - start
        return self._result(request, "two_waves", rows, latency, len(prefix), forwards, timeline)

    def predict(self, request: Request, mode: str = "wave",
                early: Callable[[EarlyCall], None] | None = None) -> WaveResult:
        """``request``'s wave in ``mode``; ``early`` hears a progressive wave's first delivery."""
        if mode == "wave":
            return self.predict_wave(request)
        if mode == "progressive_wave":
            return self.predict_wave(request, early=early or (lambda _: None))
        if mode == "wave_no_prefix_share":
            return self.predict_wave(request, share_prefix=False)
        if mode == "chosen_wave":
            return self.predict_wave(request, chosen_only=True)
        if mode == "sequential":
            return self.predict_sequential(request)
        if mode == "two_waves":
            return self.predict_two_waves(request)
        raise ValueError(f"unknown sidecar mode {mode!r}; one of {MODES}")

    # ------------------------------------------------------------ construction

    @classmethod
    def from_frozen(cls, adapter_dir: Path, profile: str = "cpu", max_new_tokens: int | None = None,
                    required_values: bool = REQUIRED_VALUES, packed: bool = True,
                    copy_values: CopySettings | None = None,
                    optional_values: bool = OPTIONAL_VALUES, runtime: str = "torch") -> "SlotPredictor":
        """The sidecar base of ``profile`` cut to the adapter's layer count, adapter merged.

        ``max_new_tokens`` defaults to the value the adapter was evaluated with. With ``packed`` (as
        served) an fp32 CPU model computes its multi-row products (the prefix, the batched rows) on
        oneDNN-packed weights, as the targets do (`ooospec.models.packed_linear`); ``packed=False``
        keeps torch's plain products, the arithmetic the adapter's own dev waves were written in.
        ``runtime`` ``llama.cpp:<weights>`` runs the wave's forwards on llama.cpp
        (`ooospec.sidecar.gguf_export.load_runtime`; torch, said in one line, where it is missing);
        ``served``, the runtime the serving rule picked for this CPU kind and the model's arithmetic
        (`ooospec.sidecar.served_runtime`).
        """
        from ooospec.sidecar.base_model import load_sidecar_base
        from ooospec.models.adapters import load_frozen_adapter, read_frozen

        record = read_frozen(adapter_dir)
        prompt = adapter_prompt(record, adapter_dir)  # before any weight is loaded
        base = adapter_base(record, adapter_dir, profile)
        if base == TINY_BASE:
            from ooospec.models.tiny import tiny_model_and_tokenizer

            model, tokenizer = tiny_model_and_tokenizer(seed=record["config"]["lora"].get("seed", 0))
        else:
            model, tokenizer = load_sidecar_base(profile, record["num_layers"], base=base)
        model = load_frozen_adapter(model, adapter_dir, merge=True)
        if packed:  # after the merge: the packed copy is of the final weights
            pack_linears(model)
        if max_new_tokens is None:
            max_new_tokens = record["config"].get("max_new_tokens", 32)
        predictor = cls(model, tokenizer, prompt, max_new_tokens=max_new_tokens, required_values=required_values,
                        copy_values=copy_values, optional_values=optional_values)
        chosen = resolve_runtime(runtime, next(model.parameters()).dtype)
        if chosen != "torch":
            from ooospec.sidecar.gguf_export import ConvertedSidecarRefused, load_runtime

            try:
                predictor.runtime = load_runtime(chosen, adapter_dir, profile,
                                                 plain=lambda: cls.from_frozen(adapter_dir, profile, packed=False))
            except ConvertedSidecarRefused as refused:
                if runtime != SERVED_BY_RULE:  # asked for by name: refused
                    raise
                print(f"{refused}; the served wave runs on torch")
        return predictor


class SlotWavePredictor:
    """The trained sidecar (`SlotPredictor`) behind the service's `Predictor` interface."""

    def __init__(self, adapter_dir: str, profile: str = "cpu", max_new_tokens: int = 32, base_only: bool = False,
                 required_values: bool = REQUIRED_VALUES, optional_values: bool = OPTIONAL_VALUES,
                 runtime: str = SERVED_BY_RULE):
        if base_only:  # ablation: the same base, layer cut and prompts, without the adapter (on torch:
            # only an adapter's merged sidecar is converted for another runtime)
            from ooospec.models.adapters import read_frozen
            from ooospec.sidecar.base_model import load_sidecar_base

            record = read_frozen(Path(adapter_dir))
            model, tokenizer = load_sidecar_base(profile, record["num_layers"],
                                                 base=adapter_base(record, adapter_dir, profile))
            pack_linears(model)
            self.predictor = SlotPredictor(model, tokenizer, adapter_prompt(record, adapter_dir),
                                           max_new_tokens=max_new_tokens, required_values=required_values,
                                           optional_values=optional_values)
        else:
            self.predictor = SlotPredictor.from_frozen(Path(adapter_dir), profile, max_new_tokens,
                                                       required_values=required_values, optional_values=optional_values,
                                                       runtime=runtime)
        served = self.predictor.runtime
        self.runtime_name = "torch" if served is None else served.name  # the records name it

    def predict(self, request: Request, mode: str, early: Callable[[Prediction], None] | None = None) -> Prediction:
        deliver = None if early is None else (lambda first: early(Prediction(
            call=first.payload, rows=0, detail={"early": True, "predictor_latency_s": first.latency_s})))
        wave = self.predictor.predict(request, mode, early=deliver)
        return Prediction(call=wave.payload, rows=len(wave.rows),
                          detail={"forwards": wave.forwards, "prefix_tokens": wave.prefix_tokens,
                                  "dropped_slots": len(wave.dropped), "reason": wave.reason,
                                  "predictor_latency_s": wave.latency_s, "runtime": self.runtime_name})
