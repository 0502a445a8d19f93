"""Imports run one way: api -> reproduce -> studies -> report -> bench -> training / decoding -> sidecar
-> models -> data, and no module of the package imports itself back through any chain.

Parsed from the source (module-level and function-level imports alike), so a lazy import inside a
function cannot hide a cycle. ``training`` may use the decoder (the teacher decodes with it), never
the other way round; the top-level helpers (``paths``, ``stage``, ``progress``, ``provenance``,
``notebook``) import no package of ours but ``paths``.

The three layers above the harness, and why in this order:

* ``report`` turns records and committed artifacts into what a chapter shows; it reads the harness's
  names (methods, configs) and the layers below, and runs nothing of its own;
* ``studies`` measure around a run (costs, audits, replays, calibration); a study's table uses the
  report's intervals, so it may import ``report`` as well as ``bench`` and below;
* ``reproduce`` plans and schedules the whole artifact (the time plan, the Ray sweep); it may import
  everything else, and nothing imports it.

``bench`` itself is the harness alone, at most `MAX_BENCH_MODULES` modules: a new table, figure or
study belongs in one of the layers above.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ooospec"
# what each package may import from the others
ALLOWED = {
    "data": set(),
    "models": {"data"},
    "sidecar": {"data", "models"},
    "decoding": {"data", "models", "sidecar"},
    "training": {"data", "models", "sidecar", "decoding"},
    "bench": {"data", "models", "sidecar", "decoding", "training"},
    "report": {"data", "models", "sidecar", "decoding", "training", "bench"},
    "studies": {"data", "models", "sidecar", "decoding", "training", "bench", "report"},
    "reproduce": {"data", "models", "sidecar", "decoding", "training", "bench", "report", "studies"},
}
# the public entry point (ooospec/api.py) is the top layer: it may import every layer, none imports it
ALLOWED["api"] = set(ALLOWED)
HELPERS = {"paths", "stage", "progress", "notebook", "resources", "provenance"}
MAX_BENCH_MODULES = 14  # the harness: config, plan, methods, runner, ... and __init__


def imported_modules(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every ``ooospec`` import in a file under ``root``, relative imports resolved."""
    tree = ast.parse(path.read_text())
    package = ".".join(("ooospec", *path.relative_to(root).parent.parts))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("ooospec")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("ooospec"):
                found.append((node.lineno, module))
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_imports_run_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = layer_of(".".join(("ooospec", *path.relative_to(PACKAGE).with_suffix("").parts)))
        for line, module in imported_modules(path):
            other = layer_of(module)
            if other is None or other == own:
                continue
            if other == "api":
                ok = False
            elif own in ALLOWED:
                ok = other in ALLOWED[own] or other in HELPERS
            else:  # a helper module or the package's __init__
                ok = other in HELPERS
            if not ok:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_layer_rule_sees_lazy_and_relative_imports(tmp_path):
    sample = tmp_path / "ooospec" / "models" / "probe.py"
    sample.parent.mkdir(parents=True)
    sample.write_text("def f():\n    from ooospec.decoding.tree import TreeBudget\n    from . import target\n"
                      "    from ..decoding import loop\n")
    found = imported_modules(sample, tmp_path / "ooospec")
    assert found == [(2, "ooospec.decoding.tree"), (3, "ooospec.models"), (4, "ooospec.decoding")]


# ---------------------------------------------------------------- no import cycle


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """The dotted name of a source file under ``root`` (a package's ``__init__`` is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("ooospec", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def runtime_imports(path: Path, modules: set[str], root: Path = PACKAGE) -> set[str]:
    """Every module of ``modules`` a file can import when it runs, inside functions too, but not
    under ``if TYPE_CHECKING:`` (annotations only: never executed). ``from package import name``
    imports the submodule ``package.name`` where there is one, else the package itself."""
    tree = ast.parse(path.read_text())
    skipped = {id(inner) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for child in node.body for inner in ast.walk(child)}
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found |= {f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                      for alias in node.names}
    return (found & modules) - {own}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, lazily or not."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    return {name: runtime_imports(path, set(files), root) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None (depth-first, colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_rule_sees_lazy_imports_and_skips_type_checking(tmp_path):
    root = tmp_path / "ooospec"
    (root / "bench").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "bench" / "__init__.py").write_text("")
    (root / "bench" / "a.py").write_text("from ooospec.bench import b\n")
    (root / "bench" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from ooospec.bench.a import x\n")
    assert find_cycle(import_graph(root)) is None
    (root / "bench" / "b.py").write_text("def f():\n    from .a import x\n")
    assert find_cycle(import_graph(root)) == ["ooospec.bench.a", "ooospec.bench.b", "ooospec.bench.a"]


def test_bench_is_the_harness_alone():
    modules = sorted(p.name for p in (PACKAGE / "bench").glob("*.py"))
    assert len(modules) <= MAX_BENCH_MODULES, (
        f"ooospec/bench has {len(modules)} modules (at most {MAX_BENCH_MODULES}): {', '.join(modules)}; "
        "tables and figures belong in ooospec.report, studies in ooospec.studies")
