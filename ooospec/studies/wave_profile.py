"""Where a sidecar wave's time goes, forward by forward, and what a lever of the wave saves.

A wave is one forward of the request prefix (batch 1), one forward of every row's question over that
prefix, then one step per token of its longest row (`ooospec.sidecar.predictor.ForwardTime`). The
target's first verify round comes right after its prefill, so a hint is in time for it only if the
wave ends inside that prefill. This study runs the served sidecar as the bench serves it (one
thread) and records, per request: each phase's seconds, the vocabulary head's seconds (timed around
the head module), the time between forwards (argmax, batch shrink, cache plumbing), and when the
chosen function's call was complete: the forward after which the function row and every row of the
function it names were final (`RowPrediction.done_after`). A hint sent then would not wait for the
other functions' rows, which decide the wave's length on most requests.

Requests: the first API-disjoint dev requests with a target call (dev data: the levers are chosen
there), and, reported only, the canonical run's Qwen requests whose target output holds a call (the
first few per benchmark), each with the Qwen target's prefill of the same request timed on one
thread beside its wave. Evaluation data chooses nothing here.

Levers are measured side by side: each request runs the control and every lever back to back, in
an order that rotates from request to request, and a lever whose payload differs from the control's
on a request is counted (`LeverSummary.same_payload`). `op_split` reads a torch profile of whole
waves by operator kind (products, attention, copies, other operators, Python between operators).

``python -m ooospec.studies.wave_profile [--requests 30] [--benchmark-requests 6] [--commit]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ooospec.data.request import Call, Request
from ooospec.paths import artifacts_dir, shown
from ooospec.progress import progress_bar
from ooospec.sidecar.metrics import score_wave
from ooospec.sidecar.predictor import EarlyCall, SlotPredictor, WaveResult
from ooospec.sidecar.slots import FUNCTION_INDEX
from ooospec.sidecar.span_drafts import SpanDraftSettings
from ooospec.stage import Stage, append_jsonl, code_fingerprint, read_jsonl, write_jsonl

if TYPE_CHECKING:
    import pandas as pd

STAGE_NAME = "wave-profile"
COMMITTED = "wave-profile"  # artifacts/committed/<this>/<machine suffix>.jsonl + .json
TARGET = "qwen2.5-coder-0.5b"
CONTROL = "sliced head"
SERVED_LEVER = "gathered head"  # what `SlotPredictor` serves by default
# How the bench serves the sidecar, as the settings a lever changes: the predictor's attributes, the
# sidecar mode, which copy of the sidecar runs it (``served``, or ``int8``: its linear layers
# quantized to 8 bits, weights per tensor, by torch's dynamic quantization: measured, not served;
# ``packed``: its bf16 linear layers on oneDNN-packed weights, as the targets run them, `packed_model`) and
# on which runtime (``torch``, or llama.cpp on the converted sidecar, `ooospec.sidecar.llama_cpp_rows`:
# ``llama.cpp:own`` in the torch sidecar's arithmetic, f32 or bf16, or ``llama.cpp:q8_0``)
SERVED = {"gathered_head": True, "span_drafts": None, "model": "served", "mode": "wave", "runtime": "torch"}
SPAN_DRAFTS = SpanDraftSettings().to_dict()
# every lever as what it changes from SERVED (``+``: on top of the gathered head); the control first
LEVERS: dict[str, dict[str, Any]] = {
    CONTROL: {"gathered_head": False},
    SERVED_LEVER: {},
    "+ chosen wave": {"mode": "chosen_wave"},
    "+ progressive": {"mode": "progressive_wave"},
    "+ span drafts": {"span_drafts": SPAN_DRAFTS},
    "+ span drafts, progressive": {"span_drafts": SPAN_DRAFTS, "mode": "progressive_wave"},
    "+ int8": {"model": "int8"},
    "+ llama.cpp": {"runtime": "llama.cpp:own"},
    "+ llama.cpp q8_0": {"runtime": "llama.cpp:q8_0"},
    "+ llama.cpp, chosen wave": {"runtime": "llama.cpp:own", "mode": "chosen_wave"},
    "+ llama.cpp, progressive": {"runtime": "llama.cpp:own", "mode": "progressive_wave"},
    "+ packed bf16": {"model": "packed"},
    "+ packed bf16, chosen wave": {"model": "packed", "mode": "chosen_wave"},
}


@dataclass(frozen=True)
class StudyRequest:
    """A request the study runs, where it comes from, and the target's own call for it."""

    source: str  # ``dev`` or the benchmark
    request: Request
    reference: Call


@dataclass(frozen=True)
class WaveProfile:
    """One wave of one lever on one request, split by phase."""

    request_id: str
    source: str  # ``dev`` or the benchmark
    lever: str
    rows: int
    prefix_tokens: int
    question_tokens: int  # the rows' first forward's width
    wave_s: float
    first_s: float  # when the chosen call was handed over: the wave's end, or a progressive wave's first delivery
    prefix_s: float
    rows_s: float
    steps: int
    steps_s: float
    head_s: float  # the vocabulary head inside those forwards
    between_s: float  # the wave's time outside its forwards
    chosen_forwards: int | None  # forwards after which the chosen call was complete (None: no call)
    chosen_s: float | None  # the wave's time until then
    forwards: int
    longest_row_chosen: bool | None  # the last row to finish is the function row or the chosen function's
    truncated_rows: int
    payload: str | None
    whole_call: bool  # the wave's call is the target's (dev: as the dev scores it; benchmarks: as written)
    followed: bool  # some call of the payload (the chosen one or an alternative) is the target's
    target_prefill_s: float | None = None  # benchmark requests: the target's prefill, same request


def served_adapter() -> Path:
    """The committed adapter the bench serves (the ``full`` preset)."""
    from ooospec.training.sidecar import PRESETS, committed_adapters_dir

    return committed_adapters_dir() / PRESETS["full"].committed_name / "adapter"


def chosen_complete(wave: WaveResult) -> int | None:
    """The forwards after which the function row and every row of the function it chose were final."""
    if wave.call is None:
        return None
    mine = [r.done_after for r in wave.rows if r.key.kind == FUNCTION_INDEX or r.key.function == wave.call.name]
    return max(mine)


class HeadClock:
    """Seconds spent inside the vocabulary head (a forward pre-hook and hook on the head module)."""

    def __init__(self, model: torch.nn.Module):
        self.seconds, self._start = 0.0, 0.0
        head = model.get_output_embeddings()
        self._handles = [head.register_forward_pre_hook(self._enter), head.register_forward_hook(self._leave)]

    def _enter(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def _leave(self, *_: Any) -> None:
        self.seconds += time.perf_counter() - self._start

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def profile_wave(predictor: SlotPredictor, models: dict[str, torch.nn.Module], clocks: dict[str, HeadClock],
                 item: StudyRequest, lever: str, runtimes: dict[str, Any] | None = None) -> WaveProfile:
    """One wave of ``item`` with ``lever``'s settings, split by phase (``runtimes``: each runtime
    name's loaded runtime, None for torch; a runtime's head is not timed apart: ``head_s`` 0)."""
    runtimes = {"torch": None, **(runtimes or {})}
    settings = {**SERVED, **LEVERS[lever]}
    model, mode = settings.pop("model"), settings.pop("mode")
    predictor.model = models[model]
    predictor.runtime = runtimes[settings["runtime"]]
    predictor.gathered_head = settings["gathered_head"]
    predictor.span_drafts = None if settings["span_drafts"] is None else SpanDraftSettings(**settings["span_drafts"])
    clocks[model].take()
    request = item.request
    early: list[EarlyCall] = []
    wave = predictor.predict(request, mode, early=early.append)
    head = clocks[model].take()
    by_kind = {kind: [f for f in wave.timeline if f.kind == kind] for kind in ("prefix", "rows", "step")}
    chosen = chosen_complete(wave)
    last = max(wave.rows, key=lambda r: r.done_after, default=None)
    return WaveProfile(
        request.id, item.source, lever, len(wave.rows), wave.prefix_tokens,
        by_kind["rows"][0].tokens if by_kind["rows"] else 0, round(wave.latency_s, 4),
        round(early[0].latency_s if early else wave.latency_s, 4),
        round(sum(f.seconds for f in by_kind["prefix"]), 4), round(sum(f.seconds for f in by_kind["rows"]), 4),
        len(by_kind["step"]), round(sum(f.seconds for f in by_kind["step"]), 4), round(head, 4),
        round(wave.latency_s - sum(f.seconds for f in wave.timeline), 4), chosen,
        None if chosen is None else round(sum(f.seconds for f in wave.timeline[:chosen]), 4), wave.forwards,
        None if last is None or wave.call is None else
        (last.key.kind == FUNCTION_INDEX or last.key.function == wave.call.name),
        sum(r.truncated for r in wave.rows), wave.payload, *holds_call(item, wave))


def holds_call(item: StudyRequest, wave: WaveResult) -> tuple[bool, bool]:
    """(whole call, followed): the chosen call, and any call of the payload, equal to the target's;
    on dev as the API-disjoint dev scores a wave (the target's call on the tool's schema), on the
    benchmarks as the bench reads a hint (the call as the target wrote it)."""
    reference = item.reference
    if item.source == "dev":
        from ooospec.sidecar.slots import reference_call

        whole = score_wave(item.request, reference, wave).call_exact
        reference = reference_call(item.request, reference)
    else:
        from ooospec.studies.sidecar_on_benchmarks import scored_wave

        whole = scored_wave(wave.to_dict(), reference)["whole"]
    payload = json.loads(wave.payload) if wave.payload else []
    calls = payload if isinstance(payload, list) else [payload]
    target = (reference.name, json.dumps(reference.arguments, sort_keys=True))
    return whole, any((c.get("name"), json.dumps(c.get("arguments") or {}, sort_keys=True)) == target for c in calls)


def rotated(levers: list[str], index: int) -> list[str]:
    """The levers in the order request ``index`` runs them (rotating, so none always runs first)."""
    shift = index % len(levers)
    return levers[shift:] + levers[:shift]


def dev_requests(count: int, profile: str = "cpu") -> list[StudyRequest]:
    """The first ``count`` API-disjoint dev requests with a target call, in the dev scoring's order."""
    from ooospec.data.api_disjoint import load_api_disjoint
    from ooospec.training.disjoint_dev import target_calls

    split = load_api_disjoint()
    references = target_calls(split.dev, profile)
    return [StudyRequest("dev", r, references[r.id]) for r in split.dev if r.id in references][:count]


def benchmark_requests(per_benchmark: int, profile: str = "cpu") -> list[StudyRequest]:
    """The canonical run's first ``per_benchmark`` Qwen requests with a target call, per benchmark."""
    from ooospec.studies.sidecar_on_benchmarks import committed_run, requests_with_calls

    out: list[StudyRequest] = []
    for item in requests_with_calls(committed_run(), TARGET, profile):
        if sum(q.source == item.benchmark for q in out) < per_benchmark:
            out.append(StudyRequest(item.benchmark, item.request, item.target_call))
    return out


@torch.no_grad()
def target_prefill_seconds(target: Any, request: Request) -> float:
    ids = torch.tensor([target.prompt_ids(request)])
    start = time.perf_counter()
    target.model(input_ids=ids, logits_to_keep=1)
    return time.perf_counter() - start


def study_stage(adapter_dir: Path, profile: str, requests: int, per_benchmark: int) -> Stage:
    """Keyed by the adapter, the sizes, the sidecar's code and the machine (times are its own)."""
    from ooospec.models.adapters import read_frozen
    from ooospec.training.sidecar import this_machine

    return Stage(STAGE_NAME, {"adapter_sha256": read_frozen(adapter_dir)["sha256"], "profile": profile,
                              "requests": requests, "benchmark_requests": per_benchmark, "levers": LEVERS,
                              "code": code_fingerprint("sidecar", "studies/wave_profile.py"),
                              "machine": this_machine()})


def run_study(adapter_dir: Path, profile: str = "cpu", requests: int = 30,
              per_benchmark: int = 6, threads: int = 1) -> list[dict[str, Any]]:
    """Every lever's wave on every request (resumable by request); the stored lines."""
    stage = study_stage(adapter_dir, profile, requests, per_benchmark)
    out = stage.path("waves.jsonl")
    done = {line["request_id"] + "|" + line["source"] for line in read_jsonl(out)} if out.exists() else set()
    work = dev_requests(requests, profile) + benchmark_requests(per_benchmark, profile)
    todo = [q for q in work if f"{q.request.id}|{q.source}" not in done]
    if todo:
        torch.set_num_threads(threads)
        predictor = SlotPredictor.from_frozen(adapter_dir, profile)
        models = {"served": predictor.model, "int8": int8_model(adapter_dir, profile),
                  "packed": packed_model(predictor.model)}
        clocks = {name: HeadClock(model) for name, model in models.items()}
        runtimes = study_runtimes(adapter_dir, profile, predictor)
        levers = [lever for lever in LEVERS if LEVERS[lever].get("runtime", "torch") in runtimes]
        target = _prefill_target(profile) if any(q.source != "dev" for q in todo) else None
        for model in models.values():  # warm-up, not recorded
            predictor.model = model
            predictor.predict_wave(todo[0].request)
        predictor.model = models["served"]
        for runtime in runtimes.values():
            predictor.runtime = runtime
            predictor.predict_wave(todo[0].request)
        for index, item in enumerate(progress_bar(todo, desc="wave profile", unit="req")):
            prefill = None if item.source == "dev" else round(target_prefill_seconds(target, item.request), 4)
            lines = [profile_wave(predictor, models, clocks, item, lever, runtimes)
                     for lever in rotated(levers, index)]
            append_jsonl(out, [{**asdict(p), "target_prefill_s": prefill} for p in lines])
        for clock in clocks.values():
            clock.close()
    wanted = {f"{q.request.id}|{q.source}" for q in work}
    return [line for line in read_jsonl(out) if line["request_id"] + "|" + line["source"] in wanted]


def study_runtimes(adapter_dir: Path, profile: str, predictor: SlotPredictor) -> dict[str, Any]:
    """The runtimes the study's levers name, loaded (torch: None); one that cannot load here (no
    llama-cpp-python) is left out, said in one line by `load_runtime`, and so are its levers."""
    from ooospec.sidecar.gguf_export import load_runtime

    own = "f32" if next(predictor.model.parameters()).dtype == torch.float32 else "bf16"
    runtimes: dict[str, Any] = {"torch": None}
    plain = lambda: SlotPredictor.from_frozen(adapter_dir, profile, packed=False)  # noqa: E731
    for name in sorted({lever.get("runtime", "torch") for lever in LEVERS.values()} - {"torch"}):
        runtime = load_runtime(name.replace(":own", f":{own}"), adapter_dir, profile, plain)
        if runtime is not None:
            runtimes[name] = runtime
    return runtimes


def int8_model(adapter_dir: Path, profile: str) -> torch.nn.Module:
    """The served sidecar with its linear layers (head included) dynamically quantized to int8
    (weights per tensor, activations per batch): a cheaper forward whose answers may differ. Its
    activations are fp32 in every profile (torch's dynamic int8 products take fp32 only), so in bf16
    the lever is int8 products in an fp32 model, not int8 over bf16."""
    import warnings

    plain = SlotPredictor.from_frozen(adapter_dir, profile, packed=False).model.float()
    with warnings.catch_warnings():  # torch.ao's notice that eager quantization moves to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(plain, {torch.nn.Linear}, dtype=torch.qint8)


def packed_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the served sidecar whose bf16 linear layers (head included) run on oneDNN-packed
    weights (`ooospec.models.row_invariant.RowInvariantLinear`, the targets' products): torch's own
    bf16 product reorders the weight on every call. Several rows: the same bits as torch's product;
    one row: its own summation order, so a payload may differ (counted). An fp32 sidecar is served
    packed already (`ooospec.models.packed_linear`): the model itself."""
    import copy

    from ooospec.models.row_invariant import pack_linear_layers

    if next(model.parameters()).dtype == torch.float32:
        return model
    packed = copy.deepcopy(model)
    pack_linear_layers(packed)
    return packed


def _prefill_target(profile: str) -> Any:
    from ooospec.models.packed_linear import pack_linears
    from ooospec.models.target import load_target

    target = load_target(TARGET, profile)
    pack_linears(target.model)  # as the bench runs an eager fp32 target (bf16: left as it is)
    return target


@dataclass(frozen=True)
class LeverSummary:
    """One lever over one request set: medians, and how many payloads equal the control's."""

    source: str
    lever: str
    n: int
    median_wave_s: float
    speedup: float  # the control's median wave over this lever's
    median_first_s: float  # the chosen call handed over
    median_chosen_s: float | None
    same_payload: int
    whole_call: int
    followed: int
    prefix_bound: float  # the control's wave over this lever's prefix forward alone, median over requests


def summarize(lines: list[dict[str, Any]]) -> list[LeverSummary]:
    out = []
    for source in sorted({line["source"] for line in lines}, key=lambda s: (s != "dev", s)):
        part = [line for line in lines if line["source"] == source]
        control = {line["request_id"]: line for line in part if line["lever"] == CONTROL}
        base = statistics.median(line["wave_s"] for line in control.values())
        for lever in [lever for lever in LEVERS if any(line["lever"] == lever for line in part)]:
            mine = [line for line in part if line["lever"] == lever]
            chosen = [line["chosen_s"] for line in mine if line["chosen_s"] is not None]
            median = statistics.median(line["wave_s"] for line in mine)
            out.append(LeverSummary(source, lever, len(mine), round(median, 3), round(base / median, 2),
                                    round(statistics.median(line["first_s"] for line in mine), 3),
                                    round(statistics.median(chosen), 3) if chosen else None,
                                    sum(line["payload"] == control[line["request_id"]]["payload"] for line in mine),
                                    sum(line["whole_call"] for line in mine), sum(line["followed"] for line in mine),
                                    prefix_bound(mine, control)))
    return out


def prefix_bound(mine: list[dict[str, Any]], control: dict[str, dict[str, Any]]) -> float:
    """The most a lever could gain over the control if its rows and steps cost nothing: per request,
    the control's wave over the lever's prefix forward alone (the prefix must be read before any
    row is asked), the median over requests. A lever whose bound is below an aim cannot reach the
    aim by cheaper rows or fewer steps, only by a cheaper prefix forward."""
    return round(statistics.median(control[line["request_id"]]["wave_s"] / line["prefix_s"] for line in mine), 2)


def phase_table(lines: list[dict[str, Any]], lever: str) -> "pd.DataFrame":
    """Per request set, ``lever``'s medians in seconds (steps: a count): the wave, its prefix forward,
    the rows' first forward, the steps, the head inside them, the chosen call complete, the
    target's prefill where it was timed; and how often another function's row ended the wave."""
    import pandas as pd

    rows = []
    for source in sorted({line["source"] for line in lines}, key=lambda s: (s != "dev", s)):
        part = [line for line in lines if line["source"] == source and line["lever"] == lever]

        def median(key: str) -> float | None:
            values = [line[key] for line in part if line[key] is not None]
            return round(statistics.median(values), 3) if values else None

        rows.append({"requests": source, "n": len(part), "wave": median("wave_s"), "prefix": median("prefix_s"),
                     "rows fwd": median("rows_s"), "steps": median("steps"), "steps s": median("steps_s"),
                     "head": median("head_s"), "chosen": median("chosen_s"),
                     "other last": sum(line["longest_row_chosen"] is False for line in part),
                     "target prefill": median("target_prefill_s")})
    return pd.DataFrame(rows).set_index("requests")


OP_KINDS = (("products", ("mm", "linear", "matmul")), ("attention", ("scaled_dot_product", "softmax", "attention")),
            ("copies", ("copy_", "cat", "index", "clone", "contiguous", "stack", "select_indices")))


def op_kind(name: str) -> str:
    """Which kind an operator is (``aten::addmm`` -> products), else ``other operators``."""
    for kind, marks in OP_KINDS:
        if any(mark in name for mark in marks):
            return kind
    return "other operators"


def op_split(predictor: SlotPredictor, requests: list[Request]) -> dict[str, float]:
    """Seconds of whole waves of ``requests`` by operator kind (self time), and the rest of the
    wall time as ``Python between operators``."""
    from torch.profiler import ProfilerActivity, profile

    split = dict.fromkeys([kind for kind, _ in OP_KINDS] + ["other operators"], 0.0)
    wall = 0.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for request in requests:
            wall += predictor.predict_wave(request).latency_s
    for event in prof.key_averages():
        split[op_kind(event.key)] += event.self_cpu_time_total / 1e6
    split["Python between operators"] = max(0.0, wall - sum(split.values()))
    return {kind: round(seconds, 3) for kind, seconds in split.items()}


def committed_dir() -> Path:
    return artifacts_dir() / "committed" / COMMITTED


def commit(lines: list[dict[str, Any]], ops: dict[str, float], adapter_dir: Path, profile: str,
           arithmetic: str) -> Path:
    """The study's lines and provenance, named by this machine (`disjoint_dev.machine_suffix`)."""
    from ooospec.models.adapters import read_frozen
    from ooospec.provenance import code_commit
    from ooospec.training.disjoint_dev import machine_suffix
    from ooospec.training.sidecar import _provenance

    provenance = _provenance()
    name = machine_suffix(provenance["machine"])
    write_jsonl(committed_dir() / f"{name}.jsonl", lines)
    record = {"adapter": read_frozen(adapter_dir)["name"], "profile": profile, "levers": LEVERS, "arithmetic": arithmetic,
              "summary": [asdict(s) for s in summarize(lines)], "op_split": ops, "threads": torch.get_num_threads(),
              "code_commit": code_commit(), "made_by": "ooospec.studies.wave_profile", **provenance}
    (committed_dir() / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return committed_dir() / f"{name}.jsonl"


def committed_studies() -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every committed study: (its provenance, its lines), one per machine kind."""
    for path in sorted(committed_dir().glob("*.json")):
        yield json.loads(path.read_text()), list(read_jsonl(path.with_suffix(".jsonl")))


def committed_tables() -> list[tuple[str, "pd.DataFrame", "pd.DataFrame"]]:
    """Per committed study (one per machine kind): the machine in words, the levers against the
    control, and the served lever's phases per request set (what the sidecar chapter shows)."""
    import pandas as pd

    from ooospec.training.disjoint_dev import machine_cell

    out = []
    for info, lines in committed_studies():
        levers = pd.DataFrame([asdict(s) for s in summarize(lines)]).rename(columns={
            "source": "requests", "median_wave_s": "wave s", "speedup": "x control", "median_first_s": "first s",
            "same_payload": "= control", "whole_call": "whole", "followed": "followed", "prefix_bound": "bound x"})
        levers = levers.drop(columns=["median_chosen_s"])
        # each request set named once, on its first row (a grouped index reads as labelling the last)
        levers["requests"] = levers["requests"].where(~levers["requests"].duplicated(), "")
        phases = phase_table(lines, SERVED_LEVER).astype(object).where(lambda t: t.notna(), "")
        out.append((f"{machine_cell(info['machine'])}, {info['threads']} thread, {info['arithmetic']}",
                    levers.set_index("requests"), phases))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Where the sidecar wave's time goes, and what each lever saves.")
    parser.add_argument("--adapter", type=Path, default=None, help="a frozen adapter folder (default: the served one)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--requests", type=int, default=30, help="API-disjoint dev requests")
    parser.add_argument("--benchmark-requests", type=int, default=6, help="canonical requests per benchmark (0: none)")
    parser.add_argument("--op-requests", type=int, default=6, help="dev requests profiled by operator kind")
    parser.add_argument("--commit", action="store_true", help="copy the finished study to artifacts/committed/")
    args = parser.parse_args(argv)
    args.adapter = args.adapter or served_adapter()
    lines = run_study(args.adapter, args.profile, args.requests, args.benchmark_requests)
    predictor = SlotPredictor.from_frozen(args.adapter, args.profile)
    predictor.predict_wave(dev_requests(1, args.profile)[0].request)  # warm-up
    ops = op_split(predictor, [q.request for q in dev_requests(args.op_requests, args.profile)])
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(pd.DataFrame([asdict(s) for s in summarize(lines)]).to_string(index=False))
        for lever in [lever for lever in LEVERS if any(line["lever"] == lever for line in lines)]:
            print(f"\n{lever}:\n{phase_table(lines, lever).to_string()}")
    print("\noperators, whole waves of", args.op_requests, "dev requests (s):", json.dumps(ops))
    if args.commit:
        arithmetic = str(next(predictor.model.parameters()).dtype).removeprefix("torch.")
        print("committed", shown(commit(lines, ops, args.adapter, args.profile, arithmetic)))


if __name__ == "__main__":
    main()
