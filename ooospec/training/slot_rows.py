"""Training rows: which call each request's slot rows come from (teacher or gold, every drop with its
reason), the rows of a split, their counts beside the paper's, and row files.

The row format itself (`SlotRow`, `expand_call`) is the runtime's (`ooospec.sidecar.slots`): the
sidecar asks online exactly the questions it was trained on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ooospec.data.request import Call, Request
from ooospec.sidecar.slots import ROW_KINDS, SlotPromptConfig, SlotRow, expand_call
from ooospec.stage import read_jsonl, write_jsonl

# the paper's slot-row totals (section 3), reported next to ours
PAPER_ROW_COUNTS = {"train": 75_567, "dev": 3_239}
PAPER_REQUEST_COUNTS = {"train": 9_662, "dev": 529}


@dataclass
class KeptCall:
    """The call a request's rows come from, and where it came from (teacher or gold)."""

    request_id: str
    call: Call
    origin: str


@dataclass
class CallSelection:
    """Kept calls of one split plus every drop with its reason (counts must reconcile)."""

    kept: list[KeptCall] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)


def calls_from_gold(requests: Iterable[Request]) -> CallSelection:
    """First gold call of each request: the stand-in for teacher traces while none exist."""
    selection = CallSelection()
    for request in requests:
        if not request.gold:
            selection.dropped["no gold call"] += 1
            continue
        call = request.gold[0]
        if request.tool(call.name) is None:
            selection.dropped["gold names a function not in tools"] += 1
            continue
        selection.kept.append(KeptCall(request.id, call, "gold"))
    return selection


def calls_from_traces(requests: Iterable[Request], traces: Iterable[dict[str, Any]], source: str) -> CallSelection:
    """Teacher calls (records ``{"id", "call": {"name","arguments"} | null, "reason"}``) per request.

    ``source`` names the trace file in error messages. A request without a trace is dropped as
    "not traced" (a teacher run on a subset), never silently.
    """
    by_id: dict[str, dict[str, Any]] = {}
    for lineno, record in enumerate(traces, 1):
        if "id" not in record or "call" not in record:
            raise ValueError(f"{source}: record {lineno}: a teacher trace needs 'id' and 'call'")
        by_id[record["id"]] = record
    selection = CallSelection()
    for request in requests:
        record = by_id.get(request.id)
        if record is None:
            selection.dropped["not traced"] += 1
        elif record["call"] is None:  # reasons read "kind: detail"; the kind is what is counted
            reason = str(record.get("reason") or "no valid call").split(":")[0]
            selection.dropped[f"teacher: {reason}"] += 1
        else:
            call = Call.from_dict(record["call"])
            if request.tool(call.name) is None:
                selection.dropped["teacher names a function not in tools"] += 1
            else:
                selection.kept.append(KeptCall(request.id, call, "teacher"))
    return selection


def build_rows(requests: list[Request], selection: CallSelection,
               cfg: SlotPromptConfig = SlotPromptConfig()) -> list[SlotRow]:
    by_id = {request.id: request for request in requests}
    rows: list[SlotRow] = []
    for kept in selection.kept:
        rows.extend(expand_call(by_id[kept.request_id], kept.call, cfg))
    return rows


def row_counts(rows: Iterable[SlotRow]) -> dict[str, int]:
    rows = list(rows)
    counts = Counter(row.kind for row in rows)
    out = {kind: counts.get(kind, 0) for kind in ROW_KINDS}
    out["total"] = sum(out.values())
    out["requests"] = len({row.request_id for row in rows})
    return out


def row_count_table(counts: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """Our counts per split next to the paper's totals (a list of plain records for a DataFrame)."""
    table = []
    for split, c in counts.items():
        table.append({
            "split": split, "requests": c.get("requests"), **{k: c.get(k, 0) for k in ROW_KINDS},
            "total rows": c.get("total", 0), "rows / request": round(c["total"] / c["requests"], 2) if c.get("requests") else None,
            "paper requests": PAPER_REQUEST_COUNTS.get(split), "paper rows": PAPER_ROW_COUNTS.get(split),
            "paper rows / request": round(PAPER_ROW_COUNTS[split] / PAPER_REQUEST_COUNTS[split], 2) if split in PAPER_ROW_COUNTS else None,
        })
    return table


def write_rows(path: Path, rows: Iterable[SlotRow]) -> int:
    return write_jsonl(path, (row.to_dict() for row in rows))


def read_rows(path: Path) -> Iterator[SlotRow]:
    for lineno, record in enumerate(read_jsonl(path), 1):
        try:
            row = SlotRow.from_dict(record)
        except TypeError as err:
            raise ValueError(f"{path}: record {lineno}: not a SlotRow ({err})") from err
        if row.kind not in ROW_KINDS:
            raise ValueError(f"{path}: record {lineno}: unknown row kind {row.kind!r}")
        yield row
