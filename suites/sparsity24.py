"""Is 2:4 sparsity still worth it? (PAPERS.md C5) on SmolLM2-135M: 2:4 sparsity plus quantization vs
dense quantization one precision tier lower, at equal storage bits (impl/sparsity24.py counts them).

Every linear layer of the 30 blocks is stored in each format of the grid: fp16; dense INT8/6/5/4/3
by RTN and by GPTQ; 2:4 by magnitude (fp16 values, and + INT8), Wanda and SparseGPT (fp16 values,
+ INT8, + INT6, + INT4: RTN after Wanda, joint quantization in SparseGPT's loop); scales fp16 per
group of 64. Calibration: the first 8,192 tokens of the license texts' first half, as 16 rows of
512, block by block. Quality: perplexity on held-out text of two sources, spans of 448 scored tokens
after a 64-token prefix: 48 of the license texts' second half (24,624 of its 26,096 tokens) and 96
spread evenly over the standard library's docstrings, a source calibration never sees (48 license
spans alone left the INT4-vs-INT3 claim's interval [0.98, 1.13] across neutral); a paired bootstrap
over the 144 spans for every change. And accuracy on two short tasks dense SmolLM2 solves (the
completion-style needle task and single-needle retrieval at 600 tokens, 12 samples each, pooled: a
Wilson interval, paired changes). Pairs at equal bits: each 2:4 + INTb beside the dense INT(b/2 + 1)
quantized the same way (RTN for magnitude and Wanda, GPTQ for SparseGPT). Speed on this CPU, as
context only (the claim's speed side needs a GPU with semi-structured sparsity): one block's seven
linears through each kernel PyTorch has here (impl/sparsity24.cpu_matmuls says which are native and
which emulated) at 1 and 256 tokens, interleaved with fp32, the rounds split over three fresh processes.
The claim rows: the perplexity ratio of 2:4 + INT8 over INT5 (and of 2:4 + INT4 over INT3), the
lowest over the pruners (the best 2:4 recipe decides), gated on the two formats' bits per weight
matching within 0.05; the same ratios on each source's spans alone explain them (do the sources
agree?). CLAIMBENCH_QUICK=1: fp16, RTN INT5 and Wanda 2:4 + INT8 only, 2,048 calibration tokens,
10 + 4 spans of 128 tokens, 5 samples per task at 400 tokens, 1 token, 3 timing rounds in one process.
"""
import logging

import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, intervals, measure, metrics
from claimbench.baselines import weight_compression
from claimbench.datasets import longcontext, text
from claimbench.impl import sparsity24
from claimbench.llm import evaluate

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 240  # seconds in quick mode on 2 cores (200 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")
FP16 = sparsity24.FP16
GRID = ({"fp16": [FP16], "rtn": [5], "wanda-2:4": [8]} if QUICK else
        {"fp16": [FP16], "rtn": [8, 6, 5, 4, 3], "gptq": [8, 6, 5, 4, 3], "magnitude-2:4": [FP16, 8],
         "wanda-2:4": [FP16, 8, 6, 4], "sparsegpt-2:4": [FP16, 8, 6, 4]})
CALIBRATION_TOKENS, CALIBRATION_ROW = (2048, 512) if QUICK else (8192, 512)
PREFIX, SCORED = (64, 128) if QUICK else (64, 448)
HELD_OUT = {"licenses": 10, "python-stdlib": 4} if QUICK else {"licenses": 48, "python-stdlib": 96}  # spans per source
TASKS = {longcontext.COMPLETION: 5, "niah-single": 5} if QUICK else {longcontext.COMPLETION: 12, "niah-single": 12}
TASK_LENGTH, NEW_TOKENS = (400, 10) if QUICK else (600, 10)
TOKENS = ["1"] if QUICK else ["1", "256"]
ROUNDS, CALLS_PER_ROUND = (3, 5) if QUICK else (9, 20)
COMPRESS_BUDGET_S = 10  # a format compressed in under ~1 s is compressed ROUNDS times, back to back
TIMING_PROCESSES = 1 if QUICK else 3  # fresh processes the CPU timings' ROUNDS are split over


def make_format(family: str, bits: int):
    if family.endswith("-2:4"):
        return sparsity24.SemiStructured24(family.removesuffix("-2:4"), bits)
    return sparsity24.Dense(bits, "rtn" if family == "fp16" else family)


FORMATS = {fmt.name: fmt for family, grid in GRID.items() for fmt in (make_format(family, b) for b in grid)}
PRUNERS = [family.removesuffix("-2:4") for family in GRID if family.endswith("-2:4")]
BITS_PER_WEIGHT = sorted({f"{fmt.bits_per_weight():g}" for fmt in FORMATS.values()}, key=float, reverse=True)
FAMILIES = list(GRID)
KERNELS = ["fp32", "int8-weight-only", "int4-weight-only", "2:4-csr", "int5-dequantize"]


def format_name(bits_per_weight: str, family: str) -> str:
    """The format of a (bits per weight, family) cell of the grid, or asv's skip."""
    for bits in GRID[family]:
        fmt = make_format(family, bits)
        if f"{fmt.bits_per_weight():g}" == bits_per_weight:
            return fmt.name
    raise SkipNotImplemented(f"{family} has no format of {bits_per_weight} bits per weight in this grid")


def held_out_text(tok) -> list[int]:
    """HELD_OUT's spans, source after source: the license texts' second half from its start (their
    first half calibrates), the other sources spread evenly over all their tokens."""
    span = PREFIX + SCORED + 1
    ids = []
    for source, count in HELD_OUT.items():
        if source == "licenses":
            _, held_out = text.token_halves(tok)
            ids += held_out[:count * span]
        else:
            ids += text.spread_spans(tok.encode(text.prose(source)).ids, span, count)
    assert len(ids) == sum(HELD_OUT.values()) * span, "the license texts' second half is too short for HELD_OUT"
    return ids


def source_spans(source: str) -> slice:
    """Where one source's spans sit in a format's per-span NLLs (held_out_text's order)."""
    start = 0
    for name, count in HELD_OUT.items():
        if name == source:
            return slice(start, start + count)
        start += count
    raise KeyError(f"{source!r} is not a held-out source ({', '.join(HELD_OUT)})")


def quality(model, tok, eos, calibration: torch.Tensor, held_out: list[int], progress=log.info) -> dict:
    """Per format: bits per weight, per-span NLL, pooled task outcomes, compression times (measure.repeated)."""
    out = {"bits": {}, "nll": {}, "accuracy": {}, "compress_s": {}}
    for i, (name, fmt) in enumerate(FORMATS.items()):
        weights, out["compress_s"][name] = measure.repeated(
            lambda: weight_compression.compress_model(model, fmt, calibration), ROUNDS, COMPRESS_BUDGET_S)
        if isinstance(fmt, sparsity24.SemiStructured24):
            share = min(sparsity24.two_of_four_share(w) for w in weights.values())
            assert share == 1.0, f"{name}: {1 - share:.2%} of some matrix's groups of 4 hold more than 2 non-zeros"
        spans = (PREFIX, SCORED, sum(HELD_OUT.values()))
        out["nll"][name], out["accuracy"][name] = evaluate.weights_quality(
            model, tok, eos, weights, held_out, spans, TASKS, TASK_LENGTH, NEW_TOKENS)
        out["bits"][name] = fmt.bits_per_weight()
        ppl = evaluate.perplexity(out["nll"][name]).value
        progress(f"sparsity24: {i + 1}/{len(FORMATS)} {name}: {fmt.bits_per_weight():g} bits per weight, perplexity "
                 f"{ppl:.2f}, accuracy {sum(out['accuracy'][name]) / len(out['accuracy'][name]):.2f} "
                 f"({measure.median(out['compress_s'][name]):.2g} s to compress)")
    return out


def timing(model, rounds: int) -> dict:
    """(tokens, kernel) -> seconds per call of one block's seven linears, interleaved rounds."""
    weights = [module.weight.detach() for module in weight_compression.block_linears(model).values()][:7]
    kernels = sparsity24.cpu_matmuls(weights)
    gen = torch.Generator().manual_seed(0)
    out = {}
    for tokens in TOKENS:
        xs = [torch.randn(int(tokens), w.shape[1], generator=gen) for w in weights]

        def batched(call):
            """CALLS_PER_ROUND calls of one kernel: a round's timed unit (not measure.repeated's single call)."""
            def run():
                with torch.inference_mode():
                    for _ in range(CALLS_PER_ROUND):
                        call(xs)
            return run
        times = measure.interleaved({name: batched(call) for name, (call, _) in kernels.items()}, rounds=rounds)
        out.update({(tokens, name): [t / CALLS_PER_ROUND for t in ts] for name, ts in times.items()})
    return out


def timing_in_fresh_process(rounds: int) -> dict:
    """timing() of SmolLM2 loaded in this process (measure.in_child runs it in a fresh one)."""
    model, _, _ = common.smollm2()
    return timing(model, rounds)


def perplexity_ratio(nll: dict, name: str, reference: str, source: str | None = None) -> intervals.Estimate:
    """Over every held-out span, or over one source's."""
    spans = source_spans(source) if source else slice(None)
    reference_nll, method_nll = nll[reference][spans], nll[name][spans]
    assert not source or len(reference_nll) == HELD_OUT[source], f"{name}: fewer spans than HELD_OUT[{source!r}]"
    return evaluate.perplexity_ratio(reference_nll, method_nll)


def accuracy_change(accuracy: dict, name: str, reference: str) -> intervals.Estimate:
    return evaluate.points_change(accuracy[reference], accuracy[name])


class _Measured(common.ComputedOnce):
    """The one setup_cache of Formats and EqualBits (asv keys it by module and line)."""
    timeout = 3 * 3600  # full mode: 21 formats, about 90 minutes on 2 cores (144 spans each)

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        calibration, _ = text.token_halves(tok)
        rows = torch.tensor(calibration[:CALIBRATION_TOKENS]).reshape(-1, CALIBRATION_ROW)
        return quality(model, tok, eos, rows, held_out_text(tok))


class Formats(_Measured):
    """Every format of the grid by (bits per weight, family): its quality, against fp16's."""
    params = (BITS_PER_WEIGHT, FAMILIES)
    param_names = ["bits_per_weight", "family"]

    def track_bits_per_weight(self, r, bits_per_weight, family):
        """Every stored bit (values, fp16 scales, 2:4 position codes) per original weight."""
        return r["bits"][format_name(bits_per_weight, family)]
    track_bits_per_weight.unit = metrics.BITS_PER_WEIGHT.unit

    @evidence.estimate
    def track_perplexity(self, r, bits_per_weight, family):
        """Held-out perplexity, bootstrap interval over the spans."""
        spans = r["nll"][format_name(bits_per_weight, family)]
        return evaluate.perplexity(spans)
    track_perplexity.unit = metrics.PERPLEXITY.unit

    @evidence.estimate
    def track_perplexity_ratio_vs_fp16(self, r, bits_per_weight, family):
        return perplexity_ratio(r["nll"], format_name(bits_per_weight, family), "fp16")
    track_perplexity_ratio_vs_fp16.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_accuracy(self, r, bits_per_weight, family):
        """Both short tasks' samples pooled, Wilson interval."""
        return intervals.rate(r["accuracy"][format_name(bits_per_weight, family)])
    track_accuracy.unit = metrics.ACCURACY.unit

    @evidence.estimate
    def track_accuracy_change_points(self, r, bits_per_weight, family):
        return accuracy_change(r["accuracy"], format_name(bits_per_weight, family), "fp16")
    track_accuracy_change_points.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_compress_s(self, r, bits_per_weight, family):
        """Calibration and compression of every block linear (context: once per model); the median of
        ROUNDS back-to-back compressions where they fit COMPRESS_BUDGET_S, else one."""
        return intervals.median_of(r["compress_s"][format_name(bits_per_weight, family)])
    track_compress_s.unit = metrics.SECONDS.unit


class EqualBits(_Measured):
    """Each pruner's 2:4 + INTb beside the dense INT(b/2 + 1) of the same bits per weight; the claim
    rows are the int8_vs_int5 and int4_vs_int3 perplexity ratios, each also on each held-out source."""
    params = (PRUNERS,)
    param_names = ["pruner"]

    @staticmethod
    def pair(r, pruner: str, value_bits: int) -> tuple[str, str]:
        """(2:4 format, its dense partner) of the grid, or asv's skip."""
        sparse = sparsity24.SemiStructured24(pruner, value_bits)
        dense = sparsity24.dense_partner(sparse)
        for name in (sparse.name, dense.name):
            if name not in r["bits"]:
                raise SkipNotImplemented(f"{name} is not in this grid")
        return sparse.name, dense.name

    def _ratio(self, r, pruner, value_bits, source=None) -> intervals.Estimate:
        """Perplexity of the 2:4 format / of the dense one at equal bits, paired over spans (one source's)."""
        return perplexity_ratio(r["nll"], *self.pair(r, pruner, value_bits), source)

    def _gap(self, r, pruner, value_bits) -> float:
        """Bits per weight of the 2:4 format minus the dense one's (the claims' gate)."""
        sparse, dense = self.pair(r, pruner, value_bits)
        return r["bits"][sparse] - r["bits"][dense]

    def _change(self, r, pruner, value_bits) -> intervals.Estimate:
        """Task accuracy of the 2:4 format minus the dense one's, paired over samples."""
        return accuracy_change(r["accuracy"], *self.pair(r, pruner, value_bits))

    @evidence.estimate
    def track_perplexity_ratio_int8_vs_int5(self, r, pruner):
        """The claim accuracy-at-equal-bits."""
        return self._ratio(r, pruner, 8)
    track_perplexity_ratio_int8_vs_int5.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int8_vs_int5_on_licenses(self, r, pruner):
        """The claim's ratio on the license spans alone (_on_docstrings: on the standard library's)."""
        return self._ratio(r, pruner, 8, "licenses")
    track_perplexity_ratio_int8_vs_int5_on_licenses.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int8_vs_int5_on_docstrings(self, r, pruner):
        return self._ratio(r, pruner, 8, "python-stdlib")
    track_perplexity_ratio_int8_vs_int5_on_docstrings.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int6_vs_int4(self, r, pruner):
        return self._ratio(r, pruner, 6)
    track_perplexity_ratio_int6_vs_int4.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int4_vs_int3(self, r, pruner):
        """The claim accuracy-at-equal-bits-int4."""
        return self._ratio(r, pruner, 4)
    track_perplexity_ratio_int4_vs_int3.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int4_vs_int3_on_licenses(self, r, pruner):
        return self._ratio(r, pruner, 4, "licenses")
    track_perplexity_ratio_int4_vs_int3_on_licenses.unit = metrics.PERPLEXITY_RATIO.unit

    @evidence.estimate
    def track_perplexity_ratio_int4_vs_int3_on_docstrings(self, r, pruner):
        return self._ratio(r, pruner, 4, "python-stdlib")
    track_perplexity_ratio_int4_vs_int3_on_docstrings.unit = metrics.PERPLEXITY_RATIO.unit

    def track_bits_gap_int8_vs_int5(self, r, pruner):
        return self._gap(r, pruner, 8)
    track_bits_gap_int8_vs_int5.unit = metrics.BITS_PER_WEIGHT.unit

    def track_bits_gap_int6_vs_int4(self, r, pruner):
        return self._gap(r, pruner, 6)
    track_bits_gap_int6_vs_int4.unit = metrics.BITS_PER_WEIGHT.unit

    def track_bits_gap_int4_vs_int3(self, r, pruner):
        return self._gap(r, pruner, 4)
    track_bits_gap_int4_vs_int3.unit = metrics.BITS_PER_WEIGHT.unit

    @evidence.estimate
    def track_accuracy_change_points_int8_vs_int5(self, r, pruner):
        return self._change(r, pruner, 8)
    track_accuracy_change_points_int8_vs_int5.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_accuracy_change_points_int6_vs_int4(self, r, pruner):
        return self._change(r, pruner, 6)
    track_accuracy_change_points_int6_vs_int4.unit = metrics.POINTS.unit

    @evidence.estimate
    def track_accuracy_change_points_int4_vs_int3(self, r, pruner):
        return self._change(r, pruner, 4)
    track_accuracy_change_points_int4_vs_int3.unit = metrics.POINTS.unit


class CpuMatmul(common.ComputedOnce):
    """One block's seven linears through each kernel PyTorch has on this CPU, interleaved with fp32:
    context for the speed claim, which needs a GPU (int5-dequantize is an emulation). A setup_cache of its
    own, so no compression's memory use shapes the timings and they rerun in minutes. The rounds are
    split over TIMING_PROCESSES fresh processes that only load the model: on the 2-core VMs a
    sub-millisecond timing's level differs from process to process, and the samples should say so."""
    timeout = 1800
    params = (TOKENS, KERNELS)
    param_names = ["tokens", "kernel"]

    def setup_cache(self):
        from claimbench.suites import sparsity24 as importable  # in_child imports its function by name
        out = {}
        for _ in range(TIMING_PROCESSES):
            for key, seconds in measure.in_child(importable.timing_in_fresh_process,
                                                 ROUNDS // TIMING_PROCESSES).items():
                out.setdefault(key, []).extend(seconds)
        return out

    @evidence.estimate
    def track_seconds(self, r, tokens, kernel):
        return intervals.median_of(r[tokens, kernel])
    track_seconds.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_speedup_vs_fp32(self, r, tokens, kernel):
        return intervals.ratio_of_rounds(r[tokens, "fp32"], r[tokens, kernel])
    track_speedup_vs_fp32.unit = metrics.SPEEDUP.unit
