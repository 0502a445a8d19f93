"""Smoke run of every notebook on tiny parameters, the book build, and what a reader sees.

The notebooks are executed by papermill into a copy of `book/` (so a smoke run never replaces the
chapters of a full `make reproduce`), the copy is built with warnings as errors, and headless
Chromium loads every chapter page and checks that it rendered with its figures.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from ooospec.notebook import hide_parameter_cells

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def built_book(tmp_path_factory) -> Path:
    book = tmp_path_factory.mktemp("smoke") / "book"
    shutil.copytree(ROOT / "book", book, ignore=shutil.ignore_patterns("_build", "chapters"))
    (book / "chapters").mkdir()
    smoke = yaml.safe_load((ROOT / "notebooks" / "smoke.yaml").read_text())
    for name, params in sorted(smoke.items()):
        args = [str(BIN / "papermill"), "-k", "python3", "--cwd", str(ROOT / "notebooks"),
                str(ROOT / "notebooks" / name), str(book / "chapters" / name), "-p", "profile", "cpu"]
        for key, value in (params or {}).items():
            args += ["-y", yaml.safe_dump({key: value})]
        proc = subprocess.run(args, capture_output=True, text=True)
        assert proc.returncode == 0, f"{name} failed under papermill:\n{proc.stderr[-4000:]}"
        hide_parameter_cells(book / "chapters" / name)  # as the Makefile does after papermill
    proc = subprocess.run([str(BIN / "jupyter-book"), "build", "--warningiserror", "--keep-going", str(book)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"book build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return book


def _toc_files(book: Path) -> list[str]:
    toc = yaml.safe_load((book / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part["chapters"]]
    return files


def _chromium_dom(url: str, profile_dir: Path, window: str | None = None) -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is not installed: `make test` installs it (Debian package chromium)")
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile_dir}", "--virtual-time-budget=3000",
         *([f"--window-size={window}"] if window else []), "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_every_chapter_renders_with_its_figures(built_book: Path, tmp_path: Path):
    html = built_book / "_build" / "html"
    for page in _toc_files(built_book):
        dom = _chromium_dom((html / f"{page}.html").as_uri(), tmp_path / "chromium")
        main = dom.split('id="main-content"', 1)[-1]
        assert re.search(r"<h1[^>]*>", main), f"{page}: no title rendered"
        assert "Traceback" not in main, f"{page}: a traceback is shown to the reader"
        notebook = built_book / f"{page}.ipynb"
        if notebook.exists():
            nb = nbformat.read(notebook, as_version=4)
            figures = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code"
                          for out in c.get("outputs", []))
            assert figures >= 1, f"{page}: a chapter should show at least one figure"
            shown = len(re.findall(r"<img[^>]+src=", main))
            assert shown >= figures, f"{page}: {figures} figures in the notebook, {shown} on the page"


def test_book_has_no_broken_images(built_book: Path):
    html = built_book / "_build" / "html"
    for page in _toc_files(built_book):
        text = (html / f"{page}.html").read_text()
        for src in re.findall(r'<img[^>]+src="([^"]+)"', text):
            if src.startswith("data:"):
                base64.b64decode(src.split(",", 1)[1][:64] + "==", validate=False)
                continue
            if src.startswith("http"):
                continue
            assert (html / Path(page).parent / src).resolve().exists(), f"{page}: missing image {src}"


def test_no_machine_noise_in_the_published_pages(built_book: Path):
    """What a reader should never see: the build machine's paths, warnings, progress-bar lines."""
    import os

    html = built_book / "_build" / "html"
    markers = {str(ROOT): "the checkout's absolute path", str(built_book.parent): "the build directory",
               os.path.expanduser("~") + "/": "the home directory", "it/s]": "a progress bar", "s/it]": "a progress bar"}
    for page in _toc_files(built_book):
        main = (html / f"{page}.html").read_text().split('id="main-content"', 1)[-1]
        found = [what for marker, what in markers.items() if marker in main]
        # any Python warning class printed into a cell (FutureWarning, Pandas4Warning, UserWarning, ...)
        found += [f"a {m}" for m in re.findall(r"\b([A-Z]\w*Warning): ", main)]
        assert not found, f"{page}: {', '.join(sorted(set(found)))} in the published page"


# a table's delimiter row left as text: Sphinx's smartquotes turn its "---" into an em or en dash
TABLE_AS_TEXT = re.compile(r"\|\s*:?(?:-{3,}|—|–)+:?\s*\|")


def test_markdown_tables_reach_the_page_as_tables(built_book: Path):
    """A markdown table, displayed by a chapter (the results chapter's verdicts) or glued from one
    into another page (the introduction's verdict), must arrive as a table, not as a paragraph of pipes."""
    html = built_book / "_build" / "html"
    for page in _toc_files(built_book):
        main = (html / f"{page}.html").read_text().split('id="main-content"', 1)[-1]
        shown = re.sub(r"<pre.*?</pre>", "", main, flags=re.S)  # source code may build a table's text
        found = TABLE_AS_TEXT.search(shown)
        assert not found, f"{page}: a markdown table shown as text ({found and found.group(0)!r})"
    intro = (html / "intro.html").read_text().split('id="main-content"', 1)[-1]
    assert '<section id="what-the-artifact-found">' in intro, "intro.html: no section 'What the artifact found'"
    found = intro.split('<section id="what-the-artifact-found">', 1)[1].split("</section>", 1)[0]
    assert '<table class="table"' in found, "intro.html: the verdict's table is missing or unstyled"


WIDTH_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {  // after the theme's toggles collapsed their cells
  const main = document.querySelector('article.bd-article') || document.querySelector('#main-content') || document.body;
  const limit = main.getBoundingClientRect().width;
  const wide = [];
  main.querySelectorAll('table').forEach((table, i) => {
    // inside a collapsed cell (a closed <details>) or hidden: not what a reader sees
    if (table.offsetParent === null || table.closest('details:not([open])')) return;
    const width = table.getBoundingClientRect().width;
    const head = (table.querySelector('tr') || table).textContent.trim().replace(/\\s+/g, ' ').slice(0, 80);
    if (width > limit + 1) wide.push(`table ${i} (${head}): ${Math.round(width)} px`);
  });
  const out = document.createElement('pre');
  out.id = 'width-probe';
  out.textContent = JSON.stringify({limit: Math.round(limit), wide});
  document.body.appendChild(out);
}, 1000));
</script>"""


def test_no_visible_table_is_wider_than_the_page(built_book: Path, tmp_path: Path):
    """At a 1280 px window, every table a reader sees fits the article's column (between the
    navigation and the page's contents): wide tables go behind a collapsed cell, a compact one
    stands in front."""
    import json

    html = built_book / "_build" / "html"
    too_wide = []
    for page in _toc_files(built_book):
        source = html / f"{page}.html"
        probe = source.with_name(source.stem + ".width-probe.html")
        probe.write_text(source.read_text().replace("</body>", WIDTH_PROBE + "</body>"))
        dom = _chromium_dom(probe.as_uri(), tmp_path / "chromium", window="1280,900")
        found = re.search(r'<pre id="width-probe"[^>]*>(.*?)</pre>', dom, re.S)
        assert found, f"{page}: the width probe did not run"
        result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                            .replace("&gt;", ">"))
        too_wide += [f"{page}: {w} > {result['limit']} px" for w in result["wide"]]
    assert not too_wide, "tables wider than the page at 1280 px:\n" + "\n".join(too_wide)


def test_every_notebook_is_valid_nbformat_with_cell_ids():
    """A cell added without an id is a validation warning today and an error in a later nbformat."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        raw = json.loads(path.read_text())
        missing = [i for i, cell in enumerate(raw["cells"]) if "id" not in cell]
        assert not missing, f"{path.name}: cells without an id: {missing}"
        nbformat.validate(nbformat.reads(path.read_text(), as_version=4))
