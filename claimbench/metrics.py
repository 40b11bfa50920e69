"""The metrics registry: every unit a suite reports, with the direction that is better.

Suites set `track_x.unit = metrics.QPS.unit`; ingest maps a unit back to its direction, so a
result file from any machine carries enough to rank, gate and alert on it (ann-benchmarks keeps
the same kind of registry). asv's own `time_*`, `mem_*` and `peakmem_*` are lower-is-better.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    unit: str
    direction: str  # "higher", "lower", or "none" for context that is neither (e.g. nprobe)
    description: str
    wall_clock: bool = False  # a time or a rate per second of this machine's CPU: it moves with the machine's speed


SECONDS = Metric("seconds", "lower", "wall time", wall_clock=True)
BYTES = Metric("bytes", "lower", "memory")
QPS = Metric("queries/s", "higher", "queries per second", wall_clock=True)
SPEEDUP = Metric("x", "higher", "method throughput / baseline throughput, same process")
RECALL = Metric("recall@10", "higher", "fraction of the true 10 nearest neighbours returned")
IDENTICAL = Metric("fraction identical", "higher", "fraction of queries with identical results to the baseline")
READ_FRACTION = Metric("fraction of vectors read", "lower", "full vectors read / vectors in probed lists")
PRUNED_FRACTION = Metric("fraction pruned", "higher", "vectors in probed lists never read in full")
CEILING_SHARE = Metric("share of ceiling", "higher", "achieved speedup / the speedup the bound allows")
VARIANCE = Metric("variance captured", "higher", "share of the data's variance in the kept directions")
NPROBE = Metric("nprobe", "none", "inverted lists probed per query")
ROWS_PER_S = Metric("rows/s", "higher", "rows ingested per second", wall_clock=True)
TOKENS_PER_S = Metric("tokens/s", "higher", "tokens processed per second", wall_clock=True)
PERPLEXITY = Metric("perplexity", "lower", "exp of the mean next-token negative log-likelihood")
ACCURACY = Metric("accuracy", "higher", "share of expected answers found (string match)")
USD = Metric("USD", "lower", "billed cost in US dollars")
PERCENT_CHANGE = Metric("% change", "lower", "relative change vs the baseline, in percent (negative = cheaper)")
PERCENT_SHARE = Metric("% of cost", "none", "share of the total, in percent (an observation)")
ACCURACY_RATIO = Metric("accuracy ratio", "higher", "method accuracy / reference accuracy")
IOPS = Metric("IOPS", "higher", "I/O requests completed per second")
BYTES_PER_S = Metric("bytes/s", "higher", "bytes read per second")
SUBMIT_SHARE = Metric("submit share", "lower", "share of wall time spent inside submission calls")
RELATIVE_ERROR = Metric("relative error", "lower", "||method - reference|| / ||reference||")
POINTS = Metric("points", "higher", "accuracy difference in percentage points")
PERCENT_OF_DENSE = Metric("% of dense", "higher", "method accuracy as a percentage of dense attention's")
COSINE = Metric("cosine", "higher", "cosine similarity to the fp32 reference output")
HELD_OUT = Metric("held-out score", "none", "the workload's held-out check (NDCG@10, top-1 agreement or perplexity ratio)")
COUNT = Metric("count", "none", "a count (context, not a quality)")
STORED = Metric("fraction stored", "higher", "rows found in the store / rows in the files")
MEMORY_RATIO = Metric("memory ratio", "lower", "extra memory of the method / memory of the full vectors")
ALERT_RECALL = Metric("share of drops flagged", "higher", "planted regressions flagged at the commit they entered")
FALSE_ALARMS = Metric("false alarm rate", "lower", "share of planted histories alerted where nothing regressed")
DROP_SIZE = Metric("drop size", "lower", "the smallest planted drop flagged in at least 95% of histories")
TERABYTES_WRITTEN = Metric("TB written", "lower", "host bytes written to SSD, in 10^12 bytes")
HIT_RATE = Metric("hit rate", "higher", "share of prompt tokens (or requests) served from the cache")
RECOMPUTED_TOKENS = Metric("tokens recomputed", "lower", "cached tokens prefilled again (no usable state checkpoint)")
WRITE_AMPLIFICATION = Metric("write amplification", "lower", "NAND bytes written / host bytes written (modelled)")
YEARS = Metric("years", "higher", "expected drive lifetime: rated TBW / (yearly host writes x write amplification)")
LIFETIME_RATIO = Metric("x lifetime", "higher", "expected lifetime under the method / under the baseline")
FLOPS = Metric("FLOPs", "lower", "floating-point operations (analytic, 2 per multiply-add)")
BYTES_PER_TOKEN = Metric("bytes/token", "lower", "KV-cache bytes per token, all layers, at 2 bytes per number")
KL_DIVERGENCE = Metric("nats", "lower", "KL divergence from the reference model's next-token distribution")
SHARE_OF_TOLERANCE = Metric("share of tolerance", "lower", "the larger quality loss over its tolerance (1 = at the limit)")
DOSE = Metric("dose", "lower", "1 - mean cosine between the calibrated and the fp32 model's embeddings of held-out text")
NDCG = Metric("NDCG@10", "higher", "normalised discounted cumulative gain of the top 10, binary relevance")
RUN_SHARE = Metric("share of runs", "none", "share of a sweep's runs (diverged, adopted): context")
RANK_CORRELATION = Metric("Spearman rho", "none", "rank correlation between two per-run quantities (an observation)")
HARMFUL_ADOPTIONS = Metric("harmful adoptions", "lower", "adopted calibrations worse than the baseline beyond their interval")
CAUGHT = Metric("% caught", "higher", "planted semantic changes a correctness gate rejected, in percent")
FALSE_REJECTS = Metric("% falsely rejected", "lower", "legitimate changes a correctness gate rejected, in percent")
LOSS_DEVIATION = Metric("relative loss deviation", "lower",
                        "largest per-step |loss - reference loss| / reference loss over a gate's check steps")
BITS_PER_WEIGHT = Metric("bits/weight", "lower", "stored bits (values, scales, sparsity metadata) per original weight")
PERPLEXITY_RATIO = Metric("perplexity ratio", "lower", "method perplexity / reference perplexity on the same text")
GETS_PER_QUERY = Metric("GETs/query", "lower", "object-store GET requests per query")
BYTES_PER_QUERY = Metric("bytes/query", "lower", "bytes read from the object store per query")
ACCEPTANCE_LENGTH = Metric("tokens/pass", "higher", "tokens produced per target forward pass (plain decoding: 1)")
DECODE_STEPS = Metric("decode steps", "lower", "a pass's cost in plain decode steps of the same model")
TRAINING_LOSS = Metric("training loss", "lower", "the training objective at the end of training")
COMPUTED_SHARE = Metric("share of token rows", "lower", "token rows a prefill computes over the layers / full prefill's")
LAYER = Metric("layer", "none", "a model layer, 0-based (a knob chosen by a probe: context)")
MEMORY_BANDWIDTH = Metric("GB/s", "none", "memory bandwidth: GB read and written per second by the machine-speed "
                          "probe's copies, timed in the same rounds (the machine's state: context)")
BANDWIDTH_SHARE = Metric("share of bandwidth", "none",
                         "bytes a method scans per second / bytes per second a copy moves in the same rounds "
                         "(about 1 or more: as fast as memory moves data, memory-bound)")
NEEDLE_RANK = Metric("rank share", "lower", "the needle's rank among the prompt's tokens by a selection score / prompt length")

REGISTRY = {m.unit: m for m in (SECONDS, BYTES, QPS, SPEEDUP, RECALL, IDENTICAL, READ_FRACTION,
                                PRUNED_FRACTION, CEILING_SHARE, VARIANCE, NPROBE, ROWS_PER_S, STORED,
                                TOKENS_PER_S, PERPLEXITY, ACCURACY, USD, PERCENT_CHANGE,
                                PERCENT_SHARE, ACCURACY_RATIO, IOPS, BYTES_PER_S, SUBMIT_SHARE,
                                RELATIVE_ERROR, POINTS, PERCENT_OF_DENSE,
                                COSINE, HELD_OUT, COUNT, MEMORY_RATIO, ALERT_RECALL, FALSE_ALARMS, DROP_SIZE,
                                TERABYTES_WRITTEN, HIT_RATE, RECOMPUTED_TOKENS, WRITE_AMPLIFICATION, YEARS,
                                LIFETIME_RATIO, FLOPS, BYTES_PER_TOKEN, KL_DIVERGENCE, SHARE_OF_TOLERANCE, DOSE, NDCG,
                                RUN_SHARE, RANK_CORRELATION, HARMFUL_ADOPTIONS, CAUGHT, FALSE_REJECTS,
                                LOSS_DEVIATION, COMPUTED_SHARE, BITS_PER_WEIGHT, PERPLEXITY_RATIO,
                                GETS_PER_QUERY, BYTES_PER_QUERY, ACCEPTANCE_LENGTH, LAYER, NEEDLE_RANK,
                                MEMORY_BANDWIDTH, BANDWIDTH_SHARE,
                                DECODE_STEPS, TRAINING_LOSS)}


def direction(benchmark: str, unit: str | None) -> str:
    """'higher', 'lower' or 'none' for an asv benchmark name and its declared unit."""
    leaf = benchmark.rsplit(".", 1)[-1]
    if leaf.startswith(("time_", "mem_", "peakmem_")):
        return "lower"
    metric = REGISTRY.get(unit or "")
    return metric.direction if metric else "none"


def wall_clock(benchmark: str, unit: str | None) -> bool:
    """Whether a benchmark's value is a time or a rate of this machine's CPU (asv's time_*, or a unit
    marked wall_clock): what a slower machine makes worse with no change in the code."""
    if benchmark.rsplit(".", 1)[-1].startswith("time_"):
        return True
    metric = REGISTRY.get(unit or "")
    return bool(metric and metric.wall_clock)
