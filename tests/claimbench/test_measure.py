import functools
import math
import os
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
