"""`claimbench device-run --out DIR`: every benchmark that needs a GPU, as one prepared command for a
GPU machine lent for minutes (its image has torch, triton, cupy and numpy; no asv, DuckDB, faiss or
package registry). Writes asv-format results under DIR/<machine>/ with the environment record (GPU
name, driver, CUDA, library versions), the run record and the evidence (intervals), so that
`claimbench ingest DIR` here takes them; it commits nothing. Imports only torch, triton and numpy.

The benchmarks are those of `suites/gpu.py` (asv runs that suite where asv and a GPU both are; each
paper with a GPU part adds its measurement here and its rows there), under the same names:
- `gpu.SsaDecode` (PAPERS.md A2, claim decode-speedup-1m): the Triton sparse decode kernel over
  the n / 50 selected tokens (50x sparsity) vs torch SDPA dense decode over all n, for one decode
  step of one layer at 32K-1M context, with Llama-3-8B's attention shape (32 query heads, 8 KV
  heads, head dim 128, bf16); interleaved rounds timed with CUDA events; gated on the kernel
  matching the torch reference (fp32) on the same inputs. Measured instead of the paper's setup:
  the attention kernel alone; the selection (proxy scores over all n keys) is not in the time, and
  the baseline is torch's SDPA, not FlashInfer.
- Lychee vs IVF-Flat on the GPU needs faiss-gpu, which the image lacks: listed as skipped.
`--dry-run` runs the same code on the CPU under Triton's interpreter at toy sizes, writing a valid
result file (mode `dry-run`), so the format is proven before any GPU time is spent.
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
from dataclasses import dataclass
from pathlib import Path

from . import asvfiles, environment, evidence, intervals, registry
from .registry import REPO_ROOT

SPARSITY = 50
FULL = {"contexts": [32_768, 131_072, 524_288, 1_048_576], "heads": 32, "kv_heads": 8, "head_dim": 128, "rounds": 15}
DRY = {"contexts": [1024, 2048], "heads": 4, "kv_heads": 2, "head_dim": 64, "rounds": 6}
# max |kernel - fp32 reference| on bf16 inputs (the dry run's fp32: far below), from the claim's gate
GATE_TOLERANCE = registry.load().gate_of("gpu.SsaDecode.track_speedup_vs_dense").max
BUDGET_S = 8 * 60  # every GPU benchmark together, within a lent machine's minutes


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
    return [Planned("gpu.SsaDecode", "Triton sparse decode (n/50 tokens) vs torch SDPA dense decode, "
                    "32K-1M context" if device == "cuda" else "the same at toy sizes on the CPU (interpreter)", True),
            Planned("gpu.LycheeSearch", "Lychee vs faiss IVF-Flat on the GPU", gpu_faiss,
                    "" if gpu_faiss else "faiss with GPU support is not installed on this machine")]


def _timer(device: str):
    import torch
    if device == "cuda":
        def timed(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timed(fn):
            begin = time.perf_counter()
            fn()
            return time.perf_counter() - begin
    return timed


def ssa_decode(device: str, sizes: dict, progress=print, budget_s: float = BUDGET_S) -> dict[int, dict]:
    """Per context: the speedup estimate (per-round dense time / sparse time), both times and the
    kernel's max error against the fp32 torch reference. Contexts are measured smallest first; once
    budget_s is spent the larger ones are left out, and a line says which."""
    started = time.monotonic()
    import torch
    import torch.nn.functional as F

    from claimbench.llm.sparse import weighted_attention
    from claimbench.impl.sparse_decode_triton import sparse_decode_attention
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)  # made where used: 1M tokens of K and V are GBs
    H, hkv, d = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    timed = _timer(device)
    out = {}
    for n in sizes["contexts"]:
        if time.monotonic() - started > budget_s:
            progress(f"  ssa decode: {budget_s:.0f} s spent; left out {[c for c in sizes['contexts'] if c >= n]}")
            break
        m = max(n // SPARSITY, 16)
        q, k, v = (torch.randn(shape, generator=gen, device=device, dtype=dtype)
                   for shape in ((1, H, 1, d), (1, hkv, n, d), (1, hkv, n, d)))
        index = torch.stack([torch.randperm(n, generator=gen, device=device)[:m].sort().values for _ in range(hkv)])
        log_w = torch.rand(hkv, m, generator=gen, device=device).log()
        reference = weighted_attention(q.float(), k.float(), v.float(), index, log_w)
        error = float((sparse_decode_attention(q, k, v, index, log_w).float() - reference).abs().max())
        sparse = lambda: sparse_decode_attention(q, k, v, index, log_w)  # noqa: E731
        dense = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        for fn in (sparse, dense):  # warm up: compile, caches
            fn()
        times = {"dense": [], "sparse": []}
        for _ in range(sizes["rounds"]):
            times["dense"].append(timed(dense))
            times["sparse"].append(timed(sparse))
        out[n] = {"speedup": intervals.ratio_of_rounds(times["dense"], times["sparse"]),
                  "dense_s": intervals.median_of(times["dense"]), "sparse_s": intervals.median_of(times["sparse"]),
                  "max_error": error}
        progress(f"  ssa decode at {n:,} tokens: dense {out[n]['dense_s'].value * 1e6:.1f} us, sparse "
                 f"{out[n]['sparse_s'].value * 1e6:.1f} us, {out[n]['speedup'].text()}x, max error {error:.2e}")
    return out


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


def run(out: Path, dry_run: bool = False, machine: str | None = None, root: Path = REPO_ROOT,
        progress=print) -> Path:
    """Run every device benchmark this machine can; write DIR/<machine>/ as ingest reads it."""
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
    commit, mode = _commit(root), "dry-run" if dry_run else "full"
    machine_dir = out / name
    evidence_path = machine_dir / f"{commit[:8]}{evidence.SUFFIX}"
    if evidence_path.exists():
        evidence_path.unlink()  # this run's intervals only
    for item in plan(device):
        progress(f"device-run: {item.benchmark}: {item.what}" if item.runnable else
                 f"device-run: {item.benchmark}: skipped ({item.why_not})")
    started = time.time()
    decode = ssa_decode(device, DRY if dry_run else FULL, progress)
    contexts = sorted(decode)
    bench = "gpu.SsaDecode"
    ok = {n: decode[n]["max_error"] <= GATE_TOLERANCE for n in contexts}  # a failed gate: no ratio, recorded failed
    for n in contexts:
        params = {"context": n}
        if ok[n]:
            evidence.record(f"{bench}.track_speedup_vs_dense", params, decode[n]["speedup"], evidence_path)
        evidence.record(f"{bench}.track_dense_seconds", params, decode[n]["dense_s"], evidence_path)
        evidence.record(f"{bench}.track_sparse_seconds", params, decode[n]["sparse_s"], evidence_path)
    path = asvfiles.write_run(out, name, commit, int(started * 1000), {
        f"{bench}.track_speedup_vs_dense": (["context"], [contexts],
                                            [decode[n]["speedup"].value if ok[n] else None for n in contexts], "x"),
        f"{bench}.track_max_error_vs_reference": (["context"], [contexts], [decode[n]["max_error"] for n in contexts],
                                                  "relative error"),
        f"{bench}.track_dense_seconds": (["context"], [contexts], [decode[n]["dense_s"].value for n in contexts],
                                         "seconds"),
        f"{bench}.track_sparse_seconds": (["context"], [contexts], [decode[n]["sparse_s"].value for n in contexts],
                                          "seconds"),
    }, env_name=f"device-py{sys.version_info[0]}.{sys.version_info[1]}", machine_info=_machine_info(name),
        python=platform.python_version())
    environment.write_sidecar(machine_dir)
    environment.write_run_record(machine_dir, commit, mode, {"gpu": {}})
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
    ap.add_argument("--out", required=True, type=Path, help="folder for the results (brought back and ingested)")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: check the format, spend no GPU time")
    ap.add_argument("--machine", help="machine name (default: gpu-<GPU name>)")
    args = ap.parse_args(argv)
    _map_folders()
    run(args.out, dry_run=args.dry_run, machine=args.machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
