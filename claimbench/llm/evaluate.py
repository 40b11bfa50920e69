"""The one evaluation loop of the LLM substrate: prefill, greedy decode, teacher-forced NLL and
long-context task accuracy with per-item outcomes (the intervals are computed from those).

A method here is anything `model.attention_method` takes (or None for the model as it is); it
is active for every decode step, the first new token included.
"""
from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from typing import Callable, Sequence

import torch

from claimbench import intervals
from claimbench.datasets import longcontext
from claimbench.llm.model import KVCache, Llama

log = logging.getLogger(__name__)


def token_counter(tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer.encode(text).ids)


def _active(model: Llama, method):
    return model.attention_method(method) if method is not None else nullcontext()


@torch.inference_mode()
def prefill(model: Llama, ids: Sequence[int], room: int = 64) -> tuple[KVCache, torch.Tensor]:
    """A cache holding ids (with room for `room` more) and the logits (vocab,) after the last."""
    cache = model.new_cache(capacity=len(ids) + room)
    logits = model(torch.tensor([list(ids)]), cache, last_only=True)[0, -1]
    return cache, logits


@torch.inference_mode()
def decode(model: Llama, cache: KVCache, method=None, n: int = 16, eos: int | None = None, *,
           token: int | None = None, logits: torch.Tensor | None = None) -> list[int]:
    """Greedy continuation of the cache, at most n tokens, stopping before eos. It starts either
    from the logits after the cache's last entry or by feeding `token` first (so that the method
    decides the first new token too)."""
    if (token is None) == (logits is None):
        raise ValueError("decode starts from a token to feed or from logits, exactly one of them")
    out: list[int] = []
    with _active(model, method):
        if token is not None:
            logits = model(torch.tensor([[token]]), cache)[0, -1]
        for step in range(n):
            nxt = int(logits.argmax())
            if nxt == eos:
                break
            out.append(nxt)
            if step + 1 < n:
                logits = model(torch.tensor([[nxt]]), cache)[0, -1]
    return out


def generate(model: Llama, ids: Sequence[int], n: int, eos: int | None = None) -> list[int]:
    """Greedy continuation of a prompt (no method): prefill, then decode."""
    cache, logits = prefill(model, ids, room=n)
    return decode(model, cache, None, n, eos, logits=logits)


@torch.inference_mode()
def teacher_forced_nll(model: Llama, cache: KVCache, token: int, targets: Sequence[int], method=None) -> list[float]:
    """Negative log-likelihood of each target, decoded one step at a time from the cache (feeding
    `token`, then the targets themselves) with the method active at every step."""
    out = []
    with _active(model, method):
        for nxt in targets:
            logits = model(torch.tensor([[token]]), cache)[0, -1].float()
            out.append(float(torch.logsumexp(logits, -1) - logits[nxt]))
            token = nxt
    return out


@torch.inference_mode()
def windowed_perplexity(forward: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
                        window: int = 1024) -> float:
    """Token-level perplexity of ids (1, n) over non-overlapping windows; forward maps (1, T) token
    ids to (1, T, vocab) logits (the compact model, or any other implementation of the same weights)."""
    nll, count = 0.0, 0
    for start in range(0, ids.shape[1] - 1, window):
        chunk = ids[:, start:start + window + 1]
        logits = forward(chunk[:, :-1]).float()
        nll += torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
        count += chunk.shape[1] - 1
    return math.exp(nll / count)


def _samples(tokenizer, tasks: dict[str, int], length: int):
    """(task, seed, sample, prompt ids) for seed < tasks[task], task by task."""
    count = token_counter(tokenizer)
    for task, n in tasks.items():
        for seed in range(n):
            sample = longcontext.make(task, length, count, seed)
            yield task, seed, sample, tokenizer.encode(sample.prompt()).ids


def over_seeds(make_methods: Callable[..., dict], seeds: int, run: Callable, progress: str = "") -> dict[str, list]:
    """Per method name, run(method) for each seed < seeds, with the methods make_methods(seed) draws
    with (make_methods() at seed 0); a method whose settings no seed changes (its repr is the same)
    runs once and counts for every seed. With `progress`, a log line per seed names it."""
    done, out = {}, {}
    for seed in range(seeds):
        if progress:
            log.info("  %s: seed %d of %d", progress, seed + 1, seeds)
        for name, method in (make_methods(seed) if seed else make_methods()).items():
            if repr(method) not in done:
                done[repr(method)] = run(method)
            out.setdefault(name, []).append(done[repr(method)])
    return out


def task_accuracy(model: Llama, tokenizer, eos: int, make_methods: Callable[..., dict], tasks: dict[str, int],
                  length: int, new_tokens: int = 16,
                  on_prefill: Callable[[str, int, KVCache, int], None] | None = None,
                  seeds: int = 1) -> dict[tuple[str, str], list[float]]:
    """Per (method, task), the score of every sample (`longcontext.make(task, length, ..., seed)` for
    seed < tasks[task]). One prefill of the prompt but its last token per sample is shared by the
    methods make_methods() returns (fresh ones per sample, each decoding on its own copy);
    on_prefill(task, seed, cache, last token) sees that prefill first. With seeds > 1, a sample's
    score is its mean over the methods' own random draws (`over_seeds`)."""
    names = list(make_methods())
    scores = {(name, task): [] for name in names for task in tasks}
    for done, (task, seed, sample, ids) in enumerate(_samples(tokenizer, tasks, length)):
        log.info("  sample %d of %d (%s, %d tokens): %d methods, %d seed(s)", done + 1, sum(tasks.values()), task,
                 len(ids), len(names), seeds)
        base, _ = prefill(model, ids[:-1], room=new_tokens + 24)
        if on_prefill is not None:
            on_prefill(task, seed, base, ids[-1])

        def score(method):
            out = decode(model, base.clone(), method, new_tokens, eos, token=ids[-1])
            return longcontext.score(sample, tokenizer.decode(out))
        for name, draws in over_seeds(make_methods, seeds, score).items():
            scores[name, task].append(sum(draws) / len(draws))
    return scores


@torch.inference_mode()
def segment_nll(model: Llama, ids: Sequence[int], prefix: int, scored: int, segments: int) -> list[float]:
    """Mean NLL of each of `segments` consecutive spans of ids: prefill `prefix` tokens into a cache,
    then score the next `scored` tokens as one chunk that continues it (the same numbers as decoding
    them one at a time teacher-forced, in one forward); whatever the model runs under acts on both."""
    span = prefix + scored + 1
    if len(ids) < segments * span:
        raise ValueError(f"{segments} segments of {prefix} + {scored} tokens need {segments * span} tokens; "
                         f"got {len(ids)}")
    out = []
    for s in range(segments):
        chunk = torch.tensor([list(ids[s * span:(s + 1) * span])])
        cache = model.new_cache(capacity=span)
        model(chunk[:, :prefix], cache, last_only=True)
        logits = model(chunk[:, prefix:prefix + scored], cache)[0].float()
        out.append(torch.nn.functional.cross_entropy(logits, chunk[0, prefix + 1:]).item())
    return out


def applied_task_accuracy(model: Llama, tokenizer, eos: int, variants: dict[str, Callable], tasks: dict[str, int],
                          length: int, new_tokens: int = 16) -> dict[tuple[str, str], list[float]]:
    """Like task_accuracy, for methods that change the model itself (variants: name -> a function
    returning a context manager under which the model prefills and decodes): every sample is
    prefilled and decoded under each variant in turn."""
    encoded = list(_samples(tokenizer, tasks, length))
    scores = {(name, task): [] for name in variants for task in tasks}
    for done, (name, variant) in enumerate(variants.items()):
        log.info("  %s (%d of %d): %d samples", name, done + 1, len(variants), len(encoded))
        with variant():
            for task, _, sample, ids in encoded:
                cache, _ = prefill(model, ids[:-1], room=new_tokens + 24)
                out = decode(model, cache, None, new_tokens, eos, token=ids[-1])
                scores[name, task].append(longcontext.score(sample, tokenizer.decode(out)))
    return scores


def weights_quality(model: Llama, tokenizer, eos: int, weights: dict[str, torch.Tensor], held_out: Sequence[int],
                    spans: tuple[int, int, int], tasks: dict[str, int], length: int,
                    new_tokens: int = 10) -> tuple[list[float], list[float]]:
    """(NLL of each held-out span, every task sample's score pooled) with `weights` (parameter name ->
    tensor, e.g. a compressed format's dequantized weights) in place of the model's own; spans is
    segment_nll's (prefix, scored, segments). The model's weights are restored after."""
    from claimbench.baselines.weight_quant import quantized

    def swapped():
        return quantized(model, weights)
    with swapped():
        nll = segment_nll(model, held_out, *spans)
    scores = applied_task_accuracy(model, tokenizer, eos, {"weights": swapped}, tasks, length, new_tokens)
    return nll, [s for task in tasks for s in scores["weights", task]]


def perplexity(nll: Sequence[float]):
    """exp of the mean of per-span (or per-token) NLLs, with a bootstrap interval over them (kept as its samples)."""
    return intervals.bootstrap(nll, lambda xs: math.exp(sum(xs) / len(xs)), nll)


def perplexity_ratio(reference: Sequence[float], method: Sequence[float]):
    """Perplexity of method / of reference on the same spans (per-span NLLs), paired bootstrap."""
    items = list(zip(reference, method))
    return intervals.bootstrap(items, lambda xs: math.exp(sum(m - r for r, m in xs) / len(xs)))


def points_change(reference: Sequence[float], method: Sequence[float]):
    """Task accuracy of method minus reference's, in points, paired over the same samples."""
    items = list(zip(reference, method))
    return intervals.bootstrap(items, lambda xs: 100 * sum(m - r for r, m in xs) / len(xs))
