"""Flat exact L2 search (faiss IndexFlatL2): the ground truth, and at very high nprobe the real
competitor of any IVF method."""
from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np

from claimbench.interfaces import SearchCounters, VectorIndex, check_vectors


@dataclass
class FlatExact(VectorIndex):
    name = "flat-exact"
    counters: SearchCounters = field(default_factory=SearchCounters, repr=False)
    _index: faiss.IndexFlatL2 | None = field(default=None, repr=False)

    def build(self, xb: np.ndarray) -> None:
        xb = check_vectors(xb, "database")
        self._index = faiss.IndexFlatL2(xb.shape[1])
        self._index.add(xb)

    @property
    def ntotal(self) -> int:
        return self._index.ntotal if self._index is not None else 0

    @property
    def d(self) -> int:
        return self._index.d if self._index is not None else 0

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        n = len(xq)
        self.counters = SearchCounters(queries=n, vectors_in_probed_lists=n * self.ntotal,
                                       vectors_read_full=n * self.ntotal)
        return self._index.search(xq, k)
