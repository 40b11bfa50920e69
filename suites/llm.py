"""The LLM substrate (SmolLM2-135M): our compact Llama vs transformers' LlamaForCausalLM on the
same weights, same process, interleaved; perplexity beside the speed; dense accuracy on every
long-context task at 4K (the completion task included) as the reference that sparse and compressed
methods are measured against.

CLAIMBENCH_QUICK=1: prefill at 512 and 2K only, fewer decode steps and task samples.
"""
import copy
import time

import torch

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import measure, metrics
from claimbench.datasets import longcontext
from claimbench.llm import evaluate

from . import common

QUICK = common.QUICK
QUICK_BUDGET_S = 285  # seconds in quick mode on 2 cores (237 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")
PREFILL = [512, 2048] + ([] if QUICK else [8192])
DECODE_CONTEXT, DECODE_STEPS = 2048, 8 if QUICK else 32
TASK_LENGTH, TASK_SAMPLES = 4096, 1 if QUICK else 5
IMPLS = ["claimbench", "transformers"]


def models():
    from claimbench.llm import smollm
    model, tok, eos = common.smollm2()
    return model, smollm.to_transformers(model), tok, eos


def prefill_fns(model, hf, ids):
    def ours():
        with torch.inference_mode():
            model(ids, model.new_cache(capacity=ids.shape[1]), last_only=True)

    def theirs():
        with torch.inference_mode():
            hf(ids, use_cache=True, logits_to_keep=1)
    return {"claimbench": ours, "transformers": theirs}


def decode_times(model, hf, ids, steps, rounds=3) -> dict[str, list[float]]:
    """Seconds for `steps` greedy decode steps after one shared-length prefill, interleaved; each
    round starts from a fresh copy of the prefilled cache (copied outside the timed part)."""
    with torch.inference_mode():
        cache = model.new_cache(capacity=ids.shape[1] + 4 * steps)
        model(ids, cache, last_only=True)
        hf_past = hf(ids, use_cache=True, logits_to_keep=1).past_key_values
    times = {"claimbench": [], "transformers": []}
    for _ in range(rounds):
        for impl in times:
            ours = cache.clone() if impl == "claimbench" else None
            past = copy.deepcopy(hf_past) if impl == "transformers" else None
            start = time.perf_counter()
            if ours is not None:
                evaluate.decode(model, ours, n=steps, token=5)
            else:
                token = torch.tensor([[5]])
                with torch.inference_mode():
                    for _ in range(steps):  # transformers' own cache API: the baseline as a user runs it
                        out = hf(token, past_key_values=past, use_cache=True)
                        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            times[impl].append(time.perf_counter() - start)
    return times


class Throughput(common.ComputedOnce):
    params = (["prefill-" + str(n) for n in PREFILL] + [f"decode-{DECODE_CONTEXT}"], IMPLS)
    param_names = ["phase", "implementation"]
    timeout = 3600

    def setup_cache(self):
        model, hf, tok, _ = models()
        gen = torch.Generator().manual_seed(0)
        out = {}
        for n in PREFILL:
            ids = torch.randint(0, model.config.vocab_size, (1, n), generator=gen)
            times = measure.interleaved(prefill_fns(model, hf, ids), rounds=3 if n < 8192 else 1)
            out.update({(f"prefill-{n}", impl): n / measure.median(t) for impl, t in times.items()})
        ids = torch.randint(0, model.config.vocab_size, (1, DECODE_CONTEXT), generator=gen)
        times = decode_times(model, hf, ids, DECODE_STEPS)
        out.update({(f"decode-{DECODE_CONTEXT}", impl): DECODE_STEPS / measure.median(t) for impl, t in times.items()})
        text = torch.tensor([tok.encode(longcontext.perplexity_text(20_000 if QUICK else 100_000)).ids])
        out["ppl", "claimbench"] = evaluate.windowed_perplexity(lambda x: model(x), text)
        out["ppl", "transformers"] = evaluate.windowed_perplexity(lambda x: hf(x).logits, text)
        return out

    def track_tokens_per_s(self, r, phase, implementation):
        return r[phase, implementation]
    track_tokens_per_s.unit = metrics.TOKENS_PER_S.unit

    def track_speedup_vs_transformers(self, r, phase, implementation):
        if implementation != "claimbench":
            raise SkipNotImplemented("the ratio is reported on the claimbench row")
        return r[phase, "claimbench"] / r[phase, "transformers"]
    track_speedup_vs_transformers.unit = metrics.SPEEDUP.unit

    def track_perplexity(self, r, phase, implementation):
        return r["ppl", implementation]
    track_perplexity.unit = metrics.PERPLEXITY.unit


class PeakMemory:
    """Peak RSS of a process that loads the model and prefills 8K tokens (goal <= 2 GB)."""
    timeout = 1200

    def setup_cache(self):
        from claimbench.llm import smollm
        return measure.in_child(smollm.prefill_peak_rss, 8192)

    def track_peak_rss_prefill_8k(self, rss):
        return rss
    track_peak_rss_prefill_8k.unit = metrics.BYTES.unit


if QUICK:  # 8K prefill is a full-mode measurement
    del PeakMemory


class DenseAccuracy(common.ComputedOnce):
    """Dense attention's score on each long-context task at 4K, the completion task included: the
    reference for sparse and compressed methods."""
    params = ([*longcontext.TASKS, longcontext.COMPLETION],)
    param_names = ["task"]
    timeout = 3600

    def setup_cache(self):
        model, tok, eos = common.smollm2()
        tasks = {task: TASK_SAMPLES for task in [*longcontext.TASKS, longcontext.COMPLETION]}
        scores = evaluate.task_accuracy(model, tok, eos, lambda: {"dense": None}, tasks, TASK_LENGTH, new_tokens=32)
        return {task: sum(v) / len(v) for (_, task), v in scores.items()}

    def track_accuracy(self, scores, task):
        return scores[task]
    track_accuracy.unit = metrics.ACCURACY.unit
