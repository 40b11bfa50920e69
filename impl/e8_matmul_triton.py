"""Triton kernel for E8-QAT's decode matmul (PAPERS.md C3), the GPU side of the throughput claim:
y = x W^T with W stored as E8 codes, one 16-bit code per 8 weights (2.0 bits) and an fp16 scale per
group of weights of a row, the codes decoded inside the matmul. Reconstructed (the paper's kernel
is not in the digest): the decode is a lookup in the 2^16-point codebook table (every code's lattice
point, `impl.e8qat.from_code`: 1 MiB in fp16, which stays in a GPU's L2), tile by tile, before each
block's dot product, the tile shape autotuned per (tokens, rows, cols); the codes travel as int16
(read back as unsigned). The torch reference and the "decode, then cuBLAS" baseline is `dequantize`.
On CPU the kernel runs only under TRITON_INTERPRET=1 (tests, `claimbench device-run --dry-run`); GPU
timing needs a lent device (claimbench/device.py).
"""
from __future__ import annotations

import os

import torch

from claimbench.impl import e8qat
from claimbench.impl.triton_support import require, tl, triton


def codebook_table(dtype=torch.float16, device="cpu") -> torch.Tensor:
    """(2^16, 8): the lattice point of every code (half-integers below 4 in size: exact in fp16)."""
    return e8qat.from_code(torch.arange(2 ** 16)).to(device=device, dtype=dtype)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """int codes in [0, 2^16) -> int16 storage (two bytes per 8 weights)."""
    if codes.min() < 0 or codes.max() >= 2 ** 16:
        raise ValueError("E8 codes must be in [0, 2^16)")
    return torch.where(codes >= 2 ** 15, codes - 2 ** 16, codes).to(torch.int16)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, table: torch.Tensor, group_size: int) -> torch.Tensor:
    """(rows, cols / 8) int16 codes and (rows, cols / group_size) scales -> the (rows, cols) weight."""
    points = table[packed.long() & 0xFFFF]  # (rows, cols / 8, 8)
    rows = packed.shape[0]
    return points.reshape(rows, -1) * scales.to(table.dtype).repeat_interleave(group_size, 1)


def _configs() -> list:
    """Tile shapes the autotuner tries per (tokens, rows, cols): narrow tiles for decode's few tokens
    (more programs over the rows), wide ones for batches; one under the interpreter (tests, dry run)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64})]
    few = [triton.Config({"BLOCK_M": 16, "BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=3)
           for n in (16, 32, 64) for k in (64, 128)]
    many = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64}, num_warps=w, num_stages=3)
            for m in (32, 64, 128) for n in (64, 128) for w in (4, 8)]
    return few + many


def _fitting(configs, named_args, **kwargs):
    """Configs whose BLOCK_K divides the columns (the kernel does not mask K) and whose BLOCK_M suits
    the token count (16 for at most 16 tokens, wider above). Triton prunes only where it has several
    configs to try; e8_matmul's 64-column check leaves each group at least one."""
    few_tokens, cols = named_args["M"] <= 16, named_args["K"]
    return [c for c in configs if cols % c.kwargs["BLOCK_K"] == 0 and (c.kwargs["BLOCK_M"] == 16) == few_tokens]


if triton is not None:
    @triton.autotune(configs=_configs(), key=["M", "N", "K"], prune_configs_by={"early_config_prune": _fitting})
    @triton.jit
    def _e8_matmul(X, CODES, SCALES, TABLE, OUT, M, N, K, stride_xm, stride_cn, stride_sn, stride_om,
                   GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :], mask=offs_m[:, None] < M, other=0.0)
            in_rows = offs_n[:, None] < N
            code = tl.load(CODES + offs_n[:, None] * stride_cn + offs_k[None, :] // 8, mask=in_rows, other=0)
            code = code.to(tl.int32) & 0xFFFF
            w = tl.load(TABLE + code * 8 + offs_k[None, :] % 8)
            scale = tl.load(SCALES + offs_n[:, None] * stride_sn + offs_k[None, :] // GROUP, mask=in_rows, other=0.0)
            acc += tl.dot(x, tl.trans(w * scale))
        tl.store(OUT + offs_m[:, None] * stride_om + offs_n[None, :], acc,
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def e8_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, table: torch.Tensor,
              group_size: int) -> torch.Tensor:
    """x (tokens, cols) -> (tokens, rows) fp32, the codes decoded in the kernel; x, table and scales in
    one dtype (fp16 on a GPU)."""
    require(x.device, "the E8 matmul kernel")
    tokens, cols = x.shape
    rows = packed.shape[0]
    block_k = 64
    assert packed.shape == (rows, cols // 8) and scales.shape == (rows, cols // group_size), \
        f"codes {tuple(packed.shape)} and scales {tuple(scales.shape)} do not fit x {tuple(x.shape)}"
    assert cols % block_k == 0 and group_size % 8 == 0, f"cols {cols} must be a multiple of {block_k}"
    x, packed, scales = x.contiguous(), packed.contiguous(), scales.to(table.dtype).contiguous()
    out = torch.empty(tokens, rows, device=x.device, dtype=torch.float32)

    def grid(meta):
        return triton.cdiv(tokens, meta["BLOCK_M"]), triton.cdiv(rows, meta["BLOCK_N"])
    _e8_matmul[grid](x, packed, scales, table, out, tokens, rows, cols, x.stride(0), packed.stride(0),
                     scales.stride(0), out.stride(0), GROUP=group_size)
    return out
