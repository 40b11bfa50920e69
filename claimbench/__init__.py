"""claimbench: does an ML-systems paper's claimed speedup hold on your hardware, at equal quality?"""
import os
import sys

__version__ = "0.1.0"


def _full_vector_width() -> None:
    """Let numba vectorize with the CPU's full 512-bit registers. LLVM's tuning for Intel server cores
    (`prefer-256-bit`) keeps its loop vectorizer at 256 bits even where AVX-512 is there; Lychee's bound pass
    is elementwise arithmetic over many members and runs about 1.2x faster at full width on the reference
    Xeon. faiss's AVX-512 build uses the full width, so both sides then do. numba fixes its target when it
    is imported: this works only before that, and never overrides a NUMBA_CPU_FEATURES the user set."""
    if "numba" in sys.modules or "NUMBA_CPU_FEATURES" in os.environ:
        return
    try:
        import llvmlite.binding as llvm
    except ImportError:
        return
    features = llvm.get_host_cpu_features()
    if features.get("avx512f"):
        os.environ["NUMBA_CPU_FEATURES"] = features.flatten() + ",-prefer-256-bit"


_full_vector_width()
