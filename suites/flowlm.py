"""Flow drafter vs speculative baselines and token-by-token decoding on SmolLM2-135M (PAPERS.md C4).

Every drafter's blocks are verified by the target (claimbench.llm.speculative, greedy), so each
output must equal plain greedy decoding's token for token: that is the quality gate, checked per
prompt. Drafters: the flow drafter (impl/flowlm.py), prompt lookup, Medusa-1 heads and an early
exit at half depth (baselines/drafters.py). The learned two (flow, Medusa) get the same data and
budget: the target's hidden states over rows of the license texts' first half, `TRAINING` Adam
steps on minibatches of (hidden state, next K_MAX tokens after the target's own) pairs; their
training seconds are results.

Tasks on the held-out second half: `continuation` (free continuation of a span: where lookup has
little to find) and `copy` (a passage, a blank line and the passage's first words again: the greedy
continuation repeats it, where lookup helps). Per (task, drafter) at block size K: tokens per second
against plain greedy decoding (the same harness with nothing drafted, its output checked equal to
evaluate.generate's), interleaved in one process, `ROUNDS` rounds of every prompt, the ratio per
round with its interval; acceptance length (tokens per target pass, the bonus token counted;
bootstrap over prompts); draft time per pass; a verify pass's cost in decode steps (the plain rows'
pass, timed in the same round); and what that implies: the speedup if a verify pass cost one decode
step, as it nearly does on a GPU at batch 1 (memory-bound), the drafting cost as measured here (these
three per round, the median over the rounds with its interval). Sweeps,
untimed: acceptance length over the block size k per drafter, and over the flow's Euler steps.
CLAIMBENCH_QUICK=1: 2 prompts of 12 new tokens per task, 2 rounds, 4 training steps.
"""
import logging
import time

import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, measure, metrics
from claimbench.baselines import drafters
from claimbench.datasets import text, vectors
from claimbench.impl import flowlm
from claimbench.llm import evaluate, speculative
from claimbench.llm.model import save_for_model

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 400  # seconds in quick mode on 2 cores (its first run, building its cached inputs, took 334 s)
INPUTS = ("corpus", "smollm2-135m")
TASKS = ["continuation", "copy"]
DRAFTERS = ["prompt-lookup", "medusa", "early-exit", "flow"]
K = 4  # the block size of the timed rows and the claim
KS = ["2", "4"] if QUICK else ["2", "4", "6"]
K_MAX = max(int(k) for k in KS)  # the learned drafters' heads / block width
FLOW_STEPS = ["1", "4"] if QUICK else ["1", "2", "4", "8"]
PROMPTS, PROMPT_TOKENS, NEW_TOKENS = (2, 48, 12) if QUICK else (5, 96, 32)
COPY_PASSAGE, COPY_CUE = (24, 4) if QUICK else (64, 8)
ROUNDS = 2 if QUICK else 7
ROWS, ROW_TOKENS = (4, 32) if QUICK else (192, 128)
TRAINING = speculative.HeadTraining(steps=4 if QUICK else 300, batch=16 if QUICK else 128, lr=1e-3)


def prompts(tok) -> dict[str, list[list[int]]]:
    """task -> prompts (token ids) from the held-out half, spread evenly over it."""
    _, held_out = text.token_halves(tok)
    stride = (len(held_out) - PROMPT_TOKENS - NEW_TOKENS) // PROMPTS
    spans = [held_out[i * stride:i * stride + PROMPT_TOKENS] for i in range(PROMPTS)]
    blank = tok.encode("\n\n").ids
    return {"continuation": spans,
            "copy": [span[:COPY_PASSAGE] + blank + span[:COPY_CUE] for span in spans]}


def training_rows(tok) -> torch.Tensor:
    calibration, _ = text.token_halves(tok)
    usable = min(ROWS, len(calibration) // ROW_TOKENS)
    return torch.tensor(calibration[:usable * ROW_TOKENS]).reshape(usable, ROW_TOKENS)


def train(model, tok, progress=log.info) -> tuple[dict, dict, dict]:
    """The learned drafters, their loss curves and training seconds (hidden states' extraction apart)."""
    started = time.perf_counter()
    hidden, future = speculative.future_pairs(model, training_rows(tok), K_MAX)
    seconds = {"hidden-states": time.perf_counter() - started}
    progress(f"flowlm: {len(hidden)} training pairs in {seconds['hidden-states']:.0f} s")
    learned, losses = {}, {}
    for name, fit in (("medusa", drafters.train_medusa), ("flow", flowlm.train_flow)):
        started = time.perf_counter()
        learned[name], losses[name] = fit(model, hidden, future, TRAINING, say=progress)
        seconds[name] = time.perf_counter() - started
        save_for_model(vectors.cache_dir() / "flowlm" / f"{name}{'-quick' if QUICK else ''}.pt", model,
                       knobs=learned[name].knobs(), state=learned[name].state_dict())
    return learned, losses, seconds


def make(name: str, learned: dict):
    return {"prompt-lookup": drafters.PromptLookup, "early-exit": drafters.EarlyExit,
            "medusa": lambda: learned["medusa"], "flow": lambda: learned["flow"]}[name]()


def run_all(model, eos, drafter, ids_list, k: int) -> list[speculative.Generation]:
    return [speculative.generate(model, ids, drafter, NEW_TOKENS, k, eos) for ids in ids_list]


def measure_all(model, tok, eos, progress=log.info) -> dict:
    learned, losses, seconds = train(model, tok, progress)
    tasks = prompts(tok)
    out = {"losses": losses, "training_s": seconds, "timing": {}, "generations": {}, "references": {},
           "rounds": {}, "sweep": {}, "flow_steps": {}}
    for task, ids_list in tasks.items():
        out["references"][task] = [evaluate.generate(model, ids, NEW_TOKENS, eos) for ids in ids_list]
        calls = {}
        for name in ("plain", *DRAFTERS):  # plain: the same harness with nothing drafted, one token per pass
            def call(drafter=None if name == "plain" else make(name, learned), key=(task, name), ids_list=ids_list):
                out["generations"][key] = run_all(model, eos, drafter, ids_list, K)  # the last round's are kept
                out["rounds"].setdefault(key, []).append(totals(out["generations"][key]))
            calls[name] = call
        for name, times in measure.interleaved(calls, rounds=ROUNDS).items():
            out["timing"][task, name] = times
            out["rounds"][task, name] = out["rounds"][task, name][-ROUNDS:]  # the warmup round's dropped
        if [g.tokens for g in out["generations"][task, "plain"]] != out["references"][task]:
            raise RuntimeError(f"flowlm: the harness's plain decoding differs from evaluate.generate on {task}")
        progress(f"flowlm: {task}: " + ", ".join(
            f"{name} {measure.ratio(out['timing'][task, 'plain'], out['timing'][task, name]):.2f}x"
            for name in DRAFTERS))
        for name in DRAFTERS:
            for k in KS:
                out["sweep"][task, name, k] = (out["generations"][task, name] if int(k) == K else
                                               run_all(model, eos, make(name, learned), ids_list, int(k)))
        default_steps = learned["flow"].steps
        for steps in FLOW_STEPS:
            learned["flow"].steps = int(steps)
            out["flow_steps"][task, steps] = (out["generations"][task, "flow"] if int(steps) == default_steps else
                                              run_all(model, eos, learned["flow"], ids_list, K))
        learned["flow"].steps = default_steps
    for table in ("generations", "sweep", "flow_steps"):  # plain data for the tracks
        out[table] = {key: [_plain(g) for g in value] for key, value in out[table].items()}
    return out


def totals(generations: list[speculative.Generation]) -> dict:
    """One round's sums over its prompts: new tokens, target passes after the prompt's, seconds drafting
    and verifying."""
    return {"tokens": sum(len(g.tokens) - 1 for g in generations), "passes": sum(g.forwards - 1 for g in generations),
            "draft_s": sum(g.draft_s for g in generations), "verify_s": sum(g.verify_s for g in generations)}


def _plain(generation: speculative.Generation) -> dict:
    return {"tokens": generation.tokens, "forwards": generation.forwards, "draft_s": generation.draft_s,
            "verify_s": generation.verify_s}


def acceptance(generations: list[dict]) -> intervals.Estimate:
    """Tokens per target pass over all prompts (ratio of sums), bootstrap over prompts."""
    return intervals.bootstrap(generations,
                               lambda gs: sum(len(g["tokens"]) for g in gs) / sum(g["forwards"] for g in gs))


def step_seconds(r, task: str) -> list[float]:
    """One decode step per timed round: the plain rows' target time per pass."""
    return [plain["verify_s"] / plain["passes"] for plain in r["rounds"][task, "plain"]]


class _Measured(common.ComputedOnce):
    """The one setup_cache of every class here."""
    timeout = 2 * 3600

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        return measure_all(model, tok, eos)


class Decoding(_Measured):
    """Per (task, drafter) at block size K: speed against plain greedy decoding and what explains it."""
    params = (TASKS, DRAFTERS)
    param_names = ["task", "drafter"]

    def _generations(self, r, task, drafter):
        return r["generations"][task, drafter]

    def track_mismatched_outputs(self, r, task, drafter):
        """Prompts whose output differs from plain greedy decoding's (the gate: 0)."""
        return sum(g["tokens"] != ref for g, ref in zip(self._generations(r, task, drafter), r["references"][task]))
    track_mismatched_outputs.unit = metrics.COUNT.unit

    @evidence.estimate
    def track_acceptance_length(self, r, task, drafter):
        """Tokens per target forward pass (plain decoding: 1)."""
        return acceptance(self._generations(r, task, drafter))
    track_acceptance_length.unit = metrics.ACCEPTANCE_LENGTH.unit

    @staticmethod
    def _speedup(r, task, drafter) -> intervals.Estimate:
        return intervals.ratio_of_rounds(r["timing"][task, "plain"], r["timing"][task, drafter])

    @evidence.estimate
    def track_speedup(self, r, task, drafter):
        """Plain greedy decoding's time over the drafter's for the same prompts, per interleaved round."""
        return self._speedup(r, task, drafter)
    track_speedup.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_speedup_claim(self, r, task, drafter):
        """The claim row: the flow drafter's speedup on free continuation."""
        if (task, drafter) != ("continuation", "flow"):
            raise SkipNotImplemented("the claim row is the flow drafter's on free continuation")
        return self._speedup(r, task, drafter)
    track_speedup_claim.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_tokens_per_s(self, r, task, drafter):
        tokens = sum(len(g["tokens"]) for g in self._generations(r, task, drafter))
        return intervals.median_of([tokens / s for s in r["timing"][task, drafter]])
    track_tokens_per_s.unit = metrics.TOKENS_PER_S.unit

    @evidence.estimate
    def track_draft_s_per_pass(self, r, task, drafter):
        """Drafting seconds per target pass, the median over the timed rounds."""
        return intervals.median_of([one["draft_s"] / one["passes"] for one in r["rounds"][task, drafter]])
    track_draft_s_per_pass.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_verify_cost_in_steps(self, r, task, drafter):
        """A verify pass (up to K + 1 tokens) over one plain decode step of the same round, both in the
        same harness; the median over the timed rounds."""
        return intervals.median_of([one["verify_s"] / one["passes"] / step
                                    for one, step in zip(r["rounds"][task, drafter], step_seconds(r, task))])
    track_verify_cost_in_steps.unit = metrics.DECODE_STEPS.unit

    @evidence.estimate
    def track_speedup_if_verify_cost_one_step(self, r, task, drafter):
        """What the acceptance implies where a verify pass costs one decode step (a GPU at batch 1 is
        memory-bound): decoded tokens over (passes + drafting time in decode steps of the same round),
        drafting as here; the median over the timed rounds."""
        return intervals.median_of([one["tokens"] / (one["passes"] + one["draft_s"] / step)
                                    for one, step in zip(r["rounds"][task, drafter], step_seconds(r, task))])
    track_speedup_if_verify_cost_one_step.unit = metrics.SPEEDUP.unit


class BlockSize(_Measured):
    """Acceptance length over the block size k (untimed), per drafter; the learned heads are K_MAX wide."""
    params = (DRAFTERS, KS)
    param_names = ["drafter", "k"]

    @evidence.estimate
    def track_acceptance_length_continuation(self, r, drafter, k):
        return acceptance(r["sweep"]["continuation", drafter, k])
    track_acceptance_length_continuation.unit = metrics.ACCEPTANCE_LENGTH.unit

    @evidence.estimate
    def track_acceptance_length_copy(self, r, drafter, k):
        return acceptance(r["sweep"]["copy", drafter, k])
    track_acceptance_length_copy.unit = metrics.ACCEPTANCE_LENGTH.unit


class FlowSteps(_Measured):
    """The flow drafter's acceptance length over its Euler steps, at block size K (untimed)."""
    params = (TASKS, FLOW_STEPS)
    param_names = ["task", "steps"]

    @evidence.estimate
    def track_acceptance_length(self, r, task, steps):
        return acceptance(r["flow_steps"][task, steps])
    track_acceptance_length.unit = metrics.ACCEPTANCE_LENGTH.unit

    def track_mismatched_outputs(self, r, task, steps):
        return sum(g["tokens"] != ref for g, ref in zip(r["flow_steps"][task, steps], r["references"][task]))
    track_mismatched_outputs.unit = metrics.COUNT.unit


class Training(_Measured):
    """The learned drafters' training: seconds and the final loss (mean of the last 10 steps)."""
    params = (["medusa", "flow"],)
    param_names = ["drafter"]

    def track_training_seconds(self, r, drafter):
        return r["training_s"][drafter]
    track_training_seconds.unit = metrics.SECONDS.unit

    def track_final_loss(self, r, drafter):
        """Medusa: cross-entropy (nats) over its heads; flow: flow-matching MSE."""
        tail = r["losses"][drafter][-10:]
        return sum(tail) / len(tail)
    track_final_loss.unit = metrics.TRAINING_LOSS.unit
