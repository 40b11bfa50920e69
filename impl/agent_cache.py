"""Cache engineering for agents (PAPERS.md A3): keep the text, drop only the KV entries of tool
outputs older than the `keep_last` most recent (K = 12 in the paper). The remaining entries keep
their original positions and nothing is re-prefilled.

Billing: KVDrop is a ContextPolicy whose dropped segments are invisible (not read, not billed)
but never break the cached prefix. Mechanism: KVDropSession runs a real model (the compact Llama)
turn by turn over one KV cache, prefilling only each new turn and dropping old tool-output spans
through the cache's `drop` hook.
Reconstructed: how a provider would bill dropped entries (not read, no write) is our reading of
the digest; the RSI policy and the AKV serving change are not described enough to rebuild.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from claimbench.agentcost import history, old_tool_outputs
from claimbench.interfaces import ContextPolicy, Segment
from claimbench.llm.evaluate import decode
from claimbench.llm.model import Llama


@dataclass
class KVDrop(ContextPolicy):
    keep_last: int = 12
    name = "kv-drop"

    def prompt(self, traj, upto, state):
        dropped = old_tool_outputs(traj, upto, self.keep_last)
        return [Segment(s.key, s.tokens, visible=s.key not in dropped) for s in history(traj, upto)]


@dataclass
class KVDropSession:
    """A conversation held in one KV cache; tool outputs beyond the `keep_last` newest are dropped."""
    model: Llama
    keep_last: int = 12
    prefilled: list[int] = field(default_factory=list)  # tokens prefilled per turn
    spans: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, first position, last + 1)

    def __post_init__(self):
        self.cache = self.model.new_cache()

    @torch.inference_mode()
    def add(self, kind: str, ids: list[int]) -> torch.Tensor:
        """Append one turn (prefill only its tokens); returns the logits of its last token."""
        start = self.cache.next_position
        logits = self.model(torch.tensor([ids]), self.cache, last_only=True)
        self.prefilled.append(len(ids))
        self.spans.append((kind, start, start + len(ids)))
        if kind == "tool_output":
            self._drop_old_outputs()
        return logits[0, -1]

    def _drop_old_outputs(self) -> None:
        outputs = [(a, b) for kind, a, b in self.spans if kind == "tool_output"]
        old = outputs[:-self.keep_last] if self.keep_last else outputs
        if not old:
            return
        positions = self.cache.valid_positions()
        drop = torch.zeros_like(positions, dtype=torch.bool)
        for a, b in old:
            drop |= (positions >= a) & (positions < b)
        if drop.any():
            self.cache.drop(drop.nonzero().flatten())

    def dropped_positions(self) -> set[int]:
        kept = set(self.cache.valid_positions().tolist())
        return set(range(self.cache.next_position)) - kept

    def answer(self, ids: list[int], max_new_tokens: int, eos_id: int | None = None) -> list[int]:
        """Greedy answer to a final prompt, continuing the cache."""
        return decode(self.model, self.cache, None, max_new_tokens, eos_id, logits=self.add("user", ids))
