"""Sidecar choices scored on the API-disjoint dev (`ooospec.data.api_disjoint`).

Every sidecar choice (an adapter, a decoding option) is scored here against the target's own call
for the request (its teacher trace: what greedy verification accepts), on dev requests none of
whose functions occur in the training split. An adapter trained before this split existed may
have trained on some of these requests (they came from the hash split's train side); each scored
request records whether it did (``seen_in_training``), and the summary is given for all requests
and for the unseen ones alone.

The waves are written to a stage keyed by the adapter's hash, the decoding options and the split's
settings, one line per request, so an interrupted run resumes where it stopped.
``python -m ooospec.training.disjoint_dev --adapter <dir> [--copy-margin M]`` scores one choice.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ooospec.data.api_disjoint import ApiDisjointSplit, load_api_disjoint, source_of
from ooospec.data.request import Call, Request
from ooospec.models.adapters import read_frozen
from ooospec.paths import shown
from ooospec.progress import progress_bar
from ooospec.sidecar.copy_values import CopySettings
from ooospec.sidecar.metrics import rescore, score_to_dict, score_wave
from ooospec.sidecar.predictor import REQUIRED_VALUES, SlotPredictor
from ooospec.stage import Stage, append_jsonl, read_jsonl, write_jsonl
from ooospec.training.sidecar import (SidecarConfig, drop_long_prefixes, load_splits, select_calls, subset,
                                      this_machine)

if TYPE_CHECKING:
    import pandas as pd

STAGE_NAME = "sidecar-disjoint-dev"
COMMITTED = "sidecar-disjoint-dev"  # artifacts/committed/<this>/<label>.jsonl + .json: what the book shows


@dataclass(frozen=True)
class DecodingChoice:
    """How the sidecar decodes on dev: as served (required slots filled), optionally copy-aware."""

    required_values: bool = REQUIRED_VALUES
    copy_values: CopySettings | None = None
    optional_values: bool = False  # no null for any slot, optional ones included
    runtime: str = "torch"  # or llama.cpp on the converted sidecar (`ooospec.sidecar.llama_cpp_rows`)

    def to_dict(self) -> dict[str, Any]:
        out = {"required_values": self.required_values,
               "copy_values": None if self.copy_values is None else self.copy_values.to_dict()}
        if self.optional_values:  # earlier keys unchanged, so earlier stages keep their keys
            out["optional_values"] = True
        return out if self.runtime == "torch" else {**out, "runtime": self.runtime}

    @property
    def label(self) -> str:
        """How the book names it: ``served`` (required slots filled: what was served when the
        API-disjoint dev was made), ``raw``, ``+fill`` (every slot filled: served since that dev chose
        it, `ooospec.sidecar.predictor.OPTIONAL_VALUES`), ``+copy<margin>``, ``+llama.cpp-<weights>``."""
        base = ("served" if self.required_values else "raw") + ("+fill" if self.optional_values else "")
        base = base if self.copy_values is None else f"{base}+copy{self.copy_values.margin:g}"
        return base if self.runtime == "torch" else f"{base}+{self.runtime.replace(':', '-')}"


def target_calls(requests: list[Request], profile: str = "cpu") -> dict[str, Call]:
    """The target's own first call per request (committed teacher traces, every one of them)."""
    selection, _ = select_calls(requests, "dev", SidecarConfig(profile=profile, calls="teacher", teacher_requests=None))
    return {k.request_id: k.call for k in selection.kept if k.origin == "teacher"}


def trained_on(record: dict[str, Any], tokenizer: Any, train: list[Request] | None = None) -> set[str]:
    """Ids of the requests an adapter trained on, re-drawn from its own config (its training side,
    the hash split's or the API-disjoint one, and the same selection, prefix limit and seeded subset
    its training ran; distractor tools are added only where they fit, so they drop nothing)."""
    from ooospec.sidecar.slots import SlotPromptConfig

    cfg = SidecarConfig(**record["config"])
    train = load_splits(cfg)["train"] if train is None else train
    selection, _ = select_calls(train, "train", cfg)
    by_id = {r.id: r for r in train}
    selection = drop_long_prefixes(by_id, selection, tokenizer, SlotPromptConfig(**cfg.prompt), cfg.max_prefix_tokens)
    chosen = subset(selection, cfg.train_requests, cfg.lora.get("seed", 0))
    return {k.request_id for k in chosen.kept}


def choice_stage(record: dict[str, Any], choice: DecodingChoice, profile: str, split: ApiDisjointSplit) -> Stage:
    """Keyed by the machine too: wave times are its own, and a checkout moved to another CPU scores again."""
    return Stage(STAGE_NAME, {"adapter_sha256": record["sha256"], "profile": profile, **choice.to_dict(),
                              "split": split.settings, "machine": this_machine()})


def score_choice(adapter_dir: Path, choice: DecodingChoice = DecodingChoice(), profile: str = "cpu",
                 split: ApiDisjointSplit | None = None, limit: int | None = None) -> dict[str, Any]:
    """Waves of one adapter + decoding choice on the API-disjoint dev, scored against the target's
    call; resumable by request. Returns the summary over all scored requests and the unseen ones."""
    adapter_dir = Path(adapter_dir)
    record = read_frozen(adapter_dir)
    split = split or load_api_disjoint()
    references = target_calls(split.dev, profile)
    requests = [r for r in split.dev if r.id in references][:limit]
    stage = choice_stage(record, choice, profile, split)
    out = stage.path("waves.jsonl")
    done = {w["request_id"] for w in read_jsonl(out)} if out.exists() else set()
    todo = [r for r in requests if r.id not in done]
    if todo:
        predictor = SlotPredictor.from_frozen(adapter_dir, profile, required_values=choice.required_values,
                                              copy_values=choice.copy_values, optional_values=choice.optional_values,
                                              runtime=choice.runtime)
        if choice.runtime != "torch" and predictor.runtime is None:  # never score torch under another name
            raise RuntimeError(f"sidecar runtime {choice.runtime} cannot run here; {choice.label} not scored")
        seen = trained_on(record, predictor.tokenizer)
        for request in progress_bar(todo, desc=f"disjoint dev {record['name']}", unit="req"):
            wave = predictor.predict_wave(request)
            score = score_wave(request, references[request.id], wave)
            append_jsonl(out, [{**wave.to_dict(), "score": score_to_dict(score), "source": source_of(request),
                                "seen_in_training": request.id in seen,
                                "reference": references[request.id].to_dict()}])
    waves = [w for w in read_jsonl(out) if w["request_id"] in {r.id for r in requests}]
    by_id = {r.id: r for r in requests}
    unseen = [w for w in waves if not w["seen_in_training"]]
    summary = {"adapter": record["name"], "adapter_sha256": record["sha256"][:12], "choice": choice.to_dict(),
               "all": rescore(waves, by_id, references), "unseen": rescore(unseen, by_id, references),
               "by_source": {s: rescore([w for w in waves if w["source"] == s], by_id, references)
                             for s in sorted({w["source"] for w in waves})}}
    stage.path("summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def committed_dir() -> Path:
    from ooospec.paths import artifacts_dir

    return artifacts_dir() / "committed" / COMMITTED


def machine_suffix(machine: dict[str, Any]) -> str:
    """What tells this machine's committed scores apart: its CPU's bf16 flag where it has one
    (``avx512_bf16``), else its kernel level (``avx2``)."""
    flag = machine.get("bf16_flag")
    return str(flag if flag not in (None, "none", "unknown") else machine.get("cpu_capability")).lower()


def same_machine(theirs: dict[str, Any], machine: dict[str, Any]) -> bool:
    """One CPU kind: model name, kernel level, bf16 kernels and bf16 flag all equal. A record made
    before the flag was recorded is another machine's: its CPU may have lacked the flag."""
    keys = ("cpu", "cpu_capability", "bf16_kernels")
    return (all(theirs.get(k) == machine.get(k) for k in keys)
            and theirs.get("bf16_flag", "unrecorded") == machine.get("bf16_flag"))


def committed_name(directory: Path, name: str, machine: dict[str, Any]) -> str:
    """``name``, or ``name--<machine suffix>`` where ``name`` is committed from another machine: wave
    times (and, across arithmetics, answers) are the machine's, so a score from one is never replaced
    by a score from another; the book's table shows both, each with its machine."""
    found = directory / f"{name}.json"
    if not found.exists():
        return name
    theirs = json.loads(found.read_text()).get("machine", {})
    return name if same_machine(theirs, machine) else f"{name}--{machine_suffix(machine)}"


def commit_choice(adapter_dir: Path, choice: DecodingChoice = DecodingChoice(), profile: str = "cpu") -> Path:
    """Copy a finished choice's per-request scores (not its rows) and its provenance next to the
    other committed assets, so the book shows them without running the sidecar."""
    from ooospec.training.sidecar import _provenance
    from ooospec.provenance import code_commit

    record = read_frozen(Path(adapter_dir))
    split = load_api_disjoint()
    summary = score_choice(adapter_dir, choice, profile, split)
    waves = list(read_jsonl(choice_stage(record, choice, profile, split).path("waves.jsonl")))
    machine = this_machine()
    out = committed_dir()
    name = committed_name(out, f"{record['name']}--{choice.label}", machine)
    keep = ("request_id", "source", "seen_in_training", "payload", "reference", "score", "latency_s", "reason")
    write_jsonl(out / f"{name}.jsonl", [{k: w.get(k) for k in keep} for w in waves])  # atomic
    provenance = {"adapter": record["name"], "adapter_sha256": record["sha256"], "choice": choice.to_dict(),
                  "label": choice.label, "profile": profile, "split": split.settings, "requests": len(waves),
                  "summary": summary, "code_commit": code_commit(), "made_by": "ooospec.training.disjoint_dev",
                  **_provenance()}
    (out / f"{name}.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return out / f"{name}.jsonl"


def _cpu_name(cpu: str) -> str:
    """A CPU's model name as a column can hold it: ``Intel(R) Xeon(R) Processor`` -> ``Intel Xeon``."""
    return " ".join(cpu.replace("(R)", "").replace("(TM)", "").split()[:2])


def machine_cell(machine: dict[str, Any]) -> str:
    """``AVX2, AMD EPYC``; ``AVX512 (avx512_bf16), Intel Xeon`` where the CPU's bf16 flag was recorded."""
    flag = machine.get("bf16_flag")
    level = machine["cpu_capability"] + (f" ({flag})" if flag not in (None, "none", "unknown") else "")
    return f"{level}, {_cpu_name(machine['cpu'])}"


def as_written(wave: dict[str, Any]) -> bool:
    """A scored wave's call equals the target's call as the target wrote it, arguments outside the
    tool's schema included. ``call_exact`` compares with the call as the sidecar can express it
    (schema parameters only), which counts a request whose target adds an argument the schema lacks;
    greedy verification accepts the hint's whole call only as written, which is what the bench's
    hint-agreement table reads."""
    if not wave["score"]["call_exact"] or not wave.get("payload"):
        return False
    payload = json.loads(wave["payload"])
    call = payload[0] if isinstance(payload, list) else payload
    reference = wave["reference"]
    return call["name"] == reference["name"] and \
        json.dumps(call["arguments"], sort_keys=True) == json.dumps(reference["arguments"], sort_keys=True)


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def committed_table() -> "pd.DataFrame":
    """One row per committed adapter + decoding choice: n, function, values, whole call (all and
    unseen-in-training requests; `as_written` for all), median wave time."""
    import pandas as pd

    from ooospec.sidecar.metrics import RequestScore, summarize

    rows = []
    for path in sorted(committed_dir().glob("*.json")):
        info = json.loads(path.read_text())
        waves = list(read_jsonl(path.with_suffix(".jsonl")))
        scores = {part: summarize(RequestScore(**w["score"]) for w in waves if part == "all" or not w["seen_in_training"])
                  for part in ("all", "unseen")}
        rows.append({"adapter": info["adapter"], "decoding": info["label"], "requests": scores["all"]["requests"],
                     "function": scores["all"]["function_index_accuracy"],
                     "values": scores["all"]["argument_value_exact_match"],
                     "whole call": scores["all"]["whole_call_exact_match"],
                     "as written": _share([as_written(w) for w in waves]),
                     "unseen requests": scores["unseen"]["requests"],
                     "whole call (unseen)": scores["unseen"]["whole_call_exact_match"],
                     "median wave s": scores["all"]["median_wave_latency_s"],
                     "machine": machine_cell(info["machine"])})
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description="Score a sidecar adapter + decoding on the API-disjoint dev.")
    parser.add_argument("--adapter", required=True, type=Path, help="a frozen adapter folder")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--copy-margin", type=float, default=None, help="copy-aware string slots, this margin")
    parser.add_argument("--raw", action="store_true", help="the adapter's raw answers (required slots may be null)")
    parser.add_argument("--fill-optional", action="store_true", help="no slot may answer null, optional ones included")
    parser.add_argument("--runtime", default="torch", help="torch, or llama.cpp:<f32|bf16|q8_0> (the converted sidecar)")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--commit", action="store_true", help="copy the finished scores to artifacts/committed/")
    args = parser.parse_args()
    choice = DecodingChoice(required_values=not args.raw, optional_values=args.fill_optional, runtime=args.runtime,
                            copy_values=None if args.copy_margin is None else CopySettings(margin=args.copy_margin))
    summary = score_choice(args.adapter, choice, args.profile, limit=args.limit)
    print(shown(args.adapter), json.dumps(choice.to_dict()))
    for part in ("all", "unseen"):
        m = summary[part]
        print(f"{part:7s} n={m.get('requests')} function={m.get('function_index_accuracy')} "
              f"values={m.get('argument_value_exact_match')} whole call={m.get('whole_call_exact_match')} "
              f"median wave={m.get('median_wave_latency_s')} s")
    if args.commit:
        print("committed", shown(commit_choice(args.adapter, choice, args.profile)))


if __name__ == "__main__":
    main()
