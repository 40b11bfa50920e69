"""The docstring retrieval set: relevance by construction, splits disjoint."""
from claimbench.datasets import retrieval


def test_splits_are_disjoint_by_query_and_by_docstring():
    data = retrieval.docstring_retrieval(queries_per_split=30, distractor_docstrings=50)
    splits = [set(data.splits[s]) for s in retrieval.SPLITS]
    assert all(len(s) == 30 for s in splits) and not set.intersection(*splits)
    assert not (splits[0] & splits[1]) and not (splits[1] & splits[2]) and not (splits[0] & splits[2])
    sources = [{data.query_ids[q] for q in s} for s in splits]  # the docstrings whose passages are relevant
    assert sum(map(len, sources)) == len(set.union(*sources)) == 90
    relevant_sources = [{data.passage_ids[p] for q in s for p in data.relevant[q]} for s in splits]
    assert not (relevant_sources[0] & relevant_sources[1]) and not (relevant_sources[1] & relevant_sources[2])


def test_a_query_s_relevant_passages_are_its_own_docstring_s_and_distractors_are_others():
    data = retrieval.docstring_retrieval(queries_per_split=10, distractor_docstrings=40)
    for q, relevant in enumerate(data.relevant):
        assert relevant and {data.passage_ids[p] for p in relevant} == {data.query_ids[q]}
        assert all(data.passages[p] not in data.queries[q] for p in relevant)  # the summary is not a passage
    assert len(set(data.passage_ids)) == 30 + 40  # every drawn docstring gives passages
    assert len({q.lower() for q in data.queries}) == len(data.queries)


def test_the_set_is_the_same_every_time_it_is_built():
    a = retrieval.docstring_retrieval(10, 20)
    b = retrieval.docstring_retrieval(10, 20)
    assert a == b and a.describe() == b.describe()
    assert retrieval.docstring_retrieval(10, 20, seed=1).queries != a.queries


def test_held_out_sentences_come_from_outside_the_docstrings():
    data = retrieval.docstring_retrieval(10, 20)
    held = retrieval.held_out_sentences(50)
    assert len(held) == 50 and not set(held) & set(data.passages)
