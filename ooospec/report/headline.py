"""The README's headline table, computed from bench records so that no number in it is typed.

Per target x benchmark, in the decode phase, over the same work (the requests where both methods
wrote the same tokens, `ooospec.report.speedups`): ToolSpec and OoO-Spec over AR, OoO-Spec over
ToolSpec with its paired bootstrap 95% interval, tokens per verify forward (MAT) of both, and how
many speculative decodes wrote exactly AR's tokens. OoO-Spec is compared in the paper's placement
(``ooospec:static`` against ``toolspec``, each target on one core) where the records have it.

``python -m ooospec.report.headline RECORDS`` prints it (RECORDS: a records ``.jsonl``, the canonical
run's directory, or a bench stage directory, whose ``slices/*/*.jsonl`` are read); ``--readme``
rewrites the table between the README's headline markers from the records the opening marker
names, which tests/test_readme.py checks against the records.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ooospec.report.canonical import MANIFEST, load_canonical
from ooospec.report.speedups import speedup_intervals
from ooospec.report.tables import method_table

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
# the README block: <!-- headline: RECORDS --> ... <!-- /headline -->
BLOCK = re.compile(r"(<!-- headline: (?P<source>\S+) -->\n)(?P<table>.*?)(<!-- /headline -->)", re.S)
OOOSPEC_CHOICES = ("ooospec:static", "ooospec")  # the paper's placement first


@dataclass(frozen=True)
class Headline:
    """The table and the methods it compares."""

    table: pd.DataFrame
    ooospec: str
    toolspec: str
    differing: int  # speculative decodes whose tokens differ from AR's
    near_ties: int  # of those, the ones that differ first at a rounding tie of AR's top-2 logits

    def markdown(self) -> str:
        """A GitHub markdown table (no index), one line per target x benchmark, and what the
        decodes that differ from AR are (a lossless run has only near-ties there)."""
        columns = list(self.table.columns)
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in self.table.itertuples(index=False)]
        lines += ["", f"Methods: `{self.toolspec}`, `{self.ooospec}`. (n k): the cell's same-work requests where "
                  f"fewer than n. Decodes that differ from AR: {self.differing}, of which {self.near_ties} at a "
                  "rounding near-tie of AR's top-2 logits."]
        return "\n".join(lines) + "\n"


def read_records(path: Path) -> list[dict[str, Any]]:
    """Bench records from a ``.jsonl`` file, the committed canonical run (its directory, every file
    checked against the manifest: `ooospec.report.canonical`), or every slice of a bench stage."""
    if (path / MANIFEST).exists():
        return load_canonical(path).records  # type: ignore[union-attr]
    files = [path] if path.is_file() else sorted(path.glob("slices/*/*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{path}: no records (a records .jsonl, or a bench stage with slices/)")
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def _ratio(row: pd.Series | None, interval: bool = False) -> str:
    if row is None or not row["n"]:
        return "-"
    text = f"{row['speedup']:.2f}x"
    if interval:
        text += f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return text + (f" (n {row['n']})" if row["n"] < row["n_all"] else "")


def headline(records: Iterable[dict[str, Any]], ooospec: str | None = None, toolspec: str = "toolspec") -> Headline:
    """The headline of ``records`` (see the module doc); ``ooospec``: the OoO-Spec method to show
    (None: the first of `OOOSPEC_CHOICES` the records hold)."""
    records = list(records)
    methods = {r["method"] for r in records}
    ooospec = ooospec or next((m for m in OOOSPEC_CHOICES if m in methods), None)
    missing = [m for m in ("ar", toolspec, ooospec) if m not in methods]
    if missing:
        raise ValueError(f"the headline needs records of {missing}; these have {sorted(methods)}")
    over_ar = speedup_intervals(records, "ar", methods=[toolspec, ooospec], phases=("decode",))
    over_toolspec = speedup_intervals(records, toolspec, methods=[ooospec], phases=("decode",))
    cells = method_table(records)
    rows = []
    for (target, benchmark), cell in cells.groupby(["target", "benchmark"], sort=False):
        def find(table: pd.DataFrame, method: str) -> pd.Series | None:
            hit = table[(table.target == target) & (table.benchmark == benchmark) & (table.method == method)]
            return hit.iloc[0] if len(hit) else None

        mats = {m: find(cells, m) for m in (toolspec, ooospec)}
        speculative = cell[cell.method.isin([toolspec, ooospec])]
        identical = int(round((speculative.lossless * speculative.requests).sum()))
        rows.append({
            "target": target, "benchmark": benchmark, "n": int(cell.requests.max()),
            "ToolSpec x AR": _ratio(find(over_ar, toolspec)),
            "OoO-Spec x AR": _ratio(find(over_ar, ooospec)),
            "OoO-Spec x ToolSpec [95%]": _ratio(find(over_toolspec, ooospec), interval=True),
            "MAT ToolSpec / OoO-Spec": " / ".join(f"{mats[m]['mat']:.2f}" if mats[m] is not None else "-"
                                                 for m in (toolspec, ooospec)),
            "same tokens as AR": f"{identical}/{int(speculative.requests.sum())}",
        })
    speculative = [r for r in records if r["method"] in (toolspec, ooospec)]
    differing = [r for r in speculative if not r["identical_to_ar"]]
    return Headline(pd.DataFrame(rows), ooospec, toolspec, len(differing), sum(bool(r.get("near_tie")) for r in differing))


def readme_block(text: str) -> tuple[str, str]:
    """(the records path the README's block names, the table in it); ValueError without a block."""
    match = BLOCK.search(text)
    if match is None:
        raise ValueError("README.md has no <!-- headline: RECORDS --> ... <!-- /headline --> block")
    return match["source"], match["table"]


def rewrite_readme(readme: Path = README) -> str:
    """Recompute the README's table from the records its block names; returns the new table."""
    text = readme.read_text()
    source, _ = readme_block(text)
    table = headline(read_records(REPO_ROOT / source)).markdown()
    readme.write_text(BLOCK.sub(lambda m: m.group(1) + table + m.group(4), text, count=1))
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="?", type=Path, help="a records .jsonl or a bench stage directory")
    parser.add_argument("--ooospec", default=None, help=f"the OoO-Spec method (default: first of {OOOSPEC_CHOICES})")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's headline block from its records")
    args = parser.parse_args(argv)
    if args.readme:
        print(rewrite_readme(), end="")
    elif args.records is None:
        parser.error("name the records (or --readme)")
    else:
        print(headline(read_records(args.records), args.ooospec).markdown(), end="")


if __name__ == "__main__":
    main()
