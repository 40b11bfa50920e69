"""Triton where it is installed: the GPU kernels' one optional import, and where they can run (a CUDA
device, or Triton's CPU interpreter under TRITON_INTERPRET=1 for tests and `claimbench device-run
--dry-run`, which must be set before this module is first imported)."""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the GPU extra is not installed
    triton = tl = None


def available(device: torch.device | str) -> bool:
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def require(device: torch.device | str, kernel: str) -> None:
    """A clear error where `kernel` cannot run on `device`."""
    if triton is None:
        raise RuntimeError(f"{kernel} needs triton (the GPU extra), which is not installed")
    if not available(device):
        raise RuntimeError(f"{kernel} needs a CUDA device, or TRITON_INTERPRET=1 for Triton's interpreter; "
                           f"got {torch.device(device)}")
