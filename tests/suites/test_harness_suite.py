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
    rows = device.matmul_rows("cpu", {"shapes": {"toy": (32, 64)}, "tokens": [4], "rounds": 2, "calls": 1},
                              lambda rows, cols, generator, where: {
                                  "fp16": ((lambda x, w=torch.ones(rows, cols): x @ w.T), torch.ones(rows, cols)),
                                  "refused": (None, "needs CUDA")}, "toy")
    row = rows["toy", 4]
    assert row["fp16"]["error"] == 0 and row["fp16"]["speedup"].value == 1.0 and row["refused"] == {"skipped": "needs CUDA"}


def test_a_paired_kernel_gets_its_time_over_its_partners_per_round_at_the_paired_shapes_only():
    import torch
    weight = torch.ones(32, 64)

    def kernels(rows, cols, generator, where):
        return {"fp16": ((lambda x: x @ weight.T), weight),
                "twice": ((lambda x: (x @ weight.T + x @ weight.T) / 2), weight)}
    sizes = {"shapes": {"paired": (32, 64), "other": (32, 64)}, "tokens": [4], "rounds": 3, "calls": 1}
    rows = device.matmul_rows("cpu", sizes, kernels, "toy", pairs={"twice": "fp16"}, pair_shapes=("paired",))
    slowdown = rows["paired", 4]["twice"]["slowdown_vs_tier_lower"]
    assert len(slowdown.samples) == 3 and slowdown.low <= slowdown.value <= slowdown.high
    assert "slowdown_vs_tier_lower" not in rows["other", 4]["twice"] and "slowdown_vs_tier_lower" not in rows[
        "paired", 4]["fp16"]


def test_the_fp8_row_runs_on_the_cpu_within_the_error_bound():
    rows = device.sparse24_matmul("cpu", {"shapes": {"toy": (64, 128)}, "tokens": [16], "rounds": 2, "calls": 1},
                                  progress=lambda line: None)["toy", 16]
    assert rows["fp8"]["error"] < device.MATMUL_MAX_ERROR and "seconds" in rows["fp8"]  # activations' e4m3 rounding
    assert rows["2:4-fp16"] == {"skipped": "needs CUDA"}
    assert not any("slowdown_vs_tier_lower" in row for row in rows.values())


def test_each_gpu_measurement_has_its_own_setup_cache_and_the_tier_lower_rows_share_the_2_4_one():
    """asv keys setup_cache by module and line and hands one key's result to every class that has it."""
    from asv_runner.benchmarks._base import get_setup_cache_key
    keys = {cls: get_setup_cache_key(cls.setup_cache) for cls in (gpu.Sparse24Matmul, gpu.Sparse24VsTierLower,
                                                                  gpu.E8Matmul, gpu.SsaDecode)}
    assert keys[gpu.Sparse24Matmul] == keys[gpu.Sparse24VsTierLower]
    assert len({keys[gpu.Sparse24Matmul], keys[gpu.E8Matmul], keys[gpu.SsaDecode]}) == 3
    with pytest.raises(SkipNotImplemented, match="needs a CUDA GPU"):
        gpu.Sparse24VsTierLower().track_slowdown({}, "llama8b-ffn-up", 16, "2:4-fp16")


def test_planted_alert_outcomes_are_rates_with_intervals():
    out = harness.planted_outcomes("flat", 0.5, "higher", trials=12)
    assert out["recall"].value == 1.0 and out["recall"].n == 12 and out["false"].value == 0.0
