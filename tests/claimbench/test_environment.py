import os
import subprocess
import sys

import llvmlite.binding as llvm

from claimbench import environment

PROBE = "import os, claimbench; print(os.environ.get('NUMBA_CPU_FEATURES', ''))"


def features_after_import(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "NUMBA_CPU_FEATURES"}
    return subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_importing_claimbench_widens_numba_vectors_only_where_avx512_is():
    features = features_after_import()
    if llvm.get_host_cpu_features().get("avx512f"):
        assert features.endswith(",-prefer-256-bit") and "+avx512f" in features
    else:
        assert features == ""


def test_a_users_numba_cpu_features_are_kept():
    assert features_after_import(NUMBA_CPU_FEATURES="+sse2") == "+sse2"


def test_environment_record_says_which_vector_width_numba_used(monkeypatch):
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx512f,-prefer-256-bit")
    assert environment.describe()["numba_vectors"] == "full width (AVX-512)"
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    assert environment.describe()["numba_vectors"] == "LLVM's default width"


def test_io_uring_is_probed_in_a_child_process_that_may_die_of_an_illegal_instruction():
    """liburing's 2026.3 wheels use AVX-512 registers: on a CPU without AVX-512 the process that opens a ring
    dies of SIGILL. The probe's child dies instead, and the reason says so."""
    sigill = "import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n"
    assert "uses instructions this CPU lacks: SIGILL" in environment.io_uring_problem(sigill)
    refused = "raise OSError(38, 'Function not implemented')"
    assert environment.io_uring_problem(refused) == ("opening an io_uring ring failed: OSError: [Errno 38] Function "
                                                     "not implemented")
    assert environment.io_uring_problem("pass") == ""


def test_a_machine_without_a_working_io_uring_cannot_run_what_needs_it():
    broken = {"io_uring": "liburing 2026.3.30's compiled module uses instructions this CPU lacks: SIGILL"}
    assert "io_uring" in environment.capabilities({"io_uring": environment.AVAILABLE})
    assert "io_uring" in environment.capabilities({})  # recorded before the probe: its runs measured io_uring
    assert "io_uring" not in environment.capabilities(broken)
    assert environment.unmet(["io_uring"], set(), broken) == (
        "needs io_uring through a PyPI liburing that runs here (liburing 2026.3.30's compiled module uses "
        "instructions this CPU lacks: SIGILL)")
    assert environment.unmet(["io_uring"], set()) == "needs io_uring through a PyPI liburing that runs here"
    assert environment.unmet(["io_uring"], {"io_uring"}, broken) == ""


def test_the_record_says_whether_the_cpu_had_avx512_and_older_records_tell_it_by_their_vector_width():
    assert environment.describe()["avx512"] == environment.avx512() == bool(llvm.get_host_cpu_features().get("avx512f"))
    assert environment.recorded_avx512({"avx512": False, "numba_vectors": "full width (AVX-512)"}) is False
    assert environment.recorded_avx512({"numba_vectors": "full width (AVX-512)"}) is True
    assert environment.recorded_avx512({"numba_vectors": "LLVM's default width"}) is False
    assert environment.recorded_avx512({}) is None


def test_the_record_names_each_gpu_by_its_uuid(monkeypatch, tmp_path):
    """nvidia-smi as on a lent machine with two GPUs (a script standing in for it: this machine has none)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   'case "$1" in\n'
                   "  --query-gpu=*) printf 'NVIDIA H200, 580.159.04, GPU-aa11\\n"
                   "NVIDIA H200, 580.159.04, GPU-bb22\\n' ;;\n"
                   "  *) echo '| NVIDIA-SMI 580.159.04   Driver Version: 580.159.04   CUDA Version: 13.0 |' ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert environment.gpu_info() == {"gpu": "NVIDIA H200", "gpu_count": 2, "driver": "580.159.04", "cuda": "13.0",
                                      "gpu_uuids": ["GPU-aa11", "GPU-bb22"]}
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert environment.gpu_info()["gpu_uuids"] == []
