"""Lychee: certified screening of inverted lists (PAPERS.md A1; baseline faiss IVF-Flat).

From the paper: a global PCA (mean mu, top-m directions P) gives each vector a short code, its
projection P^T (x - mu) and the norm r(x) of what the projection drops, hence the lower bound
||x - q||^2 >= ||a_x - a_q||^2 + (r_x - r_q)^2. Members whose bound exceeds an upper bound U on
the k-th distance are never read; the rest are read in increasing bound, stopping once the bound
passes the current k-th best. The result is exactly IVF-Flat's at the same nprobe.

Reconstructed (not in the digest): U from the closest list's k smallest-bound members (no stride
anchors by default); a list-level triangle-inequality skip; 8-bit codes standing for intervals (still
a lower bound); members in k-d order, cut into blocks of 16 with bounding boxes, summed 16 at a time
in one vector register (LLVM IR) with an early exit; the pooled survivors read in one increasing-bound
order with software prefetch; m from a cost model at build (`_choose_m`); a float32 slack so rounding
never prunes a true neighbour. What each of these measured: reports/notes/lychee-design.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import faiss
import numba
import numpy as np
import threadpoolctl
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from claimbench.baselines.ivf_flat import IVFFlat
from claimbench.interfaces import MISSING_DISTANCE, MISSING_ID, InputError, SearchCounters, VectorIndex, check_vectors


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


LANES = 16  # members whose bounds one 512-bit register holds (float32)
CHECK_ROWS = 8  # code rows added between two checks of whether 16 members are all over the threshold


@intrinsic
def _lane_bounds(typingctx, codes, base, stride, z, w, threshold, lb, t0):
    """lb[t0:t0 + 16]: the bounds of 16 consecutive members (see _screen_list; member t's code row v is
    codes[base + v stride + t]), summed CHECK_ROWS rows at a time and given up as soon as all 16 partial sums
    are over the threshold (the terms are never negative: a sum only grows); returns whether any of the 16 is
    at most the threshold. Written in LLVM IR with 16-wide vector types so that the sums stay in one
    register through the early-exit loop (numba's own 16-trip loops were slower: reports/notes/lychee-design.md)."""
    if not (all(isinstance(a, types.Array) and a.ndim == 1 for a in (codes, z, w, lb))
            and all(a.dtype == types.float32 for a in (z, w, lb)) and threshold == types.float32):
        return None

    def codegen(context, builder, signature, args):
        codes_ty, _, _, z_ty, w_ty, _, lb_ty, _ = signature.args
        codes_a, base, stride, z_a, w_a, threshold, lb_a, t0 = args
        code_arr, z_arr, w_arr, lb_arr = (context.make_array(ty)(context, builder, a)
                                          for ty, a in ((codes_ty, codes_a), (z_ty, z_a), (w_ty, w_a), (lb_ty, lb_a)))
        code_data, z_data, w_data, lb_data = code_arr.data, z_arr.data, w_arr.data, lb_arr.data
        rows = builder.extract_value(z_arr.shape, 0)
        intp = context.get_value_type(types.intp)
        lanes = ir.VectorType(ir.FloatType(), LANES)
        code_lanes = ir.VectorType(context.get_data_type(codes_ty.dtype), LANES)
        undef = ir.Constant(lanes, ir.Undefined)
        first = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)

        def splat(x):
            return builder.shuffle_vector(builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0)), undef,
                                          first)
        fabs, fma = (cgutils.get_or_insert_function(builder.module, ir.FunctionType(lanes, [lanes] * n),
                                                    f"llvm.{name}.v{LANES}f32")
                     for name, n in (("fabs", 1), ("fma", 3)))
        half, zero = ir.Constant(lanes, [0.5] * LANES), ir.Constant(lanes, [0.0] * LANES)
        thresholds = splat(threshold)
        entry = builder.block
        chunk, row, add_row, check, done = (builder.append_basic_block(name)
                                            for name in ("chunk", "row", "add_row", "check", "done"))
        builder.branch(chunk)
        # chunk: rows v..end - 1, end = min(v + CHECK_ROWS, rows)
        builder.position_at_end(chunk)
        v = builder.phi(intp)
        total = builder.phi(lanes)
        v.add_incoming(ir.Constant(intp, 0), entry)
        total.add_incoming(zero, entry)
        end = builder.add(v, ir.Constant(intp, CHECK_ROWS))
        end = builder.select(builder.icmp_signed("<", end, rows), end, rows)
        builder.branch(row)
        builder.position_at_end(row)
        r = builder.phi(intp)
        acc = builder.phi(lanes)
        r.add_incoming(v, chunk)
        acc.add_incoming(total, chunk)
        builder.cbranch(builder.icmp_signed("<", r, end), add_row, check)
        builder.position_at_end(add_row)
        at = builder.gep(code_data, [builder.add(base, builder.mul(r, stride))])
        c = builder.uitofp(builder.load(builder.bitcast(at, code_lanes.as_pointer()), align=1), lanes)
        u = builder.fsub(builder.call(fabs, [builder.fsub(c, splat(builder.load(builder.gep(z_data, [r]))))]), half)
        g = builder.fmul(builder.select(builder.fcmp_ordered(">", u, zero), u, zero),
                         splat(builder.load(builder.gep(w_data, [r]))))
        r.add_incoming(builder.add(r, ir.Constant(intp, 1)), add_row)
        acc.add_incoming(builder.call(fma, [g, g, acc]), add_row)
        builder.branch(row)
        # check: stop when all 16 are over the threshold, or after the last row
        builder.position_at_end(check)
        under = builder.bitcast(builder.fcmp_ordered("<=", acc, thresholds), ir.IntType(LANES))
        alive = builder.icmp_unsigned("!=", under, ir.Constant(ir.IntType(LANES), 0))
        v.add_incoming(end, check)
        total.add_incoming(acc, check)
        builder.cbranch(builder.and_(alive, builder.icmp_signed("<", end, rows)), chunk, done)
        builder.position_at_end(done)
        builder.store(acc, builder.bitcast(builder.gep(lb_data, [t0]), lanes.as_pointer()), align=4)
        return alive
    return types.boolean(codes, base, stride, z, w, threshold, lb, t0), codegen


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


SHRINK = np.float32(1.0 - 1e-6)  # the code bound's step, shrunk: float32 rounding in it can only lower it


@njit(cache=True, nogil=True, fastmath=True)
def _screen_list(screen, lst, s0, s1, qc, threshold, lb, cand, z, w, box_lb):
    """Lower bounds of one list's members from their 8- (or 16-) bit codes, block by block.

    screen = (codes, boxes, block_offsets, code_lo, code_step, block, box_rows). Code row 0 is the
    residual norm, rows 1..m the directions; a code c stands for the interval [lo + c step, lo + (c + 1) step]
    of its list, so each coordinate contributes (step * max(|c - z| - 1/2, 0))^2 with
    z = (query - lo) / step - 1/2: the squared distance from the query's coordinate to that interval, never
    more than to the member's own. Members are grouped in blocks of `block` (neighbours in the list's
    k-d order); a block's box, the smallest and largest code of its first `box_rows` rows, gives
    (step * max(max(lo - z, z - hi) - 1/2, 0))^2 per row, a bound for every member at once. Only blocks
    under the threshold have their members' bounds computed, 16 members at a time (_lane_bounds: the codes
    of 16 consecutive members are stored row after row, 16 codes a row), each 16 given up as soon as all
    are over the threshold. Returns how many candidates are left in cand[:count] (list positions,
    increasing); lb holds their bounds. z, w: room for m + 1 values; box_lb: for the list's blocks."""
    codes, boxes, block_offsets, code_lo, code_step, block, box_rows = screen
    n = s1 - s0
    rows = code_lo.shape[1]
    for v in range(rows):
        z[v] = (qc[v] - code_lo[lst, v]) / code_step[lst, v] - np.float32(0.5)
        w[v] = code_step[lst, v] * SHRINK
    half, zero = np.float32(0.5), np.float32(0.0)
    b0 = block_offsets[lst]
    nb = block_offsets[lst + 1] - b0
    box = boxes[2 * box_rows * b0:2 * box_rows * (b0 + nb)]
    for b in range(nb):
        box_lb[b] = zero
    for v in range(box_rows):
        zv, wv = z[v], w[v]
        low, high = box[v * nb:(v + 1) * nb], box[(box_rows + v) * nb:(box_rows + v + 1) * nb]
        for b in range(nb):
            g = max(max(np.float32(low[b]) - zv, zv - np.float32(high[b])) - half, zero) * wv
            box_lb[b] += g * g
    block_codes = codes[rows * block * b0:rows * block * (b0 + nb)]
    count = 0
    for b in range(nb):
        if box_lb[b] <= threshold:
            for t0 in range(b * block, (b + 1) * block, LANES):
                if _lane_bounds(block_codes, rows * t0, LANES, z, w, threshold, lb, t0):
                    for t in range(t0, min(t0 + LANES, n)):  # the padding past n is never a member
                        cand[count] = t
                        count += lb[t] <= threshold
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
def _query(q, qc, probe, probe_dist, offsets, X, screen, ids, radius, stride, list_bound, slack, sorted_below,
           top_d, top_i, counts, lb, cand, z, w, box_lb, pool_lb, pool_row):
    """One query; qc: its short code, residual first (computed for the whole batch at once); probe_dist: a
    lower bound of its distance to each probed list's centroid (not squared); screen: the
    codes and boxes (see _screen_list); lb, cand: one list's bounds and candidates; z, w: room for m + 1
    values; box_lb: room for one list's blocks; pool_lb, pool_row: room for every probed member."""
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
            gap = probe_dist[j] - radius[lst]
            if gap > 0.0 and gap * gap > bound:
                skipped += 1
                continue
        count = _screen_list(screen, lst, s0, s1, qc, bound, lb, cand, z, w, box_lb)
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
def _search(Q, QC, probes, probe_dist, offsets, X, screen, ids, radius, stride, list_bound, slack, sorted_below,
            out_d, out_i, counts, max_list, max_blocks, max_pool, chunks):
    per = (Q.shape[0] + chunks - 1) // chunks
    for chunk in prange(chunks):  # one set of buffers per chunk of queries, not per query
        lb = np.empty(max_list, np.float32)
        cand = np.empty(max_list, np.int64)
        z = np.empty(screen[3].shape[1], np.float32)
        w = np.empty(screen[3].shape[1], np.float32)
        box_lb = np.empty(max_blocks, np.float32)
        pool_lb = np.empty(max_pool, np.float32)
        pool_row = np.empty(max_pool, np.int64)
        for qi in range(chunk * per, min((chunk + 1) * per, Q.shape[0])):
            _query(Q[qi], QC[qi], probes[qi], probe_dist[qi], offsets, X, screen, ids, radius, stride, list_bound,
                   slack, sorted_below, out_d[qi], out_i[qi], counts[qi], lb, cand, z, w, box_lb, pool_lb, pool_row)


@njit(cache=True)
def _survivors(QC, probes, offsets, screen, thresholds, lb, cand, box_lb, rows, row_offsets):
    """Rows of the probed members whose bound is at most the query's threshold, in memory order,
    query after query (rows[row_offsets[i]:row_offsets[i + 1]]); with rows empty, counts only."""
    n = 0
    z = np.empty(screen[3].shape[1], np.float32)
    w = np.empty(screen[3].shape[1], np.float32)
    for qi in range(QC.shape[0]):
        row_offsets[qi] = n
        for j in range(probes.shape[1]):
            lst = probes[qi, j]
            if lst < 0:
                continue
            s0 = offsets[lst]
            count = _screen_list(screen, lst, s0, offsets[lst + 1], QC[qi], thresholds[qi], lb, cand, z, w, box_lb)
            if rows.shape[0]:
                for c in range(count):
                    rows[n + c] = s0 + cand[c]
            n += count
        if rows.shape[0]:
            rows[row_offsets[qi]:n].sort()
    row_offsets[QC.shape[0]] = n


@njit(cache=True)
def _all_bounds(QC, offsets, screen, lb, cand, box_lb, out):
    """Every member's bound for every query (no threshold), into out (nq, n) in list order."""
    z = np.empty(screen[3].shape[1], np.float32)
    w = np.empty(screen[3].shape[1], np.float32)
    for qi in range(QC.shape[0]):
        for lst in range(offsets.shape[0] - 1):
            s0 = offsets[lst]
            count = _screen_list(screen, lst, s0, offsets[lst + 1], QC[qi], np.float32(np.inf), lb, cand, z, w,
                                 box_lb)
            for c in range(count):
                out[qi, s0 + cand[c]] = lb[cand[c]]


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


NEAR_LEAST = 1.02  # _choose_m: the smallest m within 2% of the least estimated cost


@dataclass
class Lychee(VectorIndex):
    """Build knobs are fields; nprobe is the query knob (as IVF-Flat's)."""
    nlist: int = 1024
    m: int | None = None
    read_cost: float = 3.0  # cost model for m: one element of a full-vector read vs one code row's bound term
    anchor_stride: int = 0  # the paper's anchors, every s-th member of each list; 0: the closest list's best bounds
    list_bound: bool = True
    block: int = 16  # members per screening block (neighbours in their list's k-d order), a multiple of 16
    box_rows: int = 5  # code rows (residual, then directions) in each block's box; 0: no boxes
    sorted_below: float = 0.03  # a list whose survivors are fewer than this share is read in increasing bound
    code_bits: int = 8  # bits per short-code coordinate (8 or 16), per-list intervals
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
        if self.block < 1 or self.block % LANES or self.box_rows < 0:
            raise InputError(f"block must be a positive multiple of {LANES} and box_rows >= 0, got {self.block} "
                             f"and {self.box_rows}")
        if self.anchor_stride < 0:
            raise InputError(f"anchor_stride must be >= 0 (0: no stride anchors), got {self.anchor_stride}")
        if self.code_bits not in (8, 16):
            raise InputError(f"code_bits must be 8 or 16, got {self.code_bits}")
        if not 0.0 <= self.sorted_below <= 1.0:
            raise InputError(f"sorted_below must be in [0, 1], got {self.sorted_below}")
        n, d = xb.shape
        lists = [ivf.list_ids(i) for i in range(ivf.nlist)]
        order = np.concatenate(lists).astype(np.int64)
        self.offsets = np.zeros(ivf.nlist + 1, np.int64)
        self.offsets[1:] = np.cumsum([len(x) for x in lists])
        self.ids = order
        self.X = np.ascontiguousarray(xb[order])
        centroids = ivf.centroids().astype(np.float64)
        self.centroid_sq = (centroids ** 2).sum(1)
        # global PCA (float64), directions sorted by variance, most first
        self.mu = xb.mean(axis=0, dtype=np.float64)
        centered = self.X.astype(np.float64) - self.mu
        cov = centered.T @ centered / max(n - 1, 1)
        evals, evecs = np.linalg.eigh(cov)
        evals, evecs = np.clip(evals[::-1], 0, None), evecs[:, ::-1]
        total = evals.sum()
        captured = np.cumsum(evals) / total if total > 0 else np.ones(d)
        m = self.m if self.m is not None else self._choose_m(ivf, centered, evecs)
        if not 1 <= m <= d:
            raise InputError(f"m={m} must be in [1, d={d}]")
        self.m_used = m
        self.variance_captured = float(captured[m - 1])
        self.P = np.ascontiguousarray(evecs[:, :m])
        a, r = self._project(centered)  # the centered database, already at hand for the PCA
        full = np.concatenate([r[:, None], a], axis=1)
        box_rows = min(self.box_rows, m + 1)
        within = self._block_order(full[:, :box_rows])
        self.ids, self.X, full = self.ids[within], self.X[within], full[within]
        # float32 sums differ from exact ones by ~1e-7 of the squared norms: never prune on that
        self.slack = np.float32(1e-5 * float((self.X.astype(np.float64) ** 2).sum(1).mean()) + 1e-12)
        # a coordinate constant over a list still gets a finite step: its z stays within float32's range
        self._box(self._quantize(full, floor=float(np.sqrt(self.slack)) / 2 ** 10), box_rows)
        member_list = np.repeat(np.arange(ivf.nlist), np.diff(self.offsets))
        dist_to_c = np.sqrt(((self.X.astype(np.float64) - centroids[member_list]) ** 2).sum(1))
        self.radius = np.zeros(ivf.nlist)
        np.maximum.at(self.radius, member_list, dist_to_c)
        self.ivf = ivf

    def _quantize(self, full: np.ndarray, floor: float) -> np.ndarray:
        """Per list and code row (residual, then the m directions), `code_bits`-bit codes of the interval
        [lo + c step, lo + (c + 1) step] holding the exact value; lo and step are float32 chosen so that
        the intervals hold in exact arithmetic (lo rounded down, step rounded up, at least `floor`). Codes
        are stored list after list, a list's members padded to whole blocks with copies of its last member
        (a pad never keeps 16 members from being given up early), in groups of 16 members, each group's
        (m + 1) x 16 codes row after row. Returns the codes as (n, m + 1), member after member."""
        levels = 2 ** self.code_bits
        rows = full.shape[1]
        nlist = len(self.offsets) - 1
        lo, hi = np.zeros((nlist, rows)), np.zeros((nlist, rows))
        for lst, (s0, s1) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            if s1 > s0:
                lo[lst], hi[lst] = full[s0:s1].min(0), full[s0:s1].max(0)
        lo32 = lo.astype(np.float32)
        lo32 = np.where(lo32 > lo, np.nextafter(lo32, np.float32(-np.inf)), lo32)
        step32 = np.maximum((hi - lo32) / levels, floor).astype(np.float32)
        step32 = np.where(lo32 + levels * step32.astype(np.float64) < hi, np.nextafter(step32, np.float32(np.inf)),
                          step32)
        member_list = np.repeat(np.arange(nlist), np.diff(self.offsets))
        codes = np.floor((full - lo32[member_list]) / step32[member_list])
        codes = np.clip(codes, 0, levels - 1).astype(np.uint8 if self.code_bits == 8 else np.uint16)
        sizes = np.diff(self.offsets)
        self.block_offsets = np.zeros(nlist + 1, np.int64)
        self.block_offsets[1:] = np.cumsum(-(-sizes // self.block))
        widths = np.diff(self.block_offsets) * self.block
        self.codes = np.concatenate([np.zeros(0, codes.dtype)] + [
            np.pad(codes[s0:s0 + n], ((0, width - n), (0, 0)), mode="edge").reshape(-1, LANES, rows)
            .transpose(0, 2, 1).ravel() for s0, n, width in zip(self.offsets[:-1], sizes, widths)])
        self.code_lo, self.code_step = lo32, step32
        return codes

    def _block_order(self, box_coords: np.ndarray) -> np.ndarray:
        """Row order putting each list's members in k-d order over the box coordinates: split at the
        median (rounded to whole blocks) of the coordinate with the largest spread, recursively, down to
        `block` members, so every block is a small box (a permutation of rows within each list)."""
        def split(idx):
            if len(idx) <= self.block or not box_coords.shape[1]:
                return [idx]
            sub = box_coords[idx]
            idx = idx[np.argsort(sub[:, np.argmax(sub.var(0))], kind="stable")]
            half = -(-len(idx) // 2 // self.block) * self.block
            return split(idx[:half]) + split(idx[half:])
        return np.concatenate([np.zeros(0, np.int64)] + [
            part for s0, s1 in zip(self.offsets[:-1], self.offsets[1:]) for part in split(np.arange(s0, s1))])

    def _box(self, codes: np.ndarray, box_rows: int) -> None:
        """Each block's box: the smallest and the largest code (codes: (n, m + 1), from _quantize) of its
        members in each of the first `box_rows` rows, stored list after list as (2 box_rows) x blocks, lows
        first."""
        parts = []
        for s0, n in zip(self.offsets[:-1], np.diff(self.offsets)):
            if n:
                head = codes[s0:s0 + n, :box_rows].T
                starts = np.arange(0, n, self.block)
                parts += [np.minimum.reduceat(head, starts, axis=1).ravel(),
                          np.maximum.reduceat(head, starts, axis=1).ravel()]
        self.boxes = np.concatenate([np.zeros(0, self.codes.dtype)] + parts)
        self._screening = (self.codes, self.boxes, self.block_offsets, self.code_lo, self.code_step, self.block,
                           box_rows)

    def short_codes(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, r): projections P^T (x - mu), (n, m), and the norms of what they drop, (n,); float64."""
        return self._project(np.asarray(x, np.float64) - self.mu)

    def _project(self, centered: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = centered @ self.P
        return a, np.sqrt(np.clip((centered ** 2).sum(1) - (a ** 2).sum(1), 0, None))

    def _query_codes(self, xq: np.ndarray) -> np.ndarray:
        a, r = self.short_codes(xq)
        return np.ascontiguousarray(np.concatenate([r[:, None], a], axis=1), dtype=np.float32)

    @staticmethod
    def lower_bound(codes_q: tuple[np.ndarray, np.ndarray], codes_x: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """||a_x - a_q||^2 + (r_x - r_q)^2 for every (query, vector) pair: (nq, n), float64."""
        (aq, rq), (ax, rx) = codes_q, codes_x
        a = ((aq[:, None, :].astype(np.float64) - ax[None, :, :]) ** 2).sum(-1)
        return a + (rq[:, None].astype(np.float64) - rx[None, :]) ** 2

    def _choose_m(self, ivf: IVFFlat, centered: np.ndarray, evecs: np.ndarray, k: int = 10) -> int:
        """The smallest m (of 64 spread over 1..d) whose estimated cost per query is within NEAR_LEAST of the
        least (the cost is flat near its minimum; fewer rows, fewer code bytes): the code rows summed per
        scanned member plus `read_cost` x d per member the bound leaves unpruned. Both are estimated on up to
        64 database vectors taken as queries, against their exact k-th neighbour distance, with up to 512
        members of their nlist / 16 closest lists taken 16 at a time, as the search sums them: a 16 sums
        CHECK_ROWS rows at a time until all its partial bounds are over (members drawn at random: a
        pessimistic stand-in for the k-d order's neighbours). (Reconstructed: the paper fixes m per
        dataset.)"""
        n, d = centered.shape
        rng = np.random.default_rng(0)
        sample = rng.choice(n, min(64, n), replace=False)
        flat = faiss.IndexFlatL2(d)
        flat.add(self.X)
        kth = flat.search(self.X[sample], min(k + 1, n))[0][:, -1]  # the sample itself is its own 0th
        _, probes = ivf.probe(self.X[sample], max(1, ivf.nlist // 16))
        a_q = centered[sample] @ evecs
        choices = np.unique(np.geomspace(1, d, 64).astype(np.int64))
        unpruned, rows_summed = np.zeros(len(choices)), np.zeros(len(choices))
        for i in range(len(sample)):
            members = np.concatenate([np.arange(self.offsets[lst], self.offsets[lst + 1]) for lst in probes[i]
                                      if lst >= 0])
            if len(members) > 512:
                members = rng.choice(members, 512, replace=False)
            a_x = centered[members] @ evecs
            r_x = np.sqrt(np.clip((centered[members] ** 2).sum(1)[:, None] - np.cumsum(a_x ** 2, 1), 0, None))
            r_q = np.sqrt(np.clip((a_q[i] ** 2).sum() - np.cumsum(a_q[i] ** 2), 0, None))
            directions = np.cumsum((a_x - a_q[i]) ** 2, 1)  # column j - 1: the first j directions' terms
            residual = (r_x - r_q) ** 2  # column m - 1: the residual's term with m directions
            for c, m in enumerate(choices):
                unpruned[c] += (directions[:, m - 1] + residual[:, m - 1] <= kth[i]).sum()
                checks = np.append(np.arange(CHECK_ROWS, m + 1, CHECK_ROWS), m + 1)  # rows summed at each check
                over = residual[:, m - 1, None] + directions[:, checks - 2] > kth[i]
                stop = np.where(over.any(1), checks[over.argmax(1)], m + 1)
                rows_summed[c] += LANES * np.maximum.reduceat(stop, np.arange(0, len(stop), LANES)).sum()
        cost = rows_summed + self.read_cost * d * unpruned
        return int(choices[np.flatnonzero(cost <= NEAR_LEAST * cost.min())[0]])

    @property
    def _blocks_room(self) -> int:
        """Room for the bounds of the largest list's blocks (box_lb)."""
        return int(np.diff(self.block_offsets).max()) + 1

    @property
    def _members_room(self) -> int:
        """Room for the bounds of the largest list's members, padded to whole blocks (lb, cand)."""
        return self.block * self._blocks_room

    def _screen_buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lb, cand, box_lb): one list's member bounds, candidates and block bounds (see _screen_list)."""
        return (np.empty(self._members_room, np.float32), np.empty(self._members_room, np.int64),
                np.empty(self._blocks_room, np.float32))

    @property
    def ntotal(self) -> int:
        return self.ivf.ntotal if self.ivf is not None else 0

    @property
    def d(self) -> int:
        return self.ivf.d if self.ivf is not None else 0

    @property
    def code_bytes_ratio(self) -> float:
        """Extra memory of the short codes, their per-list scales and the blocks' boxes relative to the
        full vectors: (m + 1 + 2 box_rows / block) / (4 d) with 8-bit codes, plus each list's padding to
        whole blocks."""
        extra = (self.codes, self.code_lo, self.code_step, self.boxes, self.block_offsets)
        return sum(a.nbytes for a in extra) / self.X.nbytes

    def set_query_params(self, nprobe: int = 1) -> None:
        if self.ivf is None:
            raise InputError("lychee: set_query_params before build")
        if not 1 <= nprobe <= self.ivf.nlist:
            raise InputError(f"nprobe={nprobe} must be in [1, nlist={self.ivf.nlist}]")
        self.nprobe = int(nprobe)

    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        xq = self._check_query(xq, k)
        nq = len(xq)
        probe_sq, probes = self.ivf.probe(xq, self.nprobe)
        sizes = np.diff(self.offsets)
        out_d = np.empty((nq, k), np.float32)
        out_i = np.empty((nq, k), np.int64)
        counts = np.zeros((nq, 3), np.int64)
        threads = max(1, min(self.threads, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(threads)
        _search(xq, self._query_codes(xq), probes, self._probe_distances(xq, probe_sq, probes), self.offsets, self.X,
                self._screening, self.ids, self.radius, self.anchor_stride, self.list_bound, self.slack,
                self.sorted_below, out_d, out_i, counts, self._members_room, self._blocks_room,
                int(np.where(probes >= 0, sizes[probes], 0).sum(1).max(initial=0)) + 1, max(1, min(nq, 4 * threads)))
        total = counts.sum(0)
        self.counters = SearchCounters(queries=nq, lists_probed=nq * self.nprobe, lists_skipped=int(total[2]),
                                       vectors_in_probed_lists=int(total[1]), vectors_read_full=int(total[0]))
        out_d[out_i == MISSING_ID] = MISSING_DISTANCE  # pad as faiss does: identical results include the pads
        return out_d, out_i

    def _probe_distances(self, xq: np.ndarray, probe_sq: np.ndarray, probes: np.ndarray) -> np.ndarray:
        """Lower bounds of ||q - c|| from the quantizer's own squared distances (float32, computed as
        ||q||^2 + ||c||^2 - 2 q.c): each is within (2 d + 6) 2^-24 (||q||^2 + ||c||^2) of the exact one, so
        taking that off first keeps the list-level bound a bound; (nq, nprobe) float64."""
        q_sq = (xq.astype(np.float64) ** 2).sum(1)[:, None]
        margin = (2 * self.d + 6) * 2.0 ** -24 * (q_sq + self.centroid_sq[np.maximum(probes, 0)])
        return np.sqrt(np.clip(probe_sq - margin, 0, None))

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
        row_offsets = np.zeros(len(xq) + 1, np.int64)
        args = (self._query_codes(xq), probes, self.offsets, self._screening, kth + self.slack, *self._screen_buffers())
        _survivors(*args, np.empty(0, np.int64), row_offsets)
        rows = np.empty(row_offsets[-1] if fill else 0, np.int64)
        if fill:
            _survivors(*args, rows, row_offsets)
        return rows, row_offsets

    def code_bounds(self, xq: np.ndarray) -> np.ndarray:
        """The search's lower bound of every (query, database vector) pair, (nq, ntotal) in database order:
        computed by the same kernel, from the codes (for tests and inspection; O(nq * ntotal))."""
        xq = self._check_query(xq, 1)
        out = np.full((len(xq), self.ntotal), np.nan, np.float32)
        _all_bounds(self._query_codes(xq), self.offsets, self._screening, *self._screen_buffers(), out)
        bounds = np.empty_like(out)
        bounds[:, self.ids] = out
        return bounds

    def exact_pass(self, xq: np.ndarray, k: int, rows: np.ndarray, row_offsets: np.ndarray):
        """Top k over exact distances to `rows` alone (from survivors()): timing it against IVF-Flat's
        scan gives the speedup the bound allows, the ceiling of any screening with it."""
        xq = self._check_query(xq, k)
        out_d = np.empty((len(xq), k), np.float32)
        out_i = np.empty((len(xq), k), np.int64)
        _exact_pass(xq, self.X, self.ids, rows, row_offsets, out_d, out_i)
        out_d[out_i == MISSING_ID] = MISSING_DISTANCE
        return out_d, out_i


def set_threads(threads: int) -> None:
    """Every pool either side runs on, set to `threads`: faiss's OpenMP, numba's, and the BLAS libraries
    (numpy's and faiss's own OpenBLAS, behind the coarse quantizer's GEMM and Lychee's projection), which
    otherwise use every core even when faiss's OpenMP is set to one thread."""
    faiss.omp_set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    threadpoolctl.threadpool_limits(threads)
