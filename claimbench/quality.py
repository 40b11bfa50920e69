"""Quality metrics that gate speed numbers: recall@k and the identical-result check."""
from __future__ import annotations

import numpy as np


def recall_at_k(found_ids: np.ndarray, true_ids: np.ndarray, k: int = 10) -> float:
    """Mean fraction of each query's true k nearest neighbours found among its first k results."""
    assert found_ids.shape[0] == true_ids.shape[0], (found_ids.shape, true_ids.shape)
    hits = [len(np.intersect1d(f[:k], t[:k])) for f, t in zip(found_ids, true_ids)]
    return float(np.mean(hits)) / k


def identical_rows(d1: np.ndarray, i1: np.ndarray, d2: np.ndarray, i2: np.ndarray, rtol: float = 1e-5) -> np.ndarray:
    """Per query: True when both result lists are the same.

    Same means equal distances position by position (within rtol: the two sides sum in a
    different order), and equal ids except where distances tie, where either id is a right answer.
    """
    assert d1.shape == d2.shape == i1.shape == i2.shape, (d1.shape, d2.shape, i1.shape, i2.shape)
    scale = np.maximum(np.abs(d1), np.abs(d2)).max(axis=1, keepdims=True) + 1e-30
    close = (np.abs(d1 - d2) <= rtol * scale).all(axis=1)
    same = np.empty(len(d1), bool)
    for r in range(len(d1)):
        if not close[r]:
            same[r] = False
            continue
        diff = set(i1[r]) ^ set(i2[r])
        if not diff:
            same[r] = True
            continue
        # ids that differ must sit at the tied tail: distance equal to the k-th distance
        kth = max(d1[r, -1], d2[r, -1])
        tail = {i for dd, ii in ((d1[r], i1[r]), (d2[r], i2[r]))
                for d, i in zip(dd, ii) if abs(d - kth) <= rtol * scale[r, 0]}
        same[r] = diff <= tail
    return same
