"""Imports run one way: api -> bench -> training / decoding -> sidecar -> models -> data.

Parsed from the source (module-level and function-level imports alike), so a lazy import inside a
function cannot hide a cycle. ``training`` may use the decoder (the teacher decodes with it), never
the other way round; the top-level helpers (``paths``, ``stage``, ``progress``,
``notebook``) import no package of ours but ``paths``.
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
}
# the public entry point (ooospec/api.py) is the top layer: it may import every layer, none imports it
ALLOWED["api"] = set(ALLOWED)
HELPERS = {"paths", "stage", "progress", "notebook", "resources"}


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
