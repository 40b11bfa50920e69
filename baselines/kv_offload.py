"""Gandalf's baselines (PAPERS.md B3): what a tiered KV cache writes to SSD when DRAM evicts.

- WriteAll: every evicted object goes to SSD (LRU offload as LMCache/Mooncake-style stores do it; the
  paper's baseline).
- AdmitAfterReads: only objects read at least `reads` times (a common flash-cache admission rule).
- SizeGated: only objects of at least `min_bytes` (small writes cost the most write amplification).
"""
from __future__ import annotations

from dataclasses import dataclass

from claimbench.interfaces import KVOffloadPolicy


@dataclass
class WriteAll(KVOffloadPolicy):
    name = "write-all"

    def admit(self, kind, size, reads):
        return True


@dataclass
class AdmitAfterReads(KVOffloadPolicy):
    reads: int = 1
    name = "admit-after-reads"

    def admit(self, kind, size, reads):
        return reads >= self.reads


@dataclass
class SizeGated(KVOffloadPolicy):
    min_bytes: int = 16 << 20
    name = "size-gated"

    def admit(self, kind, size, reads):
        return size >= self.min_bytes
