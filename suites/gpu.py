"""GPU benchmarks: on a machine with asv and a CUDA GPU, asv runs them here; on a lent GPU machine
without asv, `claimbench device-run` runs the same measurements (claimbench/device.py, where each is
described) and writes the same rows. Elsewhere `make run` and `claimbench run` skip the suite with one line
(REQUIRES), and asv on its own (or `claimbench run --bench gpu`) skips every row, saying why.
"""
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import device, evidence, metrics

from . import common

INPUTS = ()  # generated tensors only
REQUIRES = ("gpu",)  # as papers.toml's requires: without one, claimbench run skips the suite (claimbench.runner)
QUICK_BUDGET_S = 150  # seconds in quick mode on 2 cores (120 s in a fresh clone's make run)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class SsaDecode:
    params = (device.FULL["contexts"],)
    param_names = ["context"]
    timeout = 1800

    def setup_cache(self):
        if not _cuda():
            return {}  # (asv passes no cache at all for None)
        return device.ssa_decode("cuda", device.FULL)

    def _point(self, r, context):
        if not r:
            raise SkipNotImplemented("needs a CUDA GPU (torch.cuda.is_available() is False here); on a lent GPU "
                                     "machine run python -m claimbench.device --out OUT")
        return r[context]

    def _gated(self, r, context, field):
        point = self._point(r, context)
        common.check_gate("gpu.SsaDecode.track_step_speedup_vs_dense", point["max_error"],
                          f"the kernel differs from the reference by {point['max_error']:.3g}")
        return point[field]

    @evidence.estimate
    def track_speedup_vs_dense(self, r, context):
        """The sparse kernel alone (a fixed selection) against dense."""
        return self._gated(r, context, "speedup")
    track_speedup_vs_dense.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_step_speedup_vs_dense(self, r, context):
        """A whole SSA decode step (selection from the PQ proxy, then the kernel) against dense."""
        return self._gated(r, context, "step_speedup")
    track_step_speedup_vs_dense.unit = metrics.SPEEDUP.unit

    def track_max_error_vs_reference(self, r, context):
        return self._point(r, context)["max_error"]
    track_max_error_vs_reference.unit = metrics.RELATIVE_ERROR.unit

    @evidence.estimate
    def track_dense_seconds(self, r, context):
        return self._point(r, context)["dense_s"]
    track_dense_seconds.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_sparse_seconds(self, r, context):
        return self._point(r, context)["sparse_s"]
    track_sparse_seconds.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_step_seconds(self, r, context):
        return self._point(r, context)["step_s"]
    track_step_seconds.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_step_torch_ops_seconds(self, r, context):
        """The same step with the selection as torch ops (impl.ssa.ssa_select_pq) instead of Triton's."""
        return self._point(r, context)["step_torch_ops_s"]
    track_step_torch_ops_seconds.unit = metrics.SECONDS.unit


class _MatmulRows:
    """Rows of a device.matmul_rows result by (shape, tokens, kernel). Each measuring class has a setup_cache
    of its own line: asv keys setup_cache by module and line, and one key's result serves every class."""
    param_names = ["shape", "tokens", "kernel"]
    timeout = 1800
    measure = sizes = None

    def _measured(self):
        if not _cuda():
            return {}
        return type(self).measure("cuda", self.sizes)

    def _row(self, r, shape, tokens, kernel, field):
        if not r:
            raise SkipNotImplemented("needs a CUDA GPU (torch.cuda.is_available() is False here); on a lent GPU "
                                     "machine run python -m claimbench.device --out OUT")
        row = r[shape, tokens][kernel]
        if field not in row:
            raise SkipNotImplemented(row.get("skipped") or f"{kernel} erred by {row['error']:.3g} (over "
                                     f"{device.MATMUL_MAX_ERROR}): no speed row")
        return row[field]


class _MatmulTracks(_MatmulRows):
    """Per (shape, tokens, kernel): speedup vs fp16, seconds, relative error."""

    @evidence.estimate
    def track_speedup_vs_fp16(self, r, shape, tokens, kernel):
        return self._row(r, shape, tokens, kernel, "speedup")
    track_speedup_vs_fp16.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_seconds(self, r, shape, tokens, kernel):
        return self._row(r, shape, tokens, kernel, "seconds")
    track_seconds.unit = metrics.SECONDS.unit

    def track_relative_error(self, r, shape, tokens, kernel):
        return self._row(r, shape, tokens, kernel, "error")
    track_relative_error.unit = metrics.RELATIVE_ERROR.unit


class Sparse24Matmul(_MatmulTracks):
    """2:4 vs dense matmuls at fp16, fp8, int8 and weight-only int4 (claimbench/device.py describes them)."""
    params = (list(device.SPARSE24["shapes"]), device.SPARSE24["tokens"], device.SPARSE24_KERNELS)
    measure, sizes = staticmethod(device.sparse24_matmul), device.SPARSE24

    def setup_cache(self):
        return self._measured()


class Sparse24VsTierLower(_MatmulRows):
    """A 2:4 kernel's time over dense one precision tier lower (device.TIER_LOWER), per round, at the
    paper's scale; the measurement is Sparse24Matmul's (the same setup_cache)."""
    params = (list(device.TIER_LOWER_SHAPES), device.SPARSE24["tokens"], list(device.TIER_LOWER))
    measure, sizes = staticmethod(device.sparse24_matmul), device.SPARSE24
    setup_cache = Sparse24Matmul.setup_cache

    @evidence.estimate
    def track_slowdown(self, r, shape, tokens, kernel):
        return self._row(r, shape, tokens, kernel, "slowdown_vs_tier_lower")
    track_slowdown.unit = metrics.SPEEDUP.unit


class E8Matmul(_MatmulTracks):
    """E8 codes decoded inside a Triton matmul vs fp16 cuBLAS (claimbench/device.py describes them)."""
    params = (list(device.E8["shapes"]), device.E8["tokens"], device.E8_KERNELS)
    measure, sizes = staticmethod(device.e8_matmul), device.E8

    def setup_cache(self):
        return self._measured()
