"""Lychee: certified screening of inverted lists (PAPERS.md A1; baseline faiss IVF-Flat).

From the paper (as the digest states it): global PCA (mean mu, top-m directions P); each vector's
short code is its projection a(x) = P^T (x - mu) plus the norm of what the projection drops,
r(x); the lower bound ||x - q||^2 >= ||a_x - a_q||^2 + (r_x - r_q)^2; anchors (every s-th member
of each probed list) give an upper bound U on the k-th distance; members whose bound exceeds U
are never read; the rest are read in increasing bound, stopping once the bound passes the
current k-th best. The result is exactly IVF-Flat's at the same nprobe.

Reconstructed here (not in the digest): a list-level bound that skips a probed list whole when
(||q - c|| - radius)^2 > U (triangle inequality; the radius is the farthest member from its
centroid); short codes stored direction-major (m x n) so one list's bounds are a vectorized pass
over the first directions, continued only for members still under the threshold (partial sums of
the bound are bounds too); survivors read per list in increasing bound with software prefetch of
the rows ahead (memory order when more than `sorted_below` of a list survives: with a weak bound
the sort and the random order cost more than the reads they save);
m chosen as the smallest multiple of 8 whose directions capture `variance_target` of the variance
(capped at d/4) unless set; float32 sums with a slack of 1e-5 x the mean squared norm, so float
rounding can never prune a true neighbour.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from claimbench.baselines.ivf_flat import IVFFlat
from claimbench.interfaces import InputError, SearchCounters, VectorIndex, check_vectors


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _sqdist(q, X, t):
    s = np.float32(0.0)
    for j in range(q.shape[0]):
        diff = X[t, j] - q[j]
        s += diff * diff
    return s


@intrinsic
def _prefetch_row(typingctx, arr, row):
    """Ask the CPU to start loading arr[row, :] (every 64-byte line): LLVM's prefetch intrinsic,
    which numba does not expose. Survivors are read in bound order, not memory order, so the
    hardware prefetcher cannot guess them; asking two rows ahead hides most of the miss latency."""
    if not (isinstance(arr, types.Array) and arr.ndim == 2):
        return None

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        i8p = ir.IntType(8).as_pointer()
        base = builder.bitcast(cgutils.get_item_pointer(context, builder, aryty, ary, [args[1], zero]), i8p)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3), "llvm.prefetch.p0")
        row_bytes = builder.mul(builder.extract_value(ary.shape, 1),
                                context.get_constant(types.intp, context.get_abi_sizeof(
                                    context.get_data_type(aryty.dtype))))
        read, keep, data = (ir.Constant(ir.IntType(32), v) for v in (0, 3, 1))
        with cgutils.for_range_slice(builder, zero, row_bytes, context.get_constant(types.intp, 64)) as (off, _):
            builder.call(fn, [builder.gep(base, [off]), read, keep, data])
        return context.get_dummy_value()
    return types.void(arr, row), codegen


PREFETCH_AHEAD = 2  # rows requested ahead of the one being read


@njit(cache=True, nogil=True, inline="always")
def _push(d, i, top_d, top_i):
    k = top_d.shape[0]
    if d >= top_d[k - 1]:
        return
    p = k - 1
    while p > 0 and top_d[p - 1] > d:
        top_d[p] = top_d[p - 1]
        top_i[p] = top_i[p - 1]
        p -= 1
    top_d[p] = d
    top_i[p] = i


@njit(cache=True, nogil=True, fastmath=True)
def _screen_list(AT, R, s0, s1, aq, rq, threshold, first, step, lb, cand):
    """Short-code lower bounds of one list's members, stopping early: every partial sum of the bound
    is itself a lower bound, so a member whose first `first` directions (plus the residual term)
    already exceed the threshold is dropped, and the rest continue `step` directions at a time.
    Codes are stored m x n, so the first pass is vectorized across members. Returns how many
    candidates are left in cand[:count] (list positions, increasing); lb holds their full bounds."""
    n = s1 - s0
    m = AT.shape[0]
    for t in range(n):
        dr = R[s0 + t] - rq
        lb[t] = dr * dr
    head = min(first, m)
    for v in range(head):
        a = aq[v]
        row = AT[v]
        for t in range(n):
            diff = row[s0 + t] - a
            lb[t] += diff * diff
    count = 0
    for t in range(n):
        if lb[t] <= threshold:
            cand[count] = t
            count += 1
    v = head
    while v < m and count > 0:
        end = min(v + step, m)
        kept = 0
        for c in range(count):
            t = cand[c]
            acc = lb[t]
            for u in range(v, end):
                diff = AT[u, s0 + t] - aq[u]
                acc += diff * diff
            lb[t] = acc
            if acc <= threshold:
                cand[kept] = t
                kept += 1
        count = kept
        v = end
    return count


@njit(cache=True, nogil=True)
def _query(q, mu, P, probe, offsets, X, AT, R, ids, centroids, radius, stride, list_bound, slack, first, step,
           sorted_below, top_d, top_i, counts, lb, cand):
    d, m = P.shape
    k = top_d.shape[0]
    # short code of the query: a_q = P^T (q - mu), r_q = ||q - mu - P a_q||
    qc = q.astype(np.float64) - mu
    aq64 = qc @ P
    rq = np.float32(np.sqrt(max((qc * qc).sum() - (aq64 * aq64).sum(), 0.0)))
    aq = aq64.astype(np.float32)
    for j in range(k):
        top_d[j] = np.inf
        top_i[j] = -1
    read = 0
    scanned = 0
    skipped = 0
    # 1. anchors: exact distances, real candidates; their k-th distance is the upper bound U
    for j in range(probe.shape[0]):
        lst = probe[j]
        if lst < 0:
            continue
        s0, s1 = offsets[lst], offsets[lst + 1]
        scanned += s1 - s0
        for t in range(s0, s1, stride):
            _push(_sqdist(q, X, t), ids[t], top_d, top_i)
            read += 1
    # 2. lists closest first: list-level bound, then the short-code bound of every member; members
    #    still under the current k-th best are read in increasing bound until the bound passes the
    #    k-th best, which tightens it for the lists after them. A member left unread has bound >
    #    k-th best: never in the top k.
    for j in range(probe.shape[0]):
        lst = probe[j]
        if lst < 0:
            continue
        s0, s1 = offsets[lst], offsets[lst + 1]
        if s1 - s0 <= 1:
            continue
        bound = top_d[k - 1] + slack
        if list_bound:
            gap = np.sqrt(_sqdist(q, centroids, lst)) - radius[lst]
            if gap > 0.0 and gap * gap > bound:
                skipped += 1
                continue
        count = _screen_list(AT, R, s0, s1, aq, rq, bound, first, step, lb, cand)
        if count < sorted_below * (s1 - s0):  # few survivors: increasing bound, stop once it passes the k-th best
            order = np.argsort(lb[cand[:count]])
            for o in range(count):
                t = cand[order[o]]
                if lb[t] > top_d[k - 1] + slack:
                    break
                if o + PREFETCH_AHEAD < count:
                    _prefetch_row(X, s0 + cand[order[o + PREFETCH_AHEAD]])
                if t % stride != 0:  # anchors are read already
                    _push(_sqdist(q, X, s0 + t), ids[s0 + t], top_d, top_i)
                    read += 1
        else:  # many survivors (a weak bound): memory order, which the hardware prefetcher follows
            for c in range(count):
                t = cand[c]
                if lb[t] <= top_d[k - 1] + slack and t % stride != 0:
                    _push(_sqdist(q, X, s0 + t), ids[s0 + t], top_d, top_i)
                    read += 1
    counts[0] = read
    counts[1] = scanned
    counts[2] = skipped


@njit(cache=True, parallel=True)
def _search(Q, mu, P, probes, offsets, X, AT, R, ids, centroids, radius, stride, list_bound, slack, first, step,
            sorted_below, out_d, out_i, counts, max_list):
    for qi in prange(Q.shape[0]):
        lb = np.empty(max_list, np.float32)
        cand = np.empty(max_list, np.int64)
        _query(Q[qi], mu, P, probes[qi], offsets, X, AT, R, ids, centroids, radius, stride, list_bound, slack,
               first, step, sorted_below, out_d[qi], out_i[qi], counts[qi], lb, cand)


@dataclass
class Lychee(VectorIndex):
    """Build knobs are fields; nprobe is the query knob (as IVF-Flat's)."""
    nlist: int = 1024
    m: int | None = None
    variance_target: float = 0.9
    anchor_stride: int = 256
    list_bound: bool = True
    screen_first: int = 32  # directions every member's bound starts with
    screen_step: int = 8  # directions added at a time for members still under the threshold
    sorted_below: float = 0.125  # a list whose survivors are fewer than this share is read in increasing bound
    threads: int = 1
    name = "lychee"
    nprobe: int = field(default=1, init=False)
    counters: SearchCounters = field(default_factory=SearchCounters, init=False, repr=False)
    ivf: IVFFlat | None = field(default=None, init=False, repr=False)

    def build(self, xb: np.ndarray) -> None:
        ivf = IVFFlat(nlist=self.nlist)
        ivf.build(xb)
        self.attach(ivf, xb)

    @classmethod
    def from_ivf(cls, ivf: IVFFlat, xb: np.ndarray, **knobs) -> "Lychee":
        """Screen the lists of an already trained IVF-Flat: same quantizer, same assignment."""
        index = cls(nlist=ivf.nlist, **knobs)
        index.attach(ivf, xb)
        return index

    def attach(self, ivf: IVFFlat, xb: np.ndarray) -> None:
        xb = check_vectors(xb, "database", ivf.d)
        if len(xb) != ivf.ntotal:
            raise InputError(f"database has {len(xb)} vectors but the IVF index holds {ivf.ntotal}")
        for knob in ("anchor_stride", "screen_first", "screen_step"):
            if getattr(self, knob) < 1:
                raise InputError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if not 0.0 <= self.sorted_below <= 1.0:
            raise InputError(f"sorted_below must be in [0, 1], got {self.sorted_below}")
        n, d = xb.shape
        lists = [ivf.list_ids(i) for i in range(ivf.nlist)]
        order = np.concatenate(lists).astype(np.int64)
        self.offsets = np.zeros(ivf.nlist + 1, np.int64)
        self.offsets[1:] = np.cumsum([len(x) for x in lists])
        self.ids = order
        self.X = np.ascontiguousarray(xb[order])
        self.centroids = np.ascontiguousarray(ivf.centroids(), dtype=np.float32)
        # global PCA (float64), directions sorted by variance, most first
        self.mu = xb.mean(axis=0, dtype=np.float64)
        centered = self.X.astype(np.float64) - self.mu
        cov = centered.T @ centered / max(n - 1, 1)
        evals, evecs = np.linalg.eigh(cov)
        evals, evecs = np.clip(evals[::-1], 0, None), evecs[:, ::-1]
        total = evals.sum()
        captured = np.cumsum(evals) / total if total > 0 else np.ones(d)
        m = self.m if self.m is not None else self._auto_m(captured, d)
        if not 1 <= m <= d:
            raise InputError(f"m={m} must be in [1, d={d}]")
        self.m_used = m
        self.variance_captured = float(captured[m - 1])
        self.P = np.ascontiguousarray(evecs[:, :m])
        a, r = self.short_codes(self.X)
        self.AT = np.ascontiguousarray(a.T)  # m x n: members contiguous per direction
        self.R = r
        member_list = np.repeat(np.arange(ivf.nlist), np.diff(self.offsets))
        dist_to_c = np.sqrt(((self.X.astype(np.float64) - self.centroids[member_list]) ** 2).sum(1))
        self.radius = np.zeros(ivf.nlist)
        np.maximum.at(self.radius, member_list, dist_to_c)
        # float32 sums differ from exact ones by ~1e-7 of the squared norms: never prune on that
        self.slack = np.float32(1e-5 * float((self.X.astype(np.float64) ** 2).sum(1).mean()) + 1e-12)
        self.ivf = ivf

    def short_codes(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, r): projections P^T (x - mu), (n, m), and the norms of what they drop, (n,)."""
        centered = np.asarray(x, np.float64) - self.mu
        a = centered @ self.P
        r = np.sqrt(np.clip((centered ** 2).sum(1) - (a ** 2).sum(1), 0, None))
        return a.astype(np.float32), r.astype(np.float32)

    @staticmethod
    def lower_bound(codes_q: tuple[np.ndarray, np.ndarray], codes_x: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """||a_x - a_q||^2 + (r_x - r_q)^2 for every (query, vector) pair: (nq, n), float64."""
        (aq, rq), (ax, rx) = codes_q, codes_x
        a = ((aq[:, None, :].astype(np.float64) - ax[None, :, :]) ** 2).sum(-1)
        return a + (rq[:, None].astype(np.float64) - rx[None, :]) ** 2

    def _auto_m(self, captured: np.ndarray, d: int) -> int:
        cap = max(8, d // 4)
        for m in range(8, cap + 1, 8):
            if captured[min(m, d) - 1] >= self.variance_target:
                return min(m, d)
        return min(cap, d)

    @property
    def ntotal(self) -> int:
        return self.ivf.ntotal if self.ivf is not None else 0

    @property
    def d(self) -> int:
        return self.ivf.d if self.ivf is not None else 0

    @property
    def code_bytes_ratio(self) -> float:
        """Extra memory of the short codes relative to the full vectors: (m + 1) / d."""
        return (self.AT.nbytes + self.R.nbytes) / self.X.nbytes

    def set_query_params(self, nprobe: int = 1) -> None:
        if self.ivf is None:
            raise InputError("lychee: set_query_params before build")
        if not 1 <= nprobe <= self.ivf.nlist:
            raise InputError(f"nprobe={nprobe} must be in [1, nlist={self.ivf.nlist}]")
        self.nprobe = int(nprobe)

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        nq = len(xq)
        _, probes = self.ivf.probe(xq, self.nprobe)
        sizes = np.diff(self.offsets)
        out_d = np.empty((nq, k), np.float32)
        out_i = np.empty((nq, k), np.int64)
        counts = np.zeros((nq, 3), np.int64)
        numba.set_num_threads(max(1, min(self.threads, numba.config.NUMBA_NUM_THREADS)))
        _search(xq, self.mu, self.P, probes, self.offsets, self.X, self.AT, self.R, self.ids, self.centroids,
                self.radius, self.anchor_stride, self.list_bound, self.slack, self.screen_first, self.screen_step,
                self.sorted_below, out_d, out_i, counts, int(sizes.max()) + 1)
        total = counts.sum(0)
        self.counters = SearchCounters(queries=nq, lists_probed=nq * self.nprobe, lists_skipped=int(total[2]),
                                       vectors_in_probed_lists=int(total[1]), vectors_read_full=int(total[0]))
        return out_d, out_i


def set_single_thread() -> None:
    """Both sides single-threaded: faiss's OpenMP and numba's pool."""
    faiss.omp_set_num_threads(1)
    numba.set_num_threads(1)
