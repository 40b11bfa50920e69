"""Triton kernels for sparse decode attention (gather + weighted softmax + V), the GPU side of
SSA (PAPERS.md A2), split the way flash-decoding splits dense decode: one program per (KV head,
chunk of the selected tokens) gathers its chunk's keys and values in blocks once for all the query
heads sharing that KV head (GQA) and runs an online softmax over s + log w; a second kernel merges
the chunks' partial maxima, sums and outputs per query head. Reconstructed (the paper's kernel is
not in the digest): the split sizes and the merge are flash-decoding's, not SSA's. The torch
reference is `claimbench.baselines.sparse_attention.weighted_attention`; on CPU the kernels run only
under TRITON_INTERPRET=1 (tests, `claimbench device-run --dry-run`).
"""
from __future__ import annotations

import math

import torch

from claimbench.impl.triton_support import require, tl, triton


if triton is not None:
    @triton.jit
    def _sparse_decode_chunk(Q, K, V, IDX, LOGW, PART_M, PART_L, PART_ACC, n_sel, group, chunk, n_chunks, scale,
                             stride_kh, stride_kn, stride_ih, D: tl.constexpr, G: tl.constexpr, BLOCK: tl.constexpr):
        kvh, part = tl.program_id(0), tl.program_id(1)
        offs_g, offs_d = tl.arange(0, G), tl.arange(0, D)
        in_group = offs_g < group
        heads = kvh * group + offs_g
        q = tl.load(Q + heads[:, None] * D + offs_d[None, :], mask=in_group[:, None], other=0.0)  # (G, D)
        m_i = tl.full([G], -float("inf"), tl.float32)
        l_i = tl.zeros([G], tl.float32)
        acc = tl.zeros([G, D], tl.float32)
        begin = part * chunk
        end = tl.minimum(begin + chunk, n_sel)
        for start in range(begin, end, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < end
            idx = tl.load(IDX + kvh * stride_ih + offs, mask=mask, other=0).to(tl.int64)
            lw = tl.load(LOGW + kvh * stride_ih + offs, mask=mask, other=-float("inf"))
            rows = kvh * stride_kh + idx[:, None] * stride_kn + offs_d[None, :]
            k = tl.load(K + rows, mask=mask[:, None], other=0.0)  # (BLOCK, D)
            s = tl.dot(q, tl.trans(k)) * scale + lw[None, :]  # (G, BLOCK)
            s = tl.where(mask[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            v = tl.load(V + rows, mask=mask[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        slot = heads * n_chunks + part
        tl.store(PART_M + slot, m_i, mask=in_group)
        tl.store(PART_L + slot, l_i, mask=in_group)
        tl.store(PART_ACC + slot[:, None] * D + offs_d[None, :], acc, mask=in_group[:, None])

    @triton.jit
    def _merge_chunks(PART_M, PART_L, PART_ACC, OUT, n_chunks, D: tl.constexpr, CHUNKS: tl.constexpr):
        h = tl.program_id(0)
        offs_c, offs_d = tl.arange(0, CHUNKS), tl.arange(0, D)
        valid = offs_c < n_chunks
        m = tl.load(PART_M + h * n_chunks + offs_c, mask=valid, other=-float("inf"))
        weight = tl.where(m == -float("inf"), 0.0, tl.exp(m - tl.max(m, 0)))  # a chunk of padding weighs nothing
        total = tl.sum(tl.load(PART_L + h * n_chunks + offs_c, mask=valid, other=0.0) * weight, 0)
        acc = tl.load(PART_ACC + (h * n_chunks + offs_c)[:, None] * D + offs_d[None, :], mask=valid[:, None], other=0.0)
        tl.store(OUT + h * D + offs_d, (tl.sum(acc * weight[:, None], 0) / total).to(OUT.dtype.element_ty))


def sparse_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor,
                            log_w: torch.Tensor, block: int = 64, max_chunks: int = 128) -> torch.Tensor:
    """q (1, H, 1, d); k, v (1, Hkv, n, d); index, log_w (Hkv, m) -> (1, H, 1, d), via Triton. The m
    selected tokens are cut into at most max_chunks chunks of whole blocks, one program each per KV head."""
    require(q.device, "the sparse decode kernel")
    _, H, _, d = q.shape
    hkv = k.shape[1]
    assert q.shape[0] == k.shape[0] == 1 and d & (d - 1) == 0 and H % hkv == 0, (q.shape, k.shape)
    kk, vv = k[0].contiguous(), v[0].contiguous()
    idx = index.contiguous()  # int32 or int64: the kernel widens what it loads
    lw = log_w.to(torch.float32).contiguous()
    m = idx.shape[1]
    blocks = triton.cdiv(m, block)
    chunk = block * triton.cdiv(blocks, max_chunks)
    n_chunks = triton.cdiv(m, chunk)
    group = H // hkv
    part_m = torch.empty(H, n_chunks, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(H, n_chunks, d, dtype=torch.float32, device=q.device)
    _sparse_decode_chunk[(hkv, n_chunks)](
        q[0, :, 0].contiguous(), kk, vv, idx, lw, part_m, part_l, part_acc, m, group, chunk, n_chunks,
        1.0 / math.sqrt(d), kk.stride(0), kk.stride(1), idx.stride(0), D=d,
        G=max(16, triton.next_power_of_2(group)), BLOCK=block)  # tl.dot takes 16 rows at least
    out = torch.empty(H, d, dtype=q.dtype, device=q.device)
    _merge_chunks[(H,)](part_m, part_l, part_acc, out, n_chunks, D=d, CHUNKS=triton.next_power_of_2(n_chunks))
    return out.view(1, H, 1, d)
