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
