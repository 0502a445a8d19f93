"""The README stays short and true: at most 200 lines, its Python example runs (on the tiny models),
its headline table is what `ooospec.report.headline` computes from the records it names, and its
layout names every package of ooospec."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

from ooospec.report.headline import headline, read_records, readme_block

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_read_in_five_minutes():
    lines = len(README.splitlines())
    assert lines <= 200, f"README.md has {lines} lines; findings belong in book/measured.md"
    assert "make reproduce" in README and "make test" in README


def test_the_python_example_runs():
    (block,) = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    torch.set_num_threads(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    assert "Call(name='get_weather', arguments={'city': 'Paris'})" in out.getvalue()


def test_the_headline_table_is_computed_not_typed():
    source, table = readme_block(README)
    assert table == headline(read_records(ROOT / source)).markdown(), (
        "README.md's headline differs from its records: run python -m ooospec.report.headline --readme")


def test_the_layout_names_every_package():
    packages = sorted(p.parent.name for p in (ROOT / "ooospec").glob("*/__init__.py"))
    missing = [name for name in packages if f"\n  {name}/" not in README]
    assert not missing, f"README.md's layout does not name {missing}"
    assert "\n  api.py" in README
