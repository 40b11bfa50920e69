"""Offline long-context tasks in the style of RULER (Hsieh et al., 2024), reconstructed: any
length in the model's own tokens, deterministic per seed, haystacks from the pinned corpus
(datasets/text.py), so every machine builds the same prompts.

Chat-format tasks (TASKS): `niah-single` (one needle), `niah-multikey` (the asked key among
distractor keys), `niah-multivalue` (every value of one key), `variable-tracking` (which variables
hold a value after a chain of assignments), `common-words` (the most frequent words of a long
list), `doc-qa` (which standard-library function a one-line summary belongs to, among many).
`niah-completion` (ours, not RULER's): contiguous license text with one needle at one of 12
depths, then "The special magic number for KEY is" for the model to continue as plain text; a
task that dense SmolLM2-135M solves at 4K and 8K, so what a sparse method keeps of dense is
measurable. Scoring is RULER's string match: the share of expected answers in the model's output.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from .text import SOURCES, documents, prose, sentences

TASKS = ("niah-single", "niah-multikey", "niah-multivalue", "variable-tracking", "common-words", "doc-qa")
COMPLETION = "niah-completion"
DEPTHS = 12  # needle depths of the completion task: seed s puts it at (s % 12 + 0.5) / 12 of the context


@dataclass(frozen=True)
class Sample:
    task: str
    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]

    def prompt(self) -> str:
        """SmolLM2's chat format with the answer's opening words already written; the completion
        task is plain text the model continues."""
        if self.task == COMPLETION:
            return f"{self.context}\n\n{self.answer_prefix}"
        return (f"<|im_start|>user\n{self.context}\n\n{self.question}<|im_end|>\n"
                f"<|im_start|>assistant\n{self.answer_prefix}")


def score(sample: Sample, output: str) -> float:
    """Share of the expected answers found in the output (case-insensitive)."""
    out = output.lower()
    return sum(a.lower() in out for a in sample.answers) / len(sample.answers)


@lru_cache(maxsize=1)
def haystack_sentences() -> tuple[str, ...]:
    return tuple(sentences(SOURCES))


@lru_cache(maxsize=1)
def function_descriptions() -> tuple[tuple[str, str], ...]:
    """(dotted name, one-line summary) of public standard-library functions and classes whose
    summary is a short sentence of words (4-14 of them), each name and summary once."""
    pairs, seen = [], set()
    for doc in documents("python-stdlib"):
        if doc.id.startswith("topic:") or "." not in doc.id or any(part.startswith("_") for part in doc.id.split(".")):
            continue
        summary = doc.summary
        words = summary.split()
        if not (4 <= len(words) <= 14 and summary.endswith(".") and summary[0].isupper()):
            continue
        if sum(c.isalpha() or c == " " for c in summary) < 0.9 * len(summary):
            continue
        if doc.id not in seen and summary.lower() not in seen:
            seen.update({doc.id, summary.lower()})
            pairs.append((doc.id, summary.rstrip(".")))
    return tuple(pairs)


def _fill(rng: random.Random, inserts: list[str], length: int, count: Callable[[str], int],
          filler: Callable[[random.Random], str]) -> str:
    """Haystack of about `length` tokens with the inserts at random depths (always all of them)."""
    budget = length - sum(count(s) for s in inserts) - 60
    body, used = [], 0
    while used < budget:
        s = filler(rng)
        body.append(s)
        used += count(s) + 1
    if body:
        body.pop()
    for s in inserts:
        body.insert(rng.randint(0, len(body)), s)
    return " ".join(body)


def _sentence(rng: random.Random) -> str:
    pool = haystack_sentences()
    return pool[rng.randrange(len(pool))]


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _key(rng: random.Random) -> str:
    words = ["amber", "falcon", "quartz", "meadow", "cobalt", "harbor", "lantern", "willow", "saffron", "glacier",
             "ember", "orchid", "thistle", "canyon", "marble", "juniper", "zephyr", "tundra", "beacon", "mosaic"]
    return f"{rng.choice(words)}-{rng.choice(words)}-{rng.randint(10, 99)}"


def make(task: str, length: int, count: Callable[[str], int], seed: int) -> Sample:
    """One sample of `task` whose context is about `length` tokens as `count` measures them."""
    if task not in (*TASKS, COMPLETION):
        raise ValueError(f"unknown task {task!r}; known: {', '.join((*TASKS, COMPLETION))}")
    rng = random.Random(f"{task}-{length}-{seed}")
    if task == COMPLETION:
        return _completion(rng, length, count, seed)
    if task in ("niah-single", "niah-multikey", "niah-multivalue"):
        key = _key(rng)
        values = [_number(rng) for _ in range(4 if task == "niah-multivalue" else 1)]
        needles = [f"One of the special magic numbers for {key} is: {v}." for v in values]
        if task == "niah-multikey":
            others = {_key(rng) for _ in range(6)} - {key}
            needles += [f"One of the special magic numbers for {k} is: {_number(rng)}." for k in sorted(others)]
        context = _fill(rng, needles, length, count, _sentence)
        if task == "niah-multivalue":
            return Sample(task, context, f"What are all the special magic numbers for {key} mentioned in the text?",
                          f"The special magic numbers for {key} are:", tuple(values))
        return Sample(task, context, f"What is the special magic number for {key} mentioned in the text?",
                      f"The special magic number for {key} is:", tuple(values))
    if task == "variable-tracking":
        value = _number(rng)
        names = rng.sample([f"{c}{d}" for c in "ABCDEFGHJKLMNPQRSTUVWXYZ" for d in "ABCDEFGHJKLMNPQRSTUVWXYZ"], 5)
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
        context = _fill(rng, chain, length, count, _sentence)
        context = _order_chain(context, chain)
        return Sample(task, context, f"Find all variables that are assigned the value {value} in the text above.",
                      f"Answer: the variables assigned the value {value} are:", tuple(names))
    if task == "common-words":
        vocab = sorted({w.lower() for s in haystack_sentences()[:5000] for w in re.findall(r"[A-Za-z]{4,9}", s)})
        words = rng.sample(vocab, 400)
        common, rare = words[:10], words[10:]
        numbered, used = [], 0
        while True:
            batch = [w for w in common for _ in range(3)] + rng.sample(rare, 12)
            rng.shuffle(batch)
            text = " ".join(f"{len(numbered) + i + 1}. {w}" for i, w in enumerate(batch))
            used += count(text) + 1
            if used > length - 80:
                break
            numbered.append(text)
        context = "Below is a numbered list of words. " + " ".join(numbered)
        return Sample(task, context, "What are the 10 most common words in the above list?",
                      "Answer: The top 10 words that appear most often in the list are:", tuple(common))
    pairs = list(function_descriptions())
    rng.shuffle(pairs)
    (target, description), entries, used = pairs[0], [], 0
    for name, desc in pairs:
        line = f"{name}: {desc}."
        used += count(line) + 1
        if used > length - 80:
            break
        entries.append(line)
    rng.shuffle(entries)
    context = "A list of Python functions and what they do. " + " ".join(entries)
    return Sample(task, context, f"Which function does this: {description}?", "The function is:", (target,))


def _completion(rng: random.Random, length: int, count: Callable[[str], int], seed: int) -> Sample:
    """Contiguous license text of about `length` tokens from a seed-chosen paragraph, the needle
    between two paragraphs at depth (seed % 12 + 0.5) / 12."""
    key, value = _key(rng), _number(rng)
    needle = f"The special magic number for {key} is: {value}."
    paragraphs = [p for p in prose("licenses").split("\n\n") if p.strip()]
    start = rng.randrange(len(paragraphs))
    body, used = [], count(needle) + 40
    while used < length:
        p = paragraphs[(start + len(body)) % len(paragraphs)]
        used += count(p) + 2
        body.append(p)
    body.pop()
    body.insert(round((seed % DEPTHS + 0.5) / DEPTHS * len(body)), needle)
    return Sample(COMPLETION, "\n\n".join(body), "", f"The special magic number for {key} is", (value,))


def _order_chain(context: str, chain: list[str]) -> str:
    """Assignments must appear in chain order: re-place them at their sorted positions."""
    for c in chain:
        context = context.replace(c, "\0", 1)
    parts = context.split("\0")
    out = parts[0]
    for c, rest in zip(chain, parts[1:]):
        out += c + rest
    return out


def perplexity_text(n_chars: int = 200_000) -> str:
    """English prose for perplexity: the corpus's license texts, in the shipped order."""
    return prose("licenses")[:n_chars]
