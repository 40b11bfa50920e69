"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a drafter proposes a block of
tokens, one forward pass of the target model verifies them all, and the longest prefix the target
would have produced itself is kept, plus the target's own next token (the bonus), so every pass
yields at least one token. The rejected tail's cache entries are rolled back (`KVCache.truncate`).

Greedy verification is lossless: the output equals plain greedy decoding token for token (the
quality gate of every drafter). Sampled verification (`temperature` > 0) is speculative sampling for
drafters that propose single tokens (a one-hot draft distribution): a drafted token d is kept with
the target's probability p(d), and on the first rejection the token is drawn from p with d taken out;
the output is then distributed as the target's own samples.

Acceptance length = tokens produced per target forward pass, the prefill's first token and every
bonus token counted, so plain decoding is 1.00.

What drafters learn from: `future_pairs` (the target's last hidden state at each position and the
tokens 2..k+1 after it, the tokens a drafter proposes after the target's own next one), trained with
one budget (`HeadTraining`, `train_head`) and saved keyed by the target's digest
(claimbench.llm.model.save_for_model).
"""
from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import Tensor, nn

from claimbench.interfaces import Drafter, InputError
from claimbench.llm.model import KVCache, Llama, check_window


@dataclass
class DraftContext:
    """What a drafter sees: `tokens` (the prompt and every token produced; the last is the target's
    newest token, not yet in the cache), `hidden` (dim,): the target's last hidden state (after its final
    norm) at the position that predicted that token, and the model with its cache (all earlier tokens)."""
    tokens: list[int]
    hidden: Tensor
    model: Llama
    cache: KVCache


@dataclass
class Generation:
    """One generation: the new tokens and what producing them cost."""
    tokens: list[int]
    forwards: int = 0  # target forward passes, the prefill included
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0  # the target's passes, prefill excluded
    accepted_per_pass: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        return len(self.tokens) / max(1, self.forwards)


def _valid_prefix(draft: Sequence, vocab: int) -> list[int]:
    """The draft up to its first entry that is not a token id (an integer in [0, vocab)): invalid
    proposals count as rejected, never as an error."""
    out = []
    for token in draft:
        try:
            token = operator.index(token)
        except TypeError:
            break
        if isinstance(token, bool) or not 0 <= token < vocab:
            break
        out.append(token)
    return out


def _accept_sampled(logits: Tensor, draft: list[int], temperature: float, generator) -> tuple[int, int]:
    """Speculative sampling against one-hot drafts: (accepted count, the token after them)."""
    probs = torch.softmax(logits.float() / temperature, -1)
    for i, token in enumerate(draft):
        if torch.rand((), generator=generator) < probs[i, token]:
            continue
        residual = probs[i].clone()
        residual[token] = 0.0
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return len(draft), int(torch.multinomial(probs[len(draft)], 1, generator=generator))


@torch.inference_mode()
def generate(model: Llama, ids: Sequence[int], drafter: Drafter | None, n: int, k: int = 4,
             eos: int | None = None, temperature: float = 0.0, seed: int = 0) -> Generation:
    """At most n new tokens after the prompt, stopping before eos, with blocks of at most k drafted
    tokens verified by one target pass each (drafter None: plain decoding, one token per pass)."""
    if k < 1:
        raise InputError(f"block size k must be at least 1; got {k}")
    if temperature < 0:
        raise InputError(f"temperature must be >= 0; got {temperature}")
    check_window(model, ids, n + k + 1)
    generator = torch.Generator().manual_seed(seed)

    def pick(logits: Tensor) -> int:
        if temperature == 0:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator))

    cache = model.new_cache(capacity=len(ids) + n + k + 2)
    hidden = model.hidden_states(torch.tensor([list(ids)]), cache)[0, -1]
    result = Generation([], forwards=1)
    token, tokens = pick(model.output(hidden)), list(ids)
    if drafter is not None:
        drafter.start(model, list(ids))
    while token != eos:
        result.tokens.append(token)
        tokens.append(token)
        room = n - len(result.tokens)
        if room == 0:
            break
        draft: list[int] = []
        if drafter is not None and room > 1:
            started = time.perf_counter()
            draft = _valid_prefix(drafter.propose(DraftContext(tokens, hidden, model, cache), min(k, room - 1)),
                                  model.config.vocab_size)[:min(k, room - 1)]
            result.draft_s += time.perf_counter() - started
        started = time.perf_counter()
        start = cache.next_position
        states = model.hidden_states(torch.tensor([[token, *draft]]), cache)[0]
        logits = model.output(states)
        if temperature == 0:
            predicted = logits.argmax(-1).tolist()
            accepted = next((i for i, d in enumerate(draft) if d != predicted[i]), len(draft))
            following = predicted[accepted]
        else:
            accepted, following = _accept_sampled(logits, draft, temperature, generator)
        cache.truncate(start + 1 + accepted)
        result.verify_s += time.perf_counter() - started
        result.forwards += 1
        result.drafted += len(draft)
        result.accepted += accepted
        result.accepted_per_pass.append(accepted)
        for drafted in draft[:accepted]:
            if drafted == eos:
                return result
            result.tokens.append(drafted)
            tokens.append(drafted)
        token, hidden = following, states[accepted]
    return result


def future_pairs(model: Llama, rows: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """From token rows (N, T) of training text: the target's last hidden state at each position t
    (M, dim) and the tokens at t + 2 .. t + 1 + k (M, k), the ones a drafter proposes once the target
    has produced t + 1 itself."""
    if rows.dim() != 2 or rows.shape[1] < k + 2:
        raise InputError(f"training rows must be (N, T) with T >= k + 2 = {k + 2}; got {tuple(rows.shape)}")
    with torch.inference_mode():
        hidden = torch.cat([model.hidden_states(row[None])[0] for row in rows])
    usable = rows.shape[1] - k - 1
    hidden = hidden.view(len(rows), rows.shape[1], -1)[:, :usable].reshape(-1, hidden.shape[-1]).clone()
    future = torch.stack([rows[:, 1 + i: 1 + i + usable] for i in range(1, k + 1)], -1).reshape(-1, k)
    return hidden, future


@dataclass
class HeadTraining:
    """The training budget every learned drafter gets (same data, steps, batch): Adam over random
    minibatches of `future_pairs`, the target frozen."""
    steps: int = 300
    batch: int = 256
    lr: float = 1e-3
    seed: int = 0


def train_head(head: nn.Module, model: Llama, hidden: Tensor, future: Tensor, knobs: HeadTraining,
               say=None) -> list[float]:
    """Train `head` (which defines loss(model, hidden, future) -> scalar) for knobs.steps; the loss of
    every step. The target's weights never change: heads read its LM head detached."""
    torch.manual_seed(knobs.seed)
    generator = torch.Generator().manual_seed(knobs.seed)
    optimizer = torch.optim.Adam(head.parameters(), lr=knobs.lr)
    head.train()
    losses, started = [], time.monotonic()
    for step in range(knobs.steps):
        index = torch.randint(0, len(hidden), (knobs.batch,), generator=generator)
        loss = head.loss(model, hidden[index], future[index])
        if not torch.isfinite(loss):
            raise RuntimeError(f"{type(head).__name__} training diverged at step {step} (loss {loss.item()})")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if say and ((step + 1) % max(1, knobs.steps // 5) == 0):
            say(f"{type(head).__name__}: step {step + 1}/{knobs.steps} loss {loss.item():.4f} "
                f"({time.monotonic() - started:.0f} s)")
    head.eval()
    return losses
