"""Offline long-context tasks in the style of RULER (Hsieh et al., 2024), reconstructed: any
length in the model's own tokens, deterministic per seed, haystacks of on-machine English text.

Tasks: `niah-single` (one needle), `niah-multikey` (the asked key among distractor keys),
`niah-multivalue` (every value of one key), `variable-tracking` (which variables hold a value
after a chain of assignments), `common-words` (the most frequent words of a long list),
`doc-qa` (which command a man-page description belongs to, among many). Scoring is RULER's
string match: the share of expected answers that appear in the model's output.
"""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from .text import read_document, sentences, source_files

TASKS = ("niah-single", "niah-multikey", "niah-multivalue", "variable-tracking", "common-words", "doc-qa")


@dataclass(frozen=True)
class Sample:
    task: str
    context: str
    question: str
    answer_prefix: str
    answers: tuple[str, ...]

    def prompt(self) -> str:
        """SmolLM2's chat format, with the answer's opening words already written."""
        return (f"<|im_start|>user\n{self.context}\n\n{self.question}<|im_end|>\n"
                f"<|im_start|>assistant\n{self.answer_prefix}")


def score(sample: Sample, output: str) -> float:
    """Share of the expected answers found in the output (case-insensitive)."""
    out = output.lower()
    return sum(a.lower() in out for a in sample.answers) / len(sample.answers)


@lru_cache(maxsize=1)
def haystack_sentences() -> tuple[str, ...]:
    pool = tuple(sentences(("vim-docs", "licenses")))
    if len(pool) < 1000:
        raise FileNotFoundError("too little on-machine text for haystacks (vim docs, /usr/share/common-licenses)")
    return pool


@lru_cache(maxsize=1)
def command_descriptions() -> tuple[tuple[str, str], ...]:
    """(command, one-line description) from the NAME sections of section-1 man pages."""
    pairs, seen = [], set()
    for path in source_files(("manpages",)):
        if "/man1/" not in str(path):
            continue
        try:
            text = read_document(path)
        except (OSError, EOFError, ValueError):
            continue
        m = re.search(r"NAME\s*\n\s*([A-Za-z][\w.+-]*)\s+-+\s+(.+)", text)
        if not m:
            continue
        command, desc = m.group(1), " ".join(m.group(2).split())
        words = desc.split()
        if 4 <= len(words) <= 14 and command not in seen and desc.lower() not in seen:
            seen.update({command, desc.lower()})
            pairs.append((command, desc.rstrip(".")))
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
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    rng = random.Random(f"{task}-{length}-{seed}")
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
    pairs = list(command_descriptions())
    if len(pairs) < 50:
        raise FileNotFoundError("too few man pages with NAME sections on this machine for doc-qa")
    rng.shuffle(pairs)
    (target, description), entries, used = pairs[0], [], 0
    for command, desc in pairs:
        line = f"{command}: {desc}."
        used += count(line) + 1
        if used > length - 80:
            break
        entries.append(line)
    rng.shuffle(entries)
    context = "A list of commands and what they do. " + " ".join(entries)
    return Sample(task, context, f"Which command does this: {description}?", "The command is:", (target,))


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
    """English prose for perplexity: Debian's license texts, concatenated in a stable order."""
    files = source_files(("licenses",))
    if not files:
        raise FileNotFoundError("no license texts under /usr/share/common-licenses")
    text = "\n\n".join(read_document(p) for p in files)
    return text[:n_chars]
