"""A trace-driven tiered prefix cache (HBM / DRAM / SSD) for KV offload, and an SSD endurance model.

Every request is a chain of prefix blocks (`hash_ids`, 512 tokens each in the Mooncake traces; equal
ids mean equal prefixes). A block's objects are its full-attention KV and, for a hybrid model, the
checkpoint of every linear layer's recurrent state at the block's end (kept at every block or only at
the end of each request's prompt: `checkpoint`). A hit is the longest cached prefix whose end has a
state checkpoint too; KV blocks past the last usable checkpoint are recomputed (counted). Each tier
is LRU: HBM evicts to DRAM, DRAM evicts to SSD when the policy admits the object (else drops it),
SSD drops. An object read from a lower tier is copied back to HBM. Deterministic, no randomness.

Endurance: lifetime = rated TBW / (yearly host writes x write amplification). Write amplification is
a stated function of the write unit s: WA(s) = 1 + (WA_random - 1) x max(0, 1 - s / erase unit), with
WA_random = (1 + spare) / (2 spare), the greedy-garbage-collection estimate under uniform random
writes (Hu et al., SYSTOR 2009; Desnoyers, SYSTOR 2012). The interpolation to whole-erase-unit
writes (WA 1) is ours (reconstructed), so the report shows the bytes' and WA's shares separately.
"""
from __future__ import annotations

import tomllib
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from claimbench.interfaces import KVOffloadPolicy

PROFILES = Path(__file__).resolve().parent.parent / "datasets" / "kv_offload.toml"
TIERS = ("hbm", "dram", "ssd")
CHECKPOINTS = ("block", "turn")
SECONDS_PER_YEAR = 365 * 86400


class SimulatorError(ValueError):
    """Bad trace, profile or cache sizes; the message names what and where."""


@dataclass(frozen=True)
class ModelProfile:
    name: str
    layers: int
    full_attention_layers: int
    linear_layers: int
    dtype_bytes: int
    kv_bytes_per_token: int
    state_bytes: int
    source: str

    def __post_init__(self):
        if self.full_attention_layers + self.linear_layers != self.layers:
            raise SimulatorError(f"profile {self.name}: {self.full_attention_layers} full-attention + "
                                 f"{self.linear_layers} linear layers != {self.layers} layers")
        if self.linear_layers and not self.state_bytes:
            raise SimulatorError(f"profile {self.name}: linear layers but no state_bytes")

    @property
    def hybrid(self) -> bool:
        return self.state_bytes > 0


@dataclass(frozen=True)
class Drive:
    name: str
    tbw: float
    capacity_bytes: float
    spare_fraction: float
    erase_unit_bytes: int
    source: str

    def write_amplification(self, write_bytes: float) -> float:
        """WA of writes `write_bytes` long (see the module docstring)."""
        random = (1 + self.spare_fraction) / (2 * self.spare_fraction)
        return 1 + (random - 1) * max(0.0, 1 - write_bytes / self.erase_unit_bytes)


@lru_cache(maxsize=4)
def load_data(path: Path = PROFILES) -> tuple[dict[str, ModelProfile], dict[str, Drive]]:
    """(profiles, drives) by name, read once per process."""
    data = tomllib.loads(Path(path).read_text())
    return ({m["name"]: ModelProfile(**m) for m in data["model"]}, {d["name"]: Drive(**d) for d in data["drive"]})


@dataclass(frozen=True)
class Tiers:
    """Cache capacities in bytes, the block size and the rates the TTFT estimate uses (parameters)."""
    hbm_bytes: float = 64 * 2 ** 30
    dram_bytes: float = 512 * 2 ** 30
    ssd_bytes: float = 2e12
    block_tokens: int = 512
    prefill_tokens_per_s: float = 20_000.0  # an 80B-A3B-class model on one modern GPU (assumed)
    ssd_read_bytes_per_s: float = 7e9  # a PCIe 4.0 NVMe drive's sequential read


@dataclass(frozen=True)
class Request:
    timestamp: float  # ms
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(rows, block_tokens: int = 512) -> list[Request]:
    """Mooncake-format rows -> requests. A row with a missing field, a negative length, a block count
    that does not cover its input, or a timestamp before the previous one is refused, naming its line."""
    out, last = [], float("-inf")
    for line, row in enumerate(rows, 1):
        try:
            r = Request(float(row["timestamp"]), int(row["input_length"]), int(row["output_length"]),
                        tuple(int(h) for h in row["hash_ids"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SimulatorError(f"trace line {line}: missing or malformed field ({e!r})") from None
        if r.input_length < 0 or r.output_length < 0:
            raise SimulatorError(f"trace line {line}: negative length")
        if len(r.hash_ids) != -(-r.input_length // block_tokens):
            raise SimulatorError(f"trace line {line}: {len(r.hash_ids)} blocks for {r.input_length} tokens "
                                 f"(blocks of {block_tokens})")
        if r.timestamp < last:
            raise SimulatorError(f"trace line {line}: timestamp {r.timestamp:g} before the previous {last:g}")
        out.append(r)
        last = r.timestamp
    return out


def agent_trace(trajectories, start_every_s: float = 60.0, call_every_s: float = 20.0,
                block_tokens: int = 512) -> list[Request]:
    """Agent sessions as requests in the Mooncake format: every model call's prompt is the whole history
    so far, so it shares the previous call's full blocks (its partial last block is its own). Session s
    starts at s x start_every_s, its calls call_every_s apart (tool execution); merged in time order."""
    ids: dict[tuple, int] = {}
    out = []
    for s, traj in enumerate(trajectories):
        ends = [sum(t.tokens for t in traj.turns[:upto]) for upto in traj.calls]
        for c, (upto, length) in enumerate(zip(traj.calls, ends)):
            blocks = [(s, b) if (b + 1) * block_tokens <= length else (s, b, length)
                      for b in range(-(-length // block_tokens))]
            out.append(Request(1000 * (s * start_every_s + c * call_every_s), length, traj.turns[upto].tokens,
                               tuple(ids.setdefault(key, len(ids)) for key in blocks)))
    return sorted(out, key=lambda r: r.timestamp)


@dataclass
class Replay:
    """What one replay of a trace did, summed over its requests."""
    requests: int = 0
    requests_hit: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    recompute_tokens: int = 0  # cached KV past the last usable state checkpoint, prefilled again
    hit_tokens_by_tier: dict = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    ssd_read_bytes: int = 0
    ssd_bytes_written: int = 0
    ssd_writes: int = 0
    ssd_bytes_admitted: int = 0  # conservation: every admitted byte is written once
    ttft_s: float = 0.0  # summed over requests
    duration_s: float = 0.0
    write_sizes: dict = field(default_factory=dict)  # object bytes -> how many such objects were written
    merge_bytes: int = 0  # the policy's sequential segment size (0: each object is one write)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / max(self.input_tokens, 1)

    @property
    def request_hit_rate(self) -> float:
        return self.requests_hit / max(self.requests, 1)

    def yearly_writes(self) -> float:
        return self.ssd_bytes_written * SECONDS_PER_YEAR / max(self.duration_s, 1.0)

    def write_amplification(self, drive: Drive) -> float:
        """Bytes-weighted WA of the writes, each as long as its object or the policy's merged segment."""
        if not self.ssd_bytes_written:
            return 1.0
        return sum(size * count * drive.write_amplification(max(size, self.merge_bytes))
                   for size, count in self.write_sizes.items()) / self.ssd_bytes_written

    def lifetime_years(self, drive: Drive) -> float:
        if not self.ssd_bytes_written:
            return float("inf")
        return drive.tbw / (self.yearly_writes() * self.write_amplification(drive))


class TieredCache:
    """Three LRU tiers of objects -> bytes (object 2h: block h's KV, 2h + 1: the state checkpoint at
    its end); see the module docstring. Written for speed: the whole trace is replayed per policy."""

    def __init__(self, tiers: Tiers, policy: KVOffloadPolicy):
        self.policy = policy
        self.cap = [tiers.hbm_bytes, tiers.dram_bytes, tiers.ssd_bytes]
        self.held = [OrderedDict(), OrderedDict(), OrderedDict()]
        self.used = [0, 0, 0]
        self.reads: dict[int, int] = {}
        self.written = self.admitted = 0
        self.write_sizes: dict[int, int] = {}

    def where(self, obj: int) -> int | None:
        """0 (HBM), 1 (DRAM), 2 (SSD) or None."""
        for tier, held in enumerate(self.held):
            if obj in held:
                return tier
        return None

    def touch(self, obj: int, size: int, tier: int) -> None:
        """Use an object found in `tier` a moment ago: it ends up most recent in HBM (copied up from its
        tier, which may have evicted it since: then it comes back from where it was read)."""
        self.reads[obj] = self.reads.get(obj, 0) + 1
        if obj in self.held[tier]:
            self.held[tier].move_to_end(obj)
        self.put(obj, size)

    def put(self, obj: int, size: int) -> None:
        """A new or re-read object into HBM; evictions cascade down the tiers."""
        hbm, dram, ssd = self.held
        if obj in hbm:
            hbm.move_to_end(obj)
            return
        hbm[obj] = size
        self.used[0] += size
        if self.used[0] <= self.cap[0]:
            return
        used, cap = self.used, self.cap
        while used[0] > cap[0]:
            victim, bytes_ = hbm.popitem(last=False)
            used[0] -= bytes_
            if victim in dram:  # a re-read copy leaving HBM: DRAM still holds it
                dram.move_to_end(victim)
                continue
            dram[victim] = bytes_
            used[1] += bytes_
        admit, reads = self.policy.admit, self.reads
        while used[1] > cap[1]:
            victim, bytes_ = dram.popitem(last=False)
            used[1] -= bytes_
            if victim in ssd or not admit("state" if victim & 1 else "kv", bytes_, reads.get(victim, 0)):
                continue
            ssd[victim] = bytes_
            used[2] += bytes_
            self.admitted += bytes_
            self.written += bytes_
            self.write_sizes[bytes_] = self.write_sizes.get(bytes_, 0) + 1
        while used[2] > cap[2]:
            used[2] -= ssd.popitem(last=False)[1]


def replay(requests: list[Request], profile: ModelProfile, policy: KVOffloadPolicy, tiers: Tiers = Tiers(),
           checkpoint: str = "block") -> Replay:
    """Replay a trace through the tiered cache under the policy; see the module docstring."""
    if checkpoint not in CHECKPOINTS:
        raise SimulatorError(f"checkpoint must be one of {', '.join(CHECKPOINTS)}; got {checkpoint!r}")
    kv_block = profile.kv_bytes_per_token * tiers.block_tokens
    smallest = min(tiers.hbm_bytes, tiers.dram_bytes, tiers.ssd_bytes)
    if smallest < kv_block + profile.state_bytes:
        raise SimulatorError(f"a cache tier of {smallest:.3g} bytes cannot hold one block "
                             f"({kv_block + profile.state_bytes} bytes of KV and state)")
    cache, out = TieredCache(tiers, policy), Replay()
    where, touch, put, block = cache.where, cache.touch, cache.put, tiers.block_tokens
    by_tier = [0, 0, 0]
    for r in requests:
        ids, n = r.hash_ids, len(r.hash_ids)
        kv_hit = 0
        while kv_hit < n and where(2 * ids[kv_hit]) is not None:
            kv_hit += 1
        usable = kv_hit
        if profile.hybrid:
            while usable and where(2 * ids[usable - 1] + 1) is None:
                usable -= 1
        hit_tokens = min(usable * block, r.input_length)
        used = [(2 * ids[b], kv_block) for b in range(usable)]
        if profile.hybrid and usable:
            used.append((2 * ids[usable - 1] + 1, profile.state_bytes))
        found = [where(obj) for obj, _ in used]  # all read at once, then copied up in prefix order
        ssd_read = sum(size for (_, size), tier in zip(used, found) if tier == 2)
        for b, tier in enumerate(found[:usable]):
            by_tier[tier] += min(block, r.input_length - b * block)
        for (obj, size), tier in zip(used, found):
            touch(obj, size, tier)
        for b in range(usable, n):
            put(2 * ids[b], kv_block)
            if profile.hybrid and (checkpoint == "block" or b == n - 1):
                put(2 * ids[b] + 1, profile.state_bytes)
        out.requests += 1
        out.requests_hit += usable > 0
        out.input_tokens += r.input_length
        out.hit_tokens += hit_tokens
        out.recompute_tokens += min(kv_hit * block, r.input_length) - hit_tokens
        out.ssd_read_bytes += ssd_read
        out.ttft_s += (r.input_length - hit_tokens) / tiers.prefill_tokens_per_s + ssd_read / tiers.ssd_read_bytes_per_s
    out.hit_tokens_by_tier = dict(zip(TIERS, by_tier))
    out.ssd_bytes_written, out.ssd_bytes_admitted = cache.written, cache.admitted
    out.ssd_writes, out.write_sizes, out.merge_bytes = sum(cache.write_sizes.values()), cache.write_sizes, policy.merge_bytes
    out.duration_s = (requests[-1].timestamp - requests[0].timestamp) / 1000 if requests else 0.0
    return out
