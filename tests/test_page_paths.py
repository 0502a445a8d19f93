"""Pages print no path of the machine that built them.

A chapter that prints an adapter or stage directory as it is (``f"... {plan.adapter}"``) publishes
the build machine's checkout path; `ooospec.paths.shown` turns it into a path relative to the
repository. The book test (tests/test_book.py) catches such a path on the rendered pages, but only
where `make test` builds the book; these checks read the sources, in a second: every notebook and
book chapter, and the package code whose text the chapters print (the bench and the layers that
report its results). Error messages are left alone: they name the file a user must fix.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from ooospec.bench.plan import BenchPlan
from ooospec.bench.records import BenchRecords
from ooospec.paths import REPO_ROOT

ROOT = Path(__file__).resolve().parents[1]
# names whose value is a path: adapter, adapter_dir, stage_dir, plan_path, root, ...
PATHY = re.compile(r"(^|_)(dir|path|adapter|root|file)s?$")
# the package layers whose text lands on the pages (the bench and the packages split from it)
PAGE_LAYERS = ("bench", "report", "studies", "reproduce")


def _names_a_path(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return bool(PATHY.search(node.id))
    if isinstance(node, ast.Attribute):
        return bool(PATHY.search(node.attr))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str":
        return any(_names_a_path(arg) for arg in node.args)
    return False


def bare_paths(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every path-named value formatted into an f-string or printed as it is,
    outside ``raise`` statements; ``shown(path)``, ``path.name`` and the like pass."""
    tree = ast.parse(source)
    in_raise = {id(node) for r in ast.walk(tree) if isinstance(r, ast.Raise) for node in ast.walk(r)}
    # a name bound to shown(...) (or a conditional around it) holds a shown path already
    shown_names = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "shown" for c in ast.walk(node.value))
                   for target in node.targets if isinstance(target, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if id(node) in in_raise:
            continue
        if isinstance(node, ast.FormattedValue) and _names_a_path(node.value) and getattr(node.value, "id", None) not in shown_names:
            found.append((node.lineno, ast.unparse(node.value)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("print", "display"):
            found += [(node.lineno, ast.unparse(arg)) for arg in node.args if _names_a_path(arg)]
    return found


def _notebook_code(path: Path) -> list[tuple[str, str]]:
    cells = json.loads(path.read_text())["cells"]
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            # IPython magics and shell lines are not Python
            source = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
            out.append((f"{path.relative_to(ROOT)} cell {i}", source))
    return out


def _chapter_code(path: Path) -> list[tuple[str, str]]:
    """The code cells of a MyST chapter (```{code-cell} ... ```)."""
    blocks = re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", path.read_text(), flags=re.S)
    return [(f"{path.relative_to(ROOT)} code cell {i}", block) for i, block in enumerate(blocks)]


def test_the_rule_sees_a_bare_path_and_passes_shown():
    assert bare_paths('print(f"ran with ({plan.adapter})")') == [(1, "plan.adapter")]
    assert bare_paths("print(adapter_dir)") == [(1, "adapter_dir")]
    assert bare_paths('print(f"ran with ({shown(plan.adapter)}) in {stage.dir.name}")') == []
    assert bare_paths('raise ValueError(f"{path}: bad")') == []
    assert bare_paths('adapter = shown(a) if a else None\nprint(f"({adapter})")') == []


def test_chapter_sources_print_paths_only_through_shown():
    sources = [cell for nb in sorted((ROOT / "notebooks").glob("*.ipynb")) for cell in _notebook_code(nb)]
    sources += [cell for md in sorted((ROOT / "book").rglob("*.md")) if "_build" not in md.parts
                for cell in _chapter_code(md)]
    for layer in PAGE_LAYERS:
        sources += [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "ooospec" / layer).rglob("*.py"))]
    assert len(sources) > 20
    bare = [f"{where}:{line}: {expr}" for where, source in sources for line, expr in bare_paths(source)]
    assert not bare, "paths printed as they are (wrap them in ooospec.paths.shown):\n" + "\n".join(bare)


def test_bench_notes_name_the_adapter_relative_to_the_repository():
    adapter = REPO_ROOT / "artifacts" / "committed" / "adapters" / "some-adapter"
    records = BenchRecords([], stage=None, plan=BenchPlan("slot", adapter, [], {}, []), skipped_targets={}, cores=None)
    (line,) = [n for n in records.notes() if "trained sidecar" in n]
    assert "(artifacts/committed/adapters/some-adapter)" in line and str(REPO_ROOT) not in line
