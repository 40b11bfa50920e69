"""The harness suite's rows where an optional part is missing: one skip line, never a traceback."""
import pytest
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import appserver
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


def test_planted_alert_outcomes_are_rates_with_intervals():
    out = harness.planted_outcomes("flat", 0.5, "higher", trials=12)
    assert out["recall"].value == 1.0 and out["recall"].n == 12 and out["false"].value == 0.0
