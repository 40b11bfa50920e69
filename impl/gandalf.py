"""Gandalf: SSD write gating for KV offload of hybrid models (PAPERS.md B3).

The idea as the digest states it: a hybrid model's linear-attention layers carry a fixed-size state
per sequence, its full-attention layers a per-token KV; keep the linear state in DRAM only and write
only the full-attention KV to SSD. LayerTypeGating does that; LayerTypeGatingMerged also merges the
admitted KV into large sequential segments (`merge_bytes`), which is where lower write amplification
would come from. Reconstructed: the merge variant and its segment size are ours (the digest names
lifetime gains, not how they were written); the simulator and endurance model are in
claimbench/kvoffload.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from claimbench.interfaces import KVOffloadPolicy


@dataclass
class LayerTypeGating(KVOffloadPolicy):
    name = "layer-type-gating"

    def admit(self, kind, size, reads):
        return kind == "kv"


@dataclass
class LayerTypeGatingMerged(LayerTypeGating):
    merge_bytes: int = 256 << 20
    name = "layer-type-gating-merged"
