"""What asv's machine file lacks: GPU name/count, driver, CUDA, the library versions, numba's vector width,
whether the CPU has AVX-512 and whether io_uring works here (and why not)."""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

LIBRARIES = ("numpy", "torch", "faiss-cpu", "faiss-gpu-cu12", "onnxruntime", "tensorrt",
             "triton", "duckdb", "asv", "numba", "sentence-transformers")
SIDECAR = "claimbench-env.json"
DEVICE_SUITE = "gpu"  # suites/gpu.py: the one suite `claimbench device-run` runs on a lent GPU machine (no asv there)
RECORD_SUFFIX = ".claimbench.json"  # <commit>.claimbench.json: a run's mode, input digests, environment, machine speed


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def gpu_info() -> dict:
    """GPUs as nvidia-smi reports them, with each one's UUID (two lent machines of one kind file under one
    name, as two VMs of one CPU model do: the UUIDs tell their runs apart); an empty description on machines
    without one."""
    info = {"gpu": None, "gpu_count": 0, "driver": None, "cuda": None, "gpu_uuids": []}
    if not shutil.which("nvidia-smi"):
        return info
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,uuid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return info
    rows = [r.split(", ") for r in out.strip().splitlines() if r.strip()]
    if rows:
        info.update(gpu=rows[0][0], gpu_count=len(rows), driver=rows[0][1], gpu_uuids=[r[-1] for r in rows])
    if "CUDA Version:" in header:
        info["cuda"] = header.split("CUDA Version:")[1].split()[0]
    return info


AVAILABLE = "available"
IO_URING_PROBE = ("import liburing\nring = liburing.Ring()\nliburing.io_uring_queue_init(2, ring)\n"
                  "liburing.io_uring_queue_exit(ring)\n")


@functools.cache
def io_uring_problem(probe: str = IO_URING_PROBE) -> str:
    """Why io_uring cannot be used here through PyPI liburing; "" where it can. The probe opens a ring in a
    child process: liburing's compiled module can kill the process that loads it (the 2026.3 wheels use
    AVX-512 registers, and a CPU without AVX-512 stops them with SIGILL), and there that is an answer."""
    try:
        version = importlib.metadata.version("liburing")
    except importlib.metadata.PackageNotFoundError:
        return "PyPI liburing is not installed: pip install liburing"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"opening an io_uring ring in a child process failed: {e}"
    if done.returncode == -signal.SIGILL:
        return f"liburing {version}'s compiled module uses instructions this CPU lacks: SIGILL"
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        return f"opening an io_uring ring failed: {said[-1] if said else f'exit status {done.returncode}'}"
    return ""


def avx512() -> bool:
    """Whether this CPU has AVX-512 (/proc/cpuinfo's avx512f flag). One CPU model name comes with and without it:
    every run of ref-2core-epyc had it, and another 2-core VM that also reports "AMD EPYC" has none."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512f" in flags


def recorded_avx512(env: dict) -> bool | None:
    """Whether the machine of an environment record had AVX-512: its own field, else what its numba vector width
    says (claimbench widens it exactly where AVX-512 is, unless the user set NUMBA_CPU_FEATURES); None where
    the record says neither."""
    if "avx512" in env:
        return bool(env["avx512"])
    return {"full width (AVX-512)": True, "LLVM's default width": False}.get(env.get("numba_vectors"))


def describe() -> dict:
    """The environment record stored beside asv's machine.json."""
    wide = "-prefer-256-bit" in os.environ.get("NUMBA_CPU_FEATURES", "")  # see claimbench._full_vector_width
    return {"python": platform.python_version(), **gpu_info(), "libraries": library_versions(),
            "numba_vectors": "full width (AVX-512)" if wide else "LLVM's default width", "avx512": avx512(),
            "io_uring": io_uring_problem() or AVAILABLE}


REQUIREMENT_TEXT = {"gpu": "needs a GPU", "tensorrt": "needs TensorRT (not installable here)",
                    "io_uring": "needs io_uring through a PyPI liburing that runs here"}
PROBED = ("io_uring",)  # requirements whose environment record entry says why a machine lacks them


def unmet(requires, caps: set[str], env: dict | None = None) -> str:
    """Why a machine with `caps` cannot run what `requires` names (papers.toml's and the suites' REQUIRES words):
    "needs a GPU"; "" where it can. With the machine's environment record, what it says of a probed one."""
    def why(need: str) -> str:
        said = (env or {}).get(need) if need in PROBED else None
        return REQUIREMENT_TEXT.get(need, f"needs {need}") + (f" ({said})" if said and said != AVAILABLE else "")
    return "; ".join(why(need) for need in requires if need not in caps)


def capabilities(env: dict) -> set[str]:
    """What a machine can run, from its environment record: 'gpu', 'tensorrt', 'io_uring' (a record from before
    io_uring was probed counts as having it: its runs measured the io_uring path), ..."""
    caps = set()
    if env.get("gpu_count"):
        caps.add("gpu")
    if "tensorrt" in (env.get("libraries") or {}):
        caps.add("tensorrt")
    if env.get("io_uring", AVAILABLE) == AVAILABLE:
        caps.add("io_uring")
    return caps


def write_sidecar(machine_dir: Path) -> Path:
    machine_dir.mkdir(parents=True, exist_ok=True)
    path = machine_dir / SIDECAR
    path.write_text(json.dumps(describe(), indent=2, sort_keys=True) + "\n")
    return path


def read_run_record(path: Path) -> dict:
    """A `<commit>.claimbench.json` (write_run_record), or {} where it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def write_run_record(machine_dir: Path, commit: str, mode: str, suite_inputs: dict[str, dict[str, str]],
                     machine_speed: dict[str, dict] | None = None) -> Path:
    """`<commit>.claimbench.json`: the mode, each suite's input digests, the environment of a run and,
    per suite that ran, the machine-speed probes around it (claimbench.machinespeed); a second run at
    the same commit (another paper) adds its suites' inputs and probes to the record."""
    path = machine_dir / f"{commit[:8]}{RECORD_SUFFIX}"
    old = read_run_record(path)
    record = {"commit": commit, "mode": mode, "inputs": {**old.get("inputs", {}), **suite_inputs},
              "environment": describe()}
    if speed := {**old.get("machine_speed", {}), **(machine_speed or {})}:
        record["machine_speed"] = speed
    machine_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path
