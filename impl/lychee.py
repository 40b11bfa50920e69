"""Lychee: certified screening of inverted lists (PAPERS.md A1; baseline faiss IVF-Flat).

From the paper (as the digest states it): global PCA (mean mu, top-m directions P); each vector's
short code is its projection a(x) = P^T (x - mu) plus the norm of what the projection drops,
r(x); the lower bound ||x - q||^2 >= ||a_x - a_q||^2 + (r_x - r_q)^2; anchors (every s-th member
of each probed list) give an upper bound U on the k-th distance; members whose bound exceeds U
are never read; the rest are read in increasing bound, stopping once the bound passes the
current k-th best. The result is exactly IVF-Flat's at the same nprobe.

Reconstructed here (not in the digest): by default no stride anchors (anchor_stride=0): the
closest list is screened against no bound and its k smallest-bound members are read first, which
gives U with fewer exact reads than every s-th member of every list (73 vs 106 reads per query on
the 256-d power-law set); a list-level bound that skips a probed list whole when
(||q - c|| - radius)^2 > U (triangle inequality; the radius is the farthest member from its
centroid); short codes stored direction-major (m x n) so one list's bounds are a vectorized pass
over the first directions, continued only for members still under the threshold (partial sums of
the bound are bounds too); the closest list's survivors read first in increasing bound (its
neighbours tighten the k-th best for every other list), the other lists' survivors pooled and read
in one increasing-bound order, a large pool first reading its k smallest bounds so that the sort
covers only what that leaves, with software prefetch of the rows ahead (memory order for a list
where more than `sorted_below` survives: with a weak bound the sort and the random order cost more
than the reads they save);
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


@njit(cache=True, nogil=True, inline="always")
def _is_anchor(t, stride):
    return stride > 0 and t % stride == 0


@njit(cache=True, nogil=True, fastmath=True)
def _screen_list(AT, R, s0, s1, aq, rq, threshold, first, step, lb, cand):
    """Short-code lower bounds of one list's members, stopping early: every partial sum of the bound
    is itself a lower bound, so a member whose first `first` directions (plus the residual term)
    already exceed the threshold is dropped, and the rest continue `step` directions at a time.
    Codes are stored m x n, so the first pass is vectorized across members. Returns how many
    candidates are left in cand[:count] (list positions, increasing); lb holds their full bounds."""
    n = s1 - s0
    m = AT.shape[0]
    residuals = R[s0:s1]  # contiguous views indexed from 0: LLVM drops numba's negative-index
    for t in range(n):
        dr = residuals[t] - rq
        lb[t] = dr * dr
    head = min(first, m)
    for v in range(head):
        a = aq[v]
        row = AT[v, s0:s1]  # wraparound and vectorizes the loads (twice as fast as AT[v, s0 + t])
        for t in range(n):
            diff = row[t] - a
            lb[t] += diff * diff
    count = 0
    for t in range(n):  # branch-free: survivors are rare and unpredictable
        cand[count] = t
        count += lb[t] <= threshold
    v = head
    while v < m and count > 0:
        end = min(v + step, m)
        for u in range(v, end):  # one direction at a time: its row segment stays in cache
            a = aq[u]
            row = AT[u, s0:s1]
            for c in range(count):
                t = cand[c]
                diff = row[t] - a
                lb[t] += diff * diff
        kept = 0
        for c in range(count):
            t = cand[c]
            cand[kept] = t
            kept += lb[t] <= threshold
        count = kept
        v = end
    return count


@njit(cache=True, nogil=True)
def _read_in_memory_order(q, X, ids, slack, bounds, rows, count, top_d, top_i):
    """Read rows[:count] in the order given (memory order within a list), skipping those whose bound is
    above the current k-th best, prefetching ahead; returns how many were read."""
    k = top_d.shape[0]
    read = 0
    for c in range(count):
        if c + PREFETCH_AHEAD < count:
            _prefetch_row(X, rows[c + PREFETCH_AHEAD])
        if bounds[c] <= top_d[k - 1] + slack:
            _push(_sqdist(q, X, rows[c]), ids[rows[c]], top_d, top_i)
            read += 1
    return read


@njit(cache=True, nogil=True)
def _read_in_bound_order(q, X, ids, slack, pool_lb, pool_row, count, memory_order_from, top_d, top_i):
    """Read the pool's rows in increasing bound until the bound passes the k-th best; returns how many.
    A large pool first reads its k smallest bounds (one pass, no sort) and drops every row whose bound is
    above the k-th best that gives; then it sorts only what is left, or, when at least
    `memory_order_from` rows are left (a weak bound), reads them in pool order, which is memory order
    within each list: there the sort and the random order would cost more than the reads they save."""
    k = top_d.shape[0]
    read = 0
    if count > 4 * k:
        best_lb = np.full(k, np.inf, np.float32)
        best_c = np.full(k, -1, np.int64)
        for c in range(count):
            if pool_lb[c] < best_lb[k - 1]:
                _push(pool_lb[c], c, best_lb, best_c)
        for j in range(k):
            c = best_c[j]
            if c >= 0:
                _push(_sqdist(q, X, pool_row[c]), ids[pool_row[c]], top_d, top_i)
                pool_lb[c] = np.inf  # read
                read += 1
        kept = 0
        for c in range(count):
            pool_lb[kept] = pool_lb[c]
            pool_row[kept] = pool_row[c]
            kept += pool_lb[c] <= top_d[k - 1] + slack
        count = kept
    if count >= memory_order_from:
        return read + _read_in_memory_order(q, X, ids, slack, pool_lb, pool_row, count, top_d, top_i)
    order = np.argsort(pool_lb[:count])
    for o in range(count):
        c = order[o]
        if pool_lb[c] > top_d[k - 1] + slack:
            break
        if o + PREFETCH_AHEAD < count:
            _prefetch_row(X, pool_row[order[o + PREFETCH_AHEAD]])
        _push(_sqdist(q, X, pool_row[c]), ids[pool_row[c]], top_d, top_i)
        read += 1
    return read


@njit(cache=True, nogil=True)
def _query(q, aq, rq, probe, offsets, X, AT, R, ids, centroids, radius, stride, list_bound, slack, first, step,
           sorted_below, top_d, top_i, counts, lb, cand, pool_lb, pool_row):
    """One query; aq, rq: its short code (computed for the whole batch at once); lb, cand: one list's
    bounds and candidates; pool_lb, pool_row: room for every probed member."""
    k = top_d.shape[0]
    for j in range(k):
        top_d[j] = np.inf
        top_i[j] = -1
    read = 0
    scanned = 0
    skipped = 0
    # 1. anchors (stride > 0): exact distances, real candidates; their k-th distance is the upper bound U.
    #    Without them the closest list is screened against no bound and its k smallest bounds read first.
    for j in range(probe.shape[0]):
        lst = probe[j]
        if lst < 0:
            continue
        s0, s1 = offsets[lst], offsets[lst + 1]
        scanned += s1 - s0
        if stride > 0:
            for t in range(s0, s1, stride):
                _push(_sqdist(q, X, t), ids[t], top_d, top_i)
                read += 1
    # 2. lists closest first: list-level bound, then the short-code bound of every member. The closest
    #    list is read at once, its k best bounds first (it holds most neighbours: that tightens the k-th
    #    best for every list after it); later lists' candidates are read at once in memory order where the
    #    bound is weak, else wait in one pool, read after all lists in increasing bound until the bound
    #    passes the k-th best. A member left unread has bound > k-th best: never in the top k.
    pooled = 0
    first_list = True
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
        new = 0  # stage the candidates that are not anchors (read already) after the pooled ones
        for c in range(count):
            pool_lb[pooled + new] = lb[cand[c]]
            pool_row[pooled + new] = s0 + cand[c]
            new += not _is_anchor(cand[c], stride)
        weak = sorted_below * (s1 - s0)
        if first_list:
            read += _read_in_bound_order(q, X, ids, slack, pool_lb, pool_row, new, weak, top_d, top_i)
        elif new >= weak:  # a weak bound: memory order (prefetcher-friendly)
            read += _read_in_memory_order(q, X, ids, slack, pool_lb[pooled:], pool_row[pooled:], new, top_d, top_i)
        else:
            pooled += new
        first_list = False
    read += _read_in_bound_order(q, X, ids, slack, pool_lb, pool_row, pooled, pooled + 1, top_d, top_i)
    counts[0] = read
    counts[1] = scanned
    counts[2] = skipped


@njit(cache=True, parallel=True)
def _search(Q, AQ, RQ, probes, offsets, X, AT, R, ids, centroids, radius, stride, list_bound, slack, first, step,
            sorted_below, out_d, out_i, counts, max_list, max_pool, chunks):
    per = (Q.shape[0] + chunks - 1) // chunks
    for chunk in prange(chunks):  # one set of buffers per chunk of queries, not per query
        lb = np.empty(max_list, np.float32)
        cand = np.empty(max_list, np.int64)
        pool_lb = np.empty(max_pool, np.float32)
        pool_row = np.empty(max_pool, np.int64)
        for qi in range(chunk * per, min((chunk + 1) * per, Q.shape[0])):
            _query(Q[qi], AQ[qi], RQ[qi], probes[qi], offsets, X, AT, R, ids, centroids, radius, stride, list_bound,
                   slack, first, step, sorted_below, out_d[qi], out_i[qi], counts[qi], lb, cand, pool_lb, pool_row)


@njit(cache=True)
def _survivors(AQ, RQ, probes, offsets, AT, R, thresholds, first, step, lb, cand, rows, row_offsets):
    """Rows of the probed members whose bound is at most the query's threshold, in memory order,
    query after query (rows[row_offsets[i]:row_offsets[i + 1]]); with rows empty, counts only."""
    n = 0
    for qi in range(AQ.shape[0]):
        row_offsets[qi] = n
        for j in range(probes.shape[1]):
            lst = probes[qi, j]
            if lst < 0:
                continue
            s0 = offsets[lst]
            count = _screen_list(AT, R, s0, offsets[lst + 1], AQ[qi], RQ[qi], thresholds[qi], first, step, lb, cand)
            if rows.shape[0]:
                for c in range(count):
                    rows[n + c] = s0 + cand[c]
            n += count
        if rows.shape[0]:
            rows[row_offsets[qi]:n].sort()
    row_offsets[AQ.shape[0]] = n


@njit(cache=True, nogil=True)
def _exact_pass(Q, X, ids, rows, row_offsets, top_d, top_i):
    """Exact distances to the given rows only, into the top k: the work the bound cannot remove."""
    k = top_d.shape[1]
    for qi in range(Q.shape[0]):
        for j in range(k):
            top_d[qi, j] = np.inf
            top_i[qi, j] = -1
        end = row_offsets[qi + 1]
        for t in range(row_offsets[qi], end):
            if t + PREFETCH_AHEAD < end:
                _prefetch_row(X, rows[t + PREFETCH_AHEAD])
            _push(_sqdist(Q[qi], X, rows[t]), ids[rows[t]], top_d[qi], top_i[qi])


@dataclass
class Lychee(VectorIndex):
    """Build knobs are fields; nprobe is the query knob (as IVF-Flat's)."""
    nlist: int = 1024
    m: int | None = None
    variance_target: float = 0.9
    anchor_stride: int = 0  # the paper's anchors, every s-th member of each list; 0: the closest list's best bounds
    list_bound: bool = True
    screen_first: int = 64  # directions every member's bound starts with (one vectorized pass)
    screen_step: int = 32  # directions added at a time for members still under the threshold
    sorted_below: float = 0.03  # a list whose survivors are fewer than this share is read in increasing bound
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
        for knob in ("screen_first", "screen_step"):
            if getattr(self, knob) < 1:
                raise InputError(f"{knob} must be >= 1, got {getattr(self, knob)}")
        if self.anchor_stride < 0:
            raise InputError(f"anchor_stride must be >= 0 (0: no stride anchors), got {self.anchor_stride}")
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
        threads = max(1, min(self.threads, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(threads)
        aq, rq = self.short_codes(xq)
        _search(xq, aq, rq, probes, self.offsets, self.X, self.AT, self.R, self.ids, self.centroids,
                self.radius, self.anchor_stride, self.list_bound, self.slack, self.screen_first, self.screen_step,
                self.sorted_below, out_d, out_i, counts, int(sizes.max()) + 1,
                int(np.where(probes >= 0, sizes[probes], 0).sum(1).max(initial=0)) + 1, max(1, min(nq, 4 * threads)))
        total = counts.sum(0)
        self.counters = SearchCounters(queries=nq, lists_probed=nq * self.nprobe, lists_skipped=int(total[2]),
                                       vectors_in_probed_lists=int(total[1]), vectors_read_full=int(total[0]))
        return out_d, out_i

    def survivor_counts(self, xq: np.ndarray, kth: np.ndarray) -> np.ndarray:
        """Per query, how many probed members have a bound at most its final k-th distance `kth` (nq,):
        the bound pass alone (probe, short codes, one screening of every probed member), reading no
        vector. Timed against IVF-Flat it is what screening costs even when nothing survives."""
        return np.diff(self._screen(xq, kth, fill=False)[1])

    def survivors(self, xq: np.ndarray, kth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, row_offsets): per query, the probed members whose bound does not exceed its final
        k-th distance `kth` (nq,), i.e. the members no screening with this bound can leave unread."""
        return self._screen(xq, kth, fill=True)

    def _screen(self, xq: np.ndarray, kth: np.ndarray, fill: bool) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, 1)
        kth = np.asarray(kth, np.float32)
        if kth.shape != (len(xq),):
            raise InputError(f"kth has shape {kth.shape}, expected ({len(xq)},)")
        _, probes = self.ivf.probe(xq, self.nprobe)
        aq, rq = self.short_codes(xq)
        size = int(np.diff(self.offsets).max()) + 1
        lb, cand = np.empty(size, np.float32), np.empty(size, np.int64)
        row_offsets = np.zeros(len(xq) + 1, np.int64)
        args = (aq, rq, probes, self.offsets, self.AT, self.R, kth + self.slack, self.screen_first, self.screen_step,
                lb, cand)
        _survivors(*args, np.empty(0, np.int64), row_offsets)
        rows = np.empty(row_offsets[-1] if fill else 0, np.int64)
        if fill:
            _survivors(*args, rows, row_offsets)
        return rows, row_offsets

    def exact_pass(self, xq: np.ndarray, k: int, rows: np.ndarray, row_offsets: np.ndarray):
        """Top k over exact distances to `rows` alone (from survivors()): timing it against IVF-Flat's
        scan gives the speedup the bound allows, the ceiling of any screening with it."""
        xq = self._check_query(xq, k)
        out_d = np.empty((len(xq), k), np.float32)
        out_i = np.empty((len(xq), k), np.int64)
        _exact_pass(xq, self.X, self.ids, rows, row_offsets, out_d, out_i)
        return out_d, out_i


def set_single_thread() -> None:
    """Both sides single-threaded: faiss's OpenMP and numba's pool."""
    faiss.omp_set_num_threads(1)
    numba.set_num_threads(1)
