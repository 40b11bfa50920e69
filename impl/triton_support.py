"""Triton where it is installed: the GPU kernels' one optional import, and where they can run (a CUDA
device, or Triton's CPU interpreter under TRITON_INTERPRET=1 for tests and `claimbench device-run
--dry-run`, which must be set before this module is first imported). `compile_only` compiles the
kernels for a GPU that is not here (`claimbench device-run --compile-only`)."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the GPU extra is not installed
    triton = tl = None

# shared memory one block may use, by compute capability (CUDA C++ Programming Guide, technical specifications)
MAX_SHARED_BYTES = {80: 166_912, 86: 101_376, 87: 166_912, 89: 101_376, 90: 232_448, 100: 232_448,
                    120: 101_376}
_compiling = False  # inside compile_only: the wrappers take CPU tensors, and nothing is launched


def available(device: torch.device | str) -> bool:
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or _compiling


def require(device: torch.device | str, kernel: str) -> None:
    """A clear error where `kernel` cannot run on `device`."""
    if triton is None:
        raise RuntimeError(f"{kernel} needs triton (the GPU extra), which is not installed")
    if not available(device):
        raise RuntimeError(f"{kernel} needs a CUDA device, or TRITON_INTERPRET=1 for Triton's interpreter; "
                           f"got {torch.device(device)}")


class _TargetOnly:
    """The part of a Triton driver that compiling asks for: which GPU, and a device and stream to key
    its caches by. Anything that would load or launch a kernel is absent, so it fails loudly."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


@contextlib.contextmanager
def compile_only(arch: int = 90):
    """Inside: every Triton kernel a wrapper launches is compiled for an NVIDIA GPU of compute capability
    `arch` (90: H100, H200) instead of launched, with no GPU here: Triton's own warmup path (compile, do
    not launch) under a driver that only names the target, its bundled ptxas making the cubin; an
    autotuned kernel compiles every config its pruning keeps, as its first call on the GPU would.
    Yields the list the compiled kernels (triton's CompiledKernel) are appended to. The wrappers take
    CPU tensors meanwhile (torch.empty of the GPU run's shapes and dtypes: never read), and what they
    return is unwritten. Patches Triton's launch entry points for the duration (Triton 3.x); nothing
    else may use Triton in the process meanwhile."""
    global _compiling
    if triton is None:
        raise RuntimeError("compiling the kernels needs triton (the GPU extra), which is not installed")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_only needs Triton's compiler, and TRITON_INTERPRET=1 chose its interpreter: "
                           "run it in a process without TRITON_INTERPRET")
    from triton.backends import backends
    if "nvidia" not in backends:
        raise RuntimeError(f"this triton ({triton.__version__}) has no NVIDIA backend to compile with")
    from triton.runtime import driver
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction
    compiled = []
    launch, tuned_launch = JITFunction.run, Autotuner.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    def compile_every_config(self, *args, **kwargs):
        kwargs.pop("warmup", None)
        return self.warmup(*args, **kwargs)
    previous = driver._active  # what reset_active would recreate: there is no GPU driver to find here
    driver.set_active(_TargetOnly(arch))
    JITFunction.run, Autotuner.run, _compiling = compile_instead, compile_every_config, True
    try:
        yield compiled
    finally:
        JITFunction.run, Autotuner.run, _compiling = launch, tuned_launch, False
        driver.set_active(previous)


@dataclass
class Resources:
    """What a compiled kernel asks of the GPU per block and thread."""
    kernel: str
    num_warps: int
    shared_bytes: int  # dynamic shared memory per block (Triton's metadata)
    registers: int | None  # per thread, from the cubin (cuobjdump), None where that tool is missing
    local_bytes: int | None  # per thread: spills and stack frame, in local memory (slow)

    def too_big(self, arch: int) -> str | None:
        """Why the GPU would refuse to launch it, or None."""
        limit = MAX_SHARED_BYTES.get(arch)
        if limit is not None and self.shared_bytes > limit:
            return f"{self.shared_bytes:,} bytes of shared memory, above sm_{arch}'s {limit:,}"
        return None


def resources(kernel) -> Resources:
    """A CompiledKernel's resource use, read from its cubin with the cuobjdump Triton ships."""
    registers = local = None
    try:
        tool = triton.knobs.nvidia.cuobjdump.path
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(kernel.asm["cubin"])
            cubin.flush()
            usage = subprocess.run([tool, "-res-usage", cubin.name], capture_output=True, text=True).stdout
    except (AttributeError, KeyError, OSError, RuntimeError):  # no cuobjdump or no cubin: resources unknown
        usage = ""
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    if found:
        registers, local = int(found[1]), int(found[2]) + int(found[3])
    return Resources(kernel.metadata.name, kernel.metadata.num_warps, kernel.metadata.shared, registers, local)
