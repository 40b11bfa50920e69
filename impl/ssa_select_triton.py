"""SSA's selection on a GPU decode step (PAPERS.md A2) in four launches: `impl.ssa.ssa_select_pq`'s
water filling and draws over the PQ codes, where the torch version spends about a hundred small kernels
(0.44 ms of an H200 decode step at any context).
1. One program per KV head (`_codes_kernel`): each code's proxy probability from the query group's two
   sub-vector lookup tables, the codes sorted by it (one bitonic sort of probability and code packed in
   64 bits), the tokens before each code in that order, the water-filling boundary (the first code
   whose factor times its probability is below 1 with at most m tokens before it: the code the torch
   version's two-sided test finds) and the cumulative mass of the codes from there on.
2. One program per (KV head, block of slots) (`_draw_kernel`): slot j < t takes the j-th token of the
   certainty stratum; slot j >= t draws a code by its mass (binary search of the cumulative mass), a
   token of it uniformly, and its Horvitz-Thompson log weight; each draw claims its token in a
   per-token scratch row, where the last writer wins (the row needs no clearing: a step reads only
   the tokens it drew).
3. `_dedupe_kernel`: a draw whose token another draw claimed is padding (log w = -inf).
The fourth launch draws the seed of the Philox streams with torch's generator, so that each call (and
each CUDA graph replay) draws anew. The layout differs from the torch version's, the distribution does
not: the t kept tokens, then the m - t draws in draw order, duplicates padded in place, no compaction.
Reconstructed: the paper's selection kernel is not in its digest; this one is this project's.
Runs on a CUDA device, or on CPU under TRITON_INTERPRET=1 (tests, `claimbench device-run --dry-run`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from claimbench.impl.ssa import PQBuckets
from claimbench.impl.triton_support import require, tl, triton

SUBVECTORS = 2  # the kernel's lookup tables: SSA's proxy default (PQProxy.subvectors)

if triton is not None:
    @triton.jit
    def _codes_kernel(Q, BOOKS, STARTS, RANK_START, BEFORE, SORTED_COUNT, SORTED_P, CDF, T, m, group, scale,
                      stride_qh, K: tl.constexpr, C: tl.constexpr, SUB: tl.constexpr):
        h = tl.program_id(0)
        offs_k, offs_s, ranks = tl.arange(0, K), tl.arange(0, SUB), tl.arange(0, C)
        book = offs_k[:, None] * SUB + offs_s[None, :]
        books0 = tl.load(BOOKS + (2 * h) * K * SUB + book).to(tl.float32)
        books1 = tl.load(BOOKS + (2 * h + 1) * K * SUB + book).to(tl.float32)
        counts = (tl.load(STARTS + h * (C + 1) + ranks + 1) - tl.load(STARTS + h * (C + 1) + ranks)).to(tl.int32)
        p = tl.zeros([C], tl.float32)
        for g in range(group):  # the group's query heads share one selection: their probabilities averaged
            head = h * group + g
            q0 = tl.load(Q + head * stride_qh + offs_s).to(tl.float32)
            q1 = tl.load(Q + head * stride_qh + SUB + offs_s).to(tl.float32)
            table0 = tl.sum(books0 * q0[None, :], 1) * scale
            table1 = tl.sum(books1 * q1[None, :], 1) * scale
            scores = tl.reshape(table0[:, None] + table1[None, :], [C])  # code c0 * K + c1
            weights = tl.exp(scores - tl.max(scores, 0))
            p += weights / tl.sum(weights * counts.to(tl.float32), 0)
        p = tl.where(counts > 0, p / group, 0.0)  # codes no token carries sort last
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | ranks.to(tl.int64)  # p >= 0: bits sort as p
        key = tl.sort(key, descending=True)
        code = (key & 0xFFFFFFFF).to(tl.int32)
        p_sorted = (key >> 32).to(tl.int32).to(tl.float32, bitcast=True).to(tl.float64)
        count = (tl.load(STARTS + h * (C + 1) + code + 1) - tl.load(STARTS + h * (C + 1) + code)).to(tl.int32)
        before = tl.cumsum(count, 0) - count
        mass = p_sorted * count.to(tl.float64)
        suffix = tl.sum(mass, 0) - tl.cumsum(mass, 0) + mass  # mass of this code and every one after it
        factor = (m - before).to(tl.float64) / tl.maximum(suffix, 1e-300)
        boundary = tl.min(tl.where((factor * p_sorted < 1) & (before <= m), ranks, C), 0)
        t = tl.where(boundary < C, tl.sum(tl.where(ranks < boundary, count, 0), 0), m)
        row = h * C + ranks
        tl.store(RANK_START + row, tl.load(STARTS + h * (C + 1) + code).to(tl.int32))
        tl.store(BEFORE + row, before)
        tl.store(SORTED_COUNT + row, count)
        tl.store(SORTED_P + row, p_sorted)
        tl.store(CDF + row, tl.cumsum(tl.where(ranks >= boundary, mass, 0.0), 0))
        tl.store(T + h, t)

    @triton.jit
    def _draw_kernel(ORDER, RANK_START, BEFORE, SORTED_COUNT, SORTED_P, CDF, T, SEED, INDEX, LOGW, CLAIM, n, m,
                     C: tl.constexpr, LOG2_CODES: tl.constexpr, BLOCK: tl.constexpr):
        h, block = tl.program_id(0), tl.program_id(1)
        j = block * BLOCK + tl.arange(0, BLOCK)
        live = j < m
        t = tl.load(T + h)
        kept = j < t
        row = h * C
        # the certainty stratum: the last code rank whose tokens begin at or before slot j
        lo, hi = tl.zeros([BLOCK], tl.int32), tl.full([BLOCK], C, tl.int32)
        for _ in tl.static_range(LOG2_CODES):
            mid = (lo + hi) // 2
            right = tl.load(BEFORE + row + mid) <= j
            lo, hi = tl.where(right, mid, lo), tl.where(right, hi, mid)
        kept_at = tl.load(RANK_START + row + lo) + j - tl.load(BEFORE + row + lo)
        # a draw: 52 random bits pick a point of the rest's mass, 32 more a token of the code there
        r0, r1, r2, _ = tl.randint4x(tl.load(SEED), (h * m + j).to(tl.int32))
        point = (r0.to(tl.float64) * 1048576.0 + (r1 >> 12).to(tl.float64)) * (1.0 / 4503599627370496.0)
        rest = tl.load(CDF + row + C - 1)
        target = point * rest
        lo, hi = tl.zeros([BLOCK], tl.int32), tl.full([BLOCK], C, tl.int32)
        for _ in tl.static_range(LOG2_CODES + 1):  # the first rank whose cumulative mass exceeds the point
            mid = (lo + hi) // 2
            above = tl.load(CDF + row + mid, mask=mid < C, other=float("inf")) > target
            lo, hi = tl.where(above, lo, mid + 1), tl.where(above, mid, hi)
        rank = tl.minimum(lo, C - 1)
        count = tl.load(SORTED_COUNT + row + rank)
        within = tl.minimum((r2.to(tl.float64) * (1.0 / 4294967296.0) * count).to(tl.int32), count - 1)
        drawn_at = tl.load(RANK_START + row + rank) + within
        token = tl.load(ORDER + h * n + tl.where(kept, kept_at, drawn_at), mask=live, other=0)
        share = tl.load(SORTED_P + row + rank) / rest  # p_i / P_rest
        inclusion = 1.0 - tl.exp((m - t).to(tl.float64) * tl.log(1.0 - share))
        log_w = tl.where(kept, 0.0, -tl.log(inclusion))
        tl.store(INDEX + h * m + j, token, mask=live)
        tl.store(LOGW + h * m + j, log_w.to(tl.float32), mask=live)
        tl.store(CLAIM + h * n + token, j, mask=live & ~kept)

    @triton.jit
    def _dedupe_kernel(INDEX, LOGW, CLAIM, T, n, m, BLOCK: tl.constexpr):
        h, block = tl.program_id(0), tl.program_id(1)
        j = block * BLOCK + tl.arange(0, BLOCK)
        drawn = (j < m) & (j >= tl.load(T + h))
        token = tl.load(INDEX + h * m + j, mask=drawn, other=0)
        repeat = drawn & (tl.load(CLAIM + h * n + token, mask=drawn, other=-1) != j)
        tl.store(LOGW + h * m + j, tl.full([BLOCK], -float("inf"), tl.float32), mask=repeat)


def ssa_select_pq_triton(buckets: PQBuckets, q: Tensor, m: int, gen: torch.Generator | None = None,
                         block: int = 1024) -> tuple[Tensor, Tensor]:
    """ssa_select_pq as four launches (see the module docstring): q (1, H, 1, d) -> (index (Hkv, m) int64,
    log w (Hkv, m) float32); padding has log w = -inf. gen None: torch's default generator (graph-safe)."""
    require(q.device, "SSA's selection kernel")
    hkv, n = buckets.order.shape
    per_book, sub_dim = buckets.books.shape[1:]
    H, d = q.shape[1], q.shape[-1]
    assert d == SUBVECTORS * sub_dim and buckets.books.shape[0] == SUBVECTORS * hkv, (q.shape, buckets.books.shape)
    assert per_book & (per_book - 1) == 0 and sub_dim & (sub_dim - 1) == 0 and H % hkv == 0, (per_book, sub_dim)
    assert 0 < m < n and q.stride(-1) == 1, (m, n, q.stride())
    codes = per_book * per_book
    device = q.device
    scratch = {name: torch.empty(hkv, codes, dtype=dtype, device=device) for name, dtype in (
        ("rank_start", torch.int32), ("before", torch.int32), ("count", torch.int32), ("p", torch.float64),
        ("cdf", torch.float64))}
    t = torch.empty(hkv, dtype=torch.int32, device=device)
    _codes_kernel[(hkv,)](q, buckets.books.contiguous(), buckets.starts, scratch["rank_start"], scratch["before"],
                          scratch["count"], scratch["p"], scratch["cdf"], t, m, H // hkv, 1.0 / math.sqrt(d),
                          q.stride(1), K=per_book, C=codes, SUB=sub_dim, num_warps=8)
    seed = torch.randint(0, 2 ** 31 - 1, (1,), generator=gen, device=device, dtype=torch.int32)
    index = torch.empty(hkv, m, dtype=torch.int64, device=device)
    log_w = torch.empty(hkv, m, dtype=torch.float32, device=device)
    claim = torch.empty(hkv, n, dtype=torch.int32, device=device)
    grid = (hkv, triton.cdiv(m, block))
    _draw_kernel[grid](buckets.order, scratch["rank_start"], scratch["before"], scratch["count"], scratch["p"],
                       scratch["cdf"], t, seed, index, log_w, claim, n, m, C=codes,
                       LOG2_CODES=int(math.log2(codes)), BLOCK=block)
    _dedupe_kernel[grid](index, log_w, claim, t, n, m, BLOCK=block)
    return index, log_w
