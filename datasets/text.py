"""English text from the pinned corpus (`datasets/data/corpus/`, its README names sources, versions
and licenses): documents, sentences and contiguous prose, the same bytes on every machine.

Every text input is built from here: long-context haystacks, agent tool outputs, the MiniLM
embedding corpus, SmolLM2 key vectors, perplexity text. Each file is checked against the
manifest when it is first read (claimbench.inputs.path).
"""
from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from claimbench import inputs

SOURCES = ("licenses", "python-stdlib", "numpy", "scipy", "sympy")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@dataclass(frozen=True)
class Document:
    source: str
    id: str  # a license's name, or a docstring's dotted name ("shutil.copyfile")
    text: str

    @property
    def summary(self) -> str:
        """The first line of the first paragraph (a docstring's one-line summary)."""
        return " ".join(self.text.strip().split("\n\n")[0].split())


@lru_cache(maxsize=None)
def documents(source: str) -> tuple[Document, ...]:
    if source not in SOURCES:
        raise ValueError(f"unknown corpus source {source!r}; known: {', '.join(SOURCES)}")
    path = inputs.path(f"corpus/{source}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple(Document(source, d["id"], d["text"]) for d in map(json.loads, f))


def sentences(sources=SOURCES, min_words: int = 6, max_words: int = 60) -> Iterator[str]:
    """Distinct sentence-like spans of the corpus, in a stable order (mostly letters: code,
    doctests, tables and numpydoc section rules are left out)."""
    seen = set()
    for source in sources:
        for doc in documents(source):
            for paragraph in re.split(r"\n\s*\n", doc.text):
                flat = " ".join(paragraph.split())
                for sent in _SENTENCE_END.split(flat):
                    words = sent.split()
                    if not min_words <= len(words) <= max_words:
                        continue
                    if sum(c.isalpha() for c in sent) < 0.6 * len(sent) or "---" in sent or ">>>" in sent:
                        continue
                    key = sent.lower()
                    if key not in seen:
                        seen.add(key)
                        yield sent


def prose(source: str = "licenses") -> str:
    """One source's documents as contiguous text, in the shipped order."""
    return "\n\n".join(doc.text for doc in documents(source))


def token_halves(tokenizer, source: str = "licenses") -> tuple[list[int], list[int]]:
    """(calibration, held-out): the first and the second half of one source's tokens, as prose."""
    ids = tokenizer.encode(prose(source)).ids
    return ids[:len(ids) // 2], ids[len(ids) // 2:]


def spread_spans(ids: Sequence[int], span: int, count: int) -> list[int]:
    """`count` spans of `span` tokens at even strides over ids, concatenated: a sample of a whole
    source (its documents are shipped in name order) rather than its first documents."""
    stride = len(ids) // max(count, 1)
    if stride < span:
        raise ValueError(f"{count} spans of {span} tokens do not fit apart in {len(ids)} tokens")
    return [token for start in range(0, count * stride, stride) for token in ids[start:start + span]]
