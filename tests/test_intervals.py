"""Paired bootstrap intervals: the point, the pairing, and verdicts only when 1 is excluded."""

import pytest

from ooospec.report.intervals import paired_speedup


def test_ratio_of_totals_and_mean_of_ratios_differ_as_they_should():
    base, new = [10.0, 1.0], [5.0, 1.0]  # a long request doubled, a short one unchanged
    assert paired_speedup(base, new).point == pytest.approx(11 / 6)
    assert paired_speedup(base, new, statistic="mean of ratios").point == pytest.approx(1.5)


def test_a_consistent_speedup_is_called_faster_and_noise_is_not():
    base = [1.0 + 0.1 * i for i in range(30)]
    faster = paired_speedup(base, [b / 1.3 for b in base])
    assert faster.low > 1.0 and faster.verdict == "faster" and faster.n == 30
    noisy = paired_speedup(base, [b * (0.8 if i % 2 else 1.25) for i, b in enumerate(base)])
    assert noisy.low < 1.0 < noisy.high and noisy.verdict == "no difference shown"
    assert paired_speedup(base, [b * 1.3 for b in base]).verdict == "slower"


def test_a_handful_of_requests_gets_no_verdict():
    from ooospec.report.intervals import MIN_REQUESTS, TOO_FEW

    few = [1.0 + i for i in range(MIN_REQUESTS - 1)]
    assert paired_speedup(few, [b / 3 for b in few]).verdict == TOO_FEW
    enough = few + [9.0]
    assert paired_speedup(enough, [b / 3 for b in enough]).verdict == "faster"


def test_pairing_keeps_the_per_request_correlation():
    # request lengths vary 100x, yet every request is exactly 2x faster: the paired interval is tight
    base = [0.1 * 1.2**i for i in range(25)]
    result = paired_speedup(base, [b / 2 for b in base])
    assert result.low == pytest.approx(2.0) and result.high == pytest.approx(2.0)


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="equal-length"):
        paired_speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_speedup([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="unknown statistic"):
        paired_speedup([1.0], [1.0], statistic="median")


def test_the_ceiling_says_whether_an_aim_is_within_reach():
    """The oracle first-call hint's interval decides: below the aim -> out of reach for a first-call
    sidecar; its point at or above the aim -> within reach; otherwise not shown."""
    import pandas as pd

    from ooospec.report.verdict import ceiling_table

    def row(benchmark, method, point, low, high):
        return {"target": "t", "benchmark": benchmark, "method": method, "vs": "toolspec", "phase": "decode",
                "n": 30, "speedup": point, "ci_low": low, "ci_high": high, "mean_of_ratios": point, "verdict": ""}

    trained, oracle = "ooospec:static", "ooospec:oracle:static"  # both in the paper's placement
    h2h = pd.DataFrame([row("a", trained, 1.05, 0.98, 1.12), row("a", oracle, 1.15, 1.08, 1.25),
                        row("b", trained, 1.3, 1.2, 1.4), row("b", oracle, 1.6, 1.4, 1.8),
                        row("c", trained, 1.1, 1.0, 1.2), row("c", oracle, 1.2, 1.0, 1.4),
                        row("d", trained, 1.1, 1.0, 1.2)])  # d: no oracle hint decoded, no row
    agreement = pd.DataFrame([{"target": "t", "benchmark": "a", "target wrote a call": 0.4}]).set_index(
        ["target", "benchmark"])
    table = ceiling_table(h2h, agreement)
    assert list(table.index.get_level_values("benchmark")) == ["a", "b", "c"]
    reach = table["aim 1.35x"].str.split(":").str[0].tolist()
    assert reach == ["out of reach", "within reach", "not shown"]
    assert table.loc[("t", "a"), "target wrote a call"] == 0.4
    assert table.loc[("t", "b"), "share of the oracle hint's gain"] == pytest.approx(0.5)


def test_a_share_difference_counts_only_the_items_the_two_disagree_on():
    from ooospec.report.intervals import paired_share_difference

    same = [True, False] * 20
    assert paired_share_difference(same, same).cell == "+0.000 [+0.000, +0.000]"
    better = paired_share_difference(same, [True] * 40)  # right on 20 more of 40
    assert better.point == pytest.approx(0.5) and better.low > 0 and better.verdict == "higher"
    mixed = paired_share_difference(same, [not x for x in same])  # 20 won, 20 lost
    assert mixed.point == 0 and mixed.low < 0 < mixed.high and mixed.verdict == "no difference shown"
    assert paired_share_difference([True] * 40, same).verdict == "lower"
    with pytest.raises(ValueError, match="equal-length"):
        paired_share_difference([True], [True, False])
