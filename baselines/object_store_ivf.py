"""The object-store IVF a user would write first (RemoteANN's baseline, PAPERS.md C1): faiss IVF-Flat's
coarse quantizer and lists, one object per inverted list (its ids, then its full vectors), every
probed list fetched whole for every query, no cache; exact distances over the fetched vectors.

Built once (`build` uploads the objects and the manifest), searched by any client that `open`s the
prefix (the centroids are read once there, as any client would keep them). The lists of one query
are fetched in parallel, `fetch_threads` GETs at a time, as RemoteANN's ranges are.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from claimbench.blobstore import BlobStore, LocalStore, RemoteLayout
from claimbench.interfaces import InputError, SearchCounters, VectorIndex, check_vectors

LAYOUT = "ivf-flat-objects"


def new_local_store() -> LocalStore:
    """A fresh folder under the temporary directory, removed with the store (or when the process exits)."""
    folder = tempfile.mkdtemp(prefix="claimbench-index-")
    store = LocalStore(folder)
    weakref.finalize(store, shutil.rmtree, folder, True)
    return store


def exact_top_k(query: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(squared L2 distances, ids) of the k nearest rows, ascending, padded with (inf, -1)."""
    distances = ((vectors - query) ** 2).sum(1) if len(vectors) else np.zeros(0, np.float32)
    order = np.argsort(distances, kind="stable")[:k]
    out_d, out_i = np.full(k, np.inf, np.float32), np.full(k, -1, np.int64)
    out_d[:len(order)], out_i[:len(order)] = distances[order], ids[order]
    return out_d, out_i


@dataclass
class ObjectStoreIndex(VectorIndex):
    """What an IVF index in object storage shares: its store and prefix, the manifest read at `open`
    (checked against the index digest when given), the centroids kept locally, the probe, and a pool
    of `fetch_threads` for its GETs."""
    nlist: int = 1024
    store: BlobStore | None = None  # None: a fresh local folder
    prefix: str = "index"
    fetch_threads: int = 16
    seed: int = 1234
    nprobe: int = field(default=1, init=False)
    counters: SearchCounters = field(default_factory=SearchCounters, init=False)

    def __post_init__(self):
        self.store = self.store or new_local_store()
        self.layout = RemoteLayout(self.store, self.prefix)
        self.digest, self._centroids, self._pool = None, None, None

    def _open(self, layout: str, digest: str | None) -> tuple[dict, bytes]:
        """(the manifest, the centroids object's bytes)."""
        manifest = self.layout.open(layout, digest)
        self.digest, self._d, self._ntotal = manifest["digest"], manifest["d"], manifest["ntotal"]
        self.nlist = manifest["nlist"]
        small = self.layout.read("centroids")
        self._centroids = np.frombuffer(small, np.float32, self.nlist * self._d).reshape(self.nlist, self._d)
        self._pool = ThreadPoolExecutor(self.fetch_threads)
        return manifest, small

    @property
    def ntotal(self) -> int:
        return self._ntotal if self._centroids is not None else 0

    @property
    def d(self) -> int:
        return self._d if self._centroids is not None else 0

    def _check_nprobe(self, nprobe: int) -> int:
        if not 1 <= nprobe <= self.nlist:
            raise InputError(f"nprobe={nprobe} must be in [1, nlist={self.nlist}]")
        return int(nprobe)

    def probe(self, query: np.ndarray) -> np.ndarray:
        """The nprobe lists nearest to one query."""
        distances = ((self._centroids - query) ** 2).sum(1)
        return np.argsort(distances, kind="stable")[:self.nprobe]


@dataclass
class ObjectStoreIVF(ObjectStoreIndex):
    prefix: str = "ivf-flat"
    name = "object-store-ivf"

    def build(self, xb: np.ndarray) -> None:
        from claimbench.baselines.ivf_flat import IVFFlat
        xb = check_vectors(xb, "database")
        ivf = IVFFlat(nlist=self.nlist, seed=self.seed)
        ivf.build(xb)
        objects = {"centroids": ivf.centroids().astype(np.float32).tobytes()}
        sizes = []
        for list_no in range(ivf.nlist):
            ids = ivf.list_ids(list_no)
            objects[f"lists/{list_no}"] = ids.astype(np.int64).tobytes() + xb[ids].tobytes()
            sizes.append(len(ids))
        self.open(self.layout.write(LAYOUT, objects, {"d": xb.shape[1], "nlist": ivf.nlist, "ntotal": len(xb),
                                                      "list_sizes": sizes}))

    def open(self, digest: str | None = None) -> None:
        """Read the manifest (checked against digest when given) and the centroids."""
        manifest, _ = self._open(LAYOUT, digest)
        self.list_sizes = np.array(manifest["list_sizes"], np.int64)

    def set_query_params(self, nprobe: int = 1) -> None:
        self.nprobe = self._check_nprobe(nprobe)

    def _fetch_list(self, list_no: int) -> tuple[np.ndarray, np.ndarray]:
        data = self.layout.read(f"lists/{list_no}")
        n = int(self.list_sizes[list_no])
        return np.frombuffer(data, np.int64, n), np.frombuffer(data, np.float32, offset=8 * n).reshape(n, self._d)

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        out_d, out_i = np.empty((len(xq), k), np.float32), np.empty((len(xq), k), np.int64)
        counters = SearchCounters(queries=len(xq))
        for row, query in enumerate(xq):
            lists = self.probe(query)
            fetched = list(self._pool.map(self._fetch_list, lists))
            ids = np.concatenate([i for i, _ in fetched])
            vectors = np.concatenate([v for _, v in fetched])
            out_d[row], out_i[row] = exact_top_k(query, vectors, ids, k)
            counters.lists_probed += len(lists)
            counters.vectors_in_probed_lists += len(ids)
            counters.vectors_read_full += len(ids)
        self.counters = counters
        return out_d, out_i
