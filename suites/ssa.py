"""SSA vs PQCache, top-k, Quest, importance sampling and dense on SmolLM2-135M (PAPERS.md A2).

One 4K (and, in full mode, 8K) prefill per sample is shared by every method (a copy of the KV
cache each); the methods act at decode through the model's attention hook, with the same budget
split (sink 4 + local 16 + the rest chosen; 81 tokens at 50x on 4,096) and the same PQ proxy.
Measured: attention-output relative error vs dense per layer and head (one decode step after each
sample's prefill, same q/k/v for all; an interval over the samples, each its mean over layers and
heads), task accuracy on every long-context task (each sample's score averaged over the
methods' random draws at ACCURACY_SEEDS seeds; the Wilson interval of a rate stays conservative for
such averaged scores), perplexity of license text decoded teacher-forced after a prefix of the
context length (each token's NLL averaged over the methods' random draws at PERPLEXITY_SEEDS seeds,
an interval over the tokens), and the claim numbers on the completion task (`niah-completion`,
which dense SmolLM2-135M solves, so there is something to keep): SSA's accuracy minus the strongest
practical baseline's and SSA's share of dense accuracy, each with a paired-bootstrap interval over
the same samples. The strongest baseline is chosen on all samples and held fixed in the resamples
(so the gain's interval leaves out the choice's own noise). ProxySweep: SSA and proxy top-k at 50x
with PQ proxies from 2x6 to 8x8 bits per head, low-rank keys and the exact keys (full mode; the chat
tasks, scored as in Sparse).
Full mode: 4K at 50x/20x/10x and 8K at 50x, two samples per chat task; at 50x (the claims'
sparsity) 24 completion samples (the needle at 12 depths, twice); three seeds per score.
CLAIMBENCH_QUICK=1: 4K only, 50x only, one sample per chat task and 10 completion samples (the
fewest an interval is called on), one seed per score.
"""
import functools
import logging

import torch

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, metrics
from claimbench.baselines.sparse_attention import Dense, ImportanceSampling, OracleTopK, PQCache, Quest
from claimbench.datasets import longcontext
from claimbench.impl.ssa import SSA
from claimbench.llm import evaluate as evaluate_llm
from claimbench.llm.sparse import ExactProxy, LowRankProxy, PQProxy

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 1050  # seconds in quick mode on 2 cores (878 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")
LENGTHS = [4096] if QUICK else [4096, 8192]
SPARSITIES = [50] if QUICK else [50, 20, 10]
SAMPLES = 1 if QUICK else 2
COMPLETION_SAMPLES = 10 if QUICK else 24
PERPLEXITY_TOKENS = 32  # decoded teacher-forced with each method after the shared prefill
PERPLEXITY_SEEDS = 2 if QUICK else 4  # of the methods' own draws (SSA's samples, the PQ codebooks' k-means start)
ACCURACY_SEEDS = 1 if QUICK else 3  # the same draws, for each task sample's score
PRACTICAL = ["pqcache", "quest", "importance-sampling"]  # the oracle needs exact scores: not practical
METHODS = ["dense", "ssa", "pqcache", "oracle-top-k", "quest", "importance-sampling"]
# The proxy is the lever (issue: "a finer proxy should be swept"): PQ sub-vectors x bits per head, then
# low-rank keys (4 and 16 fp16 numbers per key: as many bytes as pq-8x8, and four times that).
# Each takes the dict in which a prefill's PQ codebooks are shared (PQProxy.shared) and the seed of its k-means start.
PROXIES = {"pq-2x6": lambda books, seed: PQProxy(2, 6, seed=seed, shared=books),
           "pq-4x8": lambda books, seed: PQProxy(4, 8, seed=seed, shared=books),
           "pq-8x8": lambda books, seed: PQProxy(8, 8, seed=seed, shared=books),
           "lowrank-4": lambda *_: LowRankProxy(4), "lowrank-16": lambda *_: LowRankProxy(16),
           "exact": lambda *_: ExactProxy()}


def make_methods(sparsity: float, seed: int = 0) -> dict:
    """Fresh methods for one prefill, their random draws from `seed`; the three on PQ keys share its
    codebooks (the same numbers)."""
    books = {}
    return {"dense": Dense(), "ssa": SSA(sparsity=sparsity, seed=seed, proxy=PQProxy(seed=seed, shared=books)),
            "pqcache": PQCache(sparsity=sparsity, proxy=PQProxy(seed=seed, shared=books)),
            "oracle-top-k": OracleTopK(sparsity=sparsity), "quest": Quest(sparsity=sparsity),
            "importance-sampling": ImportanceSampling(sparsity=sparsity, seed=seed,
                                                      proxy=PQProxy(seed=seed, shared=books))}


class ErrorProbe:
    """Attention hook that returns dense attention and records every method's relative error."""

    def __init__(self, methods: dict):
        self.methods, self.errors = methods, {name: [] for name in methods}

    def attend(self, layer, q, k, v):
        dense = self.methods["dense"].attend(layer, q, k, v)
        for name, m in self.methods.items():
            out = m.attend(layer, q, k, v)
            err = (out - dense).norm(dim=-1) / dense.norm(dim=-1).clamp(min=1e-9)  # (B, H, 1)
            self.errors[name] += err.flatten().tolist()
        return dense


def proxy_methods(sparsity: float, seed: int = 0) -> dict:
    """SSA and proxy top-k (PQCache's selection) at every proxy resolution, dense as the reference."""
    out, books = {"dense": Dense()}, {}
    for proxy, make in PROXIES.items():
        out[f"ssa/{proxy}"] = SSA(sparsity=sparsity, seed=seed, proxy=make(books, seed))
        out[f"top-k/{proxy}"] = PQCache(sparsity=sparsity, proxy=make(books, seed))
    return out


def evaluate(length: int, make, samples: int, completion_samples: int = 0, seeds: int = 1) -> dict:
    """Accuracy per (method, task), per-sample scores on the chat tasks and their mean (an interval over
    the samples; the tasks have as many each, so it is also the mean over tasks), attention error and
    perplexity per method, and per-sample outcomes on the completion task, for the methods make()
    returns (fresh ones per sample; make(seed) draws with another seed), sharing one prefill per sample.
    A sample's score is its mean over the methods' draws at `seeds` seeds."""
    model, tok, eos = common.smollm2()
    names = list(make())
    tasks = {task: samples for task in longcontext.TASKS}
    if completion_samples:
        tasks[longcontext.COMPLETION] = completion_samples
    errors = {name: [] for name in names}

    def probe(task, seed, cache, token):  # one decode step with every method on the same q/k/v
        errors_of = ErrorProbe(make())
        with torch.inference_mode(), model.attention_method(errors_of):
            model(torch.tensor([[token]]), cache.clone())
        for name, e in errors_of.errors.items():
            errors[name].append(sum(e) / len(e))  # the sample's mean over layers and heads
    log.info("ssa: %d tokens, methods %s: %d samples", length, ", ".join(names), sum(tasks.values()))
    scores = evaluate_llm.task_accuracy(model, tok, eos, make, tasks, length - 120, on_prefill=probe, seeds=seeds)
    log.info("ssa: %d tokens: perplexity of each method", length)
    result = {"accuracy": {k: sum(v) / len(v) for k, v in scores.items()},
              "completion": ({name: scores[name, longcontext.COMPLETION] for name in names}
                             if completion_samples else {}),
              "error": {k: intervals.bootstrap(v, lambda xs: sum(xs) / len(xs), v) for k, v in errors.items()},
              "perplexity": perplexity(model, tok, length, make)}
    result["chat"] = per_sample({name: [s for task in longcontext.TASKS for s in scores[name, task]] for name in names})
    result["mean"] = {name: intervals.rate([item[name] for item in result["chat"]]) for name in names}
    return result


def perplexity(model, tok, length: int, make) -> dict[str, intervals.Estimate]:
    """Per method: perplexity of the PERPLEXITY_TOKENS tokens of license text that follow a prefix of
    `length` tokens, decoded one at a time (teacher-forced) with the method at every step; one
    prefill of the prefix shared by all methods. Each token's NLL is averaged over PERPLEXITY_SEEDS
    seeds of the methods' own draws (make(seed); a method whose settings no seed changes, as its
    dataclass fields show, decodes once), and the interval is a bootstrap over the tokens. One seed
    alone moves a lot: SSA at 4K and 50x gave 32.6 to 50.0 over seeds 0-4 (one code, before 40131f2)."""
    ids = tok.encode(longcontext.perplexity_text(8 * (length + PERPLEXITY_TOKENS))).ids
    if len(ids) < length + PERPLEXITY_TOKENS:
        raise ValueError(f"license texts give {len(ids)} tokens; perplexity at {length} needs "
                         f"{length + PERPLEXITY_TOKENS}")
    prefix, target = ids[:length], ids[length:length + PERPLEXITY_TOKENS]
    base, _ = evaluate_llm.prefill(model, prefix[:-1], room=PERPLEXITY_TOKENS + 2)
    nll = evaluate_llm.over_seeds(make, PERPLEXITY_SEEDS, lambda method: evaluate_llm.teacher_forced_nll(
        model, base.clone(), prefix[-1], target, method), progress=f"perplexity at {length}")
    # nll: name -> its NLL per token at every seed
    per_token = {name: [sum(seeds) / len(seeds) for seeds in zip(*runs)] for name, runs in nll.items()}
    return {name: evaluate_llm.perplexity(xs) for name, xs in per_token.items()}


def run(length: int, sparsity: float) -> dict:
    """One context and sparsity; the completion task (the claims' items) runs at the claims' 50x only."""
    log.info("ssa: %d tokens at %gx sparsity", length, sparsity)
    result = evaluate(length, functools.partial(make_methods, sparsity), SAMPLES,
                      COMPLETION_SAMPLES if sparsity == 50 else 0, ACCURACY_SEEDS)
    if result["completion"]:
        result.update(claim_estimates(result["completion"]))
    return result


def per_sample(outcomes: dict[str, list[float]]) -> list[dict]:
    """method -> score per sample (the same samples for all), turned into one method -> score dict per sample."""
    return [dict(zip(outcomes, scores)) for scores in zip(*outcomes.values())]


def mean_score(items: list[dict], method: str) -> float:
    return sum(item[method] for item in items) / len(items)


def share_of_dense(items: list[dict], method: str) -> intervals.Estimate:
    """method's mean score as % of dense's over items (method -> score, the same samples for all), with
    a paired-bootstrap interval over the samples."""
    return intervals.bootstrap(items, lambda xs: 100 * mean_score(xs, method) / mean_score(xs, "dense")
                               if mean_score(xs, "dense") else float("nan"), [item[method] for item in items])


def claim_estimates(outcomes: dict[str, list[float]]) -> dict:
    """On the completion task's samples (outcomes: method -> score per sample, same samples for
    all): SSA's gain in points over the strongest practical baseline and its share of dense, in %,
    with paired-bootstrap intervals over samples."""
    items = per_sample(outcomes)
    best = max(PRACTICAL, key=lambda n: mean_score(items, n))
    gain = intervals.bootstrap(items, lambda xs: 100 * (mean_score(xs, "ssa") - mean_score(xs, best)),
                               [item["ssa"] - item[best] for item in items])
    return {"gain": gain, "share": share_of_dense(items, "ssa"), "strongest": best,
            "completion_accuracy": {name: intervals.rate(v) for name, v in outcomes.items()}}


class Sparse:
    """Every method at every context and sparsity; the claim rows sit on (method=ssa, sparsity=50)."""
    params = ([str(n) for n in LENGTHS], [str(s) for s in SPARSITIES], METHODS)
    param_names = ["context", "sparsity", "method"]
    timeout = 4 * 3600  # full mode: four context x sparsity points, about two hours on 2 cores

    def setup_cache(self):
        return {(str(n), str(s)): run(n, s) for n in LENGTHS for s in SPARSITIES if n == 4096 or s == 50}

    def _point(self, r, context, sparsity):
        if (context, sparsity) not in r:
            raise SkipNotImplemented("contexts above 4K run at 50x only (two hours of CPU otherwise)")
        return r[context, sparsity]

    @evidence.estimate
    def track_mean_accuracy(self, r, context, sparsity, method):
        return self._point(r, context, sparsity)["mean"][method]
    track_mean_accuracy.unit = metrics.ACCURACY.unit

    @evidence.estimate
    def track_attention_relative_error(self, r, context, sparsity, method):
        return self._point(r, context, sparsity)["error"][method]
    track_attention_relative_error.unit = metrics.RELATIVE_ERROR.unit

    @evidence.estimate
    def track_perplexity(self, r, context, sparsity, method):
        return self._point(r, context, sparsity)["perplexity"][method]
    track_perplexity.unit = metrics.PERPLEXITY.unit

    @evidence.estimate
    def track_completion_accuracy(self, r, context, sparsity, method):
        """Accuracy on the completion task (dense's is the reference the claims are judged by)."""
        point = self._point(r, context, sparsity)
        if "completion_accuracy" not in point:
            raise SkipNotImplemented("the completion task runs at 50x only")
        return point["completion_accuracy"][method]
    track_completion_accuracy.unit = metrics.ACCURACY.unit

    def _claim(self, r, context, sparsity, method, key):
        if method != "ssa" or sparsity != "50":
            raise SkipNotImplemented("claim rows are SSA's at 50x")
        return self._point(r, context, sparsity)[key]

    @evidence.estimate
    def track_gain_over_strongest_baseline(self, r, context, sparsity, method):
        return self._claim(r, context, sparsity, method, "gain")
    track_gain_over_strongest_baseline.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_share_of_dense(self, r, context, sparsity, method):
        return self._claim(r, context, sparsity, method, "share")
    track_share_of_dense.unit = metrics.PERCENT_OF_DENSE.unit


class ProxySweep:
    """SSA vs proxy top-k at 50x on 4K as the proxy gets finer (PQ sub-vectors x bits, low rank, exact):
    attention error, accuracy on the chat tasks and its share of dense (each sample's score averaged
    over ACCURACY_SEEDS seeds, as in Sparse; intervals over the samples) and perplexity. Full mode only."""
    params = (list(PROXIES), ["ssa", "top-k"])
    param_names = ["proxy", "method"]
    timeout = 7200

    def setup_cache(self):
        if QUICK:  # every method builds PQ codebooks per layer: minutes even for one decode step
            return {}  # (asv passes no cache at all for None)
        return evaluate(4096, functools.partial(proxy_methods, 50), SAMPLES, seeds=ACCURACY_SEEDS)

    def _full(self, r):
        if not r:
            raise SkipNotImplemented("the proxy sweep runs in full mode only")
        return r

    @evidence.estimate
    def track_mean_accuracy(self, r, proxy, method):
        return self._full(r)["mean"][f"{method}/{proxy}"]
    track_mean_accuracy.unit = metrics.ACCURACY.unit

    @evidence.estimate
    def track_share_of_dense(self, r, proxy, method):
        return share_of_dense(self._full(r)["chat"], f"{method}/{proxy}")
    track_share_of_dense.unit = metrics.PERCENT_OF_DENSE.unit

    @evidence.estimate
    def track_attention_relative_error(self, r, proxy, method):
        return self._full(r)["error"][f"{method}/{proxy}"]
    track_attention_relative_error.unit = metrics.RELATIVE_ERROR.unit

    @evidence.estimate
    def track_perplexity(self, r, proxy, method):
        return self._full(r)["perplexity"][f"{method}/{proxy}"]
    track_perplexity.unit = metrics.PERPLEXITY.unit
