"""The hint's use measured on dev requests by replay: the real decoding loop, a known greedy output.

Where the target's greedy output of a request is already known (its teacher trace on dev), which
tree nodes a verify forward accepts is known without running the target: the walk from the root
follows the output. `ReferenceVerifier` is a `TreeVerifier` whose argmax at every tree row is the
output token at that row's position; `decode` runs on it unchanged (the real draft sources, hint
bank, tree merge, credits and rounds), so the counts a replay gives (verify forwards, tokens per
forward, nodes verified, tokens credited to the hint) are those the target would give, up to
near-ties and the re-tokenization of the trace's text. Seconds are *modelled* from this machine's
calibrated verify costs (`ooospec.studies.machine_calibration.Speed`), never measured here.

This is how the hint's constants are chosen (the merge share, the depth schedule, whether it is
gated and follows the target's function) without touching evaluation data; the results bench then
measures wall-clock time on the benchmarks. The sidecar's answers are its committed served dev waves
(payloads rebuilt from their rows, so every function's slots ride along), ready at the first
boundary (on the Qwen target the wave ends inside the prefill); the oracle first-call hint is the
trace's own call.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from transformers.cache_utils import DynamicCache

from ooospec.data.request import Call, Request
from ooospec.decoding.hint import DepthSchedule, HintBank
from ooospec.decoding.loop import DecodeResult, decode
from ooospec.decoding.out_of_order import HINT_SHARE
from ooospec.decoding.toolspec import ToolSpec
from ooospec.decoding.tree import TreeBudget
from ooospec.decoding.verifier import TreeVerifier, VerifierState
from ooospec.models.target import TargetModel, load_role_frame
from ooospec.sidecar.join import join_rows
from ooospec.sidecar.predictor import WaveResult
from ooospec.sidecar.service import SidecarResult
from ooospec.studies.machine_calibration import PLAN_FILE, Speed, load_speed

if TYPE_CHECKING:  # annotations only: pandas is imported where a frame is built
    import pandas as pd


class ReferenceVerifier(TreeVerifier):
    """A verifier whose target writes ``reference`` (output ids, first token included): the argmax
    at a tree row is the reference token at that row's position. Nothing else of `TreeVerifier`
    changes: the walk, the cut at EOS or the limit, credits and the (empty) cache commit."""

    def __init__(self, reference: list[int], eos_token_ids: list[int], vocab_size: int):
        if not reference:
            raise ValueError("a replay needs a non-empty reference output")
        self.reference, self.vocab_size = list(reference), vocab_size
        self.eos = set(int(t) for t in eos_token_ids)
        self.track_margins, self.dense_cache = False, False
        self._prompt_len = 0

    def prefill(self, prompt_ids: list[int]) -> tuple[VerifierState, float | None]:
        self._prompt_len = len(prompt_ids)
        return VerifierState(DynamicCache(), self.reference[0], len(prompt_ids)), None

    def forward_tree(self, state: VerifierState, tree: Any) -> torch.Tensor:
        after_root = state.cache_len - self._prompt_len + 1  # reference index of the root's successor
        logits = torch.zeros(1 + tree.size, self.vocab_size)
        for row, depth in enumerate([0] + tree.depths):
            index = after_root + depth
            if index < len(self.reference):
                logits[row, self.reference[index]] = 1.0
        return logits


@dataclass
class StoredTicket:
    """A sidecar ticket whose answer is already there (a stored wave: no sidecar process), or comes
    at the ``after_polls``-th poll: the bank polls once per round until it has it, so a hint that
    arrives after k verify rounds (a deferred wave, `ooospec.decoding.wave_policy`) is modelled
    without a clock."""

    result: SidecarResult
    after_polls: int = 0

    def poll(self) -> SidecarResult | None:
        if self.after_polls > 0:
            self.after_polls -= 1
            return None
        return self.result

    def wait(self, timeout: float | None = None) -> SidecarResult:
        return self.result


@dataclass
class StoredHints:
    """The `SidecarService` interface the hint bank uses, answering from stored payloads."""

    payloads: dict[str, str | None]
    after_rounds: int = 0  # the answer arrives at the bank's poll of this round (0: the first boundary)

    def submit(self, request: Request, mode: str = "wave") -> StoredTicket:
        payload = self.payloads.get(request.id)
        if payload is None:
            return StoredTicket(SidecarResult(request.id, error="no stored sidecar answer"))
        return StoredTicket(SidecarResult(request.id, payload=payload, payload_bytes=len(payload.encode())),
                            self.after_rounds)


@dataclass(frozen=True)
class HintUse:
    """One way of using the hint (None: plain ToolSpec)."""

    name: str
    hints: str | None = "sidecar"  # "sidecar" | "oracle" | None
    share: float | None = None  # `TreeBudget.hint_share`
    gate: bool = False
    follow: bool = False
    depth: DepthSchedule | None = None
    after_rounds: int = 0  # the hint arrives after this many verify rounds (a deferred wave)


@dataclass(frozen=True)
class ReplayCase:
    request: Request
    reference: list[int]  # the target's greedy output ids (its teacher trace, EOS appended if it stopped)
    oracle: str | None  # the trace's own call, compact
    sidecar: str | None  # the sidecar's payload with every function's slots


def payload_from_wave(request: Request, wave: dict[str, Any]) -> str | None:
    """The payload the sidecar now ships for a stored wave: its rows joined, alternatives included."""
    result = WaveResult.from_dict(wave)
    answers = {row.key: row.text for row in result.rows}
    truncated = frozenset(row.key for row in result.rows if row.truncated)
    return join_rows(request, answers, truncated, with_alternatives=True).payload


def replay(use: HintUse, cases: list[ReplayCase], target: TargetModel, budget: TreeBudget,
           max_tokens: int = 32) -> list[DecodeResult]:
    """Every case decoded in order by ToolSpec (+ the hint as ``use`` says) on its reference.
    ToolSpec's retrieval memory lives across the cases, as in the bench."""
    toolspec = ToolSpec()
    results = []
    for case in cases:
        sources: list[Any] = [toolspec]
        if use.hints is not None:
            payloads = {case.request.id: case.oracle if use.hints == "oracle" else case.sidecar}
            sources.insert(0, HintBank(StoredHints(payloads, use.after_rounds), max_tokens=max_tokens, gate=use.gate,
                                       follow=use.follow, depth=use.depth))
        verifier = ReferenceVerifier(case.reference, target.eos_token_ids, len(target.tokenizer))
        results.append(decode(target, sources, case.request, len(case.reference),
                              replace(budget, hint_share=use.share), verifier=verifier))
    return results


def replay_rows(use: HintUse, cases: list[ReplayCase], results: list[DecodeResult],
                verify_s: Callable[[int], float]) -> list[dict[str, Any]]:
    """One row per request: the counts, and the seconds ``verify_s(tree nodes)`` models."""
    rows = []
    for case, result in zip(cases, results):
        rows.append({
            "method": use.name, "request": case.request.id, "tokens": len(result.output_ids),
            "forwards": len(result.rounds), "nodes": sum(r.tree_size for r in result.rounds),
            "hint_tokens": result.source_counts.get("hint", 0),
            "modelled_s": sum(verify_s(r.tree_size) for r in result.rounds),
        })
    return rows


# ---- dev cases from the committed assets ------------------------------------------------------


class NotTheTeacher(ValueError):
    """A replay target whose greedy outputs no committed trace holds (only the teacher's are)."""


def check_replayable(target_name: str, profile: str) -> None:
    """The teacher traces are the target's own greedy outputs only where the target *is* the
    teacher (same model, surface, prompt and no adapter): the Qwen target, not SmolLM2."""
    from ooospec.models.registry import load_profile

    prof = load_profile(profile)
    role, teacher = prof.role(target_name), prof.role("teacher")
    same = (role.model, role.surface, role.prompt, role.adapter) == (teacher.model, teacher.surface, teacher.prompt,
                                                                     teacher.adapter)
    if not same:
        raise NotTheTeacher(f"{target_name}: a replay needs the target's own greedy outputs, and the committed traces "
                            f"are the teacher's ({teacher.model}); decode this target with the bench instead")


def dev_cases(target: TargetModel, profile: str, adapter_dir: Path, limit: int | None = None) -> list[ReplayCase]:
    """Dev requests with a committed teacher trace (the target's own greedy output) and a served
    dev wave of ``adapter_dir``, in the dev split's order."""
    from ooospec.training.sidecar import load_requests, teacher_traces
    from ooospec.training.sidecar_dev import served_dev_waves

    check_replayable(target.name, profile)

    requests = load_requests("dev")
    found = teacher_traces(requests, profile)
    traces = {r["id"]: r for r in (found[0] if found else [])}
    waves = {w["request_id"]: w for w in served_dev_waves(adapter_dir, profile)}
    eos = target.eos_token_ids[0]
    cases = []
    for request in requests:
        trace, wave = traces.get(request.id), waves.get(request.id)
        if trace is None or wave is None:
            continue
        ids = target.tokenizer(trace["raw_text"], add_special_tokens=False)["input_ids"]
        reference = ids + ([eos] if trace.get("stopped_on_eos") else [])
        oracle = Call.from_dict(trace["call"]).compact() if trace.get("call") else None
        cases.append(ReplayCase(request, reference, oracle, payload_from_wave(request, wave)))
    return cases[:limit] if limit else cases


DEFAULT_USES = (
    HintUse("toolspec", hints=None),
    HintUse("hint as before (plain_hint)", share=None),
    HintUse("+ share bound", share=HINT_SHARE),
    HintUse("+ gate", share=HINT_SHARE, gate=True),
    HintUse("+ follow (OoO-Spec now)", share=HINT_SHARE, gate=True, follow=True),
    HintUse("+ depth schedule", share=HINT_SHARE, gate=True, follow=True, depth=DepthSchedule()),
    HintUse("oracle first-call hint, as before", hints="oracle", share=None),
    HintUse("oracle first-call hint, as now", hints="oracle", share=HINT_SHARE, gate=True, follow=True),
)
SHARE_GRID = (0.25, 0.375, 0.5, 0.75, 1.0)


def share_uses(shares: tuple[float, ...] = SHARE_GRID) -> list[HintUse]:
    """The share sweep `HINT_SHARE` was chosen from (gated, following)."""
    return [HintUse(f"share {s:g}", share=s, gate=True, follow=True) for s in shares]


ARRIVAL_GRID = (0, 1, 2, 4, 8)


def arrival_uses(rounds: tuple[int, ...] = ARRIVAL_GRID) -> list[HintUse]:
    """OoO-Spec's hint arriving after k verify rounds: what a deferred wave keeps of the hint's gain
    (the rounds saved that `ooospec.decoding.wave_policy` interpolates)."""
    return [HintUse(f"hint after {k} rounds", share=HINT_SHARE, gate=True, follow=True, after_rounds=k)
            for k in rounds]


def replay_table(cases: list[ReplayCase], target: TargetModel, nodes: list[int], uses: list[HintUse],
                 speed: Speed | None = None) -> "pd.DataFrame":
    """One row per (budget, use): forwards, tokens per forward, nodes per verify, hint tokens, the
    modelled seconds (``speed``'s verify costs; without one, every forward counts 1) and the ratio
    over ToolSpec (ratio of totals, paired bootstrap over requests)."""
    import pandas as pd

    from ooospec.report.intervals import paired_speedup
    from ooospec.progress import progress_bar

    verify_s = (lambda n: speed.verify(n) if n else speed.step_s) if speed is not None else (lambda n: 1.0)
    table = []
    for budget_nodes in nodes:
        budget = TreeBudget(max_nodes=budget_nodes, max_depth=budget_nodes)
        base = None
        for use in progress_bar(uses, desc=f"replay at {budget_nodes} nodes", unit="use"):
            rows = replay_rows(use, cases, replay(use, cases, target, budget), verify_s)
            forwards = sum(r["forwards"] for r in rows)
            entry = {"nodes": budget_nodes, "use": use.name, "requests": len(rows), "forwards": forwards,
                     "tokens_per_forward": sum(r["tokens"] for r in rows) / forwards,
                     "nodes_per_verify": sum(r["nodes"] for r in rows) / forwards,
                     "hint_tokens": sum(r["hint_tokens"] for r in rows),
                     "modelled_s" if speed is not None else "cost_in_forwards": sum(r["modelled_s"] for r in rows)}
            if base is None:
                base = rows
            else:
                ratio = paired_speedup([b["modelled_s"] for b in base], [r["modelled_s"] for r in rows])
                entry.update(over_toolspec=ratio.cell, verdict=ratio.verdict)
            table.append(entry)
    return pd.DataFrame(table)


REPLAY_COLUMNS = {"tokens_per_forward": "tokens / forward", "hint_tokens": "hint tokens",
                  "modelled_s": "modelled s", "cost_in_forwards": "cost (forwards)", "over_toolspec": "x ToolSpec"}


def dev_replay(target_name: str, profile: str, nodes: list[int], shares: bool = True,
               plan_path: Path | None = None, limit: int | None = None,
               arrivals: bool = False) -> tuple["pd.DataFrame", str]:
    """The replay table of ``target_name`` on dev (every `DEFAULT_USES`, the share sweep if
    ``shares``, the late-arrival sweep if ``arrivals``; the first ``limit`` cases only, if given)
    and a sentence saying what it rests on."""
    from ooospec.bench.plan import find_sidecar_adapter
    from ooospec.paths import artifacts_dir

    plan_path = Path(plan_path) if plan_path else artifacts_dir() / "reproduce-plan" / PLAN_FILE
    target = load_role_frame(target_name, profile)
    adapter = find_sidecar_adapter(profile)
    if adapter is None:
        raise FileNotFoundError(f"no frozen sidecar adapter for profile {profile!r} (make sidecar)")
    cases = dev_cases(target, profile, adapter, limit)
    speed = load_speed(target_name, plan_path) if plan_path.exists() else None
    uses = list(DEFAULT_USES) + (share_uses() if shares else []) + (arrival_uses() if arrivals else [])
    table = replay_table(cases, target, nodes, uses, speed)
    table = table.drop(columns=["requests", "verdict", "nodes_per_verify"]).rename(columns=REPLAY_COLUMNS)
    cost = (f"seconds modelled from this machine's calibrated verify costs ({plan_path.name})" if speed
            else "no calibration here: every verify forward costs 1")
    note = (f"{len(cases)} dev requests of {target_name} replayed against its committed greedy outputs "
            f"(teacher traces) with the served dev waves of {adapter.parent.name}; {cost}")
    return table, note


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--shares", action="store_true", help="add the share sweep")
    parser.add_argument("--arrivals", action="store_true", help="add the hint arriving after 0-8 rounds")
    parser.add_argument("--limit", type=int, default=None, help="the first N dev cases only")
    parser.add_argument("--plan", default=None, help="the reproduce plan whose calibration models the seconds")
    args = parser.parse_args(argv)

    import pandas as pd

    table, note = dev_replay(args.target, args.profile, args.nodes, args.shares, args.plan, args.limit, args.arrivals)
    print(note)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 2):
        print(table.to_string(index=False))


if __name__ == "__main__":
    main()
