"""Side-by-side timing: method and baseline in one process, interleaved, on the same inputs."""
from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import signal
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from .intervals import Estimate, ratio_of_rounds


def interleaved(calls: dict[str, Callable[[], object]], rounds: int = 5, warmup: int = 1,
                clock: Callable[[], float] = time.perf_counter,
                progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Seconds per call for each entry, alternating entries within every round (by `clock`: wall time,
    or e.g. time.thread_time for the calling thread's CPU time); progress, if given, hears of each round
    as it ends ("round 2 of 6: 41 s").

    Alternating spreads slow drifts (thermal, other load) over all sides alike, and each round's
    calls ran back to back, so a ratio is taken per round (`ratio`, `ratio_estimate`) rather than
    between two blocks timed apart.
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for done in range(1, rounds + 1):
        for name, fn in calls.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
        if progress:
            progress(f"round {done} of {rounds}: {sum(t[-1] for t in times.values()):.0f} s")
    return times


def repeated(call: Callable[[], object], rounds: int, budget_s: float) -> tuple[object, list[float]]:
    """The first call's result and every call's seconds: up to `rounds` calls back to back, each while
    one more (as slow as the slowest so far) keeps the total within budget_s. A sub-second step (a
    round-to-nearest pass over every weight) gets the samples an interval and the alerts' rank-sum test
    need; a minute-long one (a calibrated solver) runs once. `call` must have no side effects."""
    start = time.perf_counter()
    first = call()
    seconds = [time.perf_counter() - start]
    while len(seconds) < rounds and sum(seconds) + max(seconds) <= budget_s:
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return first, seconds


def in_child(fn: Callable, *args):
    """fn(*args) in a fresh process (spawned: nothing inherited), its result returned. Keeps apart what
    must not share a process (torch and faiss bring OpenMP runtimes that crash together) and measures a
    peak RSS of its own. fn must be importable by name (a module-level function of an installed module);
    a child that cannot import it or dies raises here (BrokenProcessPool) instead of waiting forever."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def in_child_within(fn: Callable, args: tuple, timeout_s: float) -> tuple[str, object]:
    """fn(*args) in a fresh spawned process of its own process group, killed with everything it started
    once timeout_s pass (or when the caller is interrupted). Returns ("ok", result), ("error", "Type:
    message") when fn raised, ("crashed", why) when the child died, or ("timeout", why)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_call_into, args=(fn, args, results))
    child.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # wait for the result, noticing a dead or hung child early
            try:
                outcome = results.get(timeout=0.2)
                break
            except queue_mod.Empty:
                if not child.is_alive():
                    try:
                        outcome = results.get(timeout=1.0)
                        break
                    except queue_mod.Empty:
                        return "crashed", f"child exit code {child.exitcode}"
                if time.monotonic() > deadline:
                    return "timeout", f"no result within {timeout_s:.0f}s"
    finally:
        if child.is_alive():
            child.join(5)
        _kill_group(child)
    return outcome


def _call_into(fn, args, results):
    os.setpgrp()  # its own group: a timeout kills what it started too (DDP ranks, loader workers)
    try:
        results.put(("ok", fn(*args)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which records it
        results.put(("error", f"{type(e).__name__}: {e}"))


def _kill_group(child) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.join()


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def ratio_estimate(baseline: list[float], method: list[float]) -> Estimate:
    """How many times faster the method is: the median of per-round baseline / method times, with
    its 95% interval (claimbench.intervals.ratio_of_rounds)."""
    return ratio_of_rounds(baseline, method)


def ratio(baseline: list[float], method: list[float]) -> float:
    """ratio_estimate's value: the median of per-round ratios."""
    return ratio_of_rounds(baseline, method).value
