"""Accuracy-gated global tuner (PAPERS.md A5, the TensorRT Global Performance Tuner), backend-agnostic.

A route is one assignment of knobs. Modes: `fast` (the default plus one knob changed at a time),
`full` (the product over the knobs), `mixed` (fast, then full over the knobs whose single change
helped: passed the gate and beat the default by more than `min_gain`, so noise does not count).
Every route is built and timed in a child process, so a crash or hang is recorded and skipped;
tried routes go to a JSONL cache, so a run resumes. The fastest passing routes (finalists) are
re-timed interleaved with the default in one child (a backend's engines must then not disturb one
another while idle); the winner is the fastest there (the default itself when nothing beats it)
and that timing gives the reported ratio. The gate: per output tensor against the unoptimized fp32
reference (fraction of elements outside atol + rtol |ref|, max abs, mean abs, cosine), plus a
held-out task check on inputs the gate never saw. Reconstructed from the digest: knob sets,
thresholds and the held-out checks are ours.
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from claimbench import measure
from claimbench.interfaces import EngineBackend, Knob


def default_route(knobs: list[Knob]) -> dict:
    return {k.name: k.default for k in knobs}


def fast_routes(knobs: list[Knob]) -> list[dict]:
    base = default_route(knobs)
    out = [base]
    for k in knobs:
        out += [{**base, k.name: v} for v in k.values if v != k.default]
    return out


def full_routes(knobs: list[Knob]) -> list[dict]:
    return [dict(zip([k.name for k in knobs], combo)) for combo in itertools.product(*[k.values for k in knobs])]


def route_key(route: dict) -> str:
    return json.dumps(route, sort_keys=True, default=str)


@dataclass(frozen=True)
class GateSpec:
    atol: float = 1e-3
    rtol: float = 1e-2
    max_outside: float = 0.01  # fraction of elements allowed outside atol + rtol |ref|
    min_cosine: float = 0.999


@dataclass
class GateResult:
    passed: bool
    outside: float
    max_abs: float
    mean_abs: float
    cosine: float
    reason: str = ""


def gate(outputs: list[np.ndarray], reference: list[np.ndarray], spec: GateSpec) -> GateResult:
    """Worst case over output tensors; NaN or inf anywhere fails."""
    if len(outputs) != len(reference):
        return GateResult(False, 1.0, float("inf"), float("inf"), 0.0, "different number of outputs")
    worst = GateResult(True, 0.0, 0.0, 0.0, 1.0)
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        if out.shape != ref.shape:
            return GateResult(False, 1.0, float("inf"), float("inf"), 0.0, f"output {i}: shape {out.shape} != {ref.shape}")
        if not np.isfinite(out).all():
            return GateResult(False, 1.0, float("inf"), float("inf"), 0.0, f"output {i}: NaN or inf")
        diff = np.abs(out - ref)
        outside = float((diff > spec.atol + spec.rtol * np.abs(ref)).mean())
        denom = np.linalg.norm(out) * np.linalg.norm(ref)
        cosine = float((out * ref).sum() / denom) if denom else float(np.array_equal(out, ref))
        worst = GateResult(True, max(worst.outside, outside), max(worst.max_abs, float(diff.max(initial=0))),
                           max(worst.mean_abs, float(diff.mean()) if diff.size else 0.0), min(worst.cosine, cosine))
    reasons = []
    if worst.outside > spec.max_outside:
        reasons.append(f"{worst.outside:.2%} of elements outside tolerance (max {spec.max_outside:.2%})")
    if worst.cosine < spec.min_cosine:
        reasons.append(f"cosine {worst.cosine:.5f} < {spec.min_cosine}")
    worst.passed, worst.reason = not reasons, "; ".join(reasons)
    return worst


@dataclass
class RouteResult:
    route: dict
    status: str  # ok / crashed / timeout / error
    latency_s: float | None = None
    gate: dict | None = None
    held_out: float | None = None
    held_out_passed: bool | None = None
    error: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "ok" and bool(self.gate and self.gate["passed"]) and bool(self.held_out_passed)


def _measure(backend, workload, route, workdir, repeats):
    """Child process: build, time the timing input, run the gate and held-out inputs."""
    engine = backend.build(workload, route, Path(workdir))
    feeds = workload.timing_feeds()
    backend.run(engine, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.run(engine, feeds)
        times.append(time.perf_counter() - start)
    gate_outputs = [backend.run(engine, f) for f in workload.gate_feeds()]
    held = [backend.run(engine, f) for f in workload.held_out_feeds()]
    return float(np.median(times)), gate_outputs, held


def _compare(backend, workload, routes, workdir, repeats):
    """Child process: build every route, then time them interleaved on the same input."""
    feeds = workload.timing_feeds()
    engines = [backend.build(workload, route, Path(workdir)) for route in routes]
    for engine in engines:
        backend.run(engine, feeds)
    times = [[] for _ in engines]
    for _ in range(repeats):
        for engine, t in zip(engines, times):
            start = time.perf_counter()
            backend.run(engine, feeds)
            t.append(time.perf_counter() - start)
    return times


@dataclass
class Tuner:
    backend: EngineBackend
    workload: object
    mode: str = "mixed"
    budget_s: float = 600.0
    route_timeout_s: float = 300.0
    repeats: int = 10
    min_gain: float = 0.03  # mixed mode: a knob "helped" when one change of it passed and was this much faster
    finalists: int = 3  # fastest passing routes re-timed interleaved with the default to pick the winner
    cache: Path | None = None
    workdir: Path = field(default_factory=lambda: Path("/tmp/claimbench-tuner"))

    def _reference(self):
        if not hasattr(self, "_ref"):
            self._ref = self.workload.reference()
        return self._ref

    def _cached(self) -> dict[str, RouteResult]:
        if not self.cache or not Path(self.cache).exists():
            return {}
        out = {}
        for line in Path(self.cache).read_text().splitlines():
            if line.strip():
                r = RouteResult(**json.loads(line))
                out[route_key(r.route)] = r
        return out

    def _in_child(self, target, payload) -> tuple[str, object]:
        """(status, result or error) from a child running `target` (measure.in_child_within)."""
        return measure.in_child_within(target, (self.backend, self.workload, payload, str(self.workdir), self.repeats),
                                       self.route_timeout_s)

    def compare(self, routes: list[dict]) -> list[list[float]]:
        """Each route's latencies, one per interleaved round, all built in one child (the claim's ratio)."""
        status, rounds = self._in_child(_compare, routes)
        if status != "ok":
            raise RuntimeError(f"interleaved comparison failed ({status}): {rounds}")
        return rounds

    def try_route(self, route: dict) -> RouteResult:
        status, result = self._in_child(_measure, route)
        if status != "ok":
            return RouteResult(route, status, error=result)
        latency, gate_out, held = result
        ref_gate, ref_held = self._reference()
        g = gate(gate_out, ref_gate, self.workload.gate_spec)
        score, ok = self.workload.held_out_check(held, ref_held)
        return RouteResult(route, "ok", latency, asdict(g), score, ok)

    def run(self, progress=print) -> dict:
        knobs = self.backend.knobs(self.workload)
        done = self._cached()
        deadline = time.monotonic() + self.budget_s
        Path(self.workdir).mkdir(parents=True, exist_ok=True)

        def attempt(routes):
            for route in routes:
                key = route_key(route)
                if key in done:
                    continue
                if time.monotonic() > deadline:
                    progress(f"  time budget of {self.budget_s:.0f}s spent; stopping")
                    return
                result = self.try_route(route)
                done[key] = result
                if self.cache:
                    with open(self.cache, "a") as f:
                        f.write(json.dumps(asdict(result), default=str) + "\n")
                lat = f"{result.latency_s * 1e3:.2f} ms" if result.latency_s else result.status
                progress(f"  {self.workload.name} {key}: {lat}, gate {'passed' if result.passed else 'failed'}")

        if self.mode not in ("fast", "full", "mixed"):
            raise ValueError(f"unknown mode {self.mode!r}: fast, full or mixed")
        attempt(full_routes(knobs) if self.mode == "full" else fast_routes(knobs))
        if self.mode == "mixed":
            base = done.get(route_key(default_route(knobs)))
            helped = [k for k in knobs if base and base.latency_s and any(
                (r := done.get(route_key({**default_route(knobs), k.name: v}))) and r.passed and r.latency_s
                and r.latency_s * (1 + self.min_gain) < base.latency_s for v in k.values if v != k.default)]
            if len(helped) > 1:
                attempt([{**default_route(knobs), **combo} for combo in full_routes(helped)])
        default = done.get(route_key(default_route(knobs)))
        passing = sorted((r for r in done.values() if r.passed and r.latency_s), key=lambda r: r.latency_s)
        finalists = [r for r in passing if r is not default][: self.finalists]
        winner, interleaved, rounds = None, None, None
        if default and default.passed:  # routes timed in separate children are noisy: decide in one
            rounds_all = self.compare([default.route] + [r.route for r in finalists])
            latencies = [float(np.median(t)) for t in rounds_all]
            best = min(range(len(latencies)), key=latencies.__getitem__)
            winner = ([default] + finalists)[best]
            interleaved = (latencies[0], latencies[best])
            rounds = (rounds_all[0], rounds_all[best])
            progress("  finalists re-timed interleaved: " + ", ".join(
                f"{lat * 1e3:.2f} ms" for lat in latencies) + f"; winner {route_key(winner.route)}")
        return {"default": default, "winner": winner, "tried": list(done.values()), "interleaved": interleaved,
                "rounds": rounds}
