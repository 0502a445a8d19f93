"""An adapter's hint on the canonical benchmark requests (`ooospec.studies.sidecar_on_benchmarks`):
a stored wave is scored as the bench scores a hint, two adapters are read request for request, and
two adapters scored on different requests are refused."""

import json

import pytest

from ooospec.data.request import Call
from ooospec.stage import append_jsonl
from ooospec.studies.sidecar_on_benchmarks import agreement_table, scored_wave

TARGET = Call("get_weather", {"city": "Paris", "unit": "C"})


def _wave(call: dict | None, *alternatives: dict) -> dict:
    calls = [call, *alternatives] if call else []
    return {"call": call, "payload": json.dumps(calls) if calls else None}


def test_a_stored_wave_is_scored_against_the_targets_call_as_written():
    assert scored_wave(_wave(TARGET.to_dict()), TARGET) == {"function": True, "whole": True}
    other_value = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "F"}}
    assert scored_wave(_wave(other_value), TARGET) == {"function": True, "whole": False}
    # an alternative in the payload holding the target's call does not make the first call whole
    wrong_first = {"name": "get_time", "arguments": {"city": "Paris"}}
    assert scored_wave(_wave(wrong_first, TARGET.to_dict()), TARGET) == {"function": False, "whole": False}
    extra = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "C", "days": 1}}
    assert scored_wave(_wave(extra), TARGET)["whole"] is False
    assert scored_wave(_wave(None), TARGET) == {"function": False, "whole": False}


def _commit(directory, name, wholes, benchmark="bfcl"):
    append_jsonl(directory / f"{name}.jsonl", [{"benchmark": benchmark, "request_id": f"r{i}", "function": True,
                                                 "whole": whole, "latency_s": 1.0 + i} for i, whole in enumerate(wholes)])


def test_two_adapters_are_read_request_for_request(tmp_path):
    _commit(tmp_path, "served", [True, False, False, False] * 10)
    _commit(tmp_path, "larger", [True, True, True, False] * 10)
    row = agreement_table("served", "larger", tmp_path).loc["bfcl"]
    assert row["n"] == 40
    assert (row["whole call (ref.)"], row["whole call (cand.)"]) == (0.25, 0.75)
    point, interval = row["difference [95% CI]"].split(" ", 1)
    assert point == "+0.500" and interval.startswith("[+")


def test_adapters_scored_on_different_requests_are_refused(tmp_path):
    _commit(tmp_path, "served", [True, False])
    _commit(tmp_path, "larger", [True, False, True])
    with pytest.raises(ValueError, match="different requests"):
        agreement_table("served", "larger", tmp_path)
    with pytest.raises(FileNotFoundError, match="no committed benchmark scores of adapter missing"):
        agreement_table("served", "missing", tmp_path)


def test_a_limited_run_is_never_committed(tmp_path, capsys):
    from ooospec.studies.sidecar_on_benchmarks import main

    with pytest.raises(SystemExit):
        main(["--adapter", str(tmp_path), "--limit", "3", "--commit"])
    assert "--limit and --commit together" in capsys.readouterr().err
