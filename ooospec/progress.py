"""Progress bars in the terminal, none in executed notebooks.

Under papermill every tqdm refresh becomes an output line of the executed chapter: pages of them
in the book. `progress_bar` is tqdm, switched off when stderr is not a terminal (a notebook kernel's
stderr never is) or when ``OOOSPEC_NO_PROGRESS`` is set (the Makefile's papermill call sets it).
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
