"""Planted benchmark histories for measuring the regression alerts (claimbench.alerts): series of a
known shape with a drop of known size at a known commit, seeded.

Shapes (12 commits of history, 2% noise per point, then the newest commit):
- `climbing`: performance climbs 7x over the history (kernel work, like GloVe's 0.43x -> 3.0x), then
  the newest point drops;
- `flat`: a flat noisy history, then the newest point drops;
- `falling`: performance falls 3% a commit, then the newest point drops by more (the fall itself,
  30% over the history, is a regression too: alerts on it without a planted drop are not false);
- `last-two`: flat, and the last two points drop;
- `middle-step`: flat, then a step down in the middle, held to the end (asv's step detection's case);
- `improvement`: flat, then the newest point improves by the drop size (must never alert).
A "drop of 20%" is performance falling by a fifth: a higher-is-better value times 0.8, a
lower-is-better one (a time) divided by 0.8.
"""
from __future__ import annotations

import numpy as np

SHAPES = ("climbing", "flat", "falling", "last-two", "middle-step", "improvement")
HISTORY = 12
NOISE = 0.02


def planted(shape: str, drop: float, direction: str, seed: int) -> tuple[list[float], int]:
    """(values oldest first, index of the first dropped point); for `improvement` the index of the
    improved point."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    rng = np.random.default_rng(seed)
    n = HISTORY + 1
    if shape == "climbing":
        perf = np.geomspace(0.43, 3.0, HISTORY)
        perf = np.append(perf, perf[-1])
    elif shape == "falling":
        perf = 10 * 0.97 ** np.arange(n)
    elif shape == "middle-step":
        perf = np.full(2 * HISTORY, 10.0)
        n = len(perf)
    else:
        perf = np.full(n, 10.0)
    start = {"last-two": n - 2, "middle-step": HISTORY}.get(shape, n - 1)
    factor = 1 + drop if shape == "improvement" else 1 - drop
    perf[start:] *= factor
    perf = perf * (1 + NOISE * rng.standard_normal(len(perf)))
    values = perf if direction == "higher" else 1 / perf
    return [float(v) for v in values], start
