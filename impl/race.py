"""RACE: RoPE-aligned attention compression by query-key activation energy (PAPERS.md B2,
seeds/001): per KV head keep the rotary pairs with the largest calibration energy, fold the
choice into W_q/W_k (their rows and the RoPE frequencies sliced to the kept pairs), keep the full
head's softmax scale. The compressed model caches only the kept key dims and computes q.k over
them at prefill and decode: nothing is reconstructed.

Pair score (the digest says "largest sum of squares of queries and keys"): `rule="sum"` reads it
literally, E[|q pair|^2] (summed over the KV head's query group) + E[|k pair|^2]; `rule="product"`
multiplies the two energies, a variant (our reading of which pairs carry q.k mass). The verdict
uses "sum", the digest's words. Reconstructed: the calibration batch (ours: the calibration split
of the pinned corpus), the query-group summation and the product variant.
"""
from __future__ import annotations

from dataclasses import dataclass

from claimbench.llm.headdim import PairSelection, PairStatistics

RULES = ("sum", "product")


@dataclass
class RACE(PairSelection):
    rule: str = "sum"

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"RACE rule must be one of {RULES}; got {self.rule!r}")
        self.name = "race" if self.rule == "sum" else f"race-{self.rule}"

    def scores(self, statistics: PairStatistics):
        if self.rule == "sum":
            return statistics.query_energy + statistics.key_energy
        return statistics.query_energy * statistics.key_energy
