"""ATTUNE's training jobs (PAPERS.md B1): a validated recipe (claimbench.datasets.recipes) -> real
training steps on this machine, with what the correctness gate reads and what the tuner times.

Fixed code, like the gate: proposers edit recipes, never this module.

Data: the corpus source's documents in the recipe's order, tokenized (SmolLM2's tokenizer, or UTF-8
bytes), cut into segments of at most sequence_length + 1 tokens that overlap by one, so every token
after a document's first is a target exactly once; each step takes exactly `tokens_per_step` targets
(a segment that does not fit is split, its rest opens the next step). Each segment is an independent
sequence (positions from 0). Rows: one segment per row padded to the sequence length, or, with
`packing`, segments packed into rows with attention kept within each one (Llama.train_forward's
mask), so packing changes no token and no attention. The loss of a step is the sum of its targets'
cross-entropy over the step's target count, whatever the micro-batching or DDP split, so those
preserve the global batch exactly.

Per step the run records: the cross-entropy before the update (the loss curve the gate compares),
the targets trained on and a digest of them (document, position, token), and for the MoE the
token-expert pairs the experts computed. The MoE layer (top-k softmax routing, SwiGLU experts
stored stacked, three dispatch implementations over the same parameters) is ours: reconstructed,
the paper names no model.
"""
from __future__ import annotations

import copy
import datetime
import hashlib
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from claimbench.datasets import text

DIGEST_PRIME = 2_147_483_647  # step digests are sums of per-target hashes modulo this prime
IGNORE = -100  # target of a padded position
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)  # a DDP rank waiting longer on the others fails


@dataclass(frozen=True)
class Segment:
    doc: int  # index in the recipe's document order
    start: int  # position of the segment's first token in its document
    tokens: tuple[int, ...]

    @property
    def targets(self) -> int:
        return len(self.tokens) - 1


@lru_cache(maxsize=4)
def _document_tokens(source: str, tokenizer: str) -> tuple[tuple[int, ...], ...]:
    docs = text.documents(source)
    if tokenizer == "bytes":
        return tuple(tuple(d.text.encode("utf-8")) for d in docs)
    from claimbench.llm import smollm
    tok, eos = smollm.tokenizer()
    return tuple(tuple(e.ids) + (eos,) for e in tok.encode_batch([d.text for d in docs]))


def steps_of(recipe: dict, steps: int) -> list[list[Segment]]:
    """The segments of each of the first `steps` steps (exactly tokens_per_step targets each)."""
    docs = _document_tokens(recipe["data.source"], recipe["model.tokenizer"])
    order = (np.random.default_rng(recipe["data.seed"]).permutation(len(docs))
             if recipe["data.order"] == "shuffled" else np.arange(len(docs)))
    length, per_step, truncate = recipe["train.sequence_length"], recipe["train.tokens_per_step"], recipe["data.truncate_tokens"]

    def segments():
        for rank, index in enumerate(order):
            ids = docs[index][:truncate] if truncate else docs[index]
            for start in range(0, len(ids) - 1, length):
                yield Segment(rank, start, ids[start:start + length + 1])

    out, current, need = [], [], per_step
    stream = segments()
    while len(out) < steps:
        try:
            seg = next(stream)
        except StopIteration:
            raise ValueError(f"corpus source {recipe['data.source']!r} holds fewer than {steps} steps of "
                             f"{per_step} tokens") from None
        while seg.targets > 0:
            if seg.targets <= need:
                current.append(seg)
                need -= seg.targets
                seg = Segment(seg.doc, seg.start, ())
            else:  # split: the first `need` targets finish this step, the rest (one token overlap) opens the next
                current.append(Segment(seg.doc, seg.start, seg.tokens[:need + 1]))
                seg = Segment(seg.doc, seg.start + need, seg.tokens[need:])
                need = 0
            if need == 0:
                out.append(current)
                current, need = [], per_step
                if len(out) == steps:
                    break
    return out


def rows_of(segments: list[Segment], length: int, packing: bool) -> list[list[Segment]]:
    """Segments grouped into rows of at most `length` input tokens: one per row, or packed first-fit."""
    if not packing:
        return [[s] for s in segments]
    rows, room = [], []
    for seg in segments:
        for i, free in enumerate(room):
            if seg.targets <= free:
                rows[i].append(seg)
                room[i] -= seg.targets
                break
        else:
            rows.append([seg])
            room.append(length - seg.targets)
    return rows


def collate(rows: list[list[Segment]]) -> dict[str, torch.Tensor]:
    """Rows -> inputs, targets, positions, the (document, position) of each target and, for packed
    rows, the per-segment causal mask. Padded to the longest row."""
    width = max(sum(s.targets for s in row) for row in rows)
    shape = (len(rows), width)
    inputs, targets = torch.zeros(shape, dtype=torch.long), torch.full(shape, IGNORE, dtype=torch.long)
    positions, segment = torch.zeros(shape, dtype=torch.long), torch.full(shape, -1, dtype=torch.long)
    docs, places = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long)
    packed = any(len(row) > 1 for row in rows)
    for r, row in enumerate(rows):
        at = 0
        for j, seg in enumerate(row):
            n, ids = seg.targets, torch.tensor(seg.tokens)
            inputs[r, at:at + n], targets[r, at:at + n] = ids[:-1], ids[1:]
            positions[r, at:at + n] = torch.arange(n)
            segment[r, at:at + n], docs[r, at:at + n] = j, seg.doc
            places[r, at:at + n] = torch.arange(seg.start + 1, seg.start + 1 + n)  # the target's place in its document
            at += n
    batch = {"inputs": inputs, "targets": targets, "positions": positions, "docs": docs, "places": places}
    if packed:
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        batch["mask"] = ((segment[:, :, None] == segment[:, None, :]) & causal)[:, None]
    return batch


def target_digest(batch: dict[str, torch.Tensor]) -> int:
    """Sum over trained targets of a hash of (document, place, token), modulo DIGEST_PRIME: additive
    over micro-batches and DDP ranks, independent of row order."""
    keep = batch["targets"] != IGNORE
    d, p, t = (batch[k][keep].to(torch.int64) for k in ("docs", "places", "targets"))
    h = (d * 1_000_003 + p) % DIGEST_PRIME
    h = (h * 48_271 + t * 69_621 + 12_345) % DIGEST_PRIME
    h = (h * h + 1) % DIGEST_PRIME
    return int(h.sum() % DIGEST_PRIME)


class MoEFeedForward(nn.Module):
    """Top-k routed SwiGLU experts (weights stacked per expert), replacing a Llama block's feed-forward.
    `capacity_factor` (per expert at most ceil(cf * tokens * k / experts) pairs, later ones dropped) and
    the `balanced`/`forced` routers exist so the gate has something real to deny."""

    def __init__(self, dim: int, ffn_dim: int, experts: int, top_k: int, dispatch: str = "loop",
                 capacity_factor: float | None = None, router: str = "learned"):
        super().__init__()
        self.router_proj = nn.Linear(dim, experts, bias=False)
        scale = 1 / math.sqrt(dim)
        self.w1 = nn.Parameter(torch.randn(experts, ffn_dim, dim) * scale)
        self.w3 = nn.Parameter(torch.randn(experts, ffn_dim, dim) * scale)
        self.w2 = nn.Parameter(torch.randn(experts, dim, ffn_dim) / math.sqrt(ffn_dim))
        self.experts, self.top_k, self.dispatch = experts, top_k, dispatch
        self.capacity_factor, self.router = capacity_factor, router
        self.kept_pairs = 0  # pairs of real (not padding) tokens computed since the runner last reset it
        self.real_tokens: torch.Tensor | None = None  # (rows * width,) bool, set by the runner per micro-batch

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, dim) -> expert ids (N, k) and weights (N, k)."""
        n, k = x.shape[0], self.top_k
        probs = self.router_proj(x).softmax(-1)
        if self.router == "learned":
            weights, experts = probs.topk(k, dim=-1)
        else:
            first = torch.arange(n, device=x.device) if self.router == "balanced" else torch.zeros(n, dtype=torch.long)
            experts = (first[:, None] + torch.arange(k)) % self.experts
            weights = probs.gather(1, experts)
        return experts, weights / weights.sum(-1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        experts, weights = self.route(x)
        pair_expert, pair_weight = experts.flatten(), weights.flatten()
        pair_token = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k)
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * x.shape[0] * self.top_k / self.experts)
            order = torch.argsort(pair_expert, stable=True)
            counts = torch.bincount(pair_expert, minlength=self.experts)
            rank = torch.empty_like(order)
            rank[order] = torch.arange(len(order)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
            keep = rank < capacity
            pair_expert, pair_weight, pair_token = pair_expert[keep], pair_weight[keep], pair_token[keep]
        real = self.real_tokens
        self.kept_pairs += int(pair_expert.numel() if real is None or real.numel() != x.shape[0] else real[pair_token].sum())
        out = getattr(self, "_" + self.dispatch.replace("-", "_"))(x, pair_token, pair_expert, pair_weight)
        return out.view(shape)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ self.w1[e].T) * (x @ self.w3[e].T)) @ self.w2[e].T

    def _loop(self, x, token, expert, weight):
        """Per expert, find its pairs among all of them (as transformers' Mixtral block does)."""
        out = torch.zeros_like(x)
        for e in range(self.experts):
            index = (expert == e).nonzero().flatten()
            if len(index):
                out = out.index_add(0, token[index], weight[index, None] * self._expert(e, x[token[index]]))
        return out

    def _sorted(self, x, token, expert, weight):
        """Pairs sorted by expert once; each expert runs on its contiguous slice; one scatter back."""
        order = torch.argsort(expert, stable=True)
        token, weight = token[order], weight[order]
        gathered = x[token]
        counts = torch.bincount(expert, minlength=self.experts).tolist()
        parts = [self._expert(e, chunk) for e, chunk in enumerate(gathered.split(counts)) if counts[e]]
        return torch.zeros_like(x).index_add(0, token, weight[:, None] * torch.cat(parts))

    def _padded_bmm(self, x, token, expert, weight):
        """Pairs laid out (experts, most pairs of any expert, dim), zero-padded; three batched matmuls."""
        order = torch.argsort(expert, stable=True)
        token, weight, expert = token[order], weight[order], expert[order]
        counts = torch.bincount(expert, minlength=self.experts)
        slot = torch.arange(len(order)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        padded = x.new_zeros(self.experts, int(counts.max()), x.shape[1])
        padded[expert, slot] = x[token]
        hidden = F.silu(padded @ self.w1.transpose(1, 2)) * (padded @ self.w3.transpose(1, 2))
        y = (hidden @ self.w2.transpose(1, 2))[expert, slot]
        return torch.zeros_like(x).index_add(0, token, weight[:, None] * y)


def build_model(recipe: dict) -> nn.Module:
    from claimbench.llm.model import Llama, LlamaConfig
    if recipe["job"] == "causal-lm" and recipe["model.init"] == "gguf":
        from claimbench.llm import smollm
        model = copy.deepcopy(smollm.load()[0])  # load() caches one model per process; training changes it
    elif recipe["job"] == "causal-lm":  # SmolLM2's architecture from a seeded random initialization
        torch.manual_seed(int(recipe["model.init"].split(":", 1)[1]))
        model = Llama(LlamaConfig.smollm2_135m())
    else:
        seed = int(recipe["model.init"].split(":", 1)[1])
        config = LlamaConfig(vocab_size=256, dim=recipe["model.dim"], n_layers=recipe["model.layers"],
                             n_heads=recipe["model.heads"], n_kv_heads=recipe["model.kv_heads"],
                             ffn_dim=recipe["model.ffn_dim"], max_seq_len=recipe["train.sequence_length"])
        torch.manual_seed(seed)
        model = Llama(config)
        nn.init.normal_(model.tok_embeddings.weight, std=0.02)  # tied with the output: unit-variance logits
        for block in model.layers:
            block.feed_forward = MoEFeedForward(config.dim, config.ffn_dim, recipe["moe.experts"], recipe["moe.top_k"],
                                                recipe["moe.dispatch"], recipe["moe.capacity_factor"], recipe["moe.router"])
    model.requires_grad_(True)
    frozen = tuple(recipe["train.frozen"])
    for name, parameter in model.named_parameters():
        if frozen and name.startswith(frozen):
            parameter.requires_grad_(False)
    return model.to(torch.bfloat16 if recipe["train.precision"] == "bfloat16" else torch.float32)


def parameter_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class _StepData(torch.utils.data.Dataset):
    """Step i -> this rank's micro-batches (collated), so loader workers can build them ahead."""

    def __init__(self, steps: list[list[Segment]], recipe: dict, rank: int, world: int):
        self.steps, self.rank, self.world = steps, rank, world
        self.length, self.packing = recipe["train.sequence_length"], recipe["runtime.packing"]
        self.micro = recipe["runtime.micro_batch_rows"]

    def __len__(self):
        return len(self.steps)

    def __getitem__(self, i):
        rows = rows_of(self.steps[i], self.length, self.packing)[self.rank::self.world]
        return [collate(rows[j:j + self.micro]) for j in range(0, len(rows), self.micro)]


class _TrainForward(nn.Module):
    """Llama.train_forward as a module's forward, so DDP (which hooks forward) can wrap it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, positions, mask=None, checkpointing=False):
        return self.model.train_forward(tokens, positions, mask, checkpointing)


def _optimizer(recipe: dict, model: nn.Module):
    impl = recipe["runtime.optimizer_impl"]
    params = [p for p in model.parameters() if p.requires_grad]
    options = {"foreach": impl == "foreach", "fused": True if impl == "fused" else None}
    optimizer = torch.optim.AdamW(params, lr=recipe["train.optimizer.lr"], betas=tuple(recipe["train.optimizer.betas"]),
                                  eps=recipe["train.optimizer.eps"], weight_decay=recipe["train.optimizer.weight_decay"],
                                  **options)
    warmup, total = recipe["train.schedule.warmup_steps"], recipe["train.schedule.total_steps"]

    def factor(step):
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if recipe["train.schedule.name"] == "constant":
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def _train(recipe: dict, steps: int, deterministic: bool, profile_step: int | None, rank: int, world: int,
           store_port: int | None, report=lambda result: None) -> dict:
    """One process's training loop (rank of world, meeting the others at the TCPStore on store_port);
    rank 0's result is the run's. `report` gets the result while the DDP model and the process group
    still live: a rank's report sends it and ends the process (see _rank_main)."""
    torch.set_num_threads(recipe["runtime.threads"])
    torch.use_deterministic_algorithms(deterministic)
    if world > 1:
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=COLLECTIVE_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT)
    model = build_model(recipe)
    init_digest = parameter_digest(model)
    forward = trained = _TrainForward(model)
    if world > 1:
        if len(rows_of(steps_of(recipe, 1)[0], recipe["train.sequence_length"], recipe["runtime.packing"])) < world:
            raise ValueError(f"a step has fewer rows than runtime.processes ({world})")
        forward = trained = nn.parallel.DistributedDataParallel(trained, find_unused_parameters=bool(_moe_layers(model)))
    if recipe["runtime.compile"] != "none":
        forward = torch.compile(forward, mode=recipe["runtime.compile"])
    optimizer, schedule = _optimizer(recipe, model)
    loader = torch.utils.data.DataLoader(_StepData(steps_of(recipe, steps), recipe, rank, world), batch_size=None,
                                         shuffle=False, num_workers=recipe["runtime.loader_workers"])
    per_step = recipe["train.tokens_per_step"]
    autocast = recipe["train.autocast"]
    moe = _moe_layers(model)
    records, phases = [], {"data": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    padded = real = 0
    profile = None
    started = time.perf_counter()
    fetched = iter(loader)
    for step in range(steps):
        profiler = _profiler() if step == profile_step else nullcontext()
        with profiler as prof:
            t0 = time.perf_counter()
            micro_batches = next(fetched)
            t1 = time.perf_counter()
            loss_sum, tokens, digest, kept, t_forward, t_backward = 0.0, 0, 0, 0, 0.0, 0.0
            for j, batch in enumerate(micro_batches):
                sync = nullcontext() if world == 1 or j == len(micro_batches) - 1 else trained.no_sync()
                with sync:
                    for layer in moe:
                        layer.kept_pairs, layer.real_tokens = 0, (batch["targets"] != IGNORE).flatten()
                    a = time.perf_counter()
                    with torch.autocast("cpu", dtype=getattr(torch, autocast)) if autocast != "none" else nullcontext():
                        logits = forward(batch["inputs"], batch["positions"], batch.get("mask"),
                                         checkpointing=recipe["runtime.activation_checkpointing"])
                    flat_logits, flat_targets = logits.float().flatten(0, 1), batch["targets"].flatten()
                    ce = F.cross_entropy(flat_logits, flat_targets, ignore_index=IGNORE, reduction="sum")
                    objective = ce if recipe["train.loss.label_smoothing"] == 0 else F.cross_entropy(
                        flat_logits, flat_targets, ignore_index=IGNORE, reduction="sum",
                        label_smoothing=recipe["train.loss.label_smoothing"])
                    kept += sum(layer.kept_pairs for layer in moe)
                    b = time.perf_counter()
                    # DDP averages gradients over ranks: times world gives the sum over the global batch
                    (objective * (recipe["train.loss.scale"] * world / per_step)).backward()
                    c = time.perf_counter()
                t_forward, t_backward = t_forward + b - a, t_backward + c - b
                loss_sum += float(ce.detach())
                n = int((batch["targets"] != IGNORE).sum())
                tokens += n
                real, padded = real + n, padded + batch["targets"].numel() - n
                digest = (digest + target_digest(batch)) % DIGEST_PRIME
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["train.grad_clip"])
            if step not in recipe["train.skip_steps"]:
                optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
        if prof is not None:
            profile = _summary(prof)
        totals = torch.tensor([loss_sum, tokens, digest, kept], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(totals)
        records.append({"loss": float(totals[0] / totals[1]), "tokens": int(totals[1]),
                        "digest": int(totals[2]) % DIGEST_PRIME, "kept_pairs": int(totals[3]),
                        "end_s": time.perf_counter() - started})
        for name, seconds in zip(phases, (t1 - t0, t_forward, t_backward, t3 - t2)):
            phases[name] += seconds
    result = {"steps": records, "init_digest": init_digest, "phases": phases,
              "padding_share": padded / max(1, padded + real), "profile": profile}
    report(result)
    return result


def _profiler():
    from torch.profiler import ProfilerActivity, profile
    return profile(activities=[ProfilerActivity.CPU], profile_memory=True)


def _summary(prof, top: int = 12) -> dict:
    """torch.profiler's top operators by self CPU time, with their share, and peak memory allocated."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"top": [{"name": e.key, "share": e.self_cpu_time_total / total, "calls": e.count} for e in events[:top]],
            "self_cpu_s": total / 1e6, "operators": sum(e.count for e in events),
            "peak_memory_bytes": max((e.cpu_memory_usage for e in events), default=0)}


def _rank_main(rank, recipe, steps, deterministic, profile_step, world, store_port, queue):
    """One DDP rank. It hands its outcome over (rank 0's result, or any rank's error), waits until the
    queue has sent it and leaves with os._exit, never tearing DDP down: freeing the Reducer and gloo's
    process group deadlocks now and then (torch 2.13: the main thread joins a gloo worker while holding
    the GIL that worker waits for to free a tensor), and when it did so before the queue's feeder thread
    had sent the result, the result never came."""
    def finish(outcome):
        if rank == 0 or outcome[0] == "error":
            queue.put(outcome)
        queue.close()
        queue.join_thread()
        os._exit(0)
    try:
        _train(recipe, steps, deterministic, profile_step, rank, world, store_port,
               report=lambda result: finish(("ok", result)))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which records it
        finish(("error", f"rank {rank}: {type(e).__name__}: {e}"))


def run(recipe: dict, steps: int, deterministic: bool = False, profile_step: int | None = None) -> dict:
    """Train `steps` steps of a validated recipe from its initialization; `runtime.processes` > 1 runs
    DDP over gloo in that many processes on 127.0.0.1 (each `runtime.threads` threads), meeting at a
    TCPStore this process holds on a port the system chose. Returns the per-step records, the initial
    parameters' digest, time per phase, the padding share and, at `profile_step`, torch.profiler's
    summary."""
    world = recipe["runtime.processes"]
    if world == 1:
        return _train(recipe, steps, deterministic, profile_step, 0, 1, None)
    import multiprocessing
    import queue as queue_mod
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    ranks = [context.Process(target=_rank_main, daemon=True,
                             args=(r, recipe, steps, deterministic, profile_step, world, store.port, queue))
             for r in range(world)]
    for p in ranks:
        p.start()
    try:
        while True:  # a rank that dies without a word (killed, crashed) ends the run at once
            try:
                status, result = queue.get(timeout=1.0)
                break
            except queue_mod.Empty:
                died = [f"rank {r} died (exit code {p.exitcode})" for r, p in enumerate(ranks) if p.exitcode]
                if died:
                    status, result = "error", "; ".join(died)
                    break
    finally:
        for p in ranks:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    if status != "ok":
        raise RuntimeError(result)
    return result


def throughput(recipe: dict, warmup: int, timed: int, profile: bool = True) -> dict:
    """Target tokens per second of a recipe over `timed` steps after `warmup` ones (which pay
    compilation and first-touch allocation), each timed step's seconds, then, with `profile`, one
    more step under torch.profiler (not timed). Also the run's time per phase and padding share, for
    a profiler-guided proposer."""
    total = warmup + timed + (1 if profile else 0)
    result = run(recipe, total, profile_step=total - 1 if profile else None)
    ends = [0.0] + [r["end_s"] for r in result["steps"]]
    seconds = [ends[i + 1] - ends[i] for i in range(warmup, warmup + timed)]
    tokens = sum(r["tokens"] for r in result["steps"][warmup:warmup + timed])
    return {"tokens_per_s": tokens / sum(seconds), "step_seconds": seconds, "phases": result["phases"],
            "padding_share": result["padding_share"], "profile": result["profile"]}


def available_cores() -> int:
    return len(os.sched_getaffinity(0))
