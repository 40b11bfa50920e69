"""The 95% intervals cover the truth about 95% of the time on data whose truth is known."""
import numpy as np
import pytest

from claimbench import intervals, measure


def coverage(trials, make_estimate, truth) -> float:
    hits = 0
    for t in range(trials):
        est = make_estimate(np.random.default_rng(t))
        hits += est.low <= truth <= est.high
    return hits / trials


def test_order_statistic_interval_of_per_round_ratios_covers_the_true_median_ratio():
    # per-round times with lognormal noise: the true median ratio is exactly 4
    def make(rng, n):
        base = 4.0 * np.exp(rng.normal(0, 0.2, n))
        return intervals.ratio_of_rounds(list(base), list(np.exp(rng.normal(0, 0.2, n))))
    wide = coverage(400, lambda rng: make(rng, 40), 4.0)
    assert 0.93 <= wide <= 0.99  # nominal 95%; order statistics cover at least that (96.2% at n = 40)
    assert coverage(400, lambda rng: make(rng, 7), 4.0) >= 0.95  # (min, max) of 7: 98.4%


def test_order_statistic_interval_needs_six_rounds():
    assert intervals.ratio_of_rounds([2.0] * 5, [1.0] * 5).enough is False
    est = intervals.ratio_of_rounds([2.0, 2.2, 1.9, 2.1, 2.0, 2.05], [1.0] * 6)
    assert est.enough and (est.low, est.high) == (1.9, 2.2) and est.value == pytest.approx(2.025)
    low, high, cover = intervals.order_statistic_interval(list(range(20)))
    assert (low, high) == (5, 14) and cover >= 0.95  # the narrowest pair at n = 20 is (x_6, x_15)


def test_a_single_measurement_has_no_interval():
    single = intervals.median_of([0.09])
    assert (single.value, single.low, single.high, single.n, single.enough) == (0.09, None, None, 1, False)
    assert intervals.median_of([0.09, 0.12]).low == 0.09


def test_a_percentiles_interval_covers_it_once_there_are_enough_samples():
    # exponential latencies: the true q quantile is -log(1 - q)
    for n, percent in ((400, 99), (40, 90)):
        truth = -np.log(1 - percent / 100)
        assert coverage(300, lambda rng: intervals.percentile_of(list(rng.exponential(1, n)), percent), truth) >= 0.93
    tail = intervals.percentile_of(list(np.arange(70.0)), 99)
    assert (tail.value, tail.low, tail.high, tail.min_n, tail.enough) == (pytest.approx(68.31), None, None, 299, False)
    assert tail.method == "percentile 99 of queries" and len(tail.samples) == 70  # no interval, the samples kept
    median = intervals.percentile_of(list(range(20)), 50)
    assert (median.low, median.high) == intervals.order_statistic_interval(list(range(20)))[:2]
    with pytest.raises(ValueError):
        intervals.percentile_of([1.0], 100)


def test_percentile_difference_pvalue_is_calibrated_and_one_slow_query_is_not_a_slower_tail():
    rng = np.random.default_rng(0)
    null = [intervals.percentile_difference_pvalue(rng.exponential(1, 70), rng.exponential(1, 70), 99,
                                                   permutations=1000) for _ in range(200)]
    assert np.mean(np.array(null) < 0.05) <= 0.09  # about 5% of no-change pairs fall below 0.05
    before = rng.exponential(1, 70)
    assert intervals.percentile_difference_pvalue(2 * rng.exponential(1, 70), before, 99) < 0.05  # a slower tail
    one_slow = np.append(before[:-1], 10 * before.max())  # the same queries but one, ten times the slowest
    assert intervals.percentile_difference_pvalue(one_slow, before, 99) > 0.05


def test_wilson_interval_covers_a_rate():
    p = 0.3
    cover = coverage(500, lambda rng: intervals.rate(list(rng.random(200) < p)), p)
    assert 0.92 <= cover <= 0.98
    all_right = intervals.rate([True] * 1000)
    assert all_right.value == 1.0 and all_right.high == 1.0 and 0.995 < all_right.low < 1.0


def test_wilson_interval_of_fractional_scores_errs_wide_and_refuses_scores_outside_0_1():
    # each item scores the mean of 3 draws (SSA's seed-averaged samples): mean 0.3, variance below 0.3 x 0.7
    cover = coverage(500, lambda rng: intervals.rate(list((rng.random((60, 3)) < 0.3).mean(axis=1))), 0.3)
    assert cover >= 0.95
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        intervals.rate([0.5, 1.2, 0.0])


def test_paired_bootstrap_covers_a_difference_of_accuracies(monkeypatch):
    monkeypatch.setattr(intervals, "RESAMPLES", 400)

    def make(rng):  # two methods on the same 150 items; method b is right 10 points more often
        hard = rng.random(150)
        items = [(float(h < 0.5), float(h < 0.6)) for h in hard]
        return intervals.bootstrap(items, lambda xs: 100 * (sum(b for _, b in xs) - sum(a for a, _ in xs)) / len(xs))
    assert 0.9 <= coverage(200, make, 10.0) <= 0.99


def test_bootstrap_of_groups_that_do_not_pair_covers_the_larger_of_two_means(monkeypatch):
    monkeypatch.setattr(intervals, "RESAMPLES", 400)

    def make(rng):  # 120 spans' changes (true mean 0.6) and 80 questions' losses (true mean 0.4), unpaired
        spans, questions = list(rng.normal(0.6, 1.0, 120)), list(rng.normal(0.4, 1.0, 80))
        estimate = intervals.bootstrap_groups([spans, questions], lambda groups: max(map(np.mean, groups)))
        assert estimate.n == 80 and estimate.method == "bootstrap over items, each group on its own"
        return estimate
    assert 0.9 <= coverage(200, make, 0.6) <= 0.99
    with pytest.raises(ValueError, match="no items"):
        intervals.bootstrap_groups([[1.0], []], max)


def test_one_group_draws_what_the_paired_bootstrap_always_drew():
    """bootstrap is bootstrap_groups' one-group case, with the seeded draws it had before: a rerun of an
    earlier suite gives the interval it gave."""
    items = [float(x) for x in np.random.default_rng(3).normal(size=50)]
    rng = np.random.default_rng(0)
    draws = [np.mean([items[i] for i in rng.integers(0, 50, 50)]) for _ in range(intervals.RESAMPLES)]
    paired = intervals.bootstrap(items, lambda xs: float(np.mean(xs)))
    groups = intervals.bootstrap_groups([items], lambda groups: float(np.mean(groups[0])))
    assert (paired.low, paired.high) == tuple(np.quantile(draws, [0.025, 0.975])) == (groups.low, groups.high)


def test_estimates_map_through_monotone_functions():
    est = intervals.ratio_of_rounds([2.0, 3.0, 4.0, 2.5, 3.5, 3.0], [1.0] * 6)
    change = est.map(lambda x: 100 * (1 / x - 1))  # decreasing: the bounds swap
    assert change.low == pytest.approx(-75.0) and change.high == pytest.approx(-50.0)
    assert change.samples == pytest.approx([100 * (1 / x - 1) for x in est.samples])  # tested in its direction
    assert est.text() == "3 [2, 4]"


def test_measure_ratio_is_the_estimates_value():
    base, method = [2.0, 4.0, 3.0], [1.0, 1.0, 1.5]
    assert measure.ratio(base, method) == measure.ratio_estimate(base, method).value == 2.0


def test_wilson_bounds_are_exact_at_the_ends():
    from claimbench import intervals
    assert intervals.rate([True] * 17).high == 1.0 and intervals.rate([False] * 11).low == 0.0


def test_rank_sum_pvalue_is_calibrated_under_no_change_and_small_for_a_shift():
    rng = np.random.default_rng(0)
    null = [intervals.rank_sum_pvalue(rng.normal(0, 1, 7), rng.normal(0, 1, 7), permutations=2000) for _ in range(300)]
    assert 0.02 <= np.mean(np.array(null) < 0.05) <= 0.09  # about 5% of no-change pairs fall below 0.05
    assert intervals.rank_sum_pvalue([10, 11, 12, 13, 14, 15, 16], [1, 2, 3, 4, 5, 6, 7]) < 0.001
    assert intervals.rank_sum_pvalue([1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16]) > 0.99  # one-sided
    assert intervals.rank_sum_pvalue([1.0] * 6, [1.0] * 6) == 1.0  # all tied: no evidence either way
    with pytest.raises(ValueError):
        intervals.rank_sum_pvalue([], [1.0])


def test_mean_difference_pvalue_is_calibrated_under_no_change_and_small_for_a_drop():
    rng = np.random.default_rng(0)
    null = [intervals.mean_difference_pvalue(rng.random(24) < 0.3, rng.random(24) < 0.3, permutations=2000)
            for _ in range(300)]
    assert np.mean(np.array(null) < 0.05) <= 0.08  # at most about 5% of no-change pairs (0/1 ties make it fewer)
    seven, thirds = [1.0] * 7 + [0.0] * 17, [1 / 3] * 5 + [0.0] * 19
    assert intervals.mean_difference_pvalue(seven, thirds) < 0.05 < intervals.rank_sum_pvalue(seven, thirds)
    assert intervals.mean_difference_pvalue(thirds, seven) > 0.95  # one-sided
    assert intervals.mean_difference_pvalue([1.0] * 6, [1.0] * 6) == 1.0  # all equal: no evidence either way
    with pytest.raises(ValueError):
        intervals.mean_difference_pvalue([1.0], [])


def test_an_interval_is_printed_with_the_digits_that_tell_its_bounds_apart():
    assert intervals.bracketed(1.5511, 1.5482, 1.5531, digits=3, unit="x") == "1.551x [1.548, 1.553]"
    assert intervals.bracketed(7.61, 6.53, 8.44, digits=3, unit="x") == "7.61x [6.53, 8.44]"
    assert intervals.bracketed(1.0, 1.0, 1.0, digits=3, unit="x") == "1x [1, 1]"  # one number: nothing to tell
    assert intervals.bracketed(2.0, 2.0 - 1e-12, 2.0 + 1e-12, digits=3) == "2 [2, 2]"  # three more digits at most
    assert intervals.bracketed(2.5, digits=3) == "2.5"
