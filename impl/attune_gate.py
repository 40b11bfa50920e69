"""ATTUNE's correctness gate (PAPERS.md B1): fixed code that decides, before a tuned recipe's speed
counts, whether it still trains the same thing. No proposer edits or imports it; the tuner
(claimbench.impl.attune) imports it and checks, before every decision, that it is the code it
imported (`fingerprint`).

Static part: the recipe fits the schema (claimbench.datasets.recipes), the digest of its locked keys
equals the starting recipe's (a change is named by key), and every semantic knob holds its neutral
value (the deny-list: truncation, label smoothing, loss scaling, frozen parameters, skipped steps,
lower-precision autocast, an MoE capacity factor, a forced or fake-balanced router).

Dynamic part: `check_steps` deterministic training steps from the recipe's initialization, in a
child process, against the starting recipe's reference run: the same initial parameters, per step
the same targets (count and digest of document, place, token) and, for the MoE, every token reaching
its top-k experts in every layer (kept pairs = targets x top_k x layers, as in the reference); and the per-step loss within
`tolerance` (relative). The tolerance is derived from the measured run-to-run noise of legitimate
changes (`tolerance_from_noise`): operations reordered by micro-batching or threads move float32
losses by about 1e-7 relative; the suite states what it measured.
The check thresholds and the noise rule are ours (reconstructed): the digest names no numbers.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from claimbench import measure
from claimbench.datasets import recipes
from claimbench.impl import attune_training as training

NOISE_FACTOR = 10.0  # the tolerance is this many times the largest deviation a legitimate change showed
MIN_TOLERANCE = 1e-6  # relative; a floor for when the noise probes happened to agree bit for bit


@dataclass
class GateDecision:
    accepted: bool
    stage: str  # "static", "dynamic", or "passed"
    reasons: list[str] = field(default_factory=list)
    loss_deviation: float | None = None  # largest relative per-step deviation from the reference

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def fingerprint() -> str:
    """sha256 of this module's source and of the modules it trusts (schema, training jobs)."""
    digest = hashlib.sha256()
    for module in (__file__, recipes.__file__, training.__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()


def static_check(candidate: dict, start: dict) -> list[str]:
    """Reasons to reject before anything runs ([] when none). Both are validated flat recipes."""
    reasons = []
    if recipes.locked_digest(candidate) != recipes.locked_digest(start):
        changed = [k for k in recipes.LOCKED if candidate.get(k) != start.get(k)]
        reasons += [f"locked key {k!r} changed: {start.get(k)!r} -> {candidate.get(k)!r}" for k in changed]
    for key in recipes.SEMANTIC:
        if key in candidate and candidate[key] != recipes.SCHEMA[key].default:
            reasons.append(f"deny-listed: {key} = {candidate[key]!r} {recipes.SCHEMA[key].why}")
    return reasons


def reference_run(start: dict, check_steps: int, timeout_s: float = 1800) -> dict:
    """The starting recipe's deterministic run that candidates are compared with."""
    status, result = measure.in_child_within(training.run, (start, check_steps, True), timeout_s)
    if status != "ok":
        raise RuntimeError(f"the starting recipe's reference run failed ({status}): {result}")
    return result


def compare_runs(result: dict, reference: dict, recipe: dict, tolerance: float) -> tuple[list[str], float]:
    """Reasons a run differs from the reference (and its largest relative loss deviation)."""
    reasons = []
    if result["init_digest"] != reference["init_digest"]:
        reasons.append("the initial parameters differ from the reference's")
    if len(result["steps"]) != len(reference["steps"]):
        reasons.append(f"{len(result['steps'])} steps ran, the reference ran {len(reference['steps'])}")
    top_k = recipe.get("moe.top_k")
    pairs_per_target = top_k * recipe["model.layers"] if top_k else None  # every MoE layer routes every token
    deviation = 0.0
    for i, (step, ref) in enumerate(zip(result["steps"], reference["steps"])):
        if step["tokens"] != ref["tokens"] or step["digest"] != ref["digest"]:
            reasons.append(f"step {i}: trained on {step['tokens']} targets (digest {step['digest']}), the reference on "
                           f"{ref['tokens']} (digest {ref['digest']})")
        if top_k and (step["kept_pairs"] != step["tokens"] * pairs_per_target or step["kept_pairs"] != ref["kept_pairs"]):
            reasons.append(f"step {i}: experts computed {step['kept_pairs']} token-expert pairs of "
                           f"{step['tokens'] * pairs_per_target} (targets x top_k x MoE layers): tokens were dropped "
                           "or rerouted")
        deviation = max(deviation, abs(step["loss"] - ref["loss"]) / abs(ref["loss"]))
    if deviation > tolerance:
        reasons.append(f"loss curve off the reference by {deviation:.2e} (relative; tolerance {tolerance:.2e})")
    return reasons, deviation


def dynamic_check(candidate: dict, reference: dict, tolerance: float, timeout_s: float) -> GateDecision:
    steps = len(reference["steps"])
    status, result = measure.in_child_within(training.run, (candidate, steps, True), timeout_s)
    if status != "ok":
        return GateDecision(False, "dynamic", [f"the check run {status}: {result}"])
    reasons, deviation = compare_runs(result, reference, candidate, tolerance)
    return GateDecision(not reasons, "dynamic" if reasons else "passed", reasons, deviation)


def check(candidate: dict, start: dict, reference: dict, tolerance: float, timeout_s: float = 1800,
          static: bool = True) -> GateDecision:
    """The gate: static, then (if that passes) dynamic. `static=False` runs the dynamic part alone
    (the suite measures what it would catch by itself)."""
    if static:
        reasons = static_check(candidate, start)
        if reasons:
            return GateDecision(False, "static", reasons)
    return dynamic_check(candidate, reference, tolerance, timeout_s)


def tolerance_from_noise(deviations: list[float]) -> float:
    """The relative loss tolerance from legitimate changes' measured deviations."""
    return max(MIN_TOLERANCE, NOISE_FACTOR * max(deviations, default=0.0))
