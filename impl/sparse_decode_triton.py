"""Triton kernel for sparse decode attention (gather + weighted softmax + V), the GPU side of
SSA (PAPERS.md A2). One program per query head: it gathers its KV head's selected keys and values
in blocks and runs an online softmax over s + log w. The torch reference is
`claimbench.baselines.sparse_attention.weighted_attention`; on CPU the kernel runs only under
TRITON_INTERPRET=1 (for tests). GPU timing needs a lent device: not measured in this repository yet.
"""
from __future__ import annotations

import math

import torch

from claimbench.impl.triton_support import require, tl, triton


if triton is not None:
    @triton.jit
    def _sparse_decode(Q, K, V, IDX, LOGW, OUT, n_sel, group, scale, stride_kh, stride_kn, stride_ih,
                       D: tl.constexpr, BLOCK: tl.constexpr):
        h = tl.program_id(0)
        kvh = h // group
        offs_d = tl.arange(0, D)
        q = tl.load(Q + h * D + offs_d).to(tl.float32)
        m_i = tl.full([1], -float("inf"), tl.float32)
        l_i = tl.zeros([1], tl.float32)
        acc = tl.zeros([D], tl.float32)
        for start in range(0, n_sel, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n_sel
            idx = tl.load(IDX + kvh * stride_ih + offs, mask=mask, other=0)
            lw = tl.load(LOGW + kvh * stride_ih + offs, mask=mask, other=-float("inf"))
            rows = kvh * stride_kh + idx[:, None] * stride_kn + offs_d[None, :]
            k = tl.load(K + rows, mask=mask[:, None], other=0.0).to(tl.float32)
            s = tl.sum(k * q[None, :], 1) * scale + lw
            s = tl.where(mask, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe)
            v = tl.load(V + rows, mask=mask[:, None], other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
        tl.store(OUT + h * D + offs_d, (acc / l_i).to(OUT.dtype.element_ty))


def sparse_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index: torch.Tensor,
                            log_w: torch.Tensor, block: int = 64) -> torch.Tensor:
    """q (1, H, 1, d); k, v (1, Hkv, n, d); index, log_w (Hkv, m) -> (1, H, 1, d), via Triton."""
    require(q.device, "the sparse decode kernel")
    _, H, _, d = q.shape
    hkv = k.shape[1]
    assert q.shape[0] == k.shape[0] == 1 and d & (d - 1) == 0, (q.shape, k.shape)
    kk, vv = k[0].contiguous(), v[0].contiguous()
    idx = index.to(torch.int32).contiguous()
    lw = log_w.to(torch.float32).contiguous()
    out = torch.empty(H, d, dtype=q.dtype, device=q.device)
    _sparse_decode[(H,)](q[0, :, 0].contiguous(), kk, vv, idx, lw, out, idx.shape[1], H // hkv,
                         1.0 / math.sqrt(d), kk.stride(0), kk.stride(1), idx.stride(0), D=d, BLOCK=block)
    return out.view(1, H, 1, d)
