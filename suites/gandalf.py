"""Gandalf's layer-type gating vs write-all offload and other admission rules (PAPERS.md B3), replayed
through the tiered prefix-cache simulator (claimbench/kvoffload.py) on the Mooncake conversation trace
and generated multi-turn agent sessions (no Claude Code trace is available offline; the agent sessions
stand in for it), per model profile (datasets/kv_offload.toml) and policy: SSD bytes written, hit
rate by tokens and by requests, recomputed tokens, the TTFT estimate, write amplification and lifetime
on a 990 PRO class drive. The claims compare layer-type gating with write-all on the Qwen3-Next profile,
gated on the hit rate staying within 1 point; the lifetime ratio is split into the bytes' and the
write amplification's factors. A replay is deterministic; what a claim's value owes to chance is
which agent sessions were generated, so the claim rows replay 10 disjoint sets of generated sessions
and give their median with its order-statistic interval; the Mooncake trace is one fixed trace,
replayed exactly (its interval has no width: no sampling).
CLAIMBENCH_QUICK=1: the first 3,000 Mooncake requests and 6 sets of 10 agent sessions, through tiers
an eighth the size (8 GiB HBM, 64 GiB DRAM), so that the smaller traces still spill to SSD.
"""
import dataclasses
import os
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, kvoffload, metrics
from claimbench.baselines.kv_offload import AdmitAfterReads, SizeGated, WriteAll
from claimbench.datasets import agent_trajectories, traces
from claimbench.impl.gandalf import LayerTypeGating, LayerTypeGatingMerged

from . import common

QUICK = common.QUICK
QUICK_BUDGET_S = 250  # seconds in quick mode on 2 cores (206 s in a fresh clone's make run)
INPUTS = ("mooncake-conversation",)  # the agent sessions are generated
TRACES = ["mooncake-conversation", "generated-agent"]
PROFILES = ["qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "minimax-m1", "llama-3.1-8b", "qwen3-8b"]
POLICIES = {"write-all": WriteAll, "admit-after-reads": AdmitAfterReads, "size-gated": SizeGated,
            "layer-type-gating": LayerTypeGating, "layer-type-gating-merged": LayerTypeGatingMerged}
CLAIM_PROFILE, DRIVE = "qwen3-next-80b-a3b", "990-pro-2tb"
SESSIONS = 10 if QUICK else 50
REPLICATES = 6 if QUICK else 10  # disjoint sets of generated sessions behind each claim row
TIERS = kvoffload.Tiers(hbm_bytes=8 * 2 ** 30, dram_bytes=64 * 2 ** 30) if QUICK else kvoffload.Tiers()


@lru_cache(maxsize=None)
def trace(name: str, replicate: int = 0) -> list[kvoffload.Request]:
    """The Mooncake trace, or the generated agent sessions of one replicate (seeds replicate * SESSIONS
    on: replicate 0 is the boards' trace)."""
    if name == "mooncake-conversation":
        if replicate:
            raise ValueError("the Mooncake trace is one fixed trace: it has no replicates")
        return kvoffload.read_trace(traces.requests(name, limit=3000 if QUICK else None))
    return kvoffload.agent_trace([agent_trajectories.generate(agent_trajectories.GeneratorParams(), seed)
                                  for seed in range(replicate * SESSIONS, (replicate + 1) * SESSIONS)])


def replay_one(key: tuple) -> kvoffload.Replay:
    name, profile, policy, checkpoint, *replicate = key
    return kvoffload.replay(trace(name, *replicate), kvoffload.load_data()[0][profile], POLICIES[policy](), TIERS,
                            checkpoint)


def replays(keys=None) -> dict:
    """(trace, profile, policy, checkpoint spacing[, replicate]) -> Replay, for these keys (default:
    every trace, profile and policy with a state checkpoint at every block; pure-attention profiles
    included, where layer-type gating has nothing to gate and equals write-all), one process per core."""
    keys = keys or [(t, profile, policy, "block") for t in TRACES for profile in PROFILES for policy in POLICIES]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(keys, pool.map(replay_one, keys)))


class Replay(common.ComputedOnce):
    params = (TRACES, PROFILES, list(POLICIES))
    param_names = ["trace", "profile", "policy"]
    timeout = 1800

    def setup_cache(self):
        return {key[:3]: value for key, value in replays().items()}

    def track_ssd_tb_written(self, r, trace, profile, policy):
        return r[trace, profile, policy].ssd_bytes_written / 1e12
    track_ssd_tb_written.unit = metrics.TERABYTES_WRITTEN.unit

    def track_token_hit_rate(self, r, trace, profile, policy):
        return r[trace, profile, policy].token_hit_rate
    track_token_hit_rate.unit = metrics.HIT_RATE.unit

    def track_request_hit_rate(self, r, trace, profile, policy):
        return r[trace, profile, policy].request_hit_rate
    track_request_hit_rate.unit = metrics.HIT_RATE.unit

    def track_recompute_tokens(self, r, trace, profile, policy):
        return r[trace, profile, policy].recompute_tokens
    track_recompute_tokens.unit = metrics.RECOMPUTED_TOKENS.unit

    def track_hit_rate_change_points(self, r, trace, profile, policy):
        """Token hit rate minus write-all's on the same trace and profile, in points: the boards' gate."""
        return 100 * (r[trace, profile, policy].token_hit_rate - r[trace, profile, "write-all"].token_hit_rate)
    track_hit_rate_change_points.unit = metrics.POINTS.unit

    def track_mean_ttft_s(self, r, trace, profile, policy):
        replay = r[trace, profile, policy]
        return replay.ttft_s / replay.requests
    track_mean_ttft_s.unit = metrics.SECONDS.unit

    def track_write_amplification(self, r, trace, profile, policy):
        return r[trace, profile, policy].write_amplification(kvoffload.load_data()[1][DRIVE])
    track_write_amplification.unit = metrics.WRITE_AMPLIFICATION.unit

    def track_lifetime_years(self, r, trace, profile, policy):
        return r[trace, profile, policy].lifetime_years(kvoffload.load_data()[1][DRIVE])
    track_lifetime_years.unit = metrics.YEARS.unit


def claim(r: dict, trace: str, policy: str, checkpoint: str) -> dict:
    """The policy vs write-all on one trace with the claim's profile and a checkpoint spacing."""
    drive = kvoffload.load_data()[1][DRIVE]
    base, gated = r[trace, CLAIM_PROFILE, "write-all", checkpoint], r[trace, CLAIM_PROFILE, policy, checkpoint]
    if not base.ssd_bytes_written:
        raise ValueError(f"{trace}: write-all wrote nothing to SSD (the cache tiers hold the whole trace)")
    bytes_ratio = base.ssd_bytes_written / max(gated.ssd_bytes_written, 1)
    wa_ratio = base.write_amplification(drive) / gated.write_amplification(drive)
    return {"write_change": 100 * (gated.ssd_bytes_written / base.ssd_bytes_written - 1),
            "hit_change": 100 * (gated.token_hit_rate - base.token_hit_rate),
            "lifetime_ratio": bytes_ratio * wa_ratio, "from_bytes": bytes_ratio, "from_wa": wa_ratio}


def replicated(values: list[float]) -> intervals.Estimate:
    """A claim row over the replicates of the generated sessions: their median and its order-statistic
    interval; one value (the fixed Mooncake trace) is exact, an interval without width."""
    if len(values) == 1:
        return intervals.Estimate(values[0], values[0], values[0], 1, "deterministic replay of one fixed trace")
    return dataclasses.replace(intervals.median_of(values), method="order statistics of replicate session sets")


class Claim(common.ComputedOnce):
    """Layer-type gating (and its merged-write variant) vs write-all on the Qwen3-Next profile, per trace
    and state checkpoint spacing (at every block, or only where a request's prompt ends: the state's
    share of the bytes depends on it), the generated sessions' rows over REPLICATES disjoint sets. The
    write claim is the coding-agent trace's: its rows are the generated agent sessions'."""
    params = (TRACES, ["layer-type-gating", "layer-type-gating-merged"], list(kvoffload.CHECKPOINTS))
    param_names = ["trace", "policy", "checkpoint"]
    timeout = 1800

    def setup_cache(self):
        combos = [(t, p, c) for t in TRACES for p in self.params[1] for c in self.params[2]]
        copies = {t: range(REPLICATES) if t == "generated-agent" else range(1) for t in TRACES}
        r = replays(sorted({(t, CLAIM_PROFILE, p, c, k) for t, policy, c in combos for p in ("write-all", policy)
                            for k in copies[t]}))
        out = {}
        for t, policy, c in combos:
            rows = [claim({key[:4]: value for key, value in r.items() if key[4] == k}, t, policy, c) for k in copies[t]]
            out[t, policy, c] = {metric: replicated([row[metric] for row in rows]) for metric in rows[0]}
        return out

    @evidence.estimate
    def track_ssd_write_change_agent(self, r, trace, policy, checkpoint):
        if trace != "generated-agent":
            raise SkipNotImplemented("the write claim is on an agent trace: the generated sessions' row")
        return r[trace, policy, checkpoint]["write_change"]
    track_ssd_write_change_agent.unit = metrics.PERCENT_CHANGE.unit

    @evidence.estimate
    def track_ssd_write_change(self, r, trace, policy, checkpoint):
        return r[trace, policy, checkpoint]["write_change"]
    track_ssd_write_change.unit = metrics.PERCENT_CHANGE.unit

    @evidence.estimate
    def track_hit_rate_change_points(self, r, trace, policy, checkpoint):
        """The gate: token hit rate minus write-all's, in points (within 1 point: 'nearly equal')."""
        return r[trace, policy, checkpoint]["hit_change"]
    track_hit_rate_change_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_lifetime_ratio(self, r, trace, policy, checkpoint):
        return r[trace, policy, checkpoint]["lifetime_ratio"]
    track_lifetime_ratio.unit = metrics.LIFETIME_RATIO.unit

    @evidence.estimate
    def track_lifetime_ratio_from_bytes(self, r, trace, policy, checkpoint):
        """The share of the lifetime ratio that fewer bytes give (times the next one: the whole ratio, per
        replicate; their medians need not multiply exactly)."""
        return r[trace, policy, checkpoint]["from_bytes"]
    track_lifetime_ratio_from_bytes.unit = metrics.LIFETIME_RATIO.unit

    @evidence.estimate
    def track_lifetime_ratio_from_write_amplification(self, r, trace, policy, checkpoint):
        """The share that lower write amplification gives (larger, sequential writes)."""
        return r[trace, policy, checkpoint]["from_wa"]
    track_lifetime_ratio_from_write_amplification.unit = metrics.LIFETIME_RATIO.unit
