"""What an executed chapter shows its reader, set after papermill ran it.

The parameters cell (the notebook's defaults) and papermill's injected-parameters cell (this run's
overrides) are both code a reader rarely needs and, shown one under the other, read as the same
cell twice. Both are tagged ``hide-cell``: the book collapses them behind a toggle, the values stay
one click away.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

PARAMETER_TAGS = ("parameters", "injected-parameters")


def hide_parameter_cells(path: Path) -> int:
    """Tag the parameter cells of an executed notebook ``hide-cell`` in place; returns how many."""
    nb = nbformat.read(path, as_version=4)
    changed = 0
    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if any(t in tags for t in PARAMETER_TAGS) and "hide-cell" not in tags:
            tags.append("hide-cell")
            changed += 1
    if changed:
        nbformat.write(nb, path)
    return changed


def glue_markdown(key: str, text: str) -> None:
    """Glue ``text`` (markdown) under ``key`` for another page of the book to paste with
    ``{glue} key`` and ``:doc:``: such a pasted output is rendered from its HTML, so the markdown is
    converted here (with the markdown-it parser the book itself uses)."""
    from IPython.display import HTML
    from markdown_it import MarkdownIt
    from myst_nb import glue

    # commonmark leaves GitHub tables off; the book's own parser (MyST) has them on. The theme styles
    # a table by its class (rules, padding), as it does the book's own tables
    html = MarkdownIt("commonmark").enable("table").render(text).replace("<table>", '<table class="table">')
    glue(key, HTML(html), display=False)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        hide_parameter_cells(Path(arg))
