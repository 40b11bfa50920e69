"""95% intervals for measured values, from the samples they came from.

- A speed ratio of interleaved rounds (`ratio_of_rounds`): per round, baseline time / method time
  (the two calls ran back to back on the same inputs); the value is the median of those ratios,
  the interval the distribution-free order-statistic interval of the median: the narrowest pair
  (x_(j), x_(n+1-j)) whose binomial coverage is at least 95%. It needs 6 rounds: with 5, even
  (min, max) covers only 93.75%.
- A tail latency (`percentile_of`: the 99th percentile of a run's queries): the narrowest pair of
  order statistics whose binomial coverage of that quantile is at least 95%. Below 299 samples a 99th
  percentile has none (299 is where (min, max) first covers 95%); its samples are kept either way.
- A rate over items (`rate`: queries with identical results, questions answered): the Wilson
  score interval.
- Any statistic of per-item outcomes (`bootstrap`: a difference or a ratio of means between two
  methods on the same items, a cost change over the same tasks): percentile bootstrap over items,
  paired (each resample draws whole items), 2,000 resamples, seeded so a rerun gives the same
  interval. Every resample assumes the items are independent draws: one run's latencies are not (a
  disk is slow or fast for a while), so a latency comparison is a statistic per interleaved round,
  and its interval the order statistics of those rounds (`median_of`). A statistic of item sets that
  do not pair (`bootstrap_groups`: the worse of a perplexity change over spans and an accuracy change
  over questions) redraws each set on its own in every resample.
- A paired test (`sign_flip_pvalue`): the one-sided p-value of a mean paired difference above 0
  by random sign flips; `holm` corrects many such tests at once.
- Two runs' samples (`rank_sum_pvalue`, the rounds of one benchmark at two commits): the one-sided
  Wilcoxon rank-sum (Mann-Whitney) p-value that the first run's values lie above the second's, by
  random relabelling of the pooled ranks (ties share their mean rank). Two runs' items of a rate
  (`mean_difference_pvalue`): the same relabelling on the values themselves, testing their means, which
  a rate is: scores in [0, 1] that are means over draws (1/3, 2/3) would rank above a run's zeros
  however much lower their mean is. Two runs' tail latencies (`percentile_difference_pvalue`): the same
  relabelling, testing their percentiles: one slow query moves a 99th percentile of 70 alone, and the
  relabelling sees how often it lands on either side.
Every estimate says how many samples it rests on and how many it needs (`min_n`); below that,
verdicts call it inconclusive.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_ROUNDS = 6
MIN_ITEMS = 10


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float | None
    high: float | None
    n: int
    method: str
    min_n: int = 1
    samples: tuple[float, ...] = field(default=(), repr=False)
    confidence: float = CONFIDENCE

    @property
    def enough(self) -> bool:
        """As many samples as the method needs for its nominal confidence."""
        return self.n >= self.min_n and self.low is not None

    def map(self, fn: Callable[[float], float]) -> Estimate:
        """A monotone function of the value (e.g. 100 * (x - 1)); a decreasing one swaps the bounds. The
        samples go through it too (a round's time becomes its queries/s), so a test over two runs' samples
        reads them in the value's direction."""
        bounds = sorted((fn(self.low), fn(self.high))) if self.low is not None else (None, None)
        return Estimate(fn(self.value), bounds[0], bounds[1], self.n, self.method, self.min_n,
                        tuple(fn(s) for s in self.samples), self.confidence)

    def to_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "method": self.method,
                "min_n": self.min_n, "confidence": self.confidence, "samples": list(self.samples)}

    def text(self, digits: int = 3) -> str:
        """'7.6 [6.5, 8.4]'."""
        return bracketed(self.value, self.low, self.high, digits)


def bracketed(value: float, low: float | None = None, high: float | None = None, digits: int = 4,
              unit: str = "") -> str:
    """'7.6x [6.5, 8.4]': a value with its 95% interval, or alone where none was recorded. Where `digits`
    significant digits would print two different bounds as one number ('1.55x [1.55, 1.55]'), it takes up
    to three more ('1.551x [1.548, 1.553]')."""
    if low is not None and low != high:
        digits = next((more for more in range(digits, digits + 4) if f"{low:.{more}g}" != f"{high:.{more}g}"),
                      digits + 3)
    shown = f"{value:.{digits}g}{unit}"
    return shown if low is None else f"{shown} [{low:.{digits}g}, {high:.{digits}g}]"


def order_statistic_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, coverage) for the median: the narrowest symmetric pair of order statistics
    whose coverage under any continuous distribution reaches `confidence` (min and max when none
    does; the coverage returned says so)."""
    x = sorted(samples)
    n = len(x)
    if n == 0:
        raise ValueError("no samples")
    # 1-based j: coverage of (x_(j), x_(n+1-j)) is 1 - 2 P(Bin(n, 1/2) < j)
    coverage = 1.0 - 2 * _binomial_below(n, 0.5)[1:n // 2 + 1]  # for j = 1 .. n // 2
    ok = np.flatnonzero(coverage >= confidence)
    if len(ok) == 0:
        return x[0], x[-1], 1.0 - 2 * 0.5 ** n
    lo = int(ok[-1])  # the largest such j, 0-based index j - 1
    return x[lo], x[n - 1 - lo], float(coverage[lo])


def _binomial_below(n: int, q: float) -> np.ndarray:
    """below[j] = P(Bin(n, q) < j) for j = 0 .. n + 1; the pmf in log space, so that tens of thousands of
    samples (a fast kernel's rounds) cost O(n)."""
    k = np.arange(n + 1)
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])  # log k! for k = 0 .. n
    log_pmf = log_factorial[n] - log_factorial - log_factorial[::-1] + k * math.log(q) + (n - k) * math.log1p(-q)
    return np.concatenate([[0.0], np.cumsum(np.exp(log_pmf))])


def median_of(samples: Sequence[float], method: str = "order statistics of rounds") -> Estimate:
    """The median of repeated measurements (a time per round, a latency per query) and its
    order-statistic interval; a single measurement has none."""
    low, high, _ = order_statistic_interval(samples) if len(samples) > 1 else (None, None, 0.0)
    return Estimate(statistics.median(samples), low, high, len(samples), method, MIN_ROUNDS, tuple(samples))


def percentile_of(samples: Sequence[float], percent: float, method: str = "of queries") -> Estimate:
    """The `percent` percentile of repeated measurements (numpy's linear interpolation) with its
    distribution-free interval: the narrowest pair of order statistics (x_(j), x_(k)) with
    P(j <= Bin(n, q) < k) >= 95%, q = percent / 100. None where even (min, max) falls short; min_n says how
    many samples one takes. The method reads 'percentile 99 of queries' (what alerts' test keys on)."""
    n, q = len(samples), percent / 100
    if n == 0 or not 0 < q < 1:
        raise ValueError(f"percentile {percent} of {n} samples")
    min_n = math.ceil(math.log(1 - CONFIDENCE) / math.log(max(q, 1 - q)))  # (min, max) covers 1 - q^n - (1 - q)^n
    while 1 - q ** min_n - (1 - q) ** min_n < CONFIDENCE:
        min_n += 1
    low = high = None
    if n >= min_n:
        below = _binomial_below(n, q)
        j = np.arange(1, n)  # 1-based lower order statistic; its upper one the first k reaching the coverage
        upper = np.searchsorted(below, below[j] + CONFIDENCE - 1e-12)
        narrowest = int(np.argmin(np.where(upper <= n, upper - j, n + 1)))
        x = sorted(samples)
        low, high = x[j[narrowest] - 1], x[upper[narrowest] - 1]
    return Estimate(float(np.percentile(samples, percent)), low, high, n, f"percentile {percent:g} {method}", min_n,
                    tuple(samples))


def ratio_of_rounds(baseline: Sequence[float], method: Sequence[float]) -> Estimate:
    """How many times faster the method is, per interleaved round: median and 95% interval."""
    if len(baseline) != len(method) or not baseline:
        raise ValueError(f"rounds differ: {len(baseline)} baseline, {len(method)} method")
    ratios = [b / m for b, m in zip(baseline, method)]
    low, high, _ = order_statistic_interval(ratios)
    return Estimate(statistics.median(ratios), low, high, len(ratios), "order statistics of per-round ratios",
                    MIN_ROUNDS, tuple(ratios))


def rate(outcomes: Sequence[bool | float]) -> Estimate:
    """Share of successes with its Wilson score interval (exactly 0 or 1 at the ends where it is, not
    a rounding error inside them). An item may score a fraction (partial credit, a mean over seeds):
    a score in [0, 1] with mean p varies no more than a success with probability p does, so the
    interval then errs wide, never narrow."""
    n = len(outcomes)
    if n == 0:
        raise ValueError("no items")
    outside = [x for x in outcomes if not 0 <= float(x) <= 1]
    if outside:
        raise ValueError(f"a rate's items score in [0, 1]; got {outside[:3]} ({len(outside)} of {n})")
    p = sum(map(float, outcomes)) / n
    z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = (0.0 if p == 0 else max(0.0, centre - half)), (1.0 if p == 1 else min(1.0, centre + half))
    return Estimate(p, low, high, n, "Wilson", MIN_ITEMS,
                    tuple(map(float, outcomes)))


def bootstrap(items: Sequence, statistic: Callable[[list], float], samples: Sequence[float] = (),
              seed: int = 0) -> Estimate:
    """statistic(items) with a paired percentile-bootstrap interval: each resample draws whole
    items (e.g. one question's outcome under every method) with replacement. `samples`, kept with
    the estimate, are one number per item whose location the statistic follows (the per-item
    difference of a mean difference, a span's NLL of a perplexity); empty where no such number
    exists (a rank correlation)."""
    return _percentile_bootstrap([items], lambda groups: statistic(groups[0]), "paired bootstrap over items",
                                 samples, seed)


def bootstrap_groups(groups: Sequence[Sequence], statistic: Callable[[list[list]], float], seed: int = 0) -> Estimate:
    """statistic(groups) for item sets that do not pair with each other (a perplexity's held-out spans and
    an accuracy's questions): each resample redraws every group's items on its own, as `bootstrap` does
    one group's. It rests on its smallest group."""
    return _percentile_bootstrap(groups, statistic, "bootstrap over items, each group on its own", (), seed)


def _percentile_bootstrap(groups: Sequence[Sequence], statistic: Callable[[list[list]], float], method: str,
                          samples: Sequence[float], seed: int) -> Estimate:
    if not groups or any(len(items) == 0 for items in groups):
        raise ValueError("no items")
    value = statistic([list(items) for items in groups])
    rng = np.random.default_rng(seed)
    draws = [statistic([[items[i] for i in rng.integers(0, len(items), len(items))] for items in groups])
             for _ in range(RESAMPLES)]
    draws = [d for d in draws if d == d]  # a resample can make a ratio undefined (0 / 0)
    low, high = np.quantile(draws, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2]) if draws else (None, None)
    return Estimate(value, None if low is None else float(low), None if high is None else float(high),
                    min(map(len, groups)), method, MIN_ITEMS, tuple(map(float, samples)))


def sign_flip_pvalue(deltas: Sequence[float], permutations: int = 10_000, seed: int = 0) -> float:
    """One-sided p-value that the mean of paired differences is above 0: the share of random sign
    flips of the differences whose mean is at least the observed one (the observed counted once)."""
    d = np.asarray(deltas, dtype=np.float64)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError("deltas: a non-empty 1-d sequence")
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(permutations, len(d)))
    observed = d.mean()
    return float((1 + np.count_nonzero((signs @ d) / len(d) >= observed - 1e-12)) / (1 + permutations))


def rank_sum_pvalue(above: Sequence[float], below: Sequence[float], permutations: int = 10_000,
                    seed: int = 0) -> float:
    """One-sided p-value that the values of `above` tend to exceed those of `below`: the share of
    random splits of the pooled ranks into groups of these sizes whose first group's rank sum is at
    least the observed one (the observed split counted once): `mean_difference_pvalue` on the ranks
    (with the sizes fixed, a larger rank sum is a larger difference of mean ranks)."""
    a, b = _two_samples(above, below)
    pooled = np.concatenate([a, b])
    order = np.argsort(pooled, kind="stable")
    ranks = np.empty(len(pooled))
    ranks[order] = np.arange(1, len(pooled) + 1)
    for value in np.unique(pooled):  # ties: the mean of the ranks they span
        tied = pooled == value
        ranks[tied] = ranks[tied].mean()
    return mean_difference_pvalue(ranks[:len(a)], ranks[len(a):], permutations, seed)


def mean_difference_pvalue(above: Sequence[float], below: Sequence[float], permutations: int = 10_000,
                           seed: int = 0) -> float:
    """One-sided p-value that the mean of `above` exceeds the mean of `below`: the share of random splits
    of the pooled values into groups of these sizes whose first group's mean minus the second's is at
    least the observed one (the observed split counted once)."""
    a, b = _two_samples(above, below)
    pooled = np.concatenate([a, b])
    total = pooled.sum()

    def difference(first_sum):  # the same arithmetic for the observed split and the random ones
        return first_sum / len(a) - (total - first_sum) / len(b)
    rng = np.random.default_rng(seed)
    first = pooled[np.argsort(rng.random((permutations, len(pooled))), axis=1)[:, :len(a)]].sum(axis=1)
    tolerance = 1e-9 * (1 + np.abs(pooled).max())  # summation order only, far below one item's move
    return float((1 + np.count_nonzero(difference(first) >= difference(a.sum()) - tolerance)) / (1 + permutations))


def percentile_difference_pvalue(above: Sequence[float], below: Sequence[float], percent: float,
                                 permutations: int = 10_000, seed: int = 0) -> float:
    """One-sided p-value that the `percent` percentile of `above` exceeds that of `below`: the share of
    random splits of the pooled values into groups of these sizes whose percentiles differ by at least the
    observed difference (the observed split counted once)."""
    a, b = _two_samples(above, below)
    pooled = np.concatenate([a, b])
    observed = np.percentile(a, percent) - np.percentile(b, percent)
    shuffled = pooled[np.argsort(np.random.default_rng(seed).random((permutations, len(pooled))), axis=1)]
    split = (np.percentile(shuffled[:, :len(a)], percent, axis=1)
             - np.percentile(shuffled[:, len(a):], percent, axis=1))
    tolerance = 1e-9 * (1 + np.abs(pooled).max())
    return float((1 + np.count_nonzero(split >= observed - tolerance)) / (1 + permutations))


def _two_samples(above: Sequence[float], below: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(above, dtype=np.float64), np.asarray(below, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or not len(a) or not len(b):
        raise ValueError("above, below: non-empty 1-d sequences")
    return a, b


def holm(pvalues: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise level alpha, in the order of pvalues."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected
