"""How fast the machine was around a run: a fixed workload timed before asv starts and after it ends.

A shared VM slows down with nothing in the code changed (another tenant on the host, a lower clock):
on ref-2core-epyc the same interpreter loop took 28 ms or 44 ms, in states lasting from seconds to
days. A step in a wall-clock series cannot tell that from slower code; a control workload timed in
the same run can say which it coincides with. `claimbench run` times three single-threaded probes
in ROUNDS interleaved rounds before and after the suites and records the CPU seconds of each round
in the run's record (`<commit>.claimbench.json`, per suite that ran). An alert on a wall-clock
series compares its two runs' probes (`slowdown`) and says whether the machine slowed as much as
the series did (claimbench.alerts). The probes show the machine at the run's two ends, not
throughout it: evidence for the reader, not a verdict.

The probes, about 30 ms each on that VM: `python`, the interpreter (integer arithmetic, dict
stores); `vector`, numpy's SIMD exp over 4 MiB; `memory`, copies of a 64 MiB array (bandwidth).
CPU time of the probing thread (time.thread_time), not wall time, so other processes competing for
the cores do not count (a slower host does: a guest sees it as slower CPU time). They bound what a
CPU-bound benchmark can lose to the machine; they say nothing of a disk or a network.

The memory probe also runs inside a suite's own rounds (`memory_copy`, one more entry in
measure.interleaved) where a side is bound by memory bandwidth: on ref-2core-epyc its copies moved
22 GB/s in some states and 33 GB/s in others (the probes at a run's two ends, 24.7 ms and 16.0 ms), and
faiss IVF-Flat, which scans at nearly that rate, moved with it while Lychee, which reads short codes,
moved less. `bandwidth` turns its rounds into GB/s.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import intervals
from .measure import interleaved

ROUNDS = 40
SLOWER_P = 0.05  # a probe counts as slower when the rank-sum test over both runs' rounds gives p below this
UNIT = "CPU seconds per round"
_VECTOR_FLOATS, _VECTOR_REPEATS = 1 << 20, 60
_MEMORY_BYTES, _MEMORY_REPEATS = 64 << 20, 4  # over the 32 MiB last-level cache of the reference VMs


def _python() -> int:
    total, table = 0, {}
    for i in range(300_000):
        total += i * i % 7
        table[i & 1023] = total
    return total


def memory_copy() -> Callable[[], None]:
    """The memory probe: copies of a 64 MiB array (its two arrays allocated here, once)."""
    source = np.ones(_MEMORY_BYTES // 4, dtype=np.float32)
    target = np.empty_like(source)

    def copy() -> None:
        for _ in range(_MEMORY_REPEATS):
            np.copyto(target, source)
    return copy


def bandwidth(seconds: float) -> float:
    """GB/s moved (read and written, STREAM's convention) by one memory_copy call that took `seconds`."""
    return 2 * _MEMORY_BYTES * _MEMORY_REPEATS / seconds / 1e9


def measure(rounds: int = ROUNDS) -> dict[str, list[float]]:
    """CPU seconds per round of each probe; the probes alternate within every round."""
    values = np.random.default_rng(0).standard_normal(_VECTOR_FLOATS).astype(np.float32)
    exps = np.empty_like(values)
    probes = {"python": _python,
              "vector": lambda: [np.exp(values, out=exps) for _ in range(_VECTOR_REPEATS)],
              "memory": memory_copy()}
    return interleaved(probes, rounds, warmup=1, clock=time.thread_time)  # the warm-up call: page faults


def pooled(record: dict | None) -> dict[str, list[float]]:
    """A run's probe rounds, before and after the suites together ({} without a record)."""
    record = record or {}
    before, after = record.get("before") or {}, record.get("after") or {}
    return {name: list(before.get(name, [])) + list(after.get(name, [])) for name in {*before, *after}}


def summary(record: dict | None, end: str) -> dict[str, intervals.Estimate]:
    """Each probe's median seconds per round at one end of a run ("before" or "after" its suites), with
    its order-statistic interval."""
    rounds = (record or {}).get(end) or {}
    return {name: intervals.median_of(values, method="order statistics of probe rounds")
            for name, values in sorted(rounds.items()) if values}


@dataclass(frozen=True)
class Slowdown:
    probe: str
    ratio: float  # the newer run's median CPU seconds / the older run's
    pvalue: float  # one-sided rank-sum test that the newer run's rounds took longer

    @property
    def significant(self) -> bool:
        return self.pvalue < SLOWER_P

    def describe(self) -> str:
        return f"its {self.probe} probe took {self.ratio:.2f}x the time (rank-sum p = {self.pvalue:.3f})"


def slowdown(older: dict | None, newer: dict | None) -> Slowdown | None:
    """Of the probes two runs share (their run records' `machine_speed` entries), the one that slowed
    most; None when they share none."""
    old, new = pooled(older), pooled(newer)
    shared = sorted(name for name in old.keys() & new.keys() if old[name] and new[name])
    if not shared:
        return None
    found = [Slowdown(name, statistics.median(new[name]) / statistics.median(old[name]),
                      intervals.rank_sum_pvalue(new[name], old[name])) for name in shared]
    return max(found, key=lambda s: s.ratio)
