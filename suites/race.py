"""RACE vs other pair rules, ThinK's channel rule and Palu-style low-rank keys on SmolLM2-135M
(PAPERS.md B2), at 75%, 50% and 25% of the key numbers kept.

One calibration pass over the calibration split of the pinned corpus (the first half of the
license texts' tokens) feeds every rule; perplexity is scored on the held-out second half
(spans of 512 scored tokens after a 512-token prefix, one chunk each, so the cache methods act on
them); the completion-style needle task (which dense SmolLM2 solves) at 2K for every method and
at 8K for the full model and RACE with and without recovery. KV bytes per token and FLOPs are
analytic, from the shapes: per decode token at 8K and 256K for SmolLM2 and for Llama-3.2-3B's
published config, and per request (prefill + 1,024 decoded tokens). Measured time, interleaved
in one process: prefill (TTFT) and decode time per token at 2K/4K/8K for the full model, RACE and
low-rank keys, each with torch's fused SDPA where it applies and, for decode at 8K, to separate
the method from the kernel, with every attention in the same plain torch code. The recovery step (KL
distillation of the kept W_q/W_k rows) runs at 50% for RACE and the 2-norm rule, reported as
methods of their own. The claim rows are training-free RACE's (the digest's sum rule) at 50%,
gated on held-out perplexity within +10% of the full model's and completion accuracy at 8K
within 5 points. Two classes read the one setup_cache (asv keys it by the function's module and
line): Compression over every (retention, method), Timing over the timed methods at 50% only,
since asv starts one process per benchmark and parameter combination.
CLAIMBENCH_QUICK=1: 50% only, one random seed, fewer spans, the needle task at 1K for the full model
and RACE with and without recovery, timing at 512 and 1K.
"""
import copy
import logging
import math
from contextlib import ExitStack

import torch

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, measure, metrics
from claimbench.baselines.head_dim import FrequencyPairs, FullModel, LowRankKeys, NormProduct, RandomPairs, ThinK
from claimbench.datasets import longcontext, text
from claimbench.impl.race import RACE
from claimbench.llm import evaluate, headdim
from claimbench.llm.model import LlamaConfig

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 750  # seconds in quick mode on 2 cores (626 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")
RETENTIONS = ["50"] if QUICK else ["75", "50", "25"]
CLAIM_RETENTION = "50"
TRAINING_FREE = {
    "race": lambda r: RACE(r), "race-product": lambda r: RACE(r, rule="product"), "2-norm": NormProduct,
    **{f"random-{seed}": (lambda r, seed=seed: RandomPairs(r, seed=seed)) for seed in ((0,) if QUICK else (0, 1, 2))},
    "high-frequency": lambda r: FrequencyPairs(r, band="high"), "low-frequency": lambda r: FrequencyPairs(r, band="low"),
    "think": ThinK, "low-rank": LowRankKeys}
RECOVERED = {"race+recovery": "race", "2-norm+recovery": "2-norm"}  # at the claim's retention only
METHODS = ["full", *TRAINING_FREE, *RECOVERED]
CALIBRATION_TOKENS = 4096 if QUICK else 16384  # of the calibration split (the recovery step trains on them)
PREFIX, SCORED, SPANS = (256, 256, 4) if QUICK else (512, 512, 12)
ACCURACY_CONTEXTS = {"1k": 1024} if QUICK else {"2k": 2048, "8k": 8192}
ACCURACY_SAMPLES = 10 if QUICK else 12  # completion samples per context (the needle at 12 depths)
LONG_ACCURACY = ["full", "race", "race+recovery"]  # at the longest accuracy context; every method at shorter ones
RECOVERY_STEPS = 4 if QUICK else 150
TIMING_CONTEXTS = {"512": 512, "1k": 1024} if QUICK else {"2k": 2048, "4k": 4096, "8k": 8192}
TIMED = ["full", "race", "low-rank"]  # prefill time of low-rank keys is the full model's: decode only
ROUNDS, DECODE_STEPS = (6, 4) if QUICK else (6, 32)
CLAIM_CONTEXT = list(TIMING_CONTEXTS)[-1]
CLAIM_KERNEL = {"decode": "plain", "prefill": "fused"}  # the faster attention code for the full model per phase
PHASES = {"fused": ("prefill", "decode"), "plain": ("decode",)}  # timed per attention kernel
PERPLEXITY_TOLERANCE, ACCURACY_TOLERANCE = 10.0, 5.0  # % perplexity increase, points of accuracy lost
FLOPS_CONFIGS = {"smollm2": LlamaConfig.smollm2_135m(), "llama-3.2-3b": LlamaConfig.llama32_3b()}
REQUEST_NEW_TOKENS = 1024


def methods(model, statistics) -> dict[tuple[str, str], object]:
    """(retention, method) -> a fitted training-free compression (one full model, the paired
    reference at every retention)."""
    out, full = {}, FullModel()
    for retention in RETENTIONS:
        out[retention, "full"] = full
        for name, make in TRAINING_FREE.items():
            out[retention, name] = make(int(retention) / 100)
            out[retention, name].fit(model, statistics)
    return out


def recovered(model, statistics) -> tuple[dict, dict]:
    """The recovery step on a fresh fit of RACE and of the 2-norm rule at the claim's retention."""
    fitted, logs = {}, {}
    for name, base in RECOVERED.items():
        method = TRAINING_FREE[base](int(CLAIM_RETENTION) / 100)
        method.fit(model, statistics)
        logs[name] = headdim.recover(model, method, statistics, steps=RECOVERY_STEPS)
        fitted[CLAIM_RETENTION, name] = method
    return fitted, logs


def accuracy(model, tok, eos, fitted: dict) -> dict:
    """(context, retention, method) -> per-sample completion scores."""
    out = {}
    for label, length in ACCURACY_CONTEXTS.items():
        longest = label == list(ACCURACY_CONTEXTS)[-1]
        chosen = {key: m for key, m in fitted.items() if key[0] == CLAIM_RETENTION
                  and (not longest or key[1] in LONG_ACCURACY)}
        scores = evaluate.applied_task_accuracy(
            model, tok, eos, {key: (lambda m=m: m.apply(model)) for key, m in chosen.items()},
            {longcontext.COMPLETION: ACCURACY_SAMPLES}, length - 40, new_tokens=10)
        out.update({(label, *key): v for (key, _), v in scores.items()})
    return out


def timing(model, fitted: dict) -> dict:
    """(context, kernel, method) -> {"prefill": [s per round], "decode": [s per token per round]}.
    Each method runs on a copy of the model with the method applied once, outside the timed calls
    (applying one slices or wraps every layer: milliseconds, which would otherwise land in the
    method's time). The decode caches are prefilled once per context in fused SDPA and rewound after
    each call, so the plain-attention decode reads the same cache without a plain-attention prefill."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    with ExitStack() as stack:
        variants = {}
        for name in TIMED:
            variants[name] = copy.deepcopy(model)
            stack.enter_context(fitted[CLAIM_RETENTION, name].apply(variants[name]))
        for label, length in TIMING_CONTEXTS.items():
            ids = torch.randint(0, model.config.vocab_size, (1, length), generator=gen)
            decode_calls = {name: _decode_call(m, ids) for name, m in variants.items()}
            for kernel in kernels(label):
                with ExitStack() as kernel_set:
                    for variant in variants.values():
                        kernel_set.enter_context(variant.attention_kernel(kernel))
                    times = {}
                    if "prefill" in PHASES[kernel]:
                        times = measure.interleaved({name: _prefill_call(m, ids) for name, m in variants.items()
                                                     if name != "low-rank"}, rounds=ROUNDS)
                    steps = measure.interleaved(decode_calls, rounds=ROUNDS)
                for name in variants:
                    out[label, kernel, name] = {"prefill": times.get(name),
                                                "decode": [t / DECODE_STEPS for t in steps[name]]}
    return out


def kernels(context: str) -> tuple[str, ...]:
    """Torch's fused SDPA at every timed context; every attention in plain torch (the same code for
    full and narrowed keys) at the claim's context, for decode only (a plain-attention prefill at 8K
    took about 20 of the suite's minutes and decides no claim): PHASES."""
    return ("fused", "plain") if context == CLAIM_CONTEXT else ("fused",)


def _prefill_call(model, ids):
    def call():
        with torch.inference_mode():
            model(ids, model.new_cache(capacity=ids.shape[1] + 1), last_only=True)
    return call


def _decode_call(model, ids):
    """DECODE_STEPS decode steps after a prefill of ids (done here, untimed), the cache rewound to
    it after each call (no copy)."""
    with torch.inference_mode():
        cache = model.new_cache(capacity=ids.shape[1] + DECODE_STEPS + 1)
        model(ids, cache, last_only=True)
    start = cache.next_position

    def call():
        with torch.inference_mode():
            token = torch.tensor([[5]])
            for _ in range(DECODE_STEPS):
                model(token, cache)
        cache.truncate(start)
    return call


def flops(fitted: dict) -> dict:
    """(retention, method) -> analytic FLOPs and KV bytes (see the module docstring)."""
    out = {}
    for (retention, name), method in fitted.items():
        row = {}
        for config_name, config in FLOPS_CONFIGS.items():
            shape = method.key_shape(config)
            for label, context in (("8k", 8192), ("256k", 262144)):
                per_token = headdim.decode_flops(config, shape, context)
                row[config_name, "decode", label] = per_token["total"]
                row[config_name, "attention", label] = per_token["attention"]
                row[config_name, "request", label] = headdim.request_flops(config, shape, context, REQUEST_NEW_TOKENS)
            row[config_name, "kv_bytes"] = headdim.kv_bytes_per_token(config, shape)
        out[retention, name] = row
    return out


def _perplexity_change(pairs: list[tuple[float, float]]) -> float:
    """(full NLL, method NLL) per span -> the method's perplexity over the full model's, in % change."""
    return 100 * (math.exp(sum(m - f for f, m in pairs) / len(pairs)) - 1)


def _accuracy_change(pairs: list[tuple[float, float]]) -> float:
    """(full score, method score) per sample -> the method's accuracy minus the full model's, in points."""
    return 100 * sum(m - f for f, m in pairs) / len(pairs)


class _Measured(common.ComputedOnce):
    """The one setup_cache of Compression and Timing, and the lookups both use."""
    timeout = 3 * 3600  # full mode: setup_cache took 72 minutes on 2 cores (05646fe8), the tracks 29 more

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        calibration, held_out = text.token_halves(tok)
        log.info("race: calibration over %d tokens", CALIBRATION_TOKENS)
        statistics = headdim.calibrate(model, calibration[:CALIBRATION_TOKENS])
        fitted = methods(model, statistics)
        log.info("race: recovery step (%d steps) for %s", RECOVERY_STEPS, ", ".join(RECOVERED))
        extra, recovery = recovered(model, statistics)
        fitted.update(extra)
        log.info("race: held-out perplexity of %d methods", len(fitted))
        nll, scored = {}, {}  # scored: by method object (the full model is one, at every retention)
        for key, method in fitted.items():
            if id(method) not in scored:
                with method.apply(model):
                    scored[id(method)] = evaluate.segment_nll(model, held_out, PREFIX, SCORED, SPANS)
            nll[key] = scored[id(method)]
        log.info("race: the needle task at %s", ", ".join(ACCURACY_CONTEXTS))
        scores = accuracy(model, tok, eos, fitted)
        log.info("race: timing %s at %s", ", ".join(TIMED), ", ".join(TIMING_CONTEXTS))
        return {"nll": nll, "recovery": recovery, "flops": flops(fitted), "accuracy": scores,
                "timing": timing(model, fitted)}

    def _claim(self, retention, method):
        if (retention, method) != (CLAIM_RETENTION, "race"):
            raise SkipNotImplemented("claim rows are RACE's at 50%")


class Compression(_Measured):
    """Quality, analytic FLOPs and KV bytes of every method at every retention; the claim rows sit on
    (retention=50, method=race)."""
    params = (RETENTIONS, METHODS)
    param_names = ["retention", "method"]

    def _spans(self, r, retention, method) -> list[float]:
        return self._get(r["nll"], (retention, method), "the recovered methods run at 50% only")

    @evidence.estimate
    def track_perplexity(self, r, retention, method):
        """On the held-out spans, with a bootstrap interval over them."""
        spans = self._spans(r, retention, method)
        return evaluate.perplexity(spans)
    track_perplexity.unit = metrics.PERPLEXITY.unit

    def _span_pairs(self, r, retention, method) -> list[tuple[float, float]]:
        """Per held-out span, (the full model's NLL, the method's)."""
        return list(zip(r["nll"][retention, "full"], self._spans(r, retention, method)))

    def perplexity_change(self, r, retention, method) -> intervals.Estimate:
        """Perplexity vs the full model's on the same held-out spans, in %, paired over spans."""
        return intervals.bootstrap(self._span_pairs(r, retention, method), _perplexity_change)

    @evidence.estimate
    def track_perplexity_change(self, r, retention, method):
        return self.perplexity_change(r, retention, method)
    track_perplexity_change.unit = metrics.PERCENT_CHANGE.unit

    def _scores(self, r, context, retention, method) -> list[float]:
        longest = list(ACCURACY_CONTEXTS)[-1]
        who = ", ".join(LONG_ACCURACY) if context == longest else "every method"
        return self._get(r["accuracy"], (context, retention, method), f"the needle task at {context} runs at 50% for {who}")

    def _score_pairs(self, r, context, retention, method) -> list[tuple[float, float]]:
        """Per needle sample, (the full model's score, the method's)."""
        return list(zip(self._scores(r, context, retention, "full"), self._scores(r, context, retention, method)))

    def accuracy_change(self, r, context, retention, method) -> intervals.Estimate:
        """Completion accuracy minus the full model's, in points, paired over the same samples."""
        return intervals.bootstrap(self._score_pairs(r, context, retention, method), _accuracy_change)

    @evidence.estimate
    def track_accuracy_change_points(self, r, retention, method):
        """Completion accuracy at the longest accuracy context (8K; 1K in quick mode) minus the full
        model's, paired over the same samples: the gate reads it."""
        return self.accuracy_change(r, list(ACCURACY_CONTEXTS)[-1], retention, method)
    track_accuracy_change_points.unit = metrics.POINTS.unit

    def _flops(self, r, retention, method):
        return self._get(r["flops"], (retention, method), "the recovered methods run at 50% only")

    def track_kv_bytes_per_token(self, r, retention, method):
        return self._flops(r, retention, method)["smollm2", "kv_bytes"]
    track_kv_bytes_per_token.unit = metrics.BYTES_PER_TOKEN.unit

    def track_decode_flops_8k(self, r, retention, method):
        """Analytic FLOPs of one decode token at 8K context, SmolLM2-135M."""
        return self._flops(r, retention, method)["smollm2", "decode", "8k"]
    track_decode_flops_8k.unit = metrics.FLOPS.unit

    def track_attention_flops_8k(self, r, retention, method):
        """Its attention part: scores, values and, for low-rank keys, rebuilding every cached key."""
        return self._flops(r, retention, method)["smollm2", "attention", "8k"]
    track_attention_flops_8k.unit = metrics.FLOPS.unit

    def track_recovery_kl_after(self, r, retention, method):
        """Per-token KL from the full model's next-token distribution over the recovery step's last steps."""
        return self._get(r["recovery"], method if retention == CLAIM_RETENTION else None,
                         "only the recovered methods (at 50%) have a recovery step")["kl_after"]
    track_recovery_kl_after.unit = metrics.KL_DIVERGENCE.unit

    # the claim row and the gate every claim of the paper reads

    def track_request_flops_change_256k_llama3b(self, r, retention, method):
        """Analytic FLOPs of a request (prefill 256K + 1,024 decoded tokens) vs the full model, in %,
        for Llama-3.2-3B's published shapes: the paper's setting."""
        self._claim(retention, method)
        return self._flops_change(r, retention, method, "llama-3.2-3b", "request", "256k")
    track_request_flops_change_256k_llama3b.unit = metrics.PERCENT_CHANGE.unit

    def track_request_flops_change_8k(self, r, retention, method):
        """The same at 8K for SmolLM2-135M: the setting measured here."""
        return self._flops_change(r, retention, method, "smollm2", "request", "8k")
    track_request_flops_change_8k.unit = metrics.PERCENT_CHANGE.unit

    def _flops_change(self, r, retention, method, config, kind, context):
        return 100 * (self._flops(r, retention, method)[config, kind, context]
                      / self._flops(r, retention, "full")[config, kind, context] - 1)

    @evidence.estimate
    def track_quality_loss_vs_tolerance(self, r, retention, method):
        """The gate: the larger of the perplexity increase over 10% and the completion-accuracy loss
        at the longest accuracy context over 5 points (at most 1 passes: both within tolerance). Its
        interval redraws the spans and the needle samples, each on their own (intervals.bootstrap_groups);
        the gate passes on the value."""
        groups = [self._span_pairs(r, retention, method),
                  self._score_pairs(r, list(ACCURACY_CONTEXTS)[-1], retention, method)]
        return intervals.bootstrap_groups(groups, lambda pairs: max(_perplexity_change(pairs[0]) / PERPLEXITY_TOLERANCE,
                                                                    -_accuracy_change(pairs[1]) / ACCURACY_TOLERANCE))
    track_quality_loss_vs_tolerance.unit = metrics.SHARE_OF_TOLERANCE.unit


class Timing(_Measured):
    """Interleaved prefill and decode time of the timed methods at the claim's retention; the claim
    rows sit on (retention=50, method=race), the gate on Compression's row there."""
    params = ([CLAIM_RETENTION], TIMED)
    param_names = ["retention", "method"]

    def _times(self, r, context, kernel, retention, method, phase) -> list[float]:
        times = r["timing"].get((context, kernel, method), {}).get(phase)
        if times is None:
            raise SkipNotImplemented("prefill is timed in fused SDPA only, and not for low-rank keys (whose prefill is "
                                     "the full model's)")
        return times

    def speedup(self, r, context, kernel, retention, method, phase) -> intervals.Estimate:
        """Full model time / method time per interleaved round (the same kernel setting for both)."""
        return intervals.ratio_of_rounds(self._times(r, context, kernel, retention, "full", phase),
                                         self._times(r, context, kernel, retention, method, phase))

    @evidence.estimate
    def track_decode_speedup(self, r, retention, method):
        """Decode time per token, full / method, at the longest timed context (8K; 1K in quick mode),
        both in plain grouped attention: the code RACE's narrow keys are read with, and at 8K faster
        than torch's fused SDPA for the full model too (that ratio: track_decode_speedup_fused)."""
        self._claim(retention, method)
        return self.speedup(r, CLAIM_CONTEXT, CLAIM_KERNEL["decode"], retention, method, "decode")
    track_decode_speedup.unit = metrics.SPEEDUP.unit

    @evidence.estimate
    def track_ttft_speedup(self, r, retention, method):
        """Prefill time (TTFT) of the context, full / method, both in torch's fused SDPA (RACE's q/k
        zero-padded to v's width: the scores cost what the full model's do)."""
        self._claim(retention, method)
        return self.speedup(r, CLAIM_CONTEXT, CLAIM_KERNEL["prefill"], retention, method, "prefill")
    track_ttft_speedup.unit = metrics.SPEEDUP.unit


def _add_families() -> None:
    """Completion accuracy and its change, and time and speedup per phase: one track per context
    below the longest (named by it, e.g. track_prefill_s_2k), and for the longest one, the claims'
    context, tracks named by role (track_prefill_s, track_decode_s_per_token_plain,
    track_decode_speedup_fused, ...), so that papers.toml names the same benchmarks in quick and full mode."""
    longest = list(ACCURACY_CONTEXTS)[-1]
    for context in ACCURACY_CONTEXTS:
        suffix = "" if context == longest else f"_{context}"
        common.add_estimate_track(
            Compression, f"completion_accuracy{suffix}", f"The completion-style needle task at {context}, Wilson interval.",
            metrics.ACCURACY.unit, lambda self, r, retention, method, c=context: intervals.rate(self._scores(r, c, retention, method)))
        if context != longest:  # the longest context's change: track_accuracy_change_points, written out
            common.add_estimate_track(
                Compression, f"accuracy_change_points{suffix}",
                f"Completion accuracy at {context} minus the full model's, paired.",
                metrics.POINTS.unit, lambda self, r, retention, method, c=context: self.accuracy_change(r, c, retention, method))
    for context in TIMING_CONTEXTS:
        for kernel in kernels(context):
            for phase in PHASES[kernel]:
                at = "" if context == CLAIM_CONTEXT else f"_{context}"
                plain = "_plain" if kernel == "plain" else ""
                time_name = f"{phase}_{'s_per_token' if phase == 'decode' else 's'}{at}{plain}"
                common.add_estimate_track(
                    Timing, time_name, f"{phase} time at {context}, {kernel} attention: median of interleaved rounds.",
                    metrics.SECONDS.unit, lambda self, r, retention, method, c=context, k=kernel, p=phase:
                        intervals.median_of(self._times(r, c, k, retention, method, p)))
                if context == CLAIM_CONTEXT and kernel == CLAIM_KERNEL[phase]:
                    continue  # the claim rows: track_decode_speedup, track_ttft_speedup
                speedup_name = f"{'decode' if phase == 'decode' else 'ttft'}_speedup_{kernel}" if not at \
                    else f"{phase}_speedup{at}"
                common.add_estimate_track(
                    Timing, speedup_name, f"Full model / method {phase} time at {context}, {kernel} attention for both.",
                    metrics.SPEEDUP.unit, lambda self, r, retention, method, c=context, k=kernel, p=phase:
                        self.speedup(r, c, k, retention, method, p))


_add_families()
