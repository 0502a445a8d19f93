"""Where the raw upstream files come from, and proof that they are the bytes we expect.

Resolution order for the raw-data root (the folder that holds ``api-bank/``, ``toolalpaca/``,
``bfcl/`` and ``train-extra/``):

1. the environment variable ``OOOSPEC_RAW_DATA``;
2. ``<repo>/../shared/data`` when that folder exists (the layout of this project's checkout);
3. ``artifacts/raw/``, filled on demand from the upstream sources (GitHub raw files at the
   recorded commits, the ``bfcl-eval`` wheels on PyPI, the Hugging Face dataset repos).

Every file is checked against the sha256 list the repo keeps (``ooospec/resources/
raw_manifest.tsv``, a copy of the mirror's ``MANIFEST.tsv``), once per process, so a truncated
or edited copy fails loudly instead of silently changing the benchmark. A file that is listed in
:data:`OPTIONAL_FILES` but is not in the manifest (the API-Bank lv1/lv2 and ToolAlpaca training
files the mirror lacks) is used when present and reported as absent otherwise; it has no pinned
hash because no copy of it could be obtained to pin.
"""

from __future__ import annotations

import io
import os
import urllib.request
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

from ooospec.paths import REPO_ROOT, artifacts_dir
from ooospec.provenance import file_sha256

ENV_VAR = "OOOSPEC_RAW_DATA"

# Upstream snapshots the mirror was copied from (see ../shared/data/README.md).
APIBANK_TEST_COMMIT = "5d5a2d40b2e6b6998a06961cc43ad0a8c069b153"  # test-data/, training-data/lv3-*
APIBANK_HEAD_COMMIT = "483554eae102996f5ec1f4feab4e78ef29c2a394"  # everything else in api-bank/
TOOLALPACA_COMMIT = "189069998d64a7baf1b4a1c3c4b2e75eb9d05532"
GORILLA_COMMIT = "6ea57973c7a6097fd7c5915698c54c17c5b1b6c8"
TRAIN_EXTRA_REPOS = {  # folder under train-extra/ -> (GitHub repo, commit)
    "seal-tools": ("fairyshine/Seal-Tools", "ce753ecd60ed08dd376984035de531ab8421f1c6"),
    "toolrl-rlla": ("qiancheng0/ToolRL", "8cee13ec0ca72f0461da372a93a6fd8140dbb840"),
    "nestful": ("IBM/NESTFUL", "053cbde0446dddd31e8293f179085e1b39ab79b5"),
    "llamafactory-glaive": ("hiyouga/LLaMA-Factory", "ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30"),
    "gorilla": ("ShishirPatil/gorilla", GORILLA_COMMIT),
    "tooltalk": ("microsoft/ToolTalk", "e05f4ce6132c80ed33392b81535b077d56ab28fd"),
}
HF_APIBANK = "https://huggingface.co/datasets/liminghao1630/API-Bank/resolve/12e8158/"

# Training files the paper used that the mirror lacks: used when present, never required.
OPTIONAL_FILES = {
    "api-bank/training-data/lv1-api-train.json": HF_APIBANK + "training-data/lv1-api-train.json",
    "api-bank/training-data/lv2-api-train.json": HF_APIBANK + "training-data/lv2-api-train.json",
    "toolalpaca/train_data.json": (
        f"https://raw.githubusercontent.com/tangqiaoyu/ToolAlpaca/{TOOLALPACA_COMMIT}/data/train_data.json"
    ),
}


class RawDataError(FileNotFoundError):
    """A raw file is missing or differs from the pinned bytes."""


@dataclass(frozen=True)
class ManifestEntry:
    relpath: str
    size: int
    sha256: str


def load_manifest() -> dict[str, ManifestEntry]:
    """The pinned sha256 list: relpath -> entry."""
    text = resources.files("ooospec").joinpath("resources/raw_manifest.tsv").read_text("utf-8")
    entries: dict[str, ManifestEntry] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 5:
            raise ValueError(f"raw_manifest.tsv:{lineno}: expected 5 tab-separated columns")
        entries[cols[0]] = ManifestEntry(cols[0], int(cols[1]), cols[4])
    return entries


def candidate_roots() -> list[tuple[str, Path]]:
    """The places looked, in resolution order, with the reason each is a candidate."""
    roots: list[tuple[str, Path]] = []
    if os.environ.get(ENV_VAR):
        roots.append((f"${ENV_VAR}", Path(os.environ[ENV_VAR]).expanduser()))
    roots.append(("../shared/data beside the repo", REPO_ROOT.parent / "shared" / "data"))
    roots.append(("download cache", artifacts_dir() / "raw"))
    return roots


def raw_root() -> Path:
    """The first existing root in resolution order (the download cache is created if needed)."""
    for label, root in candidate_roots():
        if label == "download cache":
            root.mkdir(parents=True, exist_ok=True)
            return root
        if root.is_dir():
            return root
    raise AssertionError("unreachable: the download cache is always a candidate")


def upstream_url(relpath: str) -> str | None:
    """Where a manifest path comes from upstream (``None`` for files inside a wheel)."""
    if relpath in OPTIONAL_FILES:
        return OPTIONAL_FILES[relpath]
    head, _, rest = relpath.partition("/")
    if head == "api-bank":
        commit = APIBANK_TEST_COMMIT if rest.startswith(("test-data/", "training-data/")) else APIBANK_HEAD_COMMIT
        return f"https://raw.githubusercontent.com/AlibabaResearch/DAMO-ConvAI/{commit}/api-bank/{rest}"
    if head == "toolalpaca":
        if rest == "LICENSE":
            return f"https://raw.githubusercontent.com/tangqiaoyu/ToolAlpaca/{TOOLALPACA_COMMIT}/LICENSE"
        return f"https://raw.githubusercontent.com/tangqiaoyu/ToolAlpaca/{TOOLALPACA_COMMIT}/data/{rest}"
    if head == "bfcl":
        if rest == "LICENSE":
            return f"https://raw.githubusercontent.com/ShishirPatil/gorilla/{GORILLA_COMMIT}/LICENSE"
        return None  # inside a wheel: see wheel_url
    if head == "train-extra":
        folder, _, inner = rest.partition("/")
        repo, commit = TRAIN_EXTRA_REPOS[folder]
        return f"https://raw.githubusercontent.com/{repo}/{commit}/{inner}"
    return None


def wheel_url(wheel: str) -> str:
    name, _, version = wheel.partition("-")
    return (
        f"https://files.pythonhosted.org/packages/py3/{name[0]}/{name}/"
        f"{name}-{version}-py3-none-any.whl"
    )


Fetch = Callable[[str], bytes]


def urllib_fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (fixed https URLs)
        return response.read()


def download(relpath: str, dest_root: Path, fetch: Fetch = urllib_fetch) -> Path:
    """Fetch one file into ``dest_root/relpath`` (BFCL files come out of their wheel)."""
    dest = dest_root / relpath
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = upstream_url(relpath)
    if url is not None:
        payload = fetch(url)
    else:
        wheel = relpath.split("/")[1]
        inner = "bfcl_eval/data/" + relpath.split("/", 2)[2]
        with zipfile.ZipFile(io.BytesIO(fetch(wheel_url(wheel)))) as archive:
            payload = archive.read(inner)
    tmp = dest.with_suffix(dest.suffix + ".part")
    tmp.write_bytes(payload)
    tmp.replace(dest)
    return dest


_VERIFIED: dict[Path, str] = {}


def _missing_message(relpath: str, looked: list[tuple[str, Path]], why: str) -> str:
    places = "; ".join(f"{label}: {root / relpath}" for label, root in looked)
    url = upstream_url(relpath)
    source = url or f"the {relpath.split('/')[1]} wheel on PyPI ({wheel_url(relpath.split('/')[1])})"
    return (
        f"raw data file {relpath!r} {why}. Looked in: {places}. Get it from {source} "
        f"and place it under one of those roots (or set {ENV_VAR} to a folder holding it); "
        "see ../shared/data/README.md for every source."
    )


def raw_file(relpath: str, fetch: Fetch | None = urllib_fetch, root: Path | None = None) -> Path:
    """The verified local path of one raw file.

    Looks in every candidate root in order; if no root has it, downloads it into the download
    cache with ``fetch`` (pass ``None`` to forbid network access). The sha256 check runs once per
    path per process.
    """
    manifest = load_manifest()
    entry = manifest.get(relpath)
    if entry is None and relpath not in OPTIONAL_FILES:
        raise KeyError(f"{relpath!r} is not in ooospec/resources/raw_manifest.tsv")
    looked = [("given root", root)] if root is not None else candidate_roots()
    path = next((r / relpath for _, r in looked if (r / relpath).is_file()), None)
    if path is None:
        if fetch is None:
            raise RawDataError(_missing_message(relpath, looked, "is missing"))
        cache = root if root is not None else artifacts_dir() / "raw"
        try:
            path = download(relpath, cache, fetch)
        except Exception as err:  # network errors come in many types; report them all alike
            raise RawDataError(_missing_message(relpath, looked, f"is missing and download failed ({err})")) from err
    if entry is not None:
        resolved = path.resolve()
        if _VERIFIED.get(resolved) != entry.sha256:
            actual = file_sha256(path)
            if actual != entry.sha256:
                raise RawDataError(
                    f"raw data file {path} has sha256 {actual}, expected {entry.sha256} "
                    f"(ooospec/resources/raw_manifest.tsv); re-copy or re-download {relpath!r}"
                )
            _VERIFIED[resolved] = actual
    return path


def optional_raw_file(relpath: str, root: Path | None = None) -> Path | None:
    """A training file the mirror may lack: its path when present, else ``None`` (no download)."""
    try:
        return raw_file(relpath, fetch=None, root=root)
    except RawDataError:
        return None


def fetch_all(dest_root: Path | None = None, fetch: Fetch = urllib_fetch, include_optional: bool = False) -> list[Path]:
    """Download every manifest file that is not yet in the cache (for a machine without the mirror).

    ``include_optional`` also fetches the paper's training files the mirror lacks (API-Bank
    lv1/lv2 from the Hugging Face Hub, ToolAlpaca ``train_data.json`` from GitHub); they have no
    pinned hash.
    """
    dest_root = dest_root or artifacts_dir() / "raw"
    paths = []
    wanted = list(load_manifest()) + (list(OPTIONAL_FILES) if include_optional else [])
    for relpath in wanted:
        if not (dest_root / relpath).is_file():
            download(relpath, dest_root, fetch)
        paths.append(raw_file(relpath, fetch=None, root=dest_root))
    return paths


def optional_files_state() -> dict[str, str | None]:
    """sha256 prefix of each optional training file that is present (None when absent): part of
    the data config, so that adding the files later triggers a rebuild."""
    state: dict[str, str | None] = {}
    for relpath in OPTIONAL_FILES:
        path = optional_raw_file(relpath)
        state[relpath] = file_sha256(path)[:16] if path is not None else None
    return state


def clear_verification_cache() -> None:
    _VERIFIED.clear()


__all__ = [
    "ENV_VAR", "OPTIONAL_FILES", "RawDataError", "candidate_roots", "download", "fetch_all",
    "load_manifest", "optional_files_state", "optional_raw_file", "raw_file", "raw_root", "upstream_url", "wheel_url",
]
