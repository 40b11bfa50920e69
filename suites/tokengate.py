"""TokenGate's learned prefill pruning vs full prefill, GemFilter, FastKV and SnapKV on SmolLM2-135M
(PAPERS.md C2), at 4K and 8K, each pruning method at three keep shares (12.5%, 25% and 50% of the prompt).

The gates train first (base weights frozen, one gate set per keep share as its budget target, on
windows of the license texts' first half and completion samples with seeds from 10,000 that end
with their answer, so the distillation loss reads the needle; the training time is a result).
GemFilter's and FastKV's selection layers come from a needle probe on 4 samples of those seeds
(`token_pruning.needle_ranks`: the earliest layer ranking the needle in the top 5% of every probe):
the layers scaled from Llama-3.1-8B do not find the needle in SmolLM2. Then: TTFT (prefill of the
prompt and its first token) of every method against full prefill's at 8K on a needle prompt no
accuracy sample uses, interleaved in one process, 6 rounds; completion-task accuracy at 4K and 8K
(the needle task dense SmolLM2 solves; 12 samples each, the needle at all 12 depths, where the results
up to d5e78fe1 had 6, all in the context's first half; full prefill and SnapKV share one prefill per
prompt; the whole suite runs well over 2 hours on 2 cores: at 27da0e2 on the 2-core EPYC, ChatTasks' setup
took 39 min and Prefill's 112) with Wilson intervals and paired changes;
perplexity of a 32-token continuation of held-out license text after a 4K prefix (3 segments); the
share of token rows each method's prefill computes over the layers (in results up to d5e78fe1 the 10
decoded tokens counted too: 0.1-0.25% more); the peak RSS of a prefill of the timed prompt above the
loaded model, each in a fresh process, sampled every 2 ms (each layer's KV is allocated when its
first rows arrive, so a pruned layer holds only what reaches it; until 43bdfea every layer held
room for the whole prompt, and TokenGate could not use less than full prefill). SnapKV's prefill
is full prefill (it compresses the cache for decode): it is an accuracy reference, never timed.
ChatTasks: accuracy on the chat-format needle tasks at 4K (4 samples per task), whose needle
sentence, haystack and prompt format the gates never trained on (its setup loads the gates
Prefill's trained: the training runs once per recipe, keyed by the model, rows, knobs and gate code).
The claim row is TokenGate's TTFT speedup at 8K, gated on completion accuracy at least the lower
bound of full prefill's 95% interval. CLAIMBENCH_QUICK=1: 1K context, keep 25%, 10 samples, 6 rounds,
2 probes, 1 sample per chat task; the gates train as in full mode (60 steps on 256-token rows, about
3.5 min once, cached: the same file a full run loads for keep 25%), since they are the method: until
dd7d927 quick mode trained 4 steps on 128-token rows, and those gates pruned the needle from all 4
samples at 1K (the gate failed), where the full recipe's gates keep it in 11 of 12.
"""
import dataclasses
import logging
import math

import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, measure, metrics
from claimbench.baselines import token_pruning
from claimbench.baselines.token_pruning import FastKV, FullPrefill, GemFilter, SnapKV
from claimbench.datasets import longcontext, vectors
from claimbench.impl import tokengate
from claimbench.llm import evaluate, smollm

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 660  # seconds in quick mode on 2 cores (544 s with its gates cached, 768 s when it trained them)
INPUTS = ("corpus", "smollm2-135m")
CONTEXTS = {"1k": 1024} if QUICK else {"4k": 4096, "8k": 8192}
CLAIM_CONTEXT = list(CONTEXTS)[-1]
KEEPS = ["0.25"] if QUICK else ["0.125", "0.25", "0.5"]
METHODS = ["full", "tokengate", "gemfilter", "fastkv", "snapkv"]
TIMED = ["full", "tokengate", "gemfilter", "fastkv"]
SAMPLES = {"1k": 10} if QUICK else {"4k": 12, "8k": 12}  # completion samples per context (the needle at as many depths)
PERPLEXITY_CONTEXT = list(CONTEXTS)[0]
SEGMENTS, SCORED = (2, 16) if QUICK else (3, 32)
ROUNDS = 6
TRAINING = tokengate.GateTraining(steps=60, length=256, batch=2, lr=0.01, budget_weight=1.0, recent=32)
TRAINING_SEEDS = 10_000  # completion samples for the gates and the probe: seeds far from the evaluated 0..SAMPLES-1
PROBES = 2 if QUICK else 4
PROBED = {"gemfilter": "filter_layer", "fastkv": "layer"}  # method -> its selection layer's field
NEW_TOKENS = 10
CHAT_TASKS = ("niah-single", "niah-multikey", "niah-multivalue")  # the chat-format tasks dense SmolLM2 partly solves
CHAT_CONTEXT = list(CONTEXTS)[0]
CHAT_SAMPLES = 1 if QUICK else 4  # per task
CHAT_NEW_TOKENS = 32


def needle_prompt(tok, length: int, seed: int, answered: bool = False):
    """The completion sample of about `length` tokens with this seed, as accuracy evaluates it (with its
    answer after the prompt when `answered`): the sample, its token ids and the needle value's token indices."""
    sample = longcontext.make(longcontext.COMPLETION, length, evaluate.token_counter(tok), seed)
    encoding = tok.encode(sample.prompt() + (f": {sample.answers[0]}." if answered else ""))
    start = sample.context.index(sample.answers[0])
    end = start + len(sample.answers[0])
    return sample, encoding.ids, [i for i, (a, b) in enumerate(encoding.offsets) if a < end and b > start]


def training_rows(tok) -> torch.Tensor:
    """(N, length) token rows: windows of the license texts' first half, and the last `length` tokens of
    completion samples that end with their answer (those whose needle falls in that window)."""
    ids = tok.encode(longcontext.perplexity_text()).ids
    first = ids[:len(ids) // 2]
    n = TRAINING.length
    rows = [first[i:i + n] for i in range(0, len(first) - n, n)][:64]
    for seed in range(TRAINING_SEEDS, TRAINING_SEEDS + len(rows)):
        target, ids = n, []
        while len(ids) < n:  # the builder stops short of its target: grow it until the sample fills a row
            _, ids, needle = needle_prompt(tok, target, seed, answered=True)
            target += n // 4
        if needle[0] >= len(ids) - n:
            rows.append(ids[-n:])
    return torch.tensor(rows)


def selection_layers(model, tok) -> tuple[dict, dict]:
    """GemFilter's and FastKV's selection layers by the needle probe, and each layer's worst rank."""
    probes = []
    for seed in range(TRAINING_SEEDS, TRAINING_SEEDS + PROBES):
        _, ids, needle = needle_prompt(tok, CONTEXTS[PERPLEXITY_CONTEXT] - 40, seed)
        probes.append((ids[:-1], needle))
    scorers = {name: make(name, KEEPS[0], {}).scores for name in PROBED}
    ranks = token_pruning.needle_ranks(model, probes, scorers)
    return {name: token_pruning.earliest_layer(worst) for name, worst in ranks.items()}, \
        {name: worst.tolist() for name, worst in ranks.items()}


def make(method: str, keep: str, prepared: dict):
    """The method at this keep share; prepared holds the trained gates per keep and the probed layers."""
    share = float(keep)
    pruning = {"full": FullPrefill, "tokengate": lambda: tokengate.TokenGate(prepared["gates"][keep]),
               "gemfilter": lambda: GemFilter(share), "fastkv": lambda: FastKV(share),
               "snapkv": lambda: SnapKV(share)}[method]()
    if method in PROBED and "layers" in prepared:
        setattr(pruning, PROBED[method], prepared["layers"][method])
    return pruning


def computed_share(model, method, cache, length: int) -> float:
    """Token rows the method's prefill computed over the layers, over full prefill's."""
    layers = model.config.n_layers
    if isinstance(method, tokengate.TokenGate):
        return method.computed_share()
    if isinstance(method, GemFilter):
        return ((method.filter_layer + 1) * length + layers * cache.lengths[0]) / (layers * length)
    if isinstance(method, FastKV):
        return sum(cache.lengths) / (layers * length)
    return 1.0


def configurations() -> list[tuple[str, str]]:
    """(method, keep): full prefill once (under the first keep), every pruning method at every keep."""
    return [("full", KEEPS[0])] + [(m, k) for m in METHODS[1:] for k in KEEPS]


def completion_samples(tok):
    """(context, sample, prompt ids): the completion task's samples at every context."""
    for label, length in CONTEXTS.items():
        for seed in range(SAMPLES[label]):
            sample, ids, _ = needle_prompt(tok, length - 40, seed)
            yield label, sample, ids


def chat_samples(tok):
    """(task, sample, prompt ids): the chat-format needle tasks' samples at CHAT_CONTEXT."""
    count = evaluate.token_counter(tok)
    for task in CHAT_TASKS:
        for seed in range(CHAT_SAMPLES):
            sample = longcontext.make(task, CONTEXTS[CHAT_CONTEXT] - 40, count, seed)
            yield task, sample, tok.encode(sample.prompt()).ids


def prefills(model, prepared: dict, ids, room: int):
    """(method, keep, the method, its prefill's cache) for every configuration on one prompt. Full
    prefill runs once, with SnapKV's window captured: full prefill and SnapKV at each keep share get a
    copy of its cache (SnapKV's prefill is full prefill; only its compression differs)."""
    observed = None
    for method, keep in configurations():
        pruning = make(method, keep, prepared)
        if method in ("full", "snapkv"):
            observed = observed or token_pruning.observed_prefill(model, ids, room, SnapKV.window)
            cache = observed[0].clone()
            if method == "snapkv":
                pruning.compress(cache, *observed[1:])
        else:
            cache, _ = pruning.prefill(model, ids, room=room)
        yield method, keep, pruning, cache


def accuracy(model, tok, eos, prepared, samples, new_tokens: int = NEW_TOKENS) -> tuple[dict, dict]:
    """(group, method, keep) -> the scores of the samples ((group, sample, ids) each), and the mean
    computed share."""
    scores, shares = {}, {}
    samples = list(samples)
    for done, (group, sample, ids) in enumerate(samples):
        log.info("  sample %d of %d (%s, %d tokens)", done + 1, len(samples), group, len(ids))
        for method, keep, pruning, cache in prefills(model, prepared, ids[:-1], new_tokens + 24):
            key = (group, method, keep)
            shares.setdefault(key, []).append(computed_share(model, pruning, cache, len(ids) - 1))
            out = evaluate.decode(model, cache, None, new_tokens, eos, token=ids[-1])
            scores.setdefault(key, []).append(longcontext.score(sample, tok.decode(out)))
    return scores, {key: sum(v) / len(v) for key, v in shares.items()}


def continuation_nll(model, tok, prepared) -> dict:
    """(context, method, keep) -> mean NLL of SCORED held-out tokens after a context-long prefix, per segment."""
    ids = tok.encode(longcontext.perplexity_text()).ids
    held_out = ids[len(ids) // 2:]
    out = {}
    for label, length in {PERPLEXITY_CONTEXT: CONTEXTS[PERPLEXITY_CONTEXT]}.items():
        prefix = length - SCORED - 8
        for segment in range(SEGMENTS):
            start = segment * (len(held_out) - length) // max(1, SEGMENTS - 1) if SEGMENTS > 1 else 0
            chunk = held_out[start:start + prefix + SCORED + 1]
            for method, keep, _, cache in prefills(model, prepared, chunk[:prefix], SCORED + 8):
                nll = evaluate.teacher_forced_nll(model, cache, chunk[prefix], chunk[prefix + 1:prefix + 1 + SCORED])
                out.setdefault((label, method, keep), []).append(sum(nll) / len(nll))
    return out


def timed_prompt(tok) -> list[int]:
    """The prompt TTFT and memory are measured on: a needle sample at the claim's context with the first
    seed accuracy does not use (TokenGate's gates keep a share that depends on the text: on random
    token ids they computed 74% of the rows at keep 12.5%, on needle prompts 58%)."""
    return needle_prompt(tok, CONTEXTS[CLAIM_CONTEXT] - 40, SAMPLES[CLAIM_CONTEXT])[1][:-1]


def timing(model, prepared, ids) -> dict:
    """(context, method, keep) -> seconds per round of prefill + first token of `ids`, interleaved."""
    calls = {(method, keep): _ttft_call(model, make(method, keep, prepared), ids)
             for method, keep in configurations() if method in TIMED}
    times = measure.interleaved(calls, rounds=ROUNDS,
                                progress=lambda line: log.info("tokengate: TTFT at %s, %s", CLAIM_CONTEXT, line))
    return {(CLAIM_CONTEXT, *key): seconds for key, seconds in times.items()}


def _ttft_call(model, pruning, ids):
    def call():
        _, logits = pruning.prefill(model, ids, room=8)
        return int(logits.argmax())
    return call


def memory(model, prepared: dict, ids) -> dict:
    """(context, method, keep) -> peak RSS of a prefill of `ids` above the loaded model, each in a fresh
    process; a measurement that fails is kept as its error (the other results stand)."""
    out = {}
    for method, keep in configurations():
        if method in TIMED:
            try:
                out[CLAIM_CONTEXT, method, keep] = measure.in_child(
                    smollm.prefill_peak_rss_above_model, make(method, keep, prepared), ids)
            except Exception as e:  # noqa: BLE001 - a failed child costs this number, not the suite's
                out[CLAIM_CONTEXT, method, keep] = f"{type(e).__name__}: {e}"
    return out


def prepare(model, tok) -> dict:
    """What the methods need: the gates per keep share (trained once per recipe, kept beside the datasets)
    and GemFilter's and FastKV's probed layers; with the training logs and seconds and the probe's ranks."""
    rows = training_rows(tok)
    gates, logs, seconds = {}, {}, {}
    for keep in KEEPS:
        knobs = dataclasses.replace(TRAINING, target_keep=float(keep))
        log.info("tokengate: the gates for keep %s (%d training steps)", keep, knobs.steps)
        gates[keep], logs[keep], seconds[keep] = tokengate.trained_gates(
            model, rows, knobs, vectors.cache_dir() / "tokengate", say=log.info)
    log.info("tokengate: GemFilter's and FastKV's selection layers by the needle probe (%d probes)", PROBES)
    layers, ranks = selection_layers(model, tok)
    return {"gates": gates, "layers": layers, "training": logs, "training_s": seconds, "needle_ranks": ranks}


class _Measured(common.ComputedOnce):
    timeout = 3 * 3600

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        prepared = prepare(model, tok)
        log.info("tokengate: the needle task at %s, %d configurations", ", ".join(CONTEXTS), len(configurations()))
        scores, shares = accuracy(model, tok, eos, prepared, completion_samples(tok))
        log.info("tokengate: continuation perplexity at %s", PERPLEXITY_CONTEXT)
        nll = continuation_nll(model, tok, prepared)
        timed = timed_prompt(tok)
        log.info("tokengate: TTFT and peak prefill memory at %s", CLAIM_CONTEXT)
        return {**{key: prepared[key] for key in ("training", "training_s", "layers", "needle_ranks")},
                "accuracy": scores, "shares": shares, "nll": nll,
                "timing": timing(model, prepared, timed), "memory": memory(model, prepared, timed)}


class _AccuracyRows:
    """Accuracy rows over (group, method, keep), the group a context or a task; full prefill's rows sit
    on the first keep share."""

    def _key(self, group, method, keep):
        if method == "full" and keep != KEEPS[0]:
            raise SkipNotImplemented("full prefill has no keep share (its rows sit on the first)")
        return group, method, keep

    def _scores(self, r, group, method, keep):
        return self._get(r["accuracy"], self._key(group, method, keep), "not measured")

    @evidence.estimate
    def track_accuracy(self, r, group, method, keep):
        """Accuracy over the samples, Wilson interval."""
        return intervals.rate(self._scores(r, group, method, keep))
    track_accuracy.unit = metrics.ACCURACY.unit

    @evidence.estimate
    def track_accuracy_change_points(self, r, group, method, keep):
        """Accuracy minus full prefill's, in points, paired over the same samples."""
        items = list(zip(self._scores(r, group, "full", KEEPS[0]), self._scores(r, group, method, keep)))
        return intervals.bootstrap(items, lambda xs: 100 * sum(m - f for f, m in xs) / len(xs))
    track_accuracy_change_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_accuracy_margin_points(self, r, group, method, keep):
        """Accuracy minus the lower bound of full prefill's 95% interval, in points (>= 0 passes; the
        claim's gate on the completion task at 8K). Its interval is the method's own Wilson interval less
        that bound: where it spans 0, the gate passed on its value but the samples cannot tell."""
        bound = intervals.rate(self._scores(r, group, "full", KEEPS[0])).low
        return intervals.rate(self._scores(r, group, method, keep)).map(lambda share: 100 * (share - bound))
    track_accuracy_margin_points.unit = metrics.POINTS.unit

    def track_computed_share(self, r, group, method, keep):
        """Token rows computed over the layers, over full prefill's (mean over the accuracy samples)."""
        return self._get(r["shares"], self._key(group, method, keep), "not measured")
    track_computed_share.unit = metrics.COMPUTED_SHARE.unit


class Prefill(_AccuracyRows, _Measured):
    """Every (method, keep) at every context: completion-task accuracy, perplexity, computed share, TTFT
    and its speedup over full prefill; the claim rows sit on (context=8k, method=tokengate)."""
    params = (list(CONTEXTS), METHODS, KEEPS)
    param_names = ["context", "method", "keep"]

    @evidence.estimate
    def track_continuation_perplexity_change(self, r, context, method, keep):
        """Perplexity of the held-out continuation vs full prefill's, in %, paired over segments."""
        pruned = self._get(r["nll"], self._key(context, method, keep), f"perplexity is measured at {PERPLEXITY_CONTEXT}")
        items = list(zip(r["nll"][context, "full", KEEPS[0]], pruned))
        return intervals.bootstrap(items, lambda xs: 100 * (math.exp(sum(m - f for f, m in xs) / len(xs)) - 1))
    track_continuation_perplexity_change.unit = metrics.PERCENT_CHANGE.unit

    def _times(self, r, context, method, keep):
        return self._get(r["timing"], self._key(context, method, keep),
                         f"timed at {CLAIM_CONTEXT} only; SnapKV's prefill is full prefill: it is not timed")

    @evidence.estimate
    def track_ttft_s(self, r, context, method, keep):
        """Prefill + first token, median of interleaved rounds."""
        return intervals.median_of(self._times(r, context, method, keep))
    track_ttft_s.unit = metrics.SECONDS.unit

    def speedup(self, r, context, method, keep) -> intervals.Estimate:
        return intervals.ratio_of_rounds(self._times(r, context, "full", KEEPS[0]), self._times(r, context, method, keep))

    @evidence.estimate
    def track_ttft_speedup(self, r, context, method, keep):
        """Full prefill's TTFT over the method's, per interleaved round."""
        return self.speedup(r, context, method, keep)
    track_ttft_speedup.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_ttft_speedup_claim(self, r, context, method, keep):
        """The claim row: TokenGate's TTFT speedup at the claim's context (8K; 1K in quick mode)."""
        if (context, method) != (CLAIM_CONTEXT, "tokengate"):
            raise SkipNotImplemented("the claim rows are TokenGate's at the longest context")
        return self.speedup(r, context, method, keep)
    track_ttft_speedup_claim.unit = metrics.SPEEDUP.unit

    def track_peak_prefill_rss(self, r, context, method, keep):
        """Peak RSS during one prefill above the loaded model's, in a fresh process, at the claim's context."""
        value = self._get(r["memory"], self._key(context, method, keep), "memory is measured at the claim's context, "
                                                                           "for the timed methods")
        if isinstance(value, str):
            raise RuntimeError(f"the memory measurement failed: {value}")
        return float(value)
    track_peak_prefill_rss.unit = metrics.BYTES.unit


class Training(_Measured):
    """The gates' training per keep share (its budget target)."""
    params = (KEEPS,)
    param_names = ["keep"]

    def track_training_seconds(self, r, keep):
        return r["training_s"][keep]
    track_training_seconds.unit = metrics.SECONDS.unit

    def track_final_kl(self, r, keep):
        """KL from the unpruned model's next-token distribution, mean over the last 5 steps."""
        return sum(step["kl"] for step in r["training"][keep][-5:]) / min(5, len(r["training"][keep]))
    track_final_kl.unit = metrics.KL_DIVERGENCE.unit


class Probe(_Measured):
    """GemFilter's and FastKV's selection layers, picked by the needle probe."""
    params = (list(PROBED),)
    param_names = ["method"]

    def track_selection_layer(self, r, method):
        """The earliest layer (0-based) ranking the needle in the top 5% of every probe (else the best-ranked)."""
        return float(r["layers"][method])
    track_selection_layer.unit = metrics.LAYER.unit

    def track_needle_rank_share(self, r, method):
        """The needle's worst rank over the probes at that layer, as a share of the prompt."""
        return r["needle_ranks"][method][r["layers"][method]]
    track_needle_rank_share.unit = metrics.NEEDLE_RANK.unit


class ChatTasks(_AccuracyRows, common.ComputedOnce):
    """The chat-format needle tasks at 4K (1K in quick mode): another needle sentence ("One of the special
    magic numbers for KEY is: VALUE."), a haystack of corpus sentences, the question in SmolLM2's chat
    format, none of which the gates trained on; each task (4 samples) and the three pooled ("all"),
    every method at every keep, with Prefill's gates (the same recipe)."""
    params = ([*CHAT_TASKS, "all"], METHODS, KEEPS)
    param_names = ["task", "method", "keep"]
    timeout = 3 * 3600

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        scores, shares = accuracy(model, tok, eos, prepare(model, tok), chat_samples(tok), CHAT_NEW_TOKENS)
        for method, keep in configurations():
            scores["all", method, keep] = [s for task in CHAT_TASKS for s in scores[task, method, keep]]
            shares["all", method, keep] = sum(shares[task, method, keep] for task in CHAT_TASKS) / len(CHAT_TASKS)
        return {"accuracy": scores, "shares": shares}
