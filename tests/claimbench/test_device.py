"""The device run's dry run (CPU, Triton's interpreter): its output is what ingest takes, and it runs
from a bare copy of the repository, as on a lent GPU machine where nothing is installed. Its compile
check: every kernel compiled for an H200 here, with no GPU, and what it does when one does not compile."""
import json
import os
import subprocess
import sys

import pytest

from claimbench import cli, device, environment, evidence, ingest, registry, store, verdicts
from claimbench.impl import triton_support

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def bare_dry_run(tmp_path_factory):
    """The dry run from a bare copy, as on a lent GPU machine: claimbench not installed (the editable install's
    finder removed, the copy on sys.path), no numba; in a process of its own, so the interpreter is chosen
    before triton loads. Returns (the folder it wrote, the copy, its stdout)."""
    tmp_path = tmp_path_factory.mktemp("bare")
    clone = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(registry.REPO_ROOT), str(clone)], check=True)
    for folder in ("claimbench", "impl", "baselines", "datasets", "suites"):  # the working tree, as a device gets it
        subprocess.run(["cp", "-rT", str(registry.REPO_ROOT / folder), str(clone / folder)], check=True)
    script = "\n".join([
        "import runpy, sys",
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]",
        "sys.modules['numba'] = None  # the device image has no numba",
        f"sys.path.insert(0, {str(clone)!r})",
        f"sys.argv = ['device', '--dry-run', '--out', {str(tmp_path / 'out')!r}, '--machine', 'dry-box']",
        "try:",
        "    runpy.run_module('claimbench.device', run_name='__main__')",
        "except SystemExit as e:",
        "    assert not e.code, e.code",
        "print(sys.modules['claimbench.impl.sparse_decode_triton'].__file__)"])
    out = subprocess.run([sys.executable, "-c", script], cwd=clone, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return tmp_path / "out", clone, out.stdout


def test_the_dry_run_runs_from_a_bare_copy(bare_dry_run):
    out, clone, stdout = bare_dry_run
    assert "wrote" in stdout and list((out / "dry-box").glob("*-device-py*.json"))
    assert stdout.strip().splitlines()[-1] == str(clone / "impl" / "sparse_decode_triton.py")  # the copy's code


def test_dry_run_writes_results_ingest_takes_with_gpu_fields(bare_dry_run, tmp_path):
    out, _, _ = bare_dry_run
    machine_dir = out / "dry-box"
    record = json.loads(next(machine_dir.glob(f"*{environment.RECORD_SUFFIX}")).read_text())
    assert record["mode"] == "dry-run" and record["inputs"] == {"gpu": {}}
    env = json.loads((machine_dir / environment.SIDECAR).read_text())
    assert {"gpu", "gpu_count", "driver", "cuda", "libraries"} <= set(env)
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([out], db=db)
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


def test_the_command_line_passes_its_options_to_the_device_run(monkeypatch, tmp_path):
    """`claimbench device-run` is the device module's own command line (the dry run above runs that module)."""
    calls = []
    monkeypatch.setattr(device, "run", lambda out, **options: calls.append((out, options)))
    assert cli.main(["device-run", "--dry-run", "--out", str(tmp_path), "--machine", "m", "--commit", "c0ffee"]) == 0
    assert calls == [(tmp_path, {"dry_run": True, "machine": "m", "commit": "c0ffee"})]


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


def _compiler_env(tmp_path) -> dict:
    """A process that compiles (no interpreter) into a cache of its own, so each kernel is really compiled."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    return {**env, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}


def _needs_nvidia_backend():
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip("this triton has no NVIDIA backend to compile with")


COMPILE_CHECK = """
import json
from claimbench import device
rows = device.compile_check(90, {**device.FULL, "contexts": [1_048_576]},
                            {"shapes": {"llama8b-ffn-up": device.E8["shapes"]["llama8b-ffn-up"]}, "tokens": [1]},
                            progress=lambda line: None)
print(json.dumps(rows))
"""


def test_every_kernel_of_the_device_run_compiles_for_an_h200_here_without_one(tmp_path):
    _needs_nvidia_backend()
    out = subprocess.run([sys.executable, "-c", COMPILE_CHECK], env=_compiler_env(tmp_path), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert {row["kernel"] for row in rows} == {"_codes_kernel", "_draw_kernel", "_dedupe_kernel",
                                               "_sparse_decode_chunk", "_merge_chunks", "_e8_matmul"}
    assert not [row for row in rows if row["error"]], rows
    assert all(row["registers"] and row["local_bytes"] is not None for row in rows)  # read from each cubin
    assert sum(row["kernel"] == "_e8_matmul" for row in rows) > 1  # each config the autotuner keeps
    codes = next(row for row in rows if row["kernel"] == "_codes_kernel")
    assert codes["num_warps"] == 8 and codes["where"] == "gpu.SsaDecode at 1,048,576 tokens"


BROKEN = """
import json
import torch
import triton
import triton.language as tl
from claimbench import device

@triton.jit
def doubled(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, tl.load(X + offs) * 2)

@triton.jit
def broken(X, N: tl.constexpr):
    offs = tl.arange(0, N)  # N = 3: arange needs a power of two
    tl.store(X + offs, tl.load(X + offs) * 2)
x = torch.empty(64)
device._launch_sites = lambda sizes, e8_sizes: [("a fine site", lambda: doubled[(1,)](x, N=64)),
                                                ("a broken site", lambda: broken[(1,)](x, N=3))]
print(json.dumps(device.compile_check(90, progress=lambda line: None)))
"""


def test_a_kernel_that_does_not_compile_is_a_failed_row_naming_its_site_and_the_others_still_compile(tmp_path):
    _needs_nvidia_backend()
    script = tmp_path / "broken.py"  # triton.jit reads the kernels' source from their file
    script.write_text(BROKEN)
    out = subprocess.run([sys.executable, str(script)], env=_compiler_env(tmp_path), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    fine, failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert fine["kernel"] == "doubled" and fine["error"] is None
    assert failed["where"] == "a broken site" and failed["kernel"] == "" and "power of 2" in failed["error"], failed


def test_a_kernel_asking_more_shared_memory_than_the_gpu_has_would_not_launch():
    needs = triton_support.Resources("tiles", 8, 240_000, 128, 0)
    assert "232,448" in needs.too_big(90) and needs.too_big(80)  # H100/H200 227 KiB, A100 163 KiB
    assert triton_support.Resources("tiles", 8, 100_000, 128, 0).too_big(90) is None
    assert needs.too_big(75) is None  # a capability without a known limit: left to the GPU


def test_compile_only_refuses_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="interpreter"):
        with triton_support.compile_only(90):
            pass


def test_the_compile_check_exits_nonzero_and_says_why_when_a_kernel_fails(monkeypatch, capsys):
    ok = {"where": "gpu.SsaDecode at 32,768 tokens", "kernel": "_codes_kernel", "num_warps": 8,
          "shared_bytes": 8192, "registers": 254, "local_bytes": 0, "error": None}
    too_big = {**ok, "kernel": "_tiles", "shared_bytes": 240_000, "error": "240,000 bytes of shared memory, above"}
    failed = {"where": "gpu.E8Matmul toy x 1 tokens", "kernel": "", "error": "CompilationError: boom"}
    monkeypatch.setattr(device, "compile_check", lambda arch: [ok, too_big, failed])
    assert cli.main(["device-run", "--compile-only"]) == 1
    table = capsys.readouterr().out
    assert "_codes_kernel" in table and "1 too big: 240,000 bytes" in table
    assert "(gpu.E8Matmul toy x 1 tokens)" in table and "CompilationError: boom" in table and "2 failed" in table
    monkeypatch.setattr(device, "compile_check", lambda arch: [ok])
    assert device.main(["--compile-only"]) == 0 and "all 1 variants compiled and fit sm_90" in capsys.readouterr().out


def test_the_tier_lower_rows_a_gpu_run_writes_decide_the_claim_speed_vs_tier_lower(tmp_path, monkeypatch):
    """The rows a lent GPU would write (here made up: 2:4 fp16 1.3x as slow as fp8, one shape slower still)
    go through the device run's writer, ingest and verdicts as the real ones will."""
    from claimbench import asvfiles, intervals
    monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": "NVIDIA H200", "gpu_count": 1, "driver": "580",
                                                          "cuda": "13.0"})
    rounds = 15

    def timed(seconds):
        return {"seconds": intervals.median_of([seconds * (1 + 0.01 * (i % 3)) for i in range(rounds)]), "error": 0.01}
    matmuls = {}
    for shape, slower in (("llama8b-ffn-up", 1.3), ("llama8b-ffn-down", 1.6)):
        for tokens in device.SPARSE24["tokens"]:
            fp8 = [1e-4 * (1 + 0.01 * (i % 3)) for i in range(rounds)]
            sparse = [t * slower for t in fp8]
            matmuls[shape, tokens] = {"fp16": timed(2e-4), "fp8": timed(1e-4), "2:4-fp16": {
                **timed(1.3e-4), "slowdown_vs_tier_lower": intervals.ratio_of_rounds(sparse, fp8)}}
    machine_dir = tmp_path / "out" / "gpu-test"
    commit = "ab" * 20
    evidence_path = machine_dir / f"{commit[:8]}{evidence.SUFFIX}"
    columns = device._matmul_columns("gpu.Sparse24Matmul", matmuls, device.SPARSE24_KERNELS, evidence_path, print)
    assert columns[device.TIER_LOWER_BENCH][:2] == (["shape", "tokens", "kernel"], [
        sorted(device.TIER_LOWER_SHAPES), device.SPARSE24["tokens"], ["2:4-fp16"]])  # the paired combinations only
    assert device.TIER_LOWER_BENCH not in device._matmul_columns(
        "gpu.E8Matmul", {("toy", 1): {"fp16": timed(1e-4)}}, device.E8_KERNELS, tmp_path / "e8.jsonl", print)
    asvfiles.write_run(tmp_path / "out", "gpu-test", commit, 1_700_000_000_000, columns, env_name="device-py3.12",
                       machine_info=device._machine_info("gpu-test"), python="3.12.3")
    environment.write_sidecar(machine_dir)
    environment.write_run_record(machine_dir, commit, "full", {"gpu": {}})
    db = tmp_path / "s.duckdb"
    assert ingest.ingest([tmp_path / "out"], db=db).ok
    with store.connect(db) as con:
        latest = {v.claim.key: v for v in verdicts.compute(con, registry.load()) if v.machine == "gpu-test"}
    verdict = latest["sparsity-24/speed-vs-tier-lower"]
    assert verdict.verdict == verdicts.REPRODUCED and verdict.gate == "passed", verdict.reason
    # the other suites' claims: not measured, and the reason says device-run never runs them
    assert latest["lychee/speedup-at-equal-recall"].reason.endswith(verdicts.DEVICE_RUN_ONLY_TEXT)
    assert verdicts.DEVICE_RUN_ONLY_TEXT not in latest["sparsity-24/speed-at-equal-bits"].reason  # no benchmark
    assert verdict.measured == pytest.approx(1.3) and verdict.low <= 1.3 <= verdict.high  # the lowest combination
    assert len(verdict.detail) == 2 * len(device.SPARSE24["tokens"])  # the Llama-8B shapes at each token count
