"""Provenance: one code commit and one file digest for every committed artifact."""

from __future__ import annotations

import hashlib
import re

from ooospec.provenance import code_commit, file_sha256, file_sha256_or_none, files_sha256


def test_digests_are_sha256sum_of_the_bytes(tmp_path):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"x" * (3 << 20) + b"tail")  # over the block size: streamed, same digest
    b.write_bytes(b"second")
    assert file_sha256(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert files_sha256([a, b]) == hashlib.sha256(a.read_bytes() + b.read_bytes()).hexdigest()
    assert file_sha256_or_none(tmp_path / "absent") is None


def test_the_code_commit_is_a_git_hash_or_none():
    full, short = code_commit(), code_commit(short=True)
    if full is None:  # outside a checkout
        return
    assert re.fullmatch(r"[0-9a-f]{40}", full) and short and full.startswith(short)
