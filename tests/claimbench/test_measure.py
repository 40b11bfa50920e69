import functools
import math
import os
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from claimbench import measure


def test_in_child_returns_the_result_of_a_fresh_process():
    assert measure.in_child(math.factorial, 10) == 3628800
    assert measure.in_child(os.getpid) != os.getpid()


def test_in_child_raises_when_the_child_dies_instead_of_waiting():
    with pytest.raises(BrokenProcessPool):
        measure.in_child(functools.partial(os._exit, 3))


def test_ratio_is_baseline_over_method():
    assert measure.ratio([2.0, 2.0, 9.0], [1.0, 1.0, 0.5]) == pytest.approx(2.0)


def test_repeated_times_a_quick_call_every_round_and_returns_its_first_result():
    calls = iter(range(10))
    first, seconds = measure.repeated(lambda: next(calls), rounds=4, budget_s=10)
    assert first == 0 and len(seconds) == 4 and next(calls) == 4


def test_repeated_runs_a_call_once_when_a_second_would_overrun_the_budget():
    first, seconds = measure.repeated(lambda: time.sleep(0.02) or "done", rounds=4, budget_s=0.03)
    assert first == "done" and len(seconds) == 1


def test_interleaved_alternates_the_entries_in_every_round_and_reports_each_round():
    order, lines = [], []
    ticks = iter(range(1000))
    calls = {name: functools.partial(order.append, name) for name in ("baseline", "method")}
    times = measure.interleaved(calls, rounds=3, warmup=1, clock=lambda: float(next(ticks)), progress=lines.append)
    assert order == ["baseline", "method"] * 4  # the warm-up round, then three timed ones
    assert times == {"baseline": [1.0, 1.0, 1.0], "method": [1.0, 1.0, 1.0]}  # one clock tick per call
    assert lines == ["round 1 of 3: 2 s", "round 2 of 3: 2 s", "round 3 of 3: 2 s"]
