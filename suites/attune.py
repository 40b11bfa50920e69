"""ATTUNE (PAPERS.md B1) on this machine's CPU: a budgeted recipe tuner whose every proposal passes a
correctness gate, vs fixed-knob grid search, on real training steps.

Per job (claimbench.datasets.recipes: `moe-lm`, a small byte-level MoE; `causal-lm`, SmolLM2-135M
fine-tuning): the starting recipe's deterministic reference run (the gate's), its noise probes
(legitimate reorderings whose largest loss deviation sets the gate's tolerance, times
attune_gate.NOISE_FACTOR), its timing; then each proposer (grid search, profiler-guided, the shipped
external script) tunes it within the same wall-clock budget. The reported speedups are re-timed:
the starting recipe and each tuned one alternate in child processes (`BLOCKS` blocks of `TIMED`
timed steps after a warm-up step), and each round is one timed step of both in the same block. A
proposer whose proposals the gate all rejected keeps the starting recipe (speedup 1): a rejected
recipe's speed never counts. Transfer: the runtime changes tuned on one job carried over to the
other (the "held-out model"), gated, and timed beside the recipe tuned in place.
The gate audit (on `moe-lm`, where every knob exists; SmolLM2 steps cost too much for 28 checks):
planted semantic changes (each must be rejected), legitimate changes (none may be), and the
dynamic check alone on the planted ones (what it catches without the static part).
CLAIMBENCH_QUICK=1: `moe-lm` only, smaller budgets, a third of the audit.
"""
from __future__ import annotations

import logging

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, metrics

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 510  # seconds in quick mode on 2 cores (418 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m", "recipes")
JOBS = ["moe-lm"] if QUICK else ["moe-lm", "causal-lm"]
PROPOSERS = ["grid search", "profiler-guided", "external script"]
CLAIMED = "profiler-guided"  # the method's row: ATTUNE's proposer reads profiles, as its agent does
BUDGET_S = {"moe-lm": 60 if QUICK else 120, "causal-lm": 200}  # per proposer
CHECK_STEPS = 3  # the gate's deterministic steps
WARMUP, TIMED, BLOCKS = 1, 3, 1 if QUICK else 2
NOISE_PROBES = [{"runtime.micro_batch_rows": 2}, {"runtime.threads": 1}]
PLANTED = {  # semantic changes: each must be rejected
    "capacity factor 1.0 (drops overflow tokens)": {"moe.capacity_factor": 1.0},
    "capacity factor 1.25": {"moe.capacity_factor": 1.25},
    "fake-balanced router": {"moe.router": "balanced"},
    "forced router": {"moe.router": "forced"},
    "global batch halved": {"train.tokens_per_step": 1024},
    "bfloat16 precision": {"train.precision": "bfloat16"},
    "bfloat16 autocast": {"train.autocast": "bfloat16"},
    "loss scaled by 0.5": {"train.loss.scale": 0.5},
    "data order reseeded": {"data.seed": 1},
    "documents truncated to 256 tokens": {"data.truncate_tokens": 256},
    "label smoothing 0.1": {"train.loss.label_smoothing": 0.1},
    "embeddings frozen": {"train.frozen": ["tok_embeddings"]},
    "step 1's update skipped": {"train.skip_steps": [1]},
    "learning rate doubled": {"train.optimizer.lr": 2.0e-3},
    "gradient clipping at 0.1": {"train.grad_clip": 0.1},
    "sequence length 64": {"train.sequence_length": 64},
    "another initialization": {"model.init": "seed:1"},
}
LEGITIMATE = {  # how the same training runs: none may be rejected (the noise probes are not among them)
    "micro-batch 4": {"runtime.micro_batch_rows": 4},
    "micro-batch 8, packed": {"runtime.micro_batch_rows": 8, "runtime.packing": True},
    "packing": {"runtime.packing": True},
    "no activation checkpointing": {"runtime.activation_checkpointing": False},
    "fused AdamW": {"runtime.optimizer_impl": "fused"},
    "for-loop AdamW": {"runtime.optimizer_impl": "for-loop"},
    "one loader worker": {"runtime.loader_workers": 1},
    "DDP over 2 gloo processes": {"runtime.processes": 2, "runtime.threads": 1},
    "sorted dispatch": {"moe.dispatch": "sorted"},
    "padded-bmm dispatch": {"moe.dispatch": "padded-bmm"},
    "all of the fast ones": {"moe.dispatch": "sorted", "runtime.optimizer_impl": "fused", "runtime.micro_batch_rows": 8,
                             "runtime.packing": True, "runtime.activation_checkpointing": False},
}
if QUICK:
    PLANTED = dict(list(PLANTED.items())[::3])
    LEGITIMATE = dict(list(LEGITIMATE.items())[::3])
AUDIT_JOB = "moe-lm"


def proposer(name: str, cores: int):
    from claimbench.baselines.recipe_grid import GridSearch
    from claimbench.impl import attune_proposers
    return {"grid search": lambda: GridSearch(cores), "profiler-guided": lambda: attune_proposers.ProfilerGuided(cores),
            "external script": attune_proposers.scripted_example}[name]()


def timed_rounds(candidates: dict[str, dict]) -> dict[str, list[float]]:
    """Seconds per timed step of each recipe: the recipes alternate in child processes, BLOCKS times."""
    from claimbench.impl import attune
    seconds = {name: [] for name in candidates}
    for _ in range(BLOCKS):
        for name, recipe in candidates.items():
            status, timing = attune.time_recipe(recipe, WARMUP, TIMED, timeout_s=1800)
            if status != "ok":
                raise RuntimeError(f"timing {name} failed ({status}): {timing}")
            seconds[name] += timing["step_seconds"]
    return seconds


def tune(job: str) -> dict:
    from claimbench.datasets import recipes
    from claimbench.impl import attune, attune_gate, attune_training
    start = recipes.load(job)
    cores = attune_training.available_cores()
    log.info(f"{job}: reference run and noise probes")
    reference = attune_gate.reference_run(start, CHECK_STEPS)
    noise = []
    for probe in NOISE_PROBES:
        decision = attune_gate.check({**start, **probe}, start, reference, tolerance=float("inf"))
        if decision.loss_deviation is None or not decision.accepted:
            raise RuntimeError(f"{job}: noise probe {probe} failed: {decision.reason}")
        noise.append(decision.loss_deviation)
    tolerance = attune_gate.tolerance_from_noise(noise)
    log.info(f"{job}: noise {max(noise):.2e} -> tolerance {tolerance:.2e}")
    status, start_timing = attune.time_recipe(start, WARMUP, TIMED, timeout_s=1800)
    if status != "ok":
        raise RuntimeError(f"{job}: the starting recipe's timing failed ({status}): {start_timing}")
    tuner = attune.RecipeTuner(start, reference, start_timing, tolerance, budget_s=BUDGET_S[job],
                               warmup_steps=WARMUP, timed_steps=TIMED)
    results = {}
    for name in PROPOSERS:
        log.info(f"{job}: {name}, budget {BUDGET_S[job]} s")
        result = tuner.run(proposer(name, cores), progress=log.info)
        trials = [vars(t) for t in result.trials]
        deviation = next((t["loss_deviation"] for t in trials if t["status"] == "accepted"
                          and t["changes"] == result.best_changes), 0.0)
        results[name] = {"best": result.best, "changes": result.best_changes, "trials": trials, "used_s": result.used_s,
                         "single_timing": result.best_tokens_per_s, "deviation": deviation}
    return {"start": start, "reference": reference, "noise": noise, "tolerance": tolerance,
            "start_tokens_per_s": start_timing["tokens_per_s"], "proposers": results}


def carried(recipe_from: dict, start_to: dict) -> dict:
    """The runtime (tunable) changes of one job's tuned recipe applied to another job's start."""
    from claimbench.datasets import recipes
    return {**start_to, **{k: v for k, v in recipe_from.items() if k in recipes.TUNABLE and k in start_to}}


def audit(point: dict) -> dict:
    """The gate on AUDIT_JOB's planted and legitimate changes, with that job's reference and tolerance."""
    from claimbench.datasets import recipes
    from claimbench.impl import attune_gate
    start, reference, tolerance = point["start"], point["reference"], point["tolerance"]
    out = {"tolerance": tolerance, "noise": point["noise"], "planted": {}, "legitimate": {}, "dynamic_only": {}}
    for group, changes_by_name in (("planted", PLANTED), ("legitimate", LEGITIMATE)):
        for name, changes in changes_by_name.items():
            candidate = recipes.validate(recipes.nest({**start, **changes}), name)
            decision = attune_gate.check(candidate, start, reference, tolerance)
            out[group][name] = vars(decision)
            log.info(f"gate audit, {group} '{name}': {'accepted' if decision.accepted else 'rejected'} "
                     f"({decision.stage})" + (f": {decision.reasons[0]}" if decision.reasons else ""))
            if group == "planted":
                alone = attune_gate.check(candidate, start, reference, tolerance, static=False)
                out["dynamic_only"][name] = vars(alone)
                log.info(f"  dynamic check alone: {'missed' if alone.accepted else 'caught'}"
                         + (f": {alone.reasons[0]}" if alone.reasons else ""))
    return out


class _Measured(common.ComputedOnce):
    """The one setup_cache of Tuning, Transfer and Gate."""
    timeout = 3 * 3600

    def setup_cache(self):
        from claimbench.impl import attune_gate
        jobs = {job: tune(job) for job in JOBS}
        for job, point in jobs.items():
            recipes_by_name = {"start": point["start"], **{n: t["best"] for n, t in point["proposers"].items()}}
            others = [j for j in JOBS if j != job]
            point["carried"] = None
            if others:
                recipe = carried(jobs[others[0]]["proposers"][CLAIMED]["best"], point["start"])
                decision = attune_gate.check(recipe, point["start"], point["reference"], point["tolerance"])
                point["carried"] = {"from": others[0], "recipe": recipe, "gate": vars(decision)}
                if decision.accepted:
                    recipes_by_name["carried"] = recipe
            candidates, point["timed_as"] = {}, {}  # equal recipes are timed once
            for name, recipe in recipes_by_name.items():
                same = next((label for label, other in candidates.items() if other == recipe), None)
                if same is None:
                    candidates[name] = recipe
                point["timed_as"][name] = same or name
            log.info(f"{job}: re-timing {', '.join(candidates)} in {BLOCKS} interleaved block(s)")
            point["seconds"] = timed_rounds(candidates)
        return {"jobs": jobs, "audit": audit(jobs[AUDIT_JOB])}

    @staticmethod
    def _seconds(point: dict, name: str) -> list[float]:
        """Timed-step seconds of a recipe ("start", a proposer's tuned one, or "carried")."""
        return point["seconds"][point["timed_as"][name]]


class Tuning(_Measured):
    """Per job and proposer, at equal budget: the audited speedup and what the tuning tried."""
    params = (JOBS, PROPOSERS)
    param_names = ["job", "proposer"]

    @evidence.estimate
    def track_audited_speedup(self, r, job, proposer):
        """Starting recipe's seconds per step / the tuned recipe's, per round (same tokens per step)."""
        point = r["jobs"][job]
        return intervals.ratio_of_rounds(point["seconds"]["start"], self._seconds(point, proposer))
    track_audited_speedup.unit = metrics.SPEEDUP.unit

    @staticmethod
    def _tokens_per_s(point: dict, seconds: list[float]) -> intervals.Estimate:
        """Tokens per second of each re-timed step: the median, its interval, and the steps as the
        samples the alerts' rank test compares between runs."""
        tokens = point["start"]["train.tokens_per_step"]
        return intervals.median_of([tokens / s for s in seconds])

    @evidence.estimate
    def track_tuned_tokens_per_s(self, r, job, proposer):
        point = r["jobs"][job]
        return self._tokens_per_s(point, self._seconds(point, proposer))
    track_tuned_tokens_per_s.unit = metrics.TOKENS_PER_S.unit

    @evidence.estimate
    def track_start_tokens_per_s(self, r, job, proposer):
        point = r["jobs"][job]
        return self._tokens_per_s(point, point["seconds"]["start"])
    track_start_tokens_per_s.unit = metrics.TOKENS_PER_S.unit

    def track_trials(self, r, job, proposer):
        return len(r["jobs"][job]["proposers"][proposer]["trials"])
    track_trials.unit = metrics.COUNT.unit

    def track_trials_rejected(self, r, job, proposer):
        return sum(t["status"] == "rejected" for t in r["jobs"][job]["proposers"][proposer]["trials"])
    track_trials_rejected.unit = metrics.COUNT.unit

    def track_tunable_changes_rejected(self, r, job, proposer):
        """Proposals that changed only tunable keys and were rejected anyway: false rejects in the wild."""
        from claimbench.datasets import recipes
        return sum(t["status"] == "rejected" and all(k in recipes.TUNABLE for k in t["changes"])
                   for t in r["jobs"][job]["proposers"][proposer]["trials"])
    track_tunable_changes_rejected.unit = metrics.COUNT.unit

    def track_budget_used_s(self, r, job, proposer):
        return r["jobs"][job]["proposers"][proposer]["used_s"]
    track_budget_used_s.unit = metrics.SECONDS.unit

    def track_gate_tolerance(self, r, job, proposer):
        """The dynamic check's relative loss tolerance (NOISE_FACTOR x the noise probes' largest deviation)."""
        return r["jobs"][job]["tolerance"]
    track_gate_tolerance.unit = metrics.LOSS_DEVIATION.unit


class Claimed(_Measured):
    """The claim rows: the profiler-guided proposer's audited speedup per job, and the transfer."""
    params = (JOBS,)
    param_names = ["job"]

    @evidence.estimate
    def track_audited_speedup(self, r, job):
        point = r["jobs"][job]
        return intervals.ratio_of_rounds(point["seconds"]["start"], self._seconds(point, CLAIMED))
    track_audited_speedup.unit = metrics.SPEEDUP.unit

    def track_tuned_deviation_share_of_tolerance(self, r, job):
        """The tuned recipe's loss deviation in the gate's check over the tolerance (<= 1: it passed)."""
        point = r["jobs"][job]
        return point["proposers"][CLAIMED]["deviation"] / point["tolerance"]
    track_tuned_deviation_share_of_tolerance.unit = metrics.SHARE_OF_TOLERANCE.unit

    def track_tuned_changes(self, r, job):
        """How many keys the tuned recipe changed."""
        return len(r["jobs"][job]["proposers"][CLAIMED]["changes"])
    track_tuned_changes.unit = metrics.COUNT.unit

    @evidence.estimate
    def track_grid_search_speedup(self, r, job):
        """The baseline at the same budget."""
        point = r["jobs"][job]
        return intervals.ratio_of_rounds(point["seconds"]["start"], self._seconds(point, "grid search"))
    track_grid_search_speedup.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_in_place_over_carried(self, r, job):
        """Seconds per step of the recipe carried over from the other job / of the one tuned in place."""
        point = self._carried(r, job)
        return intervals.ratio_of_rounds(self._seconds(point, "carried"), self._seconds(point, CLAIMED))
    track_in_place_over_carried.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_carried_speedup(self, r, job):
        """The carried-over recipe over the starting one."""
        point = self._carried(r, job)
        return intervals.ratio_of_rounds(point["seconds"]["start"], self._seconds(point, "carried"))
    track_carried_speedup.unit = metrics.SPEEDUP.unit

    @staticmethod
    def _carried(r, job) -> dict:
        """The job's point, once a recipe carried over from the other job passed its gate: asv's skip in
        quick mode (one job, nothing to carry), a gate failure when the carried recipe failed."""
        point = r["jobs"][job]
        if not point["carried"]:
            raise SkipNotImplemented("transfer needs both jobs (full mode)")
        if not point["carried"]["gate"]["accepted"]:
            raise common.GateFailed(f"the carried-over recipe failed the gate: {point['carried']['gate']['reasons']}")
        return point


class Gate(_Measured):
    """The gate audit on moe-lm: planted semantic changes caught, legitimate changes rejected."""

    @evidence.estimate
    def track_planted_caught_percent(self, r):
        return intervals.rate([not d["accepted"] for d in r["audit"]["planted"].values()]).map(lambda x: 100 * x)
    track_planted_caught_percent.unit = metrics.CAUGHT.unit

    @evidence.estimate
    def track_legitimate_rejected_percent(self, r):
        return intervals.rate([not d["accepted"] for d in r["audit"]["legitimate"].values()]).map(lambda x: 100 * x)
    track_legitimate_rejected_percent.unit = metrics.FALSE_REJECTS.unit

    @evidence.estimate
    def track_dynamic_only_caught_percent(self, r):
        """What the dynamic check catches of the planted changes without the static part."""
        return intervals.rate([not d["accepted"] for d in r["audit"]["dynamic_only"].values()]).map(lambda x: 100 * x)
    track_dynamic_only_caught_percent.unit = metrics.CAUGHT.unit

    def track_noise_deviation(self, r):
        return max(r["audit"]["noise"])
    track_noise_deviation.unit = metrics.LOSS_DEVIATION.unit

    def track_largest_legitimate_deviation(self, r):
        return max(d["loss_deviation"] or 0.0 for d in r["audit"]["legitimate"].values())
    track_largest_legitimate_deviation.unit = metrics.LOSS_DEVIATION.unit

    def track_tolerance(self, r):
        return r["audit"]["tolerance"]
    track_tolerance.unit = metrics.LOSS_DEVIATION.unit
