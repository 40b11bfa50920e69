"""E8-QAT vs 2-bit baselines on SmolLM2-135M (PAPERS.md C3): every linear layer of the 30 blocks at
2.0 code bits per weight plus an fp16 scale per group of 64 weights (2.25 bits in all), against the
fp32 model (itself dequantized from the shipped Q4_1 GGUF).

Methods: post-training RTN 2-bit (four levels, searched scales), the E8 Voronoi code post-training
(scales at the group RMS), QuIP#-style E8P post-training with random-rotation incoherence (searched
scales); then QAT with the same budget for the E8 code (the method) and for RTN 2-bit (so the
comparison isolates the codebook): `STEPS` Adam steps on batches of 4 rows of 128 tokens from the
license texts' first half, distilling the fp32 model's next-token distribution (KL), weights at lr
5e-5 and scales at 1e-3. What the budget buys: about 30,000 training tokens, some 45 minutes on 2
cores (a step is about 20 s of distillation forward and backward; an E8 step adds some 5 s to code 13
million 8-vectors, a numba kernel); the paper trains for far longer on a GPU. Quality: perplexity on
the held-out second half (16 spans of 448 scored tokens after a 64-token prefix; paired bootstrap for
ratios) and the two short tasks dense SmolLM2 solves (completion needle and single needle at 600
tokens, 12 samples each, pooled). Weight bytes a decode step reads (the memory-bound model of decode
speed) are context, and so are the times to quantize (a post-training pass timed up to PTQ_ROUNDS
times back to back, the median kept; QAT once). The paper's claim (decode throughput 1.97x fp16 at
max batch) needs a GPU: `claimbench device-run` times the kernel under it (gpu.E8Matmul, codes
decoded inside a Triton matmul vs fp16 cuBLAS); the claims measured here are this project's own:
E8-QAT's perplexity against RTN-2bit QAT's (same budget, same bits) and against E8P post-training,
gated on equal bits per weight.
CLAIMBENCH_QUICK=1: 3 QAT steps of 2 rows of 64 tokens, 10 spans of 128 tokens, 5 samples per task,
3 timed post-training passes.
"""
import functools
import logging
import time

import torch

from claimbench import evidence, intervals, measure, metrics
from claimbench.baselines import two_bit
from claimbench.baselines.weight_compression import block_linears
from claimbench.datasets import longcontext, text
from claimbench.impl import e8qat
from claimbench.llm import evaluate

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 480  # seconds in quick mode on 2 cores (409 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")
GROUP_SIZE = 64
PTQ = {"rtn2-ptq": lambda w: two_bit.rtn_2bit(w, GROUP_SIZE), "e8-ptq": e8qat.E8Quantizer(GROUP_SIZE).compress,
       "e8p-ptq": two_bit.E8PQuantizer(GROUP_SIZE).compress}
QAT = {"rtn2-qat": "rtn2", "e8-qat": "e8"}
METHODS = ["fp32", *PTQ, *QAT]
STEPS, BATCH, LENGTH = (3, 2, 64) if QUICK else (60, 4, 128)
CURVE = [str(s) for s in range(1, STEPS + 1)] if QUICK else [str(s) for s in range(5, STEPS + 1, 5)]
PREFIX, SCORED, SPANS = (64, 128, 10) if QUICK else (64, 448, 16)
TASKS = {longcontext.COMPLETION: 5, "niah-single": 5} if QUICK else {longcontext.COMPLETION: 12, "niah-single": 12}
TASK_LENGTH, NEW_TOKENS = (400, 10) if QUICK else (600, 10)
PTQ_ROUNDS = 3 if QUICK else 7
PTQ_BUDGET_S = 30  # a post-training pass of a few seconds is timed up to PTQ_ROUNDS times, back to back


def training(quantizer: str) -> e8qat.Training:
    return e8qat.Training(quantizer=quantizer, steps=STEPS, batch=BATCH, length=LENGTH, lr=5e-5, scale_lr=1e-3,
                          group_size=GROUP_SIZE, checkpoint_every=STEPS)


def bits(method: str) -> tuple[float, float]:
    """(code bits, total bits) per weight."""
    return (32.0, 32.0) if method == "fp32" else (e8qat.CODE_BITS, e8qat.bits_per_weight(GROUP_SIZE))


def post_training(model, quantize) -> dict:
    """Every block linear's weight through one post-training quantizer."""
    with torch.no_grad():
        return {f"{name}.weight": quantize(module.weight) for name, module in block_linears(model).items()}


def measure_methods(model, tok, eos, progress=log.info) -> dict:
    """Per method: per-span NLL, pooled task outcomes, QAT's losses and the seconds to quantize: fp32 needs
    none, a post-training pass is timed back to back (measure.repeated), a QAT run once."""
    calibration, held_out = text.token_halves(tok)
    usable = len(calibration) // LENGTH * LENGTH
    rows = torch.tensor(calibration[:usable]).reshape(-1, LENGTH)
    out = {"nll": {}, "accuracy": {}, "seconds": {}, "losses": {},
           "block_weights": sum(module.weight.numel() for module in block_linears(model).values())}
    for method in METHODS:
        if method == "fp32":
            weights, out["seconds"][method] = {}, [0.0]
        elif method in PTQ:
            weights, out["seconds"][method] = measure.repeated(
                functools.partial(post_training, model, PTQ[method]), PTQ_ROUNDS, PTQ_BUDGET_S)
        else:
            started = time.perf_counter()
            run = training(QAT[method])
            weights = e8qat.train(model, rows, run, progress=progress)
            out["seconds"][method] = [time.perf_counter() - started]
            out["losses"][method] = run.losses
        out["nll"][method], out["accuracy"][method] = evaluate.weights_quality(
            model, tok, eos, weights, held_out, (PREFIX, SCORED, SPANS), TASKS, TASK_LENGTH, NEW_TOKENS)
        ppl = evaluate.perplexity(out["nll"][method]).value
        progress(f"e8qat: {method}: perplexity {ppl:.4g}, accuracy "
                 f"{sum(out['accuracy'][method]) / len(out['accuracy'][method]):.2f} "
                 f"({measure.median(out['seconds'][method]):.0f} s to quantize or train)")
    return out


class _Measured(common.ComputedOnce):
    """The one setup_cache of Methods, Training and Claim (asv keys it by module and line)."""
    timeout = 3 * 3600  # full mode: over an hour on 2 cores, most of it the E8 QAT steps

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        return measure_methods(model, tok, eos)


class Methods(_Measured):
    """Every method's bits and quality, against fp32's."""
    params = (METHODS,)
    param_names = ["method"]

    def track_code_bits_per_weight(self, r, method):
        return bits(method)[0]
    track_code_bits_per_weight.unit = metrics.BITS_PER_WEIGHT.unit

    def track_bits_per_weight(self, r, method):
        """Code bits plus the fp16 scale of every 64 weights."""
        return bits(method)[1]
    track_bits_per_weight.unit = metrics.BITS_PER_WEIGHT.unit

    @evidence.estimate
    def track_perplexity(self, r, method):
        spans = r["nll"][method]
        return evaluate.perplexity(spans)
    track_perplexity.unit = metrics.PERPLEXITY.unit

    @evidence.estimate
    def track_perplexity_ratio_vs_fp32(self, r, method):
        return evaluate.perplexity_ratio(r["nll"]["fp32"], r["nll"][method])
    track_perplexity_ratio_vs_fp32.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_accuracy(self, r, method):
        return intervals.rate(r["accuracy"][method])
    track_accuracy.unit = metrics.ACCURACY.unit

    @evidence.estimate
    def track_accuracy_change_points(self, r, method):
        return evaluate.points_change(r["accuracy"]["fp32"], r["accuracy"][method])
    track_accuracy_change_points.unit = metrics.POINTS.unit

    def track_weight_bytes_per_token(self, r, method):
        """Bytes of block-linear weights (codes and scales) a decode step reads: at batch 1 decode is
        memory-bound, so this is the CPU's model of the throughput claim (context, not the claim)."""
        return r["block_weights"] * bits(method)[1] / 8
    track_weight_bytes_per_token.unit = metrics.BYTES.unit

    @evidence.estimate
    def track_quantize_s(self, r, method):
        """Time to quantize (post-training: the median of up to PTQ_ROUNDS back-to-back passes within
        PTQ_BUDGET_S) or to train (QAT, once) every block linear."""
        return intervals.median_of(r["seconds"][method])
    track_quantize_s.unit = metrics.SECONDS.unit


class Training(_Measured):
    """QAT's distillation loss along the way: the training curves."""
    params = (list(QAT), CURVE)
    param_names = ["method", "step"]

    def track_kl(self, r, method, step):
        """Mean KL per token over the steps since the curve's previous point."""
        i = CURVE.index(step)
        start = int(CURVE[i - 1]) if i else 0
        return float(sum(r["losses"][method][start:int(step)]) / (int(step) - start))
    track_kl.unit = metrics.KL_DIVERGENCE.unit


class Claim(_Measured):
    """E8-QAT's held-out perplexity over a baseline's, paired over spans (below 1: E8-QAT better), each
    gated on equal bits per weight: the two claims measured here."""

    def _ratio(self, r, baseline: str, benchmark: str) -> intervals.Estimate:
        gap = bits("e8-qat")[1] - bits(baseline)[1]
        common.check_gate(benchmark, gap, f"E8-QAT and {baseline} store different bits per weight")
        return evaluate.perplexity_ratio(r["nll"][baseline], r["nll"]["e8-qat"])

    @evidence.estimate
    def track_perplexity_ratio_vs_rtn2_qat(self, r):
        """The codebook's effect: both trained with the same budget, data and bits."""
        return self._ratio(r, "rtn2-qat", "e8qat.Claim.track_perplexity_ratio_vs_rtn2_qat")
    track_perplexity_ratio_vs_rtn2_qat.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_vs_e8p_ptq(self, r):
        """Against the explicit E8P codebook applied post-training with incoherence processing."""
        return self._ratio(r, "e8p-ptq", "e8qat.Claim.track_perplexity_ratio_vs_e8p_ptq")
    track_perplexity_ratio_vs_e8p_ptq.unit = metrics.PERPLEXITY_RATIO.unit

    def track_bits_gap_vs_rtn2_qat(self, r):
        return bits("e8-qat")[1] - bits("rtn2-qat")[1]
    track_bits_gap_vs_rtn2_qat.unit = metrics.BITS_PER_WEIGHT.unit

    def track_bits_gap_vs_e8p_ptq(self, r):
        return bits("e8-qat")[1] - bits("e8p-ptq")[1]
    track_bits_gap_vs_e8p_ptq.unit = metrics.BITS_PER_WEIGHT.unit

    @evidence.estimate
    def track_accuracy_change_points_vs_rtn2_qat(self, r):
        return evaluate.points_change(r["accuracy"]["rtn2-qat"], r["accuracy"]["e8-qat"])
    track_accuracy_change_points_vs_rtn2_qat.unit = metrics.POINTS.unit
