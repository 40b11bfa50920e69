"""ATTUNE: a budgeted training-recipe tuner whose every proposal passes a correctness gate in fixed
code (PAPERS.md B1; the paper's agent edits recipes under a GPU-hour budget).

The tuner gives a proposer (claimbench.interfaces.RecipeProposer: grid search, the profiler-guided
proposer, an external command) copies of the starting and best recipes and its history; each
proposal is validated against the schema, gated (claimbench.impl.attune_gate: static, then a short
deterministic run against the starting recipe's reference) and, if accepted, timed in a child
process (tokens per second after warm-up, then one profiled step). A proposer that crashes, hangs or
returns an invalid recipe is recorded and the tuner goes on. The budget is wall-clock over proposals
(the reference run and the starting recipe's timing are shared by all proposers and not in it); no
trial starts after it, and a running one is stopped at its end. The best is picked on single timings,
so the suite re-times it against the starting recipe in interleaved rounds for the reported ratio.
Before every decision the tuner checks the gate is the code it imported (`GateTampered` otherwise).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from claimbench import measure
from claimbench.datasets import recipes
from claimbench.impl import attune_gate
from claimbench.impl import attune_training as training
from claimbench.interfaces import ProposerFailed, RecipeProposer

_GATE_FINGERPRINT = attune_gate.fingerprint()
_GATE_FUNCTIONS = {name: getattr(attune_gate, name) for name in
                   ("check", "static_check", "dynamic_check", "compare_runs", "tolerance_from_noise")}


class GateTampered(RuntimeError):
    """The gate's code or functions changed during tuning: no decision of this run can be trusted."""


def verify_gate() -> None:
    replaced = [name for name, fn in _GATE_FUNCTIONS.items() if getattr(attune_gate, name) is not fn]
    if replaced:
        raise GateTampered(f"gate function(s) replaced at run time: {', '.join(replaced)}")
    if attune_gate.fingerprint() != _GATE_FINGERPRINT:
        raise GateTampered("the gate's source (or the schema or training jobs it trusts) changed on disk")


def changes(recipe: dict, start: dict) -> dict:
    """The keys whose values differ from the starting recipe's."""
    return {k: v for k, v in recipe.items() if start.get(k) != v}


@dataclass
class Trial:
    proposer: str
    changes: dict
    status: str  # accepted / rejected / invalid / crashed / timeout / error / budget / proposer-crashed / proposer-timeout
    reasons: list[str] = field(default_factory=list)
    stage: str = ""  # the gate stage that decided
    tokens_per_s: float | None = None
    seconds: float = 0.0
    loss_deviation: float | None = None
    profile: dict | None = None  # the timing run's phases, padding share and top operators


@dataclass
class TuneResult:
    start: dict
    best: dict
    start_tokens_per_s: float
    best_tokens_per_s: float
    trials: list[Trial]
    budget_s: float
    used_s: float

    @property
    def best_changes(self) -> dict:
        return changes(self.best, self.start)


def time_recipe(recipe: dict, warmup: int, timed: int, timeout_s: float) -> tuple[str, object]:
    return measure.in_child_within(training.throughput, (recipe, warmup, timed), timeout_s)


@dataclass
class RecipeTuner:
    start: dict  # a validated flat recipe
    reference: dict  # attune_gate.reference_run(start, ...)
    start_timing: dict  # time_recipe(start, ...)'s result
    tolerance: float  # relative loss tolerance of the gate's dynamic check
    budget_s: float = 600.0
    warmup_steps: int = 1
    timed_steps: int = 3
    trial_timeout_s: float = 900.0
    max_failures: int = 3  # consecutive proposer failures before the tuner gives up on it
    clock: Callable[[], float] = time.monotonic

    def run(self, proposer: RecipeProposer, progress=print) -> TuneResult:
        began = self.clock()
        deadline = began + self.budget_s
        best, best_tps = copy.deepcopy(self.start), self.start_timing["tokens_per_s"]
        trials: list[Trial] = []
        failures = 0
        # the starting recipe's timing and profile: where a profiler-guided proposer begins
        start_entry = asdict(Trial("start", {}, "accepted", tokens_per_s=best_tps, profile=self.start_timing))
        while self.clock() < deadline and failures < self.max_failures:
            history = [start_entry, *(asdict(t) for t in trials)]
            t0 = self.clock()
            try:
                proposal = proposer.propose(copy.deepcopy(self.start), copy.deepcopy(best), history)
                if proposal is None:
                    progress(f"  {proposer.name}: out of proposals")
                    break
                candidate = recipes.validate(recipes.nest(proposal), f"{proposer.name}'s proposal")
            except ProposerFailed as e:
                failures += 1
                status = "invalid" if e.kind == "invalid" else f"proposer-{e.kind}"
                trials.append(Trial(proposer.name, {}, status, [str(e)], seconds=self.clock() - t0))
                progress(f"  {proposer.name}: {e.kind}: {e}")
                continue
            except recipes.RecipeError as e:
                failures += 1
                trials.append(Trial(proposer.name, {}, "invalid", [str(e)], seconds=self.clock() - t0))
                progress(f"  {proposer.name}: invalid proposal: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - an in-process proposer that crashes is recorded, not fatal
                failures += 1
                trials.append(Trial(proposer.name, {}, "proposer-crashed", [f"{type(e).__name__}: {e}"],
                                    seconds=self.clock() - t0))
                progress(f"  {proposer.name}: crashed: {type(e).__name__}: {e}")
                continue
            failures = 0
            trial = self._try(proposer.name, candidate, deadline)
            trial.seconds = self.clock() - t0
            trials.append(trial)
            shown = f"{trial.tokens_per_s:.0f} tokens/s" if trial.tokens_per_s else f"{trial.status} ({trial.stage})"
            progress(f"  {proposer.name} {trial.changes}: {shown}" + (f"; {trial.reasons[0]}" if trial.reasons else ""))
            if trial.status == "accepted" and trial.tokens_per_s > best_tps:
                best, best_tps = candidate, trial.tokens_per_s
        return TuneResult(self.start, best, self.start_timing["tokens_per_s"], best_tps, trials, self.budget_s,
                          self.clock() - began)

    def _try(self, name: str, candidate: dict, deadline: float) -> Trial:
        diff = changes(candidate, self.start)
        verify_gate()
        left = deadline - self.clock()
        if left <= 0:
            return Trial(name, diff, "budget", ["the budget ran out before the gate's check"])
        decision = attune_gate.check(candidate, self.start, self.reference, self.tolerance,
                                     timeout_s=min(self.trial_timeout_s, left))
        verify_gate()
        if not decision.accepted:
            out_of_time = self.clock() >= deadline and any("timeout" in r for r in decision.reasons)
            return Trial(name, diff, "budget" if out_of_time else "rejected", decision.reasons, decision.stage,
                         loss_deviation=decision.loss_deviation)
        left = deadline - self.clock()
        if left <= 0:
            return Trial(name, diff, "budget", ["the budget ran out before timing"], decision.stage,
                         loss_deviation=decision.loss_deviation)
        status, timing = time_recipe(candidate, self.warmup_steps, self.timed_steps, min(self.trial_timeout_s, left))
        if status != "ok":
            kind = "budget" if status == "timeout" and self.clock() >= deadline else status
            return Trial(name, diff, kind, [f"timing run {status}: {timing}"], decision.stage,
                         loss_deviation=decision.loss_deviation)
        return Trial(name, diff, "accepted", [], decision.stage, timing["tokens_per_s"],
                     loss_deviation=decision.loss_deviation, profile=timing)
