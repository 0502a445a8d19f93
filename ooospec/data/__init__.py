"""Benchmark and training-source loaders that all produce one `Request` record.

``load_split(name)`` is the one call later stages need: it returns the requests of one output
file (``eval_apibank``, ``eval_toolalpaca``, ``eval_bfcl``, ``eval_bfcl_irrelevance``, ``train``,
``dev``), building the data first when it is missing.
"""

from ooospec.data.request import Call, Request, prompt_hash, read_requests, write_requests


def load_split(name: str, include_live: bool = False) -> list[Request]:
    """Requests of one data split; see :func:`ooospec.data.build.load_split`."""
    from ooospec.data.build import load_split as _load_split  # the loaders import this package

    return _load_split(name, include_live=include_live)


def build_data(include_live: bool = False, force: bool = False) -> dict:
    """Build the data files and return the card; see :func:`ooospec.data.build.build_data`."""
    from ooospec.data.build import build_data as _build_data

    return _build_data(include_live=include_live, force=force)


__all__ = ["Call", "Request", "build_data", "load_split", "prompt_hash", "read_requests", "write_requests"]
