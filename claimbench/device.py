"""`claimbench device-run --out DIR`: every benchmark that needs a GPU, as one prepared command for a
GPU machine lent for minutes (its image has torch, triton, cupy and numpy; no asv, DuckDB, faiss or
package registry). Writes asv-format results under DIR/<machine>/ with the environment record (GPU
name, driver, CUDA, library versions), the run record and the evidence (intervals), so that
`claimbench ingest DIR` here takes them; it commits nothing. Imports only torch, triton and numpy.

The benchmarks are those of `suites/gpu.py` (asv runs that suite where asv and a GPU both are; each
paper with a GPU part adds its measurement here and its rows there), under the same names:
- `gpu.SsaDecode` (PAPERS.md A2, claim decode-speedup-1m): one SSA decode step of one layer at
  32K-1M context with Llama-3-8B's attention shape (32 query heads, 8 KV heads, head dim 128, bf16):
  the selection of n / 50 tokens (50x sparsity: the PQ proxy's probability per code, the tokens
  bucketed by code at prefill, water-filling and draws over the codes, in four Triton launches:
  impl/ssa_select_triton.py) and the Triton sparse decode kernel over them, vs torch SDPA dense decode
  over all n; beside it the kernel alone on a fixed selection, and the step with the selection as
  torch ops (impl.ssa.ssa_select_pq). Interleaved rounds timed with CUDA events (`_timer`: ten calls a
  round, each after an L2 flush, each a CUDA graph replay where capture works: `_graphed`); gated on
  the kernel matching the torch reference (fp32) on both selections. The Triton selection times the
  step only where it keeps what the torch selection keeps (the deterministic part of SSA's selection);
  elsewhere, or where it fails, the step is timed with the torch-ops one, and its row says why.
  Measured instead of
  the paper's setup: the proxy's codebooks and codes are random (the step's cost does not depend on
  their values), the new token's encoding and bucketing are not in the step, and the baseline is
  torch's SDPA, not FlashInfer.
- `gpu.Sparse24Matmul` (PAPERS.md C5, claim speed-vs-tier-lower, context for speed-at-equal-bits): one
  linear layer's matmul at SmolLM2-135M's and Llama-3.1-8B's FFN shapes and 16-4,096 tokens, each
  storage format through the kernel torch has for it: dense fp16 (cuBLAS), dense fp8 e4m3
  (`torch._scaled_mm`, per-tensor scales, torch's default accumulation), 2:4 fp16
  (`to_sparse_semi_structured`, and its cuSPARSELt op called directly), dense int8 x int8
  (`torch._int_mm`), 2:4 int8 (cuSPARSELt's op with int32 out: the tensor subclass's int8 product
  saturates), weight-only int4 (`torch._weight_int4pack_mm`, tinygemm, bf16 activations); interleaved
  rounds timed as above, the ratio to dense fp16 per round, each kernel's relative error against the
  fp32 product of the weight it stores (a kernel erring by more than 5% gets no speed row). The int8
  and fp8 rows' activation quantization (and the int8 rows' int32 -> float rescale) are separate torch
  ops, in the time (no fused prologue or epilogue). The claim row (`gpu.Sparse24VsTierLower`): 2:4 fp16
  over dense fp8, per round, at Llama-3.1-8B's shapes (TIER_LOWER): adding 2:4 against dropping a
  precision tier at the same nominal tensor-core throughput. No kernel for INT5 weights exists in torch
  or here, so 2:4 + INT8 against INT5 (equal bits) stays unmeasured. A kernel that torch refuses on
  this device (shape, dtype or build) is recorded as skipped with torch's reason.
- `gpu.E8Matmul` (PAPERS.md C3, context for the claim decode-throughput): one linear layer at the same
  shapes and 1-256 tokens, its weight stored as E8-QAT stores it (a 16-bit E8 code per 8 weights, an
  fp16 scale per 64: 2.25 bits), through the Triton kernel that decodes the codes inside the matmul
  (impl/e8_matmul_triton.py), through decode-then-cuBLAS, and as the decoded weight in dense fp16
  (cuBLAS); timed and checked as the 2:4 rows are. The claim itself is end-to-end decode throughput
  at each format's largest batch, which these rows explain but do not measure.
- Lychee vs IVF-Flat on the GPU needs faiss-gpu, which the image lacks: listed as skipped.
`--dry-run` runs the same code on the CPU under Triton's interpreter at toy sizes, writing a valid
result file (mode `dry-run`), so the format is proven before any GPU time is spent; `--compile-only`
compiles every Triton kernel of the run for the GPU (`--arch`) on the CPU (`compile_check`), so the
kernels are too.
On a bare copy of the repository (a device machine, where nothing is installed) run it as
`python -m claimbench.device --out DIR` from the repository root; where claimbench is installed,
`claimbench device-run --out DIR` is the same.
"""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import asvfiles, environment, evidence, intervals, registry
from .registry import REPO_ROOT

SPARSITY = 50
# pq_bits: SSA's proxy (PQProxy's 2 sub-vectors x 6 bits: 4,096 codes); the dry run's 64 codes keep the
# interpreter's sort of the codes under a second (4,096 take it 15 s a call). calls: how many calls a round's time
# averages (_timer); a dry run's interpreter times say nothing of a GPU, so it times one call a round (its rounds
# still give the intervals)
CALLS_PER_ROUND = 10
FULL = {"contexts": [32_768, 131_072, 524_288, 1_048_576], "heads": 32, "kv_heads": 8, "head_dim": 128, "rounds": 15,
        "pq_bits": 6, "calls": CALLS_PER_ROUND}
DRY = {"contexts": [1024, 2048], "heads": 4, "kv_heads": 2, "head_dim": 64, "rounds": 6, "pq_bits": 3, "calls": 1}
# max |kernel - fp32 reference| on bf16 inputs (the dry run's fp32: far below), from the claim's gate
GATE_TOLERANCE = registry.load().gate_of("gpu.SsaDecode.track_step_speedup_vs_dense").max
BUDGET_S = 8 * 60  # every GPU benchmark together, within a lent machine's minutes
SPARSE24 = {"shapes": {"smollm2-ffn-up": (1536, 576), "smollm2-ffn-down": (576, 1536),
                       "llama8b-ffn-up": (14336, 4096), "llama8b-ffn-down": (4096, 14336)},
            "tokens": [16, 256, 4096], "rounds": 15, "calls": CALLS_PER_ROUND}
SPARSE24_DRY = {"shapes": {"toy": (256, 128)}, "tokens": [16], "rounds": 6, "calls": 1}
SPARSE24_KERNELS = ["fp16", "fp8", "2:4-fp16", "2:4-fp16-cusparselt", "int8", "2:4-int8", "int4-weight-only"]
# 2:4 at a precision -> dense one tier lower at the same nominal tensor-core throughput (H100, H200: sparse
# fp16 and dense fp8 989 TFLOPS each), at the paper's scale (Llama-3.1-8B): the claim speed-vs-tier-lower
TIER_LOWER = {"2:4-fp16": "fp8"}
TIER_LOWER_SHAPES = ("llama8b-ffn-up", "llama8b-ffn-down")
TIER_LOWER_BENCH = "gpu.Sparse24VsTierLower.track_slowdown"  # its own grid of (shape, tokens, kernel)
MATMUL_MAX_ERROR = 0.05
E8 = {"shapes": SPARSE24["shapes"], "tokens": [1, 16, 64, 256], "rounds": 15, "calls": CALLS_PER_ROUND}
E8_DRY = {"shapes": {"toy": (128, 128)}, "tokens": [1, 16], "rounds": 3, "calls": 1}
E8_KERNELS = ["fp16", "e8-triton", "e8-decode-then-fp16"]
E8_GROUP = 64


def _selected(n: int) -> int:
    """Tokens SSA's step attends to at context n."""
    return max(n // SPARSITY, 16)


DECODE_DTYPE, MATMUL_DTYPE = "bfloat16", "float16"  # the inputs' dtypes on a GPU: the SSA step's, the matmuls'


def _input_dtype(device: str, on_gpu: str):
    """The inputs' dtype: on_gpu (DECODE_DTYPE or MATMUL_DTYPE) on a GPU, fp32 on the CPU (the dry run)."""
    import torch
    return getattr(torch, on_gpu) if device == "cuda" else torch.float32


@dataclass
class Planned:
    benchmark: str
    what: str
    runnable: bool
    why_not: str = ""


def plan(device: str) -> list[Planned]:
    """What a device run would do here, and what it cannot (with the reason)."""
    try:
        import faiss
        gpu_faiss = hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0
    except ImportError:
        gpu_faiss = False
    return [Planned("gpu.SsaDecode", "SSA decode step (selection, then the Triton sparse kernel over n/50 tokens) "
                    "vs torch SDPA dense decode, 32K-1M context" if device == "cuda"
                    else "the same at toy sizes on the CPU (interpreter)", True),
            Planned("gpu.Sparse24Matmul", "2:4 vs dense matmuls at fp16, fp8, int8 and weight-only int4"
                    if device == "cuda" else "dense fp16 and fp8 matmuls at a toy size on the CPU (the 2:4 and "
                    "integer kernels need CUDA)", True),
            Planned("gpu.E8Matmul", "E8 codes decoded inside a Triton matmul vs fp16 cuBLAS, batch 1-256"
                    if device == "cuda" else "the same at a toy size on the CPU (interpreter)", True),
            Planned("gpu.LycheeSearch", "Lychee vs faiss IVF-Flat on the GPU", gpu_faiss,
                    "" if gpu_faiss else "faiss with GPU support is not installed on this machine")]


L2_FLUSH_BYTES = 256 * 2 ** 20  # several times an H100's or H200's L2 (50-60 MB)


def _timer(device: str, calls: int):
    """timed(fn) -> seconds per call, the mean of `calls` calls. On CUDA each call is timed by its own
    pair of events after a write of L2_FLUSH_BYTES (untimed), as triton.testing.do_bench does: every
    call starts with a cold L2; one synchronize per round. Callers pass CUDA graph replays (`_graphed`),
    so the host's launch cost is not in the time."""
    import torch
    if device == "cuda":
        flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

        def timed(fn):
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(calls)]
            for start, end in events:
                flush.zero_()
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize()
            return sum(start.elapsed_time(end) for start, end in events) / calls / 1e3
    else:
        def timed(fn):
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            return (time.perf_counter() - begin) / calls
    return timed


def _graphed(fn, device: str):
    """(replay, how): fn captured once in a CUDA graph, so that a timed call is the GPU's work alone, as
    a server replaying its decode step's graph sees it (the host's launch cost differed 2x between two
    lent H200 machines); fn itself where capture fails (an op that allocates or syncs while capturing),
    with the reason."""
    import torch
    if device != "cuda":
        return fn, "eager"
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as torch's graph docs ask
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay, "CUDA graph replay"
    except Exception as e:  # recorded in the row's method, timed as it is
        torch.cuda.synchronize()
        return fn, f"eager ({type(e).__name__}: {str(e).splitlines()[0][:120]})"


def ssa_decode(device: str, sizes: dict, progress=print, budget_s: float = BUDGET_S) -> dict[int, dict]:
    """Per context: the speedup estimates (per-round dense time over the sparse kernel's, and over a
    whole SSA decode step's: selection, then the kernel), the three times, and the kernel's max error
    against the fp32 torch reference on both selections. Contexts are measured smallest first; once
    budget_s is spent the larger ones are left out, and a line says which."""
    started = time.monotonic()
    import torch
    import torch.nn.functional as F

    from claimbench.impl.sparse_decode_triton import sparse_decode_attention
    from claimbench.impl.ssa import PQBuckets, ssa_select_pq
    from claimbench.impl.ssa_select_triton import ssa_select_pq_triton
    from claimbench.llm.sparse import PQProxy, weighted_attention
    dtype = _input_dtype(device, DECODE_DTYPE)
    gen = torch.Generator(device=device).manual_seed(0)  # made where used: 1M tokens of K and V are GBs
    H, hkv, d = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    proxy = PQProxy(bits=sizes["pq_bits"])  # sub-vectors x bits per head
    timed = _timer(device, sizes["calls"])
    out = {}
    for n in sizes["contexts"]:
        if time.monotonic() - started > budget_s:
            progress(f"  ssa decode: {budget_s:.0f} s spent; left out {[c for c in sizes['contexts'] if c >= n]}")
            break
        m = _selected(n)
        q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype)
                   for shape in ((1, H, 1, d), (1, hkv, n, d), (1, hkv, n, d)))
        index = torch.stack([torch.randperm(n, generator=gen, device=device)[:m].sort().values for _ in range(hkv)])
        log_w = torch.rand(hkv, m, generator=gen, device=device).log()
        # the proxy's codebooks and codes: random, as the step's cost does not depend on their values
        books = torch.randn(hkv * proxy.subvectors, 2 ** proxy.bits, d // proxy.subvectors, generator=gen,
                            device=device)
        codes = torch.randint(0, 2 ** proxy.bits, (hkv * proxy.subvectors, n), generator=gen, device=device)
        buckets = PQBuckets.build(books, codes, proxy.subvectors)  # at prefill: not in the step

        def select_torch_ops():  # about a hundred small torch ops; torch's default generator: graph-safe on CUDA
            return ssa_select_pq(buckets, q, m)

        def select():  # the same in four Triton launches
            return ssa_select_pq_triton(buckets, q, m)
        try:  # the Triton selection must keep what the torch one keeps; else the step says why it has not
            differ = _kept_differ(select(), select_torch_ops())
            failure = f"its certainty stratum differed on {differ} KV head(s)" if differ else None
        except Exception as e:
            progress(traceback.format_exc())
            failure = f"it failed: {type(e).__name__}"
        selection = "Triton selection"
        if failure:  # the step still lands, timed with the torch-ops selection, and says so
            progress(f"  ssa decode at {n:,} tokens: the step uses the torch-ops selection: the Triton one {failure}")
            selection, select = f"torch-ops selection (the Triton one {failure})", select_torch_ops
        error = 0.0
        for chosen in ((index, log_w), select()):
            reference = weighted_attention(q.float(), k.float(), v.float(), *chosen)
            error = max(error, float((sparse_decode_attention(q, k, v, *chosen).float() - reference).abs().max()))
        sparse = lambda: sparse_decode_attention(q, k, v, index, log_w)  # noqa: E731
        step = lambda: sparse_decode_attention(q, k, v, *select())  # noqa: E731
        step_torch_ops = lambda: sparse_decode_attention(q, k, v, *select_torch_ops())  # noqa: E731
        dense = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        calls = {name: _graphed(fn, device) for name, fn in (("dense", dense), ("sparse", sparse), ("step", step),
                                                              ("step_torch_ops", step_torch_ops))}
        times = {name: [] for name in calls}
        for _ in range(sizes["rounds"]):
            for name, (call, _) in calls.items():
                times[name].append(timed(call))
        out[n] = {"speedup": intervals.ratio_of_rounds(times["dense"], times["sparse"]),
                  "step_speedup": intervals.ratio_of_rounds(times["dense"], times["step"]),
                  **{f"{name}_s": intervals.median_of(ts, f"order statistics of rounds, {calls[name][1]}"
                                                      + (f", {selection}" if name == "step" else ""))
                     for name, ts in times.items()}, "max_error": error}
        if any(how != "CUDA graph replay" for _, how in calls.values()) and device == "cuda":
            progress(f"  ssa decode at {n:,} tokens: " + ", ".join(f"{name} {how}" for name, (_, how) in calls.items()))
        progress(f"  ssa decode at {n:,} tokens: dense {out[n]['dense_s'].value * 1e6:.1f} us, sparse kernel "
                 f"{out[n]['sparse_s'].value * 1e6:.1f} us ({out[n]['speedup'].text()}x), selection + kernel "
                 f"{out[n]['step_s'].value * 1e6:.1f} us ({out[n]['step_speedup'].text()}x; with the selection as "
                 f"torch ops {out[n]['step_torch_ops_s'].value * 1e6:.1f} us), max error {error:.2e}")
    return out


def _kept_differ(selection, reference) -> int:
    """KV heads whose certainty stratum (the tokens kept with weight 1) differs between two selections
    (index, log w): the part of SSA's selection that is deterministic, so two implementations must agree."""
    return sum(set(index[log_w == 0].tolist()) != set(ref_index[ref_log_w == 0].tolist())
               for index, log_w, ref_index, ref_log_w in zip(*selection, *reference))


def _sparse24_kernels(rows: int, cols: int, generator, device: str) -> dict[str, tuple[object, object]]:
    """kernel -> (call(x fp32 (tokens, in)) -> out, the fp32 weight it stores), or (None, why) where
    torch refuses it here. Inputs are cast inside the call as the kernel needs (part of its time)."""
    import torch
    import torch.nn.functional as F

    from claimbench.baselines.weight_compression import magnitude_24
    weight = torch.randn(rows, cols, generator=generator, device=device) / cols ** 0.5
    pruned = weight * magnitude_24(weight)
    scale = weight.abs().amax(1, keepdim=True) / 127
    out = {}

    def attempt(name, build):
        try:
            out[name] = build()
        except Exception as e:  # torch says why this kernel cannot run here: recorded, not raised
            out[name] = (None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")

    def fp8_dense():  # e4m3 weights scaled per tensor, activations by a fixed scale; torch's default accumulation
        fp8_max = torch.finfo(torch.float8_e4m3fn).max
        w_scale = weight.abs().max() / fp8_max
        w8 = (weight / w_scale).to(torch.float8_e4m3fn)  # (out, in) row-major: w8.T is column-major, as cuBLASLt takes
        a_scale = torch.tensor(4 / fp8_max, device=device)  # as _ACT_SCALE: 4 sigma at e4m3's largest value
        return (lambda x: torch._scaled_mm((x / a_scale).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn), w8.T,
                                           scale_a=a_scale, scale_b=w_scale, out_dtype=torch.float16)), \
            w8.float() * w_scale

    if device != "cuda":
        attempt("fp16", lambda: ((lambda x: F.linear(x, weight)), weight))
        attempt("fp8", fp8_dense)
        for name in SPARSE24_KERNELS[2:]:
            out[name] = (None, "needs CUDA")
        return out
    from torch.sparse import to_sparse_semi_structured
    w16, p16 = weight.half(), pruned.half()
    q8, p8 = torch.round(weight / scale).clamp(-127, 127), torch.round(pruned / scale).clamp(-127, 127)

    def dense16():
        return (lambda x: F.linear(x.half(), w16)), w16.float()

    def sparse16():
        stored = to_sparse_semi_structured(p16)
        return (lambda x: F.linear(x.half(), stored)), p16.float()

    def sparse16_cusparselt():  # the same kernel through torch's op, without the tensor subclass's dispatch
        compressed = torch._cslt_compress(p16)
        return (lambda x: torch._cslt_sparse_mm(compressed, x.half().T).T), p16.float()

    def int8_dense():
        w8 = q8.to(torch.int8)  # (out, in) row-major: w8.T is the column-major (in, out) operand cuBLASLt takes
        return (lambda x: torch._int_mm(torch.round(x / _ACT_SCALE).clamp(-127, 127).to(torch.int8), w8.T).float()
                * (scale.T * _ACT_SCALE)), q8 * scale

    def int8_sparse():  # torch's op with int32 out: the tensor subclass's int8 product saturates at int8
        compressed = torch._cslt_compress(p8.to(torch.int8))
        return (lambda x: torch._cslt_sparse_mm(compressed, torch.round(x / _ACT_SCALE).clamp(-127, 127)
                                                .to(torch.int8).T, out_dtype=torch.int32).T.float()
                * (scale.T * _ACT_SCALE)), p8 * scale

    def int4_weight_only():
        rows, cols = weight.shape
        group = 128 if cols % 128 == 0 else 64  # tinygemm takes 32-256; SmolLM2's 576 columns need 64
        grouped = weight.reshape(rows, -1, group)
        low, high = grouped.amin(-1), grouped.amax(-1)
        step = ((high - low) / 15).clamp(min=1e-8)
        codes = torch.round((grouped - low.unsqueeze(-1)) / step.unsqueeze(-1)).clamp(0, 15).reshape(rows, cols)
        packed_bytes = (codes[:, ::2].to(torch.uint8) << 4) | codes[:, 1::2].to(torch.uint8)
        packed = torch._convert_weight_to_int4pack(packed_bytes.contiguous(), 8 if cols % 128 == 0 else 4)
        zero = low + 8 * step  # (q - 8) * scale + zero
        scale_zero = torch.stack([step.T, zero.T], -1).to(torch.bfloat16).contiguous()
        stored = (codes.reshape(rows, -1, group) * step.unsqueeze(-1) + low.unsqueeze(-1)).reshape(rows, cols)
        return (lambda x: torch._weight_int4pack_mm(x.to(torch.bfloat16), packed, group, scale_zero)), stored

    for name, build in zip(SPARSE24_KERNELS, (dense16, fp8_dense, sparse16, sparse16_cusparselt, int8_dense,
                                              int8_sparse, int4_weight_only)):
        attempt(name, build)
    return out


_ACT_SCALE = 4 / 127  # activations are N(0, 1) here: int8 codes of x / (4 / 127), 4 sigma at full range


def _e8_kernels(rows: int, cols: int, generator, device: str) -> dict[str, tuple[object, object]]:
    """E8-QAT's storage (random 16-bit codes, an fp16 scale per 64 weights) through the Triton kernel that
    decodes inside the matmul, through decode-then-cuBLAS, and the decoded weight as dense fp16."""
    import torch
    import torch.nn.functional as F

    from claimbench.impl import e8_matmul_triton as kernel
    dtype = _input_dtype(device, MATMUL_DTYPE)
    codes = torch.randint(0, 2 ** 16, (rows, cols // 8), generator=generator, device=device)
    packed = kernel.pack(codes)
    scales = torch.full((rows, cols // E8_GROUP), cols ** -0.5, device=device).to(dtype)
    table = kernel.codebook_table(dtype, device)
    weight = kernel.dequantize(packed, scales, table, E8_GROUP)
    return {"fp16": ((lambda x: F.linear(x.to(dtype), weight)), weight.float()),
            "e8-triton": ((lambda x: kernel.e8_matmul(x.to(dtype), packed, scales, table, E8_GROUP)), weight.float()),
            "e8-decode-then-fp16": ((lambda x: F.linear(x.to(dtype),
                                                        kernel.dequantize(packed, scales, table, E8_GROUP))),
                                    weight.float())}


def matmul_rows(device: str, sizes: dict, build, label: str, progress=print, pairs: dict | None = None,
                pair_shapes: tuple = ()) -> dict:
    """(shape, tokens) -> kernel -> {"seconds", "speedup" (vs fp16 dense, per round), "error"} or {"skipped"},
    for the kernels build(rows, cols, generator, device) makes per shape; pairs {kernel: other} add
    "slowdown_vs_tier_lower" (the kernel's time over the other's, per round) at pair_shapes."""
    import torch
    gen = torch.Generator(device=device).manual_seed(0)
    timed = _timer(device, sizes["calls"])
    out = {}
    for shape_name, (rows, cols) in sizes["shapes"].items():
        kernels = build(rows, cols, gen, device)
        for tokens in sizes["tokens"]:
            x = torch.randn(tokens, cols, generator=gen, device=device)
            rows_out, calls = {}, {}
            for name, (call, stored) in kernels.items():
                if call is None:
                    rows_out[name] = {"skipped": stored}
                    continue
                try:
                    result = call(x).float()
                    reference = x @ stored.float().T
                    error = float((result - reference).norm() / reference.norm())
                except Exception as e:  # a shape this kernel refuses (e.g. too few tokens)
                    rows_out[name] = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
                    continue
                rows_out[name] = {"error": error}
                if error <= MATMUL_MAX_ERROR:
                    calls[name] = _graphed(lambda call=call: call(x), device)
            times = {name: [] for name in calls}
            for _ in range(sizes["rounds"]):
                for name, (call, _) in calls.items():
                    times[name].append(timed(call))
            for name, ts in times.items():
                rows_out[name]["seconds"] = intervals.median_of(ts, f"order statistics of rounds, {calls[name][1]}")
                if device == "cuda" and calls[name][1] != "CUDA graph replay":
                    progress(f"  {label} {shape_name} x {tokens} tokens, {name}: {calls[name][1]}")
                if "fp16" in times:
                    rows_out[name]["speedup"] = intervals.ratio_of_rounds(times["fp16"], ts)
            for name, other in (pairs or {}).items():
                if shape_name in pair_shapes and name in times and other in times:
                    rows_out[name]["slowdown_vs_tier_lower"] = intervals.ratio_of_rounds(times[name], times[other])
            out[shape_name, tokens] = rows_out
            progress(f"  {label} {shape_name} x {tokens} tokens: " + ", ".join(
                f"{name} {r['seconds'].value * 1e6:.1f} us" if "seconds" in r else f"{name} skipped"
                for name, r in rows_out.items()))
    return out


def sparse24_matmul(device: str, sizes: dict, progress=print) -> dict:
    """2:4 vs dense at each tier torch has (module docstring)."""
    return matmul_rows(device, sizes, _sparse24_kernels, "2:4 matmul", progress, TIER_LOWER, TIER_LOWER_SHAPES)


def e8_matmul(device: str, sizes: dict, progress=print) -> dict:
    """E8 codes decoded inside the matmul vs fp16 (module docstring)."""
    return matmul_rows(device, sizes, _e8_kernels, "E8 matmul", progress)




def _matmul_columns(bench: str, matmuls: dict, kernels: list[str], evidence_path: Path, progress) -> dict:
    """asv columns of a matmul_rows result (speedup vs fp16, seconds, relative error over every shape, token
    count and kernel; the slowdown vs a tier lower over the paired shapes and kernels only), intervals recorded."""
    shapes = sorted({shape for shape, _ in matmuls})
    tokens = sorted({t for _, t in matmuls})

    def row(shape, t, kernel):
        return matmuls.get((shape, t), {}).get(kernel, {})
    grid = [(shape, t, kernel) for shape in shapes for t in tokens for kernel in kernels]
    for shape, t, kernel in grid:
        found = row(shape, t, kernel)
        for field, benchmark in (("speedup", f"{bench}.track_speedup_vs_fp16"), ("seconds", f"{bench}.track_seconds"),
                                 ("slowdown_vs_tier_lower", TIER_LOWER_BENCH)):
            if field in found:
                evidence.record(benchmark, {"shape": shape, "tokens": t, "kernel": kernel}, found[field], evidence_path)
        if "skipped" in found:
            progress(f"device-run: {bench} {shape} {t} {kernel}: skipped ({found['skipped']})")
        elif "error" in found and "seconds" not in found:
            progress(f"device-run: {bench} {shape} {t} {kernel}: not timed (relative error {found['error']:.3g} "
                     f"> {MATMUL_MAX_ERROR})")

    def column(field, shapes=shapes, kernels=kernels):
        values = [row(shape, t, kernel).get(field) for shape in shapes for t in tokens for kernel in kernels]
        return (["shape", "tokens", "kernel"], [shapes, tokens, kernels], [getattr(v, "value", v) for v in values])
    columns = {f"{bench}.track_speedup_vs_fp16": (*column("speedup"), "x"),
               f"{bench}.track_seconds": (*column("seconds"), "seconds"),
               f"{bench}.track_relative_error": (*column("error"), "relative error")}
    paired = [(shape, kernel) for shape, t, kernel in grid if "slowdown_vs_tier_lower" in row(shape, t, kernel)]
    if paired:  # its own grid: a claim folds every combination of its benchmark's
        columns[TIER_LOWER_BENCH] = (*column(
            "slowdown_vs_tier_lower", sorted({shape for shape, _ in paired}), sorted({k for _, k in paired})), "x")
    return columns


def _launch_sites(sizes: dict, e8_sizes: dict) -> list[tuple[str, object]]:
    """(where, call) for each Triton launch site of a device run at these sizes, its arguments as the GPU
    run makes them (shapes, dtypes, integers) but empty CPU tensors, built when called: for compile_check."""
    import torch

    from claimbench.impl import e8_matmul_triton
    from claimbench.impl.sparse_decode_triton import sparse_decode_attention
    from claimbench.impl.ssa import PQBuckets
    from claimbench.impl.ssa_select_triton import ssa_select_pq_triton
    from claimbench.llm.sparse import PQProxy
    H, hkv, d = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    proxy = PQProxy(bits=sizes["pq_bits"])
    per_book = 2 ** proxy.bits

    decode, matmul = _input_dtype("cuda", DECODE_DTYPE), _input_dtype("cuda", MATMUL_DTYPE)

    def ssa_step(n):
        def call():
            q = torch.empty(1, H, 1, d, dtype=decode)
            kv = torch.empty(1, hkv, n, d, dtype=decode)
            buckets = PQBuckets.build(torch.zeros(hkv * proxy.subvectors, per_book, d // proxy.subvectors),
                                      torch.zeros(hkv * proxy.subvectors, n, dtype=torch.int64), proxy.subvectors)
            sparse_decode_attention(q, kv, kv, *ssa_select_pq_triton(buckets, q, _selected(n)))
        return call

    def e8(rows, cols, tokens):
        def call():
            e8_matmul_triton.e8_matmul(torch.empty(tokens, cols, dtype=matmul),
                                       e8_matmul_triton.pack(torch.zeros(rows, cols // 8, dtype=torch.int64)),
                                       torch.empty(rows, cols // E8_GROUP, dtype=matmul),
                                       torch.empty(2 ** 16, 8, dtype=matmul), E8_GROUP)
        return call
    return ([(f"gpu.SsaDecode at {n:,} tokens", ssa_step(n)) for n in sizes["contexts"]]
            + [(f"gpu.E8Matmul {shape} x {tokens} tokens", e8(rows, cols, tokens))
               for shape, (rows, cols) in e8_sizes["shapes"].items() for tokens in e8_sizes["tokens"]])


def compile_check(arch: int = 90, sizes: dict = FULL, e8_sizes: dict = E8, progress=print) -> list[dict]:
    """Every Triton kernel a device run launches at these sizes, compiled here for an NVIDIA GPU of compute
    capability `arch` (triton_support.compile_only: no GPU needed), so that a lent GPU's minutes are not
    spent finding out that a kernel does not compile or asks for more shared memory than the GPU has.
    One row per distinct compiled kernel (where first launched, its resources, "error": None or why it
    would fail), and one per launch site that failed to compile. gpu.Sparse24Matmul runs torch's own
    kernels: nothing of it to compile. Run it in a process without TRITON_INTERPRET (`claimbench
    device-run --compile-only`)."""
    from dataclasses import asdict

    from claimbench.impl import triton_support
    rows, seen = [], set()
    for where, call in _launch_sites(sizes, e8_sizes):
        try:
            with triton_support.compile_only(arch) as compiled:
                call()
        except Exception as e:
            progress(traceback.format_exc())
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            rows.append({"where": where, "kernel": "", "error": f"{type(e).__name__}: {lines[-1] if lines else ''}"})
            progress(f"compile check: {where}: failed ({rows[-1]['error']})")
            continue
        new = [kernel for kernel in compiled if kernel.hash not in seen]
        seen.update(kernel.hash for kernel in new)
        for kernel in new:
            used = triton_support.resources(kernel)
            rows.append({"where": where, **asdict(used), "error": used.too_big(arch)})
        progress(f"compile check: {where}: {len(compiled)} kernel(s) compiled for sm_{arch}, {len(new)} new")
    return rows


def machine_name() -> str:
    gpu = environment.gpu_info()["gpu"]
    return "gpu-" + "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-") if gpu else socket.gethostname()


def _machine_info(name: str) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {"machine": name, "os": f"{platform.system()} {platform.release()}", "arch": platform.machine(),
            "cpu": cpu, "num_cpu": str(os.cpu_count()), "ram": str(ram)}


def _commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "0" * 40  # a copy without git history (a device machine's working tree may have none)


def _guarded(bench: str, measure, progress) -> dict:
    """measure(), or {} with its traceback in the log: a benchmark that breaks on this device is left
    out, and the others' minutes of device time still land in the results."""
    try:
        return measure()
    except Exception:
        progress(f"device-run: {bench}: failed, left out of the results\n{traceback.format_exc()}")
        return {}


def run(out: Path, dry_run: bool = False, machine: str | None = None, root: Path = REPO_ROOT,
        progress=print, commit: str | None = None) -> Path:
    """Run every device benchmark this machine can; write DIR/<machine>/ as ingest reads it. commit:
    what the results are filed under (default: the repository's HEAD, where it has its git history)."""
    if dry_run:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("--dry-run runs Triton's interpreter, which must be chosen before triton is "
                               "imported: run it in a fresh process (claimbench device-run --dry-run)")
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module imports triton
    import torch
    device = "cpu" if dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("claimbench device-run: no CUDA device here (torch.cuda.is_available() is False); "
                         "use --dry-run to check the output format on the CPU")
    name = machine or ("dry-run-" + socket.gethostname() if dry_run else machine_name())
    commit, mode = commit or _commit(root), "dry-run" if dry_run else "full"
    machine_dir = out / name
    evidence_path = machine_dir / f"{commit[:8]}{evidence.SUFFIX}"
    if evidence_path.exists():
        evidence_path.unlink()  # this run's intervals only
    for item in plan(device):
        progress(f"device-run: {item.benchmark}: {item.what}" if item.runnable else
                 f"device-run: {item.benchmark}: skipped ({item.why_not})")
    started = time.time()
    decode = _guarded("gpu.SsaDecode", lambda: ssa_decode(device, DRY if dry_run else FULL, progress), progress)
    matmuls = _guarded("gpu.Sparse24Matmul",
                       lambda: sparse24_matmul(device, SPARSE24_DRY if dry_run else SPARSE24, progress), progress)
    e8 = _guarded("gpu.E8Matmul", lambda: e8_matmul(device, E8_DRY if dry_run else E8, progress), progress)
    contexts = sorted(decode)
    bench = "gpu.SsaDecode"
    ok = {n: decode[n]["max_error"] <= GATE_TOLERANCE for n in contexts}  # a failed gate: no ratio, recorded failed
    decode_rows = {"speedup_vs_dense": ("speedup", "x"), "step_speedup_vs_dense": ("step_speedup", "x"),
                   "dense_seconds": ("dense_s", "seconds"), "sparse_seconds": ("sparse_s", "seconds"),
                   "step_seconds": ("step_s", "seconds"), "step_torch_ops_seconds": ("step_torch_ops_s", "seconds")}

    def shown(row, n):  # a speedup counts only where the kernel passed its gate
        return ok[n] or decode_rows[row][1] != "x"
    for n in contexts:
        for row, (field, _) in decode_rows.items():
            if shown(row, n):
                evidence.record(f"{bench}.track_{row}", {"context": n}, decode[n][field], evidence_path)
    columns = {**(_matmul_columns("gpu.Sparse24Matmul", matmuls, SPARSE24_KERNELS, evidence_path, progress)
                  if matmuls else {}),
               **(_matmul_columns("gpu.E8Matmul", e8, E8_KERNELS, evidence_path, progress) if e8 else {})}
    for row, (field, unit) in decode_rows.items() if contexts else ():
        columns[f"{bench}.track_{row}"] = (["context"], [contexts], [
            decode[n][field].value if shown(row, n) else None for n in contexts], unit)
    if contexts:
        columns[f"{bench}.track_max_error_vs_reference"] = (
            ["context"], [contexts], [decode[n]["max_error"] for n in contexts], "relative error")
    path = asvfiles.write_run(out, name, commit, int(started * 1000), columns,
                              env_name=f"device-py{sys.version_info[0]}.{sys.version_info[1]}",
                              machine_info=_machine_info(name), python=platform.python_version())
    environment.write_sidecar(machine_dir)
    environment.write_run_record(machine_dir, commit, mode, {environment.DEVICE_SUITE: {}})
    progress(f"device-run: wrote {path} in {time.time() - started:.0f}s; bring {out} back and run "
             f"`claimbench ingest {out}`")
    return path



def _map_folders() -> None:
    """Where claimbench is not installed (a bare copy), find claimbench.impl, .baselines and .datasets
    in the repository's top-level folders, as the installed package-dir mapping does."""
    import importlib.util

    import claimbench
    if importlib.util.find_spec("claimbench.impl") is None:
        claimbench.__path__.append(str(Path(claimbench.__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="claimbench device-run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder for the results (brought back and ingested)")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: check the format, spend no GPU time")
    ap.add_argument("--compile-only", action="store_true", help="compile every kernel of the run for the GPU "
                    "(--arch) here, launch nothing, write nothing: no GPU needed")
    ap.add_argument("--arch", type=int, default=90, help="compute capability --compile-only compiles for "
                    "(default 90: H100, H200)")
    ap.add_argument("--machine", help="machine name (default: gpu-<GPU name>)")
    ap.add_argument("--commit", help="commit the results are filed under (default: git HEAD; a copy of the "
                    "working tree without its history needs it)")
    args = ap.parse_args(argv)
    _map_folders()
    if args.compile_only:
        rows = compile_check(args.arch)
        print(_compile_table(rows, args.arch))
        return 1 if any(row["error"] for row in rows) else 0
    if args.out is None:
        ap.error("--out is required (or --compile-only)")
    run(args.out, dry_run=args.dry_run, machine=args.machine, commit=args.commit)
    return 0


def _compile_table(rows: list[dict], arch: int) -> str:
    """compile_check's rows as text: per kernel its variants (specializations, autotuned configs) and the
    most any of them asks for; per launch site that failed, why."""
    import triton
    header = ("kernel", "variants", "warps", "shared KiB (max)", "registers (max)", "local bytes (max)", f"sm_{arch}")
    body = []
    for name in dict.fromkeys(row["kernel"] for row in rows if row["kernel"]):
        variants = [row for row in rows if row["kernel"] == name]
        most = {field: max((row[field] for row in variants if row[field] is not None), default=None)
                for field in ("shared_bytes", "registers", "local_bytes")}
        errors = [row["error"] for row in variants if row["error"]]
        body.append((name, str(len(variants)), ",".join(sorted({str(row["num_warps"]) for row in variants})),
                     f"{most['shared_bytes'] / 1024:.1f}",
                     *("?" if most[field] is None else str(most[field]) for field in ("registers", "local_bytes")),
                     f"{len(errors)} too big: {errors[0]}" if errors else "ok"))
    body += [(f"({row['where']})", "", "", "", "", "", row["error"]) for row in rows if not row["kernel"]]
    widths = [max(len(cells[i]) for cells in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip() for cells in (header, *body)]
    failed = sum(bool(row["error"]) for row in rows)
    return "\n".join([f"triton {triton.__version__}, every kernel of the device run compiled for sm_{arch}:", *lines,
                      f"{failed} failed" if failed else f"all {len(rows)} variants compiled and fit sm_{arch}"])


if __name__ == "__main__":
    sys.exit(main())
