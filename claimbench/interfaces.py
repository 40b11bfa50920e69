"""One task interface per family, declared once; methods and baselines implement the same one.

Vector index (ann-benchmarks style): build-time knobs are dataclass fields, query-time knobs go
through `set_query_params`; numpy in, numpy out, shapes checked first (faiss contrib style).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


class InputError(ValueError):
    """Bad input to a task interface; the message names the problem."""


MISSING_ID = -1  # faiss's result for a slot no neighbour fills (a probed list holds fewer than k)
MISSING_DISTANCE = float(np.finfo(np.float32).max)  # and its distance there (FLT_MAX, not inf)


@dataclass
class SearchCounters:
    """Work done by the last `search` call, summed over its queries."""
    queries: int = 0
    lists_probed: int = 0
    lists_skipped: int = 0
    vectors_in_probed_lists: int = 0
    vectors_read_full: int = 0

    @property
    def read_fraction(self) -> float:
        return self.vectors_read_full / max(self.vectors_in_probed_lists, 1)


def check_vectors(x: np.ndarray, what: str, d: int | None = None) -> np.ndarray:
    """float32, C-contiguous, 2-D, finite; dimension d if given."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"{what}: expected a 2-D array (n, d), got shape {x.shape}")
    if x.shape[0] == 0:
        raise InputError(f"{what}: empty (0 vectors)")
    if d is not None and x.shape[1] != d:
        raise InputError(f"{what}: dimension mismatch: got d={x.shape[1]}, the index has d={d}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise InputError(f"{what}: contains NaN or inf (first at row {bad})")
    return x


class VectorIndex(ABC):
    """build(xb) / set_query_params(**p) / search(xq, k) -> (distances (nq, k), ids (nq, k))."""

    name: str = "index"
    counters: SearchCounters

    @abstractmethod
    def build(self, xb: np.ndarray) -> None: ...

    def set_query_params(self, **params) -> None:
        if params:
            raise InputError(f"{self.name} takes no query parameters, got {sorted(params)}")

    @abstractmethod
    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    @property
    @abstractmethod
    def ntotal(self) -> int: ...

    @property
    @abstractmethod
    def d(self) -> int: ...

    def _check_query(self, xq: np.ndarray, k: int) -> np.ndarray:
        if self.ntotal == 0:
            raise InputError(f"{self.name}: search before build")
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise InputError(f"{self.name}: k must be a positive integer, got {k!r}")
        if k > self.ntotal:
            raise InputError(f"{self.name}: k={k} is larger than the database ({self.ntotal} vectors)")
        return check_vectors(xq, "queries", self.d)
