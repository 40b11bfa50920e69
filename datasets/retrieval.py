"""A retrieval set with relevance known by construction, from the pinned corpus's docstrings
(`datasets/data/corpus/`: Python standard library, numpy, scipy, sympy).

A docstring's one-line summary is the query; the passages of its body (its paragraphs of prose,
code and doctest blocks left out) are its relevant documents, binary relevance; every other
docstring's passages are distractors. Queries are split disjointly into calibration, gate and test
queries, and since a docstring gives one query, no docstring's passages are relevant to two splits.
The calibration split's queries and passages are also the text the learned calibration trains on.
Which docstrings are drawn depends only on the corpus and the seed: the same set on every machine.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .text import documents

SOURCES = ("python-stdlib", "numpy", "scipy", "sympy")
SPLITS = ("calibration", "gate", "test")
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")  # numpydoc's first line: "einsum_path(subscripts, ...)"
_RULE = re.compile(r"(?:^|\s)[=\-~^*]{3,}(?:\s|$)")  # an rst heading's underline


@dataclass(frozen=True)
class RetrievalSet:
    queries: tuple[str, ...]
    passages: tuple[str, ...]
    relevant: tuple[frozenset[int], ...]  # per query: indices into passages
    splits: dict[str, tuple[int, ...]]  # split name -> query indices
    query_ids: tuple[str, ...]  # the docstring each query summarises ("scipy.linalg.solve")
    passage_ids: tuple[str, ...]  # the docstring each passage comes from

    def __post_init__(self):
        assert len(self.queries) == len(self.relevant) == len(self.query_ids)
        assert len(self.passages) == len(self.passage_ids)

    def describe(self) -> str:
        sizes = ", ".join(f"{len(self.splits[s])} {s}" for s in SPLITS)
        return (f"{len(self.queries)} docstring summaries as queries ({sizes}) over {len(self.passages)} docstring "
                "passages; a query's relevant passages are its own docstring's (binary relevance)")


def _prose(paragraph: str) -> bool:
    return (len(paragraph.split()) >= 8 and sum(c.isalpha() for c in paragraph) >= 0.6 * len(paragraph)
            and ">>>" not in paragraph and not _RULE.search(paragraph))


def _candidates(max_passages: int) -> list[tuple[str, str, list[str]]]:
    """(docstring id, summary, body passages) for every docstring with a prose summary of 4-40 words
    and at least one prose passage (at most max_passages, the first ones, kept)."""
    out = []
    for source in SOURCES:
        for doc in documents(source):
            paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc.text.strip()) if p.strip()]
            while paragraphs and _SIGNATURE.match(paragraphs[0]):
                paragraphs = paragraphs[1:]
            if len(paragraphs) < 2 or _RULE.search(paragraphs[0]) or not 4 <= len(paragraphs[0].split()) <= 40:
                continue
            body = [p for p in paragraphs[1:] if _prose(p)][:max_passages]
            if body:
                out.append((f"{source}:{doc.id}", paragraphs[0], body))
    return out


def docstring_retrieval(queries_per_split: int, distractor_docstrings: int, max_passages: int = 4,
                        seed: int = 26) -> RetrievalSet:
    """queries_per_split queries per split; the passages of distractor_docstrings further docstrings
    (which give no query) as distractors beside the queries' own."""
    pool = _candidates(max_passages)
    need = len(SPLITS) * queries_per_split + distractor_docstrings
    if len(pool) < need:
        raise ValueError(f"the corpus has {len(pool)} usable docstrings; {need} asked for")
    drawn = random.Random(seed).sample(pool, need)
    seen_summaries, chosen = set(), []
    for item in drawn:  # a summary shared by two docstrings (overloads) would make a query ambiguous
        if item[1].lower() not in seen_summaries:
            seen_summaries.add(item[1].lower())
            chosen.append(item)
    n_queries = min(len(SPLITS) * queries_per_split, len(chosen))
    queries, query_ids, relevant, passages, passage_ids = [], [], [], [], []
    for i, (doc_id, summary, body) in enumerate(chosen):
        start = len(passages)
        passages += body
        passage_ids += [doc_id] * len(body)
        if i < n_queries:
            queries.append(summary)
            query_ids.append(doc_id)
            relevant.append(frozenset(range(start, len(passages))))
    per = n_queries // len(SPLITS)
    splits = {name: tuple(range(k * per, (k + 1) * per)) for k, name in enumerate(SPLITS)}
    return RetrievalSet(tuple(queries), tuple(passages), tuple(relevant), splits, tuple(query_ids), tuple(passage_ids))


def held_out_sentences(n: int) -> list[str]:
    """Sentences of the license texts (no docstring: outside the retrieval set and the calibration
    text), for the dose: how far a calibration moves the embeddings of text it never saw."""
    from .text import sentences
    out = list(sentences(("licenses",)))[:n]
    if len(out) < n:
        raise ValueError(f"the license texts give {len(out)} sentences; {n} asked for")
    return out
