"""faiss IndexIVFFlat: the baseline Lychee claims to beat (faiss-gpu when importable and asked for).

The trained coarse quantizer and list assignment are exposed so a method can reuse them: the
same nprobe then probes the same lists.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numpy as np

from claimbench.interfaces import InputError, SearchCounters, VectorIndex, check_vectors


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


@dataclass
class IVFFlat(VectorIndex):
    nlist: int = 1024
    seed: int = 1234
    use_gpu: bool = False
    name = "ivf-flat"
    nprobe: int = field(default=1, init=False)
    index: faiss.IndexIVFFlat | None = field(default=None, repr=False)
    _search_index: object = field(default=None, repr=False)
    _last_query: np.ndarray | None = field(default=None, repr=False)

    def build(self, xb: np.ndarray) -> None:
        xb = check_vectors(xb, "database")
        n, d = xb.shape
        if self.nlist < 1 or self.nlist > n:
            raise InputError(f"nlist={self.nlist} must be in [1, {n}] (the database size)")
        quantizer = faiss.IndexFlatL2(d)
        index = faiss.IndexIVFFlat(quantizer, d, self.nlist, faiss.METRIC_L2)
        quantizer.this.disown()  # the IVF index owns its quantizer, as after read_index
        index.own_fields = True
        index.cp.seed = self.seed
        index.train(xb)
        index.add(xb)
        self._attach(index)

    def _attach(self, index: faiss.IndexIVFFlat) -> None:
        self.index, self._quantizer = index, faiss.downcast_index(index.quantizer)
        self.nlist = index.nlist
        self._search_index = index
        if self.use_gpu:
            if not gpu_available():
                raise InputError("use_gpu=True but faiss has no GPU support here (install faiss-gpu)")
            self._search_index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        self.list_sizes = np.array([index.invlists.list_size(i) for i in range(self.nlist)], dtype=np.int64)

    def save(self, path) -> None:
        faiss.write_index(self.index, str(path))

    @classmethod
    def load(cls, path, use_gpu: bool = False) -> "IVFFlat":
        index = faiss.read_index(str(path))  # already the concrete class, and owning its memory
        if not isinstance(index, faiss.IndexIVFFlat):
            raise InputError(f"{path}: not a faiss IndexIVFFlat")
        ivf = cls(nlist=index.nlist, use_gpu=use_gpu)
        ivf._attach(index)
        return ivf

    @property
    def ntotal(self) -> int:
        return self.index.ntotal if self.index is not None else 0

    @property
    def d(self) -> int:
        return self.index.d if self.index is not None else 0

    def list_ids(self, list_no: int) -> np.ndarray:
        """Database ids in one inverted list, in faiss's storage order."""
        size = self.index.invlists.list_size(list_no)
        return faiss.rev_swig_ptr(self.index.invlists.get_ids(list_no), size).copy()

    def centroids(self) -> np.ndarray:
        return self._quantizer.reconstruct_n(0, self.nlist)

    def probe(self, xq: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        """The lists IVF-Flat probes for each query (and their centroid distances)."""
        return self._quantizer.search(xq, nprobe)

    def set_query_params(self, nprobe: int = 1) -> None:
        if not 1 <= nprobe <= self.nlist:
            raise InputError(f"nprobe={nprobe} must be in [1, nlist={self.nlist}]")
        self.nprobe = int(nprobe)
        (self._search_index if self.use_gpu else self.index).nprobe = self.nprobe

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        self._last_query = xq
        return self._search_index.search(xq, k)

    @property
    def counters(self) -> SearchCounters:
        """Work of the last search, derived after the fact so it never adds to the timed call."""
        if self._last_query is None:
            return SearchCounters()
        _, lists = self.probe(self._last_query, self.nprobe)
        scanned = int(self.list_sizes[lists].sum())
        return SearchCounters(queries=len(lists), lists_probed=lists.size,
                              vectors_in_probed_lists=scanned, vectors_read_full=scanned)
