"""The hint-vs-target agreement (`ooospec.report.hint_check.agreement_row`): scored against the
target's own call, a late or failed hint never counts as agreeing, and prose has no call to match."""

from ooospec.report.hint_check import agreement_row
from ooospec.data.request import Call

TARGET = Call("get_weather", {"city": "Paris", "unit": "C"})


def test_a_hint_is_scored_against_the_targets_own_call():
    row = agreement_row({"ready_round": 1, "call": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "F"}}},
                        TARGET)
    assert (row["ready"], row["function"], row["values"], row["whole"]) == (True, True, [True, False], False)
    exact = agreement_row({"ready_round": 0, "call": TARGET.to_dict()}, TARGET)
    assert exact["whole"] and exact["values"] == [True, True]


def test_late_failed_or_missing_hints_and_prose_do_not_agree():
    late = agreement_row({"ready_round": None, "error": "hint not ready before the request finished",
                          "call": TARGET.to_dict()}, TARGET)
    assert not late["ready"] and late["function"] is None
    assert agreement_row(None, TARGET)["ready"] is False
    prose = agreement_row({"ready_round": 2, "call": TARGET.to_dict()}, None)
    assert not prose["wrote_call"] and prose["ready"] and prose["function"] is None
