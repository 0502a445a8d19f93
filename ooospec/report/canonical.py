"""The canonical run: the results the artifact stands behind, kept as a frozen asset.

A paper artifact caches its expensive step and checks it instead of redoing it; the committed
teacher traces and adapters already work that way, and so do the results here. One run of the
results chapter at its defaults (every target x benchmark, every method, n = 30 per benchmark) is
committed under ``artifacts/committed/canonical/``: one gzipped records file per cell and a
manifest with each file's sha256 and the run's provenance (code commit, machine and arithmetic,
the tree budget each target ran, seed, n, methods, the sidecar adapter and its hash). Making it is
an explicit target (``make canonical``: `ooospec.reproduce.canonical`), never a side effect of a chapter.

Reading it (`load_canonical`) checks every file against the manifest: a file whose sha256 differs,
a missing file or a provenance field that is not there stops the reader with one line naming the
file, what was expected and what was found. A run is of one arithmetic: records of two are never
pooled.

A reader's own run is set beside it (`consistency`): where the arithmetic is the same (dtype, the
CPU's kernels, torch), every decode of a request both ran must write the same tokens, and the
methods whose work does not depend on timing (AR, PLD, ToolSpec) the same number of target
forwards when the tree budget is the same; any difference is listed. Every speedup of the reader's
run is set against the canonical interval of the same claim: inside it, or flagged.
"""

from __future__ import annotations

import gzip
import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ooospec.models.arithmetic import sentences
from ooospec.paths import artifacts_dir, shown
from ooospec.provenance import bytes_sha256

MANIFEST = "manifest.json"
# what a manifest's provenance must say, so that a reader knows what the claims stand on
PROVENANCE_FIELDS = ("code_commit", "machine", "arithmetic", "tree_budgets", "seed", "requests", "methods",
                     "sidecar_adapter", "created")
# the parts of a record's arithmetic that decide its rounding (not the CPU's name or core count)
ROUNDING_FIELDS = ("dtype", "cpu_capability", "bf16_kernels", "bf16_flag", "torch", "kernels", "logits")
# methods whose forwards are fixed by the request, the tree budget and the run's order (no sidecar clock)
TIMING_FREE_BASES = ("ar", "pld", "toolspec")


class CanonicalError(RuntimeError):
    """The committed canonical run does not match its manifest; the message names file, expected, found."""


def canonical_dir() -> Path:
    return artifacts_dir() / "committed" / "canonical"


def cell_file(target: str, benchmark: str) -> str:
    return f"{target}--{benchmark}.jsonl.gz"


def rounding_of(record: dict[str, Any]) -> tuple:
    """What decides a record's rounding (`ROUNDING_FIELDS`); records without an arithmetic: ()."""
    arithmetic = record.get("arithmetic") or {}
    return tuple(arithmetic.get(f, "unrecorded" if f == "bf16_flag" else None) for f in ROUNDING_FIELDS) \
        if arithmetic else ()


@dataclass(frozen=True)
class CanonicalRun:
    """The committed records and what made them."""

    directory: Path
    provenance: dict[str, Any]
    records: list[dict[str, Any]]

    def arithmetic(self) -> str:
        return sentences(r.get("arithmetic") for r in self.records)

    def cells(self) -> list[tuple[str, str]]:
        return sorted({(r["target"], r["benchmark"]) for r in self.records})

    def summary(self) -> str:
        """One sentence: what the run is and where it came from."""
        p = self.provenance
        cells = ", ".join(f"{t} / {b}" for t, b in self.cells())
        budgets = ", ".join(f"{t}: {n} nodes" for t, n in sorted(p["tree_budgets"].items()))
        return (f"The canonical run: {len(self.records)} decodes, n = {p['requests']} per benchmark ({cells}), "
                f"methods {', '.join(p['methods'])}; measured in {p['arithmetic']} at code commit "
                f"{p['code_commit']} on {p['created']}; tree budget {budgets}; seed {p['seed']}; sidecar "
                f"{p['sidecar_adapter']}. Committed in {shown(self.directory)}, every file checked against "
                f"its sha256.")


def _gzip(lines: Iterable[str]) -> bytes:
    """Deterministic gzip (no name, mtime 0): the same records give the same bytes and hash."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as handle:
        for line in lines:
            handle.write((line + "\n").encode("utf-8"))
    return buffer.getvalue()


def check_one_arithmetic(records: list[dict[str, Any]], where: str) -> None:
    """Refuse records of two arithmetics: their ratios are never pooled."""
    found = {rounding_of(r) for r in records}
    if len(found) > 1:
        raise CanonicalError(f"{where}: records of {len(found)} arithmetics "
                             f"({sentences(r.get('arithmetic') for r in records)}); a canonical run is of one, "
                             "never pooled")


def write_canonical(records: list[dict[str, Any]], provenance: dict[str, Any], directory: Path | None = None) -> Path:
    """Write ``records`` (one file per target x benchmark, in the run's order) and the manifest."""
    directory = directory or canonical_dir()
    missing = [f for f in PROVENANCE_FIELDS if f not in provenance]
    if missing:
        raise CanonicalError(f"canonical provenance: missing {', '.join(missing)}")
    check_one_arithmetic(records, "canonical run")
    by_cell: dict[tuple[str, str], list[str]] = defaultdict(list)
    for record in records:
        by_cell[(record["target"], record["benchmark"])].append(json.dumps(record, ensure_ascii=False))
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.jsonl.gz"):
        old.unlink()
    files = {}
    for (target, benchmark), lines in sorted(by_cell.items()):
        data = _gzip(lines)
        name = cell_file(target, benchmark)
        (directory / name).write_bytes(data)
        files[name] = {"sha256": bytes_sha256(data), "records": len(lines), "target": target, "benchmark": benchmark}
    manifest = {"files": files, "provenance": provenance}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return directory / MANIFEST


def load_canonical(directory: Path | None = None) -> CanonicalRun | None:
    """The committed canonical run, every file checked (`CanonicalError` on any mismatch); None
    where no manifest is committed."""
    directory = directory or canonical_dir()
    manifest_path = directory / MANIFEST
    if not manifest_path.exists():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        files, provenance = manifest["files"], manifest["provenance"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise CanonicalError(f"{shown(manifest_path)}: expected a manifest with files and provenance, found "
                             f"{type(err).__name__}: {err}") from None
    missing = [f for f in PROVENANCE_FIELDS if f not in provenance]
    if missing:
        raise CanonicalError(f"{shown(manifest_path)}: provenance expected {', '.join(PROVENANCE_FIELDS)}, "
                             f"found no {', '.join(missing)}")
    records: list[dict[str, Any]] = []
    for name, entry in sorted(files.items()):
        path = directory / name
        if not path.exists():
            raise CanonicalError(f"{shown(path)}: expected sha256 {entry['sha256']}, found no file")
        data = path.read_bytes()
        found = bytes_sha256(data)
        if found != entry["sha256"]:
            raise CanonicalError(f"{shown(path)}: expected sha256 {entry['sha256']}, found {found}")
        lines = gzip.decompress(data).decode("utf-8").splitlines()
        records += [json.loads(line) for line in lines if line.strip()]
    unlisted = sorted(p.name for p in directory.glob("*.jsonl.gz") if p.name not in files)
    if unlisted:
        raise CanonicalError(f"{shown(directory / unlisted[0])}: expected only the manifest's files, found one it "
                             "does not list")
    check_one_arithmetic(records, shown(manifest_path))
    return CanonicalRun(directory, provenance, records)


# ---------------------------------------------------------------- this machine's run beside it


@dataclass
class Consistency:
    """This machine's run set against the canonical one."""

    same_arithmetic: bool
    canonical_arithmetic: str
    run_arithmetic: str
    compared: int  # decodes present in both runs (same target, benchmark, request and method)
    differences: pd.DataFrame  # one row per decode whose tokens or forwards differ
    ratios: pd.DataFrame  # every claim of this run against the canonical interval of the same claim
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> pd.DataFrame:
        return self.ratios[self.ratios["against the canonical interval"] != "inside"]

    def summary(self) -> str:
        """What a reader reads first: do the two runs agree."""
        if self.same_arithmetic:
            ties = int(self.differences["near-tie"].sum())
            head = (f"Same arithmetic ({self.run_arithmetic}): {self.compared} decodes ran in both runs, "
                    f"{len(self.differences)} differ from the canonical run in tokens or forwards"
                    + (f", {ties} of them in tokens at a rounding near-tie of AR's top-2 logits in the run "
                       "that departs from its AR" if ties else "")
                    + (" (listed below)." if len(self.differences) else "."))
        else:
            head = (f"Different arithmetic (this run: {self.run_arithmetic}; canonical: {self.canonical_arithmetic}): "
                    "tokens and forwards are not compared (rounding differs), only the ratios.")
        inside = int((self.ratios["against the canonical interval"] == "inside").sum())
        ratios = (f" Of this run's {len(self.ratios)} claim ratios, {inside} lie inside the canonical 95% interval"
                  + (f" and {len(self.flagged)} outside (flagged below)." if len(self.flagged) else "."))
        return head + ratios + "".join(f" {n}" for n in self.notes)


# one row per decode that differs between the two runs (`Consistency.differences`)
DIFFERENCE_COLUMNS = ["target", "benchmark", "request", "method", "what", "canonical", "this run", "near-tie"]


def _by_decode(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {(r["target"], r["benchmark"], r["request_id"], r["method"]): r for r in records}


def _at_near_tie(*pair: dict[str, Any]) -> bool:
    """Whether two runs' different tokens for one decode are rounding, not a fault: each run checks
    its decodes against its own AR, so where they differ at least one departs from its AR, and
    every one that does departs at a near-tie of AR's top-2 logits (in bf16 the tree's shape, and
    with it the rounding, follows the tree budget and what retrieval has seen earlier in the run)."""
    departed = [r for r in pair if not r.get("identical_to_ar", True)]
    return bool(departed) and all(r.get("near_tie") for r in departed)


def _differences(canonical: list[dict[str, Any]], run: list[dict[str, Any]], canonical_budgets: dict[str, Any],
                 run_budgets: dict[str, Any]) -> tuple[int, pd.DataFrame, list[str]]:
    theirs, mine = _by_decode(canonical), _by_decode(run)
    both = sorted(set(theirs) & set(mine))
    rows, notes = [], []
    unequal = sorted({k[0] for k in both if run_budgets.get(k[0]) != canonical_budgets.get(k[0])})
    for target in unequal:
        notes.append(f"{target}: tree budget {run_budgets.get(target)} here, {canonical_budgets.get(target)} in the "
                     "canonical run, so forwards are not compared.")
    for key in both:
        a, b = theirs[key], mine[key]
        if a.get("output_ids") != b.get("output_ids"):
            rows.append({"target": key[0], "benchmark": key[1], "request": key[2], "method": key[3], "what": "tokens",
                         "canonical": len(a.get("output_ids") or []), "this run": len(b.get("output_ids") or []),
                         "near-tie": _at_near_tie(a, b)})
        elif (a.get("method_base") in TIMING_FREE_BASES and key[0] not in unequal
              and a.get("target_forwards") != b.get("target_forwards")):
            rows.append({"target": key[0], "benchmark": key[1], "request": key[2], "method": key[3], "what": "forwards",
                         "canonical": a.get("target_forwards"), "this run": b.get("target_forwards"),
                         "near-tie": False})
    return len(both), pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS), notes


def _claim_rows(records: list[dict[str, Any]]) -> pd.DataFrame:
    from ooospec.report.verdict import Claims

    claims = Claims.measure(records)
    frames = [getattr(claims, name).assign(claim=name) for name in ("over_ar", "paper", "equal_hardware",
                                                                    "elastic_gain", "policy")]
    kept = [f for f in frames if not f.empty]
    if kept:
        return pd.concat(kept, ignore_index=True)
    return pd.DataFrame(columns=["claim", "target", "benchmark", "method", "vs", "phase", "n", "speedup",
                                 "ci_low", "ci_high"])


def _ratios(canonical: list[dict[str, Any]], run: list[dict[str, Any]]) -> pd.DataFrame:
    keys = ["claim", "target", "benchmark", "method", "vs", "phase"]
    theirs = _claim_rows(canonical).set_index(keys)
    mine = _claim_rows(run)
    rows = []
    for row in mine.itertuples(index=False):
        key = tuple(getattr(row, k) for k in keys)
        if key not in theirs.index or not row.n:
            continue
        ref = theirs.loc[key]
        where = ("inside" if ref.ci_low <= row.speedup <= ref.ci_high else
                 "above" if row.speedup > ref.ci_high else "below")
        rows.append({**dict(zip(keys, key)), "this run": f"{row.speedup:.2f}x (n {row.n})",
                     "canonical": f"{ref.speedup:.2f}x [{ref.ci_low:.2f}, {ref.ci_high:.2f}] (n {ref.n})",
                     "against the canonical interval": where})
    columns = keys + ["this run", "canonical", "against the canonical interval"]
    return pd.DataFrame(rows, columns=columns)


def consistency(canonical: CanonicalRun, run: list[dict[str, Any]], run_budgets: dict[str, Any],
                max_new_tokens: int | None = None) -> Consistency:
    """``run`` (this machine's records) against ``canonical``; ``run_budgets``: the tree budget
    each target ran here (`tree_budgets`); ``max_new_tokens``: this run's output cap (a different cap
    cuts outputs elsewhere, so tokens and forwards are then not compared)."""
    run = list(run)
    check_one_arithmetic(run, "this machine's run")
    same = {rounding_of(r) for r in canonical.records} == {rounding_of(r) for r in run}
    compared, differences, notes = 0, pd.DataFrame(columns=DIFFERENCE_COLUMNS), []
    cap = canonical.provenance.get("max_new_tokens")
    if same and max_new_tokens is not None and cap is not None and max_new_tokens != cap:
        notes.append(f"Outputs capped at {max_new_tokens} tokens here, {cap} in the canonical run: tokens and "
                     "forwards are not compared.")
    elif same:
        compared, differences, notes = _differences(canonical.records, run, canonical.provenance["tree_budgets"],
                                                    run_budgets)
    return Consistency(same, canonical.arithmetic(), sentences(r.get("arithmetic") for r in run), compared,
                       differences, _ratios(canonical.records, run), notes)


def tree_budgets(budget_choices: list[dict[str, Any]]) -> dict[str, Any]:
    """Per target, the tree budget its slices ran (`BenchRecords.budget_choices`); a target whose
    slices ran different budgets lists them."""
    found: dict[str, set] = defaultdict(set)
    for choice in budget_choices:
        target = choice["slice"].split("@", 1)[0]
        budget = choice.get("budget") or {}
        found[target].add(budget.get("max_nodes") if isinstance(budget, dict) else budget)
    return {t: (next(iter(v)) if len(v) == 1 else sorted(v, key=str)) for t, v in found.items()}
