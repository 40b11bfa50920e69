"""The device run's dry run (CPU, Triton's interpreter): its output is what ingest takes, and it runs
from a bare copy of the repository, as on a lent GPU machine where nothing is installed."""
import json
import os
import subprocess
import sys

import pytest

from claimbench import device, environment, ingest, registry, store, verdicts

pytest.importorskip("triton")


def test_dry_run_writes_results_ingest_takes_with_gpu_fields(tmp_path):
    cli = [sys.executable, "-m", "claimbench.cli", "device-run", "--dry-run", "--out", str(tmp_path / "out"),
           "--machine", "dry-box"]  # a process of its own: the interpreter is chosen before triton loads
    done = subprocess.run(cli, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    machine_dir = tmp_path / "out" / "dry-box"
    record = json.loads(next(machine_dir.glob(f"*{environment.RECORD_SUFFIX}")).read_text())
    assert record["mode"] == "dry-run" and record["inputs"] == {"gpu": {}}
    env = json.loads((machine_dir / environment.SIDECAR).read_text())
    assert {"gpu", "gpu_count", "driver", "cuda", "libraries"} <= set(env)
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([tmp_path / "out"], db=db)
    assert report.ok and report.added == 1, report.summary()
    with store.connect(db) as con:
        rows = con.execute("""SELECT x.benchmark, x.value, x.low, x.high, r.mode FROM results x JOIN runs r
                              USING (run_id) WHERE x.benchmark = 'gpu.SsaDecode.track_step_speedup_vs_dense'""").fetchall()
        gpu, count = con.execute("SELECT gpu, gpu_count FROM machines WHERE machine = 'dry-box'").fetchone()
        latest = [v for v in verdicts.compute(con, registry.load()) if v.claim.key == "ssa/decode-speedup-1m"]
        e8 = con.execute("""SELECT x.params, x.value FROM results x WHERE x.benchmark = 'gpu.E8Matmul.track_relative_error'
                            AND x.value IS NOT NULL""").fetchall()
    assert len(rows) == len(device.DRY["contexts"]) and all(low <= v <= high for _, v, low, high, _ in rows)
    assert {m for *_, m in rows} == {"dry-run"} and (gpu, count) == (None, 0)
    assert {v.verdict for v in latest} == {verdicts.NOT_TESTABLE}  # a dry run on a CPU measures no GPU claim
    kernels = {json.loads(params)["kernel"] for params, _ in e8}
    assert kernels == set(device.E8_KERNELS) and all(error < 1e-4 for _, error in e8)  # fp32 on the CPU


def test_the_dry_run_runs_from_a_bare_copy(tmp_path):
    """Without claimbench installed: the editable install's finder removed, the copy on sys.path."""
    clone = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(registry.REPO_ROOT), str(clone)], check=True)
    for folder in ("claimbench", "impl", "baselines", "datasets", "suites"):  # the working tree, as a device gets it
        subprocess.run(["cp", "-rT", str(registry.REPO_ROOT / folder), str(clone / folder)], check=True)
    script = "\n".join([
        "import runpy, sys",
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]",
        "sys.modules['numba'] = None  # the device image has no numba",
        f"sys.path.insert(0, {str(clone)!r})",
        f"sys.argv = ['device', '--dry-run', '--out', {str(tmp_path / 'o')!r}, '--machine', 'bare']",
        "try:",
        "    runpy.run_module('claimbench.device', run_name='__main__')",
        "except SystemExit as e:",
        "    assert not e.code, e.code",
        "print(sys.modules['claimbench.impl.sparse_decode_triton'].__file__)"])
    out = subprocess.run([sys.executable, "-c", script], cwd=clone, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "wrote" in out.stdout and list((tmp_path / "o" / "bare").glob("*-device-py*.json"))
    assert out.stdout.strip().splitlines()[-1] == str(clone / "impl" / "sparse_decode_triton.py")  # the copy's code


def test_a_benchmark_that_breaks_is_left_out_with_its_traceback_and_the_rest_still_land():
    lines = []

    def breaks():
        raise RuntimeError("no kernel image for this architecture")
    assert device._guarded("gpu.E8Matmul", breaks, lines.append) == {}
    assert "gpu.E8Matmul: failed" in lines[0] and "no kernel image" in lines[0]
    assert device._guarded("gpu.SsaDecode", lambda: {1024: "row"}, lines.append) == {1024: "row"} and len(lines) == 1


FALLBACK = """
import torch
from claimbench import device
from claimbench.impl import ssa_select_triton

def fails(*args, **kwargs):
    raise RuntimeError("no kernel image for this architecture")

def keeps_token_zero(buckets, q, m, gen=None):
    return torch.zeros(buckets.order.shape[0], m, dtype=torch.int64), torch.zeros(buckets.order.shape[0], m)
sizes = {**device.DRY, "contexts": [1024], "rounds": 2}
for replacement, why in ((fails, "the Triton one it failed: RuntimeError"),
                         (keeps_token_zero, "the Triton one its certainty stratum differed on")):
    ssa_select_triton.ssa_select_pq_triton = replacement
    point = device.ssa_decode("cpu", sizes, progress=print)[1024]
    assert f"torch-ops selection ({why}" in point["step_s"].method, point["step_s"].method
    assert point["max_error"] <= device.GATE_TOLERANCE
print("ok")
"""


def test_a_triton_selection_that_fails_or_keeps_other_tokens_leaves_the_step_to_the_torch_ops_one_labelled():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
    assert "no kernel image" in out.stdout and out.stdout.count("the step uses the torch-ops selection") == 2
