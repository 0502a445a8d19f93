"""The promises about installing and running the artifact stay true."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _requirement_lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_requirements_are_exact_pins_with_torch_first():
    lines = _requirement_lines(ROOT / "requirements.txt")
    assert lines[0] == "torch==2.13.0", "torch must be pinned first (an unpinned torch pulls CUDA)"
    for line in lines + _requirement_lines(ROOT / "requirements-models.txt") + _requirement_lines(ROOT / "requirements-nodeps.txt"):
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", line), f"not an exact pin: {line}"


def test_no_deps_requirements_are_installed_and_named_for_conda_users():
    """requirements-nodeps.txt (bfcl-eval) is installed with --no-deps by `make setup` and named in
    environment.yml's instructions; its pins stay out of requirements.txt (their dependencies conflict)."""
    makefile = (ROOT / "Makefile").read_text()
    assert "--no-deps -r requirements-nodeps.txt" in makefile
    assert "requirements-nodeps.txt" in makefile.split("SETUP_HASH :=")[1].splitlines()[0]
    nodeps = {ln.split("==")[0] for ln in _requirement_lines(ROOT / "requirements-nodeps.txt")}
    assert "bfcl-eval" in nodeps
    assert not nodeps & {ln.split("==")[0] for ln in _requirement_lines(ROOT / "requirements.txt")}
    assert "--no-deps -r requirements-models.txt -r requirements-nodeps.txt" in (ROOT / "environment.yml").read_text()


def test_environment_yml_wraps_requirements_exactly():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = [p for p in pip_section if not p.startswith("-e")]
    assert pins == _requirement_lines(ROOT / "requirements.txt")
    assert "-e ." in pip_section
    assert "python=3.11" in env["dependencies"]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [ln for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[-1].strip() == "make test"
    readme = (ROOT / "README.md").read_text()
    assert "make reproduce" in readme and "make test" in readme


def test_every_notebook_has_smoke_parameters_and_a_parameters_cell():
    import nbformat

    smoke = yaml.safe_load((ROOT / "notebooks" / "smoke.yaml").read_text())
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert notebooks, "no notebooks"
    assert sorted(smoke) == notebooks
    for name in notebooks:
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{name}: needs exactly one cell tagged 'parameters'"
        assert "profile" in tagged[0].source, f"{name}: the parameters cell must define `profile`"
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: committed with outputs"
        # a cell without an id makes nbformat warn wherever the notebook is read (into the book too)
        assert all(c.get("id") for c in nb.cells), f"{name}: a cell has no id (nbformat 4.5 needs one)"
