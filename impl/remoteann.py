"""RemoteANN: vector search on object storage (PAPERS.md C1), an index layout and read strategy made
together for a store where every request costs tens of milliseconds and bytes cost bandwidth.

Layout under a prefix (reconstructed from the digest; the paper's exact format is not public here):
- `centroids`: the IVF coarse centroids and the product quantizer's codebooks (small: read once at
  `open`, kept);
- `codes`: per inverted list, contiguous and in list order, the list's ids (int64) then its PQ codes
  (m bytes per vector, residuals to the list's centroid, 8 bits per sub-quantizer);
- `vectors`: the full vectors (float32) in the same list order, for re-ranking.
Search: the nprobe nearest lists; their code blocks not in the local cache are read with ranged GETs,
ranges less than `coalesce_gap` bytes apart merged into one GET (S3 serves one range per GET), up to
`fetch_threads` GETs at a time; asymmetric distances from the PQ codes (per-query lookup tables
||r - c||^2 = ||r||^2 - 2 r.c + ||c||^2, one batched matmul); the `rerank` best candidates'
full vectors read by coalesced ranged GETs of `vectors`; exact distances decide the top k.
The cache (reconstructed): an LRU over whole list code blocks, bounded by `cache_bytes` (0: none);
only a block whose bytes all arrived is kept. Defaults: nlist 1024, m = d/2 sub-quantizers (d odd:
d), rerank 64 (a query-time knob), coalesce_gap 16 KiB (at 88 MB/s per connection 0.2 ms of
transfer, against tens of ms for another request), fetch_threads 16, cache 32 MiB.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import faiss
import numpy as np

from claimbench.baselines.object_store_ivf import ObjectStoreIndex, exact_top_k
from claimbench.blobstore import coalesce
from claimbench.interfaces import InputError, SearchCounters, check_vectors

LAYOUT = "remoteann"


class ListCache:
    """LRU over list code blocks (bytes), bounded by capacity bytes; counts hits and misses."""

    def __init__(self, capacity: int):
        self.capacity, self.size = capacity, 0
        self.blocks: OrderedDict[int, bytes] = OrderedDict()
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def get(self, key: int) -> bytes | None:
        with self.lock:
            block = self.blocks.get(key)
            if block is None:
                self.misses += 1
                return None
            self.hits += 1
            self.blocks.move_to_end(key)
            return block

    def put(self, key: int, block: bytes) -> None:
        if len(block) > self.capacity:
            return
        with self.lock:
            if key in self.blocks:
                return
            self.blocks[key] = block
            self.size += len(block)
            while self.size > self.capacity:
                _, evicted = self.blocks.popitem(last=False)
                self.size -= len(evicted)

    def clear(self) -> None:
        with self.lock:
            self.blocks.clear()
            self.size = self.hits = self.misses = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.hits + self.misses, 1)


@dataclass
class RemoteANN(ObjectStoreIndex):
    m: int | None = None  # PQ sub-quantizers (bytes per code); None: d / 2 (d if odd)
    prefix: str = "remoteann"
    coalesce_gap: int = 16 * 1024
    cache_bytes: int = 32 * 2 ** 20
    name = "remoteann"
    rerank: int = field(default=64, init=False)

    def __post_init__(self):
        super().__post_init__()
        self.cache = ListCache(self.cache_bytes)

    def build(self, xb: np.ndarray) -> None:
        from claimbench.baselines.ivf_flat import IVFFlat
        xb = check_vectors(xb, "database")
        n, d = xb.shape
        m = self.m or (d // 2 if d % 2 == 0 else d)
        if d % m:
            raise InputError(f"m={m} sub-quantizers must divide d={d}")
        ivf = IVFFlat(nlist=self.nlist, seed=self.seed)
        ivf.build(xb)
        centroids = ivf.centroids().astype(np.float32)
        order = [ivf.list_ids(list_no) for list_no in range(ivf.nlist)]
        assignment = np.empty(n, np.int64)
        for list_no, ids in enumerate(order):
            assignment[ids] = list_no
        residuals = xb - centroids[assignment]
        pq = faiss.ProductQuantizer(d, m, 8)
        rng = np.random.default_rng(self.seed)
        pq.train(residuals[rng.choice(n, min(n, 256 * 100), replace=False)])
        codes = pq.compute_codes(residuals)
        codebooks = faiss.vector_to_array(pq.centroids).astype(np.float32)
        blocks, rows = [], [0]
        for ids in order:
            blocks.append(ids.astype(np.int64).tobytes() + codes[ids].tobytes())
            rows.append(rows[-1] + len(ids))
        code_offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks])]).tolist()
        objects = {"centroids": centroids.tobytes() + codebooks.tobytes(), "codes": b"".join(blocks),
                   "vectors": xb[np.concatenate(order)].tobytes()}
        self.open(self.layout.write(LAYOUT, objects, {"d": d, "m": m, "nlist": ivf.nlist, "ntotal": n,
                                                      "code_offsets": code_offsets, "row_offsets": rows}))

    def open(self, digest: str | None = None) -> None:
        """Read the manifest (checked against digest when given), the centroids and the codebooks."""
        manifest, small = self._open(LAYOUT, digest)
        self.m = manifest["m"]
        self.code_offsets = np.array(manifest["code_offsets"], np.int64)
        self.row_offsets = np.array(manifest["row_offsets"], np.int64)
        codebooks = np.frombuffer(small, np.float32, offset=4 * self.nlist * self._d)
        self._codebooks = codebooks.reshape(self.m, 256, self._d // self.m)
        self._codebook_norms = (self._codebooks ** 2).sum(-1)  # (m, 256)
        self._table_offsets = np.arange(self.m, dtype=np.intp) * 256  # sub-quantizer j's row in a flat table
        self.cache.clear()

    def set_query_params(self, nprobe: int = 1, rerank: int | None = None) -> None:
        if rerank is not None and rerank < 1:
            raise InputError(f"rerank={rerank} must be at least 1")
        self.nprobe = self._check_nprobe(nprobe)
        self.rerank = int(rerank) if rerank is not None else self.rerank

    def _read_ranges(self, name: str, ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """(start, bytes) of each range, coalesced, fetched in parallel."""
        merged = coalesce(ranges, self.coalesce_gap)
        return list(zip((s for s, _ in merged), self._pool.map(lambda r: self.layout.read(name, *r), merged)))

    def _code_blocks(self, lists: np.ndarray) -> dict[int, bytes]:
        out = {int(l): block for l in lists if (block := self.cache.get(int(l))) is not None}
        missing = [int(l) for l in lists if int(l) not in out and self.code_offsets[l + 1] > self.code_offsets[l]]
        spans = {l: (int(self.code_offsets[l]), int(self.code_offsets[l + 1])) for l in missing}
        for start, data in self._read_ranges("codes", list(spans.values())):
            for l, (a, b) in spans.items():
                if start <= a and b <= start + len(data):
                    out[l] = data[a - start:b - start]
                    self.cache.put(l, out[l])
        return out

    def _search_one(self, query: np.ndarray, k: int, counters: SearchCounters) -> tuple[np.ndarray, np.ndarray]:
        lists = self.probe(query)
        blocks = self._code_blocks(lists)
        residuals = (query[None] - self._centroids[lists]).reshape(len(lists), self.m, -1)
        cross = np.matmul(residuals.transpose(1, 0, 2), self._codebooks.transpose(0, 2, 1)).transpose(1, 0, 2)
        tables = (residuals ** 2).sum(-1)[:, :, None] - 2 * cross + self._codebook_norms  # (nprobe, m, 256)
        candidate_ids, candidate_rows, candidate_d = [], [], []
        for i, l in enumerate(lists):
            n = int(self.row_offsets[l + 1] - self.row_offsets[l])
            if n == 0:
                continue
            block = blocks[int(l)]
            ids = np.frombuffer(block, np.int64, n)
            codes = np.frombuffer(block, np.uint8, offset=8 * n).reshape(n, self.m)
            candidate_d.append(np.take(tables[i].ravel(), codes + self._table_offsets).sum(1))
            candidate_ids.append(ids)
            candidate_rows.append(np.arange(self.row_offsets[l], self.row_offsets[l + 1]))
        counters.lists_probed += len(lists)
        if not candidate_ids:
            return exact_top_k(query, np.zeros((0, self._d), np.float32), np.zeros(0, np.int64), k)
        approx, ids, rows = map(np.concatenate, (candidate_d, candidate_ids, candidate_rows))
        counters.vectors_in_probed_lists += len(ids)
        keep = np.argsort(approx, kind="stable")[:max(self.rerank, k)]
        keep = keep[np.argsort(rows[keep])]
        row_bytes = 4 * self._d
        fetched = dict(self._read_ranges("vectors", [(int(r) * row_bytes, (int(r) + 1) * row_bytes) for r in rows[keep]]))
        starts = sorted(fetched)
        vectors = np.empty((len(keep), self._d), np.float32)
        for j, r in enumerate(rows[keep]):
            offset = int(r) * row_bytes
            start = starts[np.searchsorted(starts, offset, side="right") - 1]
            vectors[j] = np.frombuffer(fetched[start], np.float32, self._d, offset - start)
        counters.vectors_read_full += len(keep)
        return exact_top_k(query, vectors, ids[keep], k)

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        out_d, out_i = np.empty((len(xq), k), np.float32), np.empty((len(xq), k), np.int64)
        counters = SearchCounters(queries=len(xq))
        for row, query in enumerate(xq):
            out_d[row], out_i[row] = self._search_one(query, k, counters)
        self.counters = counters
        return out_d, out_i
