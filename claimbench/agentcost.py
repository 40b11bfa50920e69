"""Billing agent trajectories under provider prompt caching, for any context policy.

A policy decides, before each model call, what the prompt holds: a list of segments, one per
turn (or summary), each with a version (text edits bump it) and a visibility (KV dropped or not).
The provider's cache holds the previous prompt. A call reads from the cache the longest prefix
whose segments are unchanged (invisible segments neither count nor break the prefix: their KV is
gone, the rest keeps its positions), and writes the rest. Tool execution is assumed to finish
within the cache's TTL.
cost = p_in * uncached + p_write * written + p_read * read + p_out * output   (per call, summed)
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from claimbench.datasets.agent_trajectories import Trajectory
from claimbench.interfaces import CallBill, ContextPolicy, Segment

PRICES = Path(__file__).resolve().parent.parent / "datasets" / "provider_prices.toml"


@dataclass(frozen=True)
class PriceTable:
    name: str
    model: str
    input: float
    cache_write: float
    cache_read: float
    output: float
    min_cacheable: int
    ttl_s: int
    date: str
    source: str

    def cost(self, bills: list[CallBill]) -> dict[str, float]:
        """USD per token class and in total."""
        per = {"uncached": sum(b.uncached for b in bills) * self.input,
               "written": sum(b.written for b in bills) * self.cache_write,
               "read": sum(b.read for b in bills) * self.cache_read,
               "output": sum(b.output for b in bills) * self.output}
        per = {k: v / 1e6 for k, v in per.items()}
        per["total"] = sum(per.values())
        return per


def load_prices(path: Path = PRICES) -> list[PriceTable]:
    data = tomllib.loads(Path(path).read_text())
    return [PriceTable(**p) for p in data["provider"]]


def bill(previous: list[Segment], prompt: list[Segment], output: int, min_cacheable: int, kind="agent") -> CallBill:
    """One call: what is read from the cache, written to it, or sent uncached."""
    matched = 0
    for i, seg in enumerate(prompt):
        if i >= len(previous) or (previous[i].key, previous[i].version) != (seg.key, seg.version):
            break
        if seg.visible and not previous[i].visible:
            break  # dropped KV cannot come back without a prefill
        if seg.visible:
            matched += seg.tokens
    context = sum(s.tokens for s in prompt if s.visible)
    if context < min_cacheable:
        return CallBill(uncached=context, output=output, context=context, kind=kind)
    if matched < min_cacheable:
        matched = 0
    return CallBill(read=matched, written=context - matched, output=output, context=context, kind=kind)


def replay(policy: ContextPolicy, traj: Trajectory, window: int, min_cacheable: int) -> list[CallBill]:
    """The bills of every call of the trajectory under the policy."""
    bills, previous, state = [], [], {}
    for upto in traj.calls:
        prompt = policy.prompt(traj, upto, state)
        prompt, previous, extra = policy.before_call(traj, upto, state, prompt, window, min_cacheable, previous)
        bills += extra
        bills.append(bill(previous, prompt, traj.turns[upto].tokens, min_cacheable))
        previous = prompt
    return bills


def history(traj: Trajectory, upto: int) -> list[Segment]:
    return [Segment(i, t.tokens) for i, t in enumerate(traj.turns[:upto])]


def old_tool_outputs(traj: Trajectory, upto: int, keep_last: int) -> set[int]:
    """Tool-output turns before `upto` other than the keep_last most recent ones."""
    outputs = [i for i, t in enumerate(traj.turns[:upto]) if t.kind == "tool_output"]
    return set(outputs[:-keep_last] if keep_last else outputs)


@dataclass
class Summary:
    """One policy on one trajectory: tokens by class and cost by class, per provider."""
    policy: str
    calls: int
    overflow_calls: int  # calls whose context exceeds the window
    tokens: dict[str, dict[str, int]] = field(default_factory=dict)  # provider -> class -> tokens
    cost: dict[str, dict[str, float]] = field(default_factory=dict)  # provider -> class -> USD

    def read_share(self, provider: str) -> float:
        c = self.cost[provider]
        return c["read"] / c["total"] if c["total"] else 0.0


def summarize(policy: ContextPolicy, traj: Trajectory, prices: list[PriceTable], window: int) -> Summary:
    """Replay under each provider's minimum cacheable prefix and price the bills."""
    summary, replays = None, {}
    for table in prices:  # bills depend only on the minimum cacheable prefix: replay once per value
        if table.min_cacheable not in replays:
            replays[table.min_cacheable] = replay(policy, traj, window, table.min_cacheable)
        bills = replays[table.min_cacheable]
        if summary is None:
            summary = Summary(policy.name, sum(b.kind == "agent" for b in bills), sum(b.context > window for b in bills))
        summary.tokens[table.name] = {k: sum(getattr(b, k) for b in bills) for k in ("read", "written", "uncached", "output")}
        summary.cost[table.name] = table.cost(bills)
    return summary
