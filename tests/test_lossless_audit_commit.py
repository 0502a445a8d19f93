"""The lossless audit is committed per target and arithmetic, beside the sets already there: its file
names the head's output precision, a set of the same name is refused, and the summary keeps the
arithmetics apart (`ooospec.studies.lossless_audit.commit_audit`). The audit itself is real decoding
(`tests/test_lossless.py` runs the same loop); here its records are given."""

import json
from types import SimpleNamespace

import pytest

from ooospec.studies import lossless_audit as audit


def record(method, identical=True, gap=None, request="r1", rows="plain"):
    return {"request_id": request, "target": "t", "benchmark": "bfcl", "method": method, "dtype": "bfloat16",
            "logits": "float32", "rows": rows, "near_tie_gap": 0.75, "identical_to_ar": identical, "near_tie": gap is not None,
            "mismatch": {"position": 3, "ar_margin": gap} if gap is not None else None, "output_ids": [1, 2],
            "rounds": [{}]}


@pytest.fixture
def planned(monkeypatch):
    arithmetic = SimpleNamespace(dtype="bfloat16", logits="float32", kernels=None,
                                 sentence=lambda: "bf16 on a test CPU; logits in fp32")
    monkeypatch.setattr(audit, "arithmetic_of", lambda spec: arithmetic)
    monkeypatch.setattr(audit, "resolve_profile", lambda profile: SimpleNamespace(model=lambda name: name))
    ran = []
    monkeypatch.setattr(audit, "lossless_audit", lambda name, **kw: ran.append(kw) or [
        record("ar"), record("pld"), record("toolspec", identical=False, gap=0.0625)])
    return ran


def test_a_set_is_written_beside_the_old_ones_with_its_provenance(tmp_path, planned):
    old = tmp_path / "t-bf16.jsonl"
    old.write_text(json.dumps({**record("toolspec", identical=False, gap=0.125), "logits": "bfloat16"}) + "\n")
    (tmp_path / "provenance.json").write_text(json.dumps({"sets": {"t-bf16.jsonl": {"config": {"max_new_tokens": 96}}}}))
    [out] = audit.commit_audit(("t",), folder=tmp_path)
    assert out.name == "t-bf16-fp32logits.jsonl" and old.exists()
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert all("output_ids" not in r and "rounds" not in r for r in kept)
    sets = json.loads((tmp_path / "provenance.json").read_text())["sets"]
    assert set(sets) == {"t-bf16.jsonl", "t-bf16-fp32logits.jsonl"}
    new = sets["t-bf16-fp32logits.jsonl"]
    assert (new["decodes_checked"], new["mismatches"], new["max_gap_at_mismatch"], new["near_tie_gap"]) == (2, 1, 0.0625, 0.75)
    assert new["config"]["max_new_tokens"] == planned[0]["max_new_tokens"] == 96
    summary, mismatches = audit.committed_audit(tmp_path)
    assert set(zip(summary.logits, summary.method)) == {("bfloat16", "toolspec"), ("float32", "pld"), ("float32", "toolspec")}
    assert sorted(mismatches.ar_gap_at_mismatch) == [0.0625, 0.125]


def test_a_set_already_committed_is_refused_before_decoding(tmp_path, planned):
    (tmp_path / "t-bf16-fp32logits.jsonl").write_text("")
    with pytest.raises(FileExistsError, match="t-bf16-fp32logits.jsonl: already committed"):
        audit.commit_audit(("t",), folder=tmp_path)
    assert planned == []


def test_row_invariant_forwards_are_a_set_of_their_own(tmp_path, monkeypatch):
    """The same target and head with row-invariant forwards (`ooospec.models.row_invariant`) is another
    arithmetic: its own file beside the plain one, its own rows in the summary."""
    arithmetic = SimpleNamespace(dtype="bfloat16", logits="float32", kernels=audit.ROW_INVARIANT_KERNELS,
                                 sentence=lambda: "bf16 on a test CPU; logits in fp32; row-invariant bf16 products")
    monkeypatch.setattr(audit, "arithmetic_of", lambda spec: arithmetic)
    monkeypatch.setattr(audit, "resolve_profile", lambda profile: SimpleNamespace(model=lambda name: name))
    monkeypatch.setattr(audit, "lossless_audit", lambda name, **kw: [
        record("ar", rows="invariant"), record("pld", rows="invariant"), record("toolspec", rows="invariant")])
    (tmp_path / "t-bf16-fp32logits.jsonl").write_text(json.dumps(record("toolspec", identical=False, gap=0.0625)) + "\n")
    [out] = audit.commit_audit(("t",), folder=tmp_path)
    assert out.name == "t-bf16-fp32logits-rowinvariant.jsonl"
    summary, mismatches = audit.committed_audit(tmp_path)
    by_rows = summary.groupby("rows").identical.sum().to_dict()
    assert by_rows == {"invariant": 2, "plain": 0} and len(mismatches) == 1


def test_a_lean_decoder_audit_is_a_set_of_its_own():
    from ooospec.models.arithmetic import Arithmetic
    from ooospec.models.lean_decoder import LEAN_KERNELS

    lean = Arithmetic(dtype="bfloat16", requested="bfloat16", device="cpu", cpu="x", cpu_capability="AVX512",
                      bf16_kernels=True, cores=2, torch="2.13.0", logits="float32",
                      kernels=f"{LEAN_KERNELS}; prefill: {audit.ROW_INVARIANT_KERNELS}")
    assert audit.rows_of(lean) == "lean"
    assert audit.set_name("t", "bfloat16", "float32", audit.rows_of(lean)) == "t-bf16-fp32logits-lean.jsonl"
