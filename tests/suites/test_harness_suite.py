"""The harness suite's rows where an optional part is missing: one skip line, never a traceback."""
import pytest
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import appserver, device
from claimbench.suites import gpu, harness


def test_first_paint_without_chromium_is_one_skip_line(monkeypatch):
    monkeypatch.setattr(appserver, "CHROMIUM", "/nonexistent/chromium")
    suite = harness.ClaimsFirstPaint()
    r = suite.setup_cache()  # no exception: asv prints a traceback for a setup_cache that raises
    with pytest.raises(SkipNotImplemented, match="apt-get install chromium"):
        suite.track_first_paint_cold_server(r)


def test_gpu_rows_without_a_gpu_are_one_skip_line(monkeypatch):
    monkeypatch.setattr(gpu, "_cuda", lambda: False)
    suite = gpu.SsaDecode()
    r = suite.setup_cache()
    with pytest.raises(SkipNotImplemented, match="needs a CUDA GPU"):
        suite.track_speedup_vs_dense(r, 32_768)
    for matmuls in (gpu.Sparse24Matmul(), gpu.E8Matmul()):
        with pytest.raises(SkipNotImplemented, match="needs a CUDA GPU"):
            matmuls.track_seconds(matmuls.setup_cache(), "smollm2-ffn-up", 16, "fp16")


def test_matmul_rows_on_the_cpu_time_every_kernel_the_device_allows():
    """The E8 rows' kernels on the CPU under Triton's interpreter are only for the dry run (a subprocess,
    tests/claimbench/test_device.py); here dense fp16 alone, through the shared row logic."""
    import torch
    rows = device.matmul_rows("cpu", {"shapes": {"toy": (32, 64)}, "tokens": [4], "rounds": 2},
                              lambda rows, cols, generator, where: {
                                  "fp16": ((lambda x, w=torch.ones(rows, cols): x @ w.T), torch.ones(rows, cols)),
                                  "refused": (None, "needs CUDA")}, "toy")
    row = rows["toy", 4]
    assert row["fp16"]["error"] == 0 and row["fp16"]["speedup"].value == 1.0 and row["refused"] == {"skipped": "needs CUDA"}


def test_planted_alert_outcomes_are_rates_with_intervals():
    out = harness.planted_outcomes("flat", 0.5, "higher", trials=12)
    assert out["recall"].value == 1.0 and out["recall"].n == 12 and out["false"].value == 0.0
