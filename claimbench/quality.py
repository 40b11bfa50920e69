"""Quality metrics that gate speed numbers: recall@k and the identical-result check."""
from __future__ import annotations

import numpy as np

from .interfaces import MISSING_ID


def recall_per_query(found_ids: np.ndarray, true_ids: np.ndarray, k: int = 10) -> np.ndarray:
    """Per query, the fraction of its true k nearest neighbours found among its first k results."""
    assert found_ids.shape[0] == true_ids.shape[0], (found_ids.shape, true_ids.shape)
    return np.array([len(np.intersect1d(f[:k], t[:k])) for f, t in zip(found_ids, true_ids)]) / k


def recall_at_k(found_ids: np.ndarray, true_ids: np.ndarray, k: int = 10) -> float:
    """recall@k: the mean over queries of recall_per_query."""
    return float(np.mean(recall_per_query(found_ids, true_ids, k)))


def identical_rows(d1: np.ndarray, i1: np.ndarray, d2: np.ndarray, i2: np.ndarray, rtol: float = 1e-5) -> np.ndarray:
    """Per query: True when both result lists are the same.

    Same means equal distances position by position (within rtol: the two sides sum in a
    different order), and equal ids except where distances tie, where either id is a right answer.
    Missing results (id -1, where a probed list holds fewer than k) must be missing at the same
    positions on both sides with the same pad distance, bit for bit (faiss pads with FLT_MAX).
    """
    assert d1.shape == d2.shape == i1.shape == i2.shape, (d1.shape, d2.shape, i1.shape, i2.shape)
    pad1, pad2 = i1 == MISSING_ID, i2 == MISSING_ID
    pads_agree = ((pad1 == pad2) & (~pad1 | (d1 == d2))).all(axis=1)
    real = ~(pad1 | pad2)
    magnitude = np.where(real, np.maximum(np.abs(d1), np.abs(d2)), 0)
    scale = magnitude.max(axis=1, keepdims=True) + 1e-30
    gap = np.abs(np.where(real, d1, 0).astype(np.float64) - np.where(real, d2, 0))
    close = (gap <= rtol * scale).all(axis=1) & pads_agree
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
        kth = max(d1[r][real[r]].max(initial=0), d2[r][real[r]].max(initial=0))  # the last real distance
        tail = {i for dd, ii in ((d1[r], i1[r]), (d2[r], i2[r]))
                for d, i in zip(dd, ii) if i != MISSING_ID and abs(d - kth) <= rtol * scale[r, 0]}
        same[r] = diff <= tail
    return same


def ndcg_at_k(ranked: np.ndarray, relevant, k: int = 10) -> np.ndarray:
    """NDCG@k per query, binary relevance: ranked (nq, >=k) ids best first, relevant[q] a set of ids.
    DCG = sum over the top k of rel / log2(rank + 1); the ideal puts min(|relevant|, k) hits first."""
    assert ranked.ndim == 2 and ranked.shape[1] >= k and len(relevant) == len(ranked), (ranked.shape, len(relevant))
    discount = 1 / np.log2(np.arange(2, k + 2))
    out = np.zeros(len(ranked))
    for q, (row, rel) in enumerate(zip(ranked[:, :k], relevant)):
        if rel:
            gains = np.fromiter((i in rel for i in row), dtype=np.float64, count=k)
            out[q] = gains @ discount / discount[:min(len(rel), k)].sum()
    return out
