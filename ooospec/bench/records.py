"""One decode -> one bench record (checked against AR's output of the same request), and the
records of a run with what it could not do."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ooospec.bench.methods import MethodSpec
from ooospec.bench.placement import CorePlan
from ooospec.bench.plan import BenchPlan
from ooospec.data.request import Call
from ooospec.decoding.hint import HintBank
from ooospec.decoding.loop import DecodeResult
from ooospec.models.arithmetic import NEAR_TIE_GAPS, first_difference, sentences
from ooospec.paths import shown
from ooospec.stage import Stage


def hint_fields(bank: HintBank | None, trace: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The hint bank's per-request stats, with the arrival time on the request's clock."""
    if bank is None:
        return None
    stats = bank.stats
    payload_bytes = stats.payload_bytes
    if not payload_bytes and stats.call is not None:
        payload_bytes = len(Call.from_dict(stats.call).compact().encode("utf-8"))
    ready = next((e for e in trace if e["kind"] == "hint_ready"), None)
    wave = next((e for e in trace if e["kind"] == "sidecar_wave"), None)
    return {
        "submitted": stats.submitted,
        "schedule": stats.schedule,
        "ready_round": stats.ready_round,
        "ready_t": None if ready is None else ready["t"],
        "error": stats.error,
        "payload_bytes": payload_bytes,
        "wave_s": stats.wave_s,
        "waited_s": stats.waited_s,
        "wave_start_t": None if wave is None else wave["start"],
        "wave_end_t": None if wave is None else wave["end"],
        "received_t": None if wave is None else wave["received"],
        "hint_text": stats.hint_text,
        "call": stats.call,
        "proposals": stats.proposals,
        **stats.extra,
    }


class LosslessViolation(RuntimeError):
    """A decode differs from AR where AR's top-2 logits were not a near-tie: a bug, never a result."""


def check_lossless(records: list[dict[str, Any]], where: str) -> None:
    """Fail loudly on a mismatch with AR that is not a near-tie (near-ties are listed by the book)."""
    bad = [r for r in records if not r["identical_to_ar"] and not r.get("near_tie")]
    if bad:
        lines = [f"{r['id']}: token {r['mismatch']['position']}, AR top-2 gap {r['mismatch']['ar_margin']}" for r in bad]
        raise LosslessViolation(f"{where}: {len(bad)} decode(s) differ from AR beyond a near-tie:\n" + "\n".join(lines))


@dataclass
class Decoded:
    """One method's decode of one request, with what its record says besides the result."""

    spec: MethodSpec
    result: DecodeResult
    sidecar: str | None  # the sidecar kind that served it (None: the method uses none)
    shared_prefill: bool  # started from the request's one measured prefill
    bank: HintBank | None  # the method's hint source, whose stats the record carries


def make_record(decoded: Decoded, *, target: str, benchmark: str, position: int, ar: DecodeResult | None,
                tie_gap: float = NEAR_TIE_GAPS["float32"]) -> dict[str, Any]:
    """The record of one decode, compared with ``ar`` (AR's decode of the same request) token by
    token; a first difference where AR's own top-2 gap is below ``tie_gap`` is a near-tie."""
    result, spec = decoded.result, decoded.spec
    record = result.to_record()
    request_id = record.pop("id")
    reference = ar or result
    diff = first_difference(reference.output_ids, result.output_ids)
    mismatch = None
    if diff is not None:
        def at(values: list, i: int) -> Any:
            return values[i] if i < len(values) else None

        mismatch = {"position": diff, "ar_token": at(reference.output_ids, diff), "token": at(result.output_ids, diff),
                    "ar_margin": at(reference.margins, diff), "margin": at(result.margins, diff)}
    return {
        "id": f"{target}/{benchmark}/{request_id}/{spec.name}",
        "request_id": request_id,
        "target": target,
        "benchmark": benchmark,
        "position": position,
        "method": spec.name,
        "method_base": spec.base,
        "sidecar": decoded.sidecar,
        "shared_prefill": decoded.shared_prefill,
        "sidecar_restarted": any(e["kind"] == "sidecar_restarted" for e in record["trace"]),
        "identical_to_ar": diff is None,
        "near_tie": mismatch is not None and mismatch["ar_margin"] is not None and mismatch["ar_margin"] < tie_gap,
        "mismatch": mismatch,
        "hint": hint_fields(decoded.bank, record["trace"]),
        **record,
    }


class BenchRecords(list):
    """The records of a run (a plain list of dicts) plus what the run could not do."""

    def __init__(self, records: list[dict[str, Any]], stage: Stage, plan: BenchPlan,
                 skipped_targets: dict[str, str], cores: CorePlan | None,
                 failed: list[dict[str, Any]] | None = None):
        super().__init__(records)
        self.stage, self.plan = stage, plan
        self.skipped_targets, self.cores = skipped_targets, cores
        self.failed = list(failed or [])  # requests that could not be decoded, counted in n

    @property
    def sidecar(self) -> str:
        return self.plan.sidecar

    def budget_choices(self) -> list[dict[str, Any]]:
        """Per slice: the tree budget the run used and what chose it (`ooospec.bench.tree_budget`)."""
        out = []
        for path in sorted((self.stage.dir / "slices").glob("*/*.budget.json")):
            out.append({"slice": f"{path.parent.name}/{path.name.removesuffix('.budget.json')}",
                        **json.loads(path.read_text())})
        return out

    def arithmetic(self) -> str:
        """The arithmetic and machine the records were measured in ("fp32 on a 2-core AVX2 CPU ...")."""
        return sentences(r.get("arithmetic") for r in self)

    def notes(self) -> list[str]:
        """Lines a reader must see next to the numbers."""
        adapter_shown = shown(self.plan.adapter) if self.plan.adapter is not None else None
        which = {"slot": f"the trained sidecar ({adapter_shown})", "oracle": "the ORACLE sidecar (the target's "
                 "own greedy call)", "gold": "a sidecar answering with the GOLD call"}[self.plan.sidecar]
        lines = [f"measured in {self.arithmetic()}", f"OoO-Spec ran with {which}"] + list(self.plan.notes)
        lines += [f"target {t} skipped: {why}" for t, why in self.skipped_targets.items()]
        lines += [f"method {m} skipped: {why}" for m, why in self.plan.skipped_methods.items()]
        lines += [f"request {f['request_id']} ({f['target']} / {f['benchmark']}) not decoded: {f['error']}"
                  for f in self.failed]
        if self.cores is not None and not self.cores.pinned:
            lines.append("cores not pinned (fewer than 2 cores available or pin_cores=False)")
        return lines
