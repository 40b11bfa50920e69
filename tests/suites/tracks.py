"""What the suite tests share: every track of a suite's classes read from one setup_cache result."""
import itertools
import math
from collections.abc import Callable

from asv_runner.benchmarks.mark import SkipNotImplemented


def measured(result, grids: dict, skipped: Callable[[str, tuple, str], bool] = lambda name, params, why: bool(why)) -> dict:
    """(track name, *params) -> value for every track_ method of each class in `grids` (class -> one
    list of values per parameter) over the product of its grid, `result` standing for the
    setup_cache value. Each must return a finite number, or raise SkipNotImplemented with a reason
    `skipped(name, params, reason)` accepts (by default: any stated reason)."""
    values = {}
    for cls, grid in grids.items():
        for name in (n for n in dir(cls) if n.startswith("track_")):
            for params in itertools.product(*grid):
                try:
                    value = getattr(cls(), name)(result, *params)
                except SkipNotImplemented as e:
                    assert skipped(name, params, str(e)), (cls.__name__, name, params, str(e))
                    continue
                assert isinstance(value, (int, float)) and math.isfinite(value), (cls.__name__, name, params, value)
                assert (name, *params) not in values, f"{name}{params} is a track of two classes"
                values[name, *params] = value
    return values
