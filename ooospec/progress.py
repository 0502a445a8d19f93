"""Progress bars in the terminal, none in executed notebooks, a line now and then in a log.

Under papermill every tqdm refresh becomes an output line of the executed chapter: pages of them
in the book. `progress_bar` is tqdm, switched off when stderr is not a terminal (a notebook kernel's
stderr never is) or when ``OOOSPEC_NO_PROGRESS`` is set (the Makefile's papermill call sets it).
A job of hours run with its output sent to a file (``nohup ... > log``) has no bar either; it
writes a plain line now and then instead (`log_lines_wanted`), so its log says how far it is.
"""

from __future__ import annotations

import functools
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from tqdm import tqdm

NO_PROGRESS_ENV = "OOOSPEC_NO_PROGRESS"


def progress_wanted() -> bool:
    return not os.environ.get(NO_PROGRESS_ENV) and sys.stderr.isatty()


def log_lines_wanted() -> bool:
    """Stderr goes to a file or a pipe, outside a notebook kernel and without ``OOOSPEC_NO_PROGRESS``:
    where a bar is off but a reader may follow the job's log."""
    return not os.environ.get(NO_PROGRESS_ENV) and not sys.stderr.isatty() and "ipykernel" not in sys.modules


def log_line(text: str) -> None:
    """One progress line for a log (see `log_lines_wanted`); nothing where a bar runs or in a book."""
    if log_lines_wanted():
        print(text, file=sys.stderr, flush=True)


def quiet_library_bars() -> None:
    """Apply the same rule to the Hugging Face libraries' own bars ("Loading weights", downloads):
    they read ``HF_HUB_DISABLE_PROGRESS_BARS`` when first imported."""
    if not progress_wanted():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # bare tqdm bars inside libraries (transformers' GGUF dequantization): tqdm reads TQDM_*
        # overrides when it is first imported
        os.environ.setdefault("TQDM_DISABLE", "1")


@contextmanager
def quiet_tqdm_in(module: Any) -> Iterator[None]:
    """Within the block, ``module.tqdm`` (a library's own bar) follows our rule too; for a library
    that imported tqdm before `quiet_library_bars` could set ``TQDM_DISABLE``."""
    original = getattr(module, "tqdm", None)
    if original is not None and not progress_wanted():
        module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            module.tqdm = original


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool = False, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)``, disabled where bars would only clutter the output."""
    return tqdm(iterable, disable=disable or not progress_wanted(), **kwargs)
