import pytest

from claimbench.datasets import longcontext


def count(text):  # a stand-in tokenizer: words
    return len(text.split())


# sha256 prefixes of two prompts built from the pinned corpus: what every machine must build
SINGLE_PROMPT_SHA, COMPLETION_PROMPT_SHA = "e0e1d67a0232b4ff", "43f9a32182b7db51"


@pytest.mark.parametrize("task", longcontext.TASKS)
def test_deterministic_sized_and_answer_present(task):
    a, b = longcontext.make(task, 1500, count, seed=3), longcontext.make(task, 1500, count, seed=3)
    assert a == b
    assert longcontext.make(task, 1500, count, seed=4) != a
    assert 1000 <= count(a.context) <= 1500
    for answer in a.answers:
        assert answer in a.context
    if task == "doc-qa":
        assert a.question.split(": ", 1)[1].rstrip("?") in a.context
    assert a.prompt().endswith(a.answer_prefix)


def test_variable_chain_in_order():
    s = longcontext.make("variable-tracking", 1200, count, seed=1)
    spots = [s.context.index(f"VAR {name} =") for name in s.answers]
    assert spots == sorted(spots)


def test_score_is_string_match():
    s = longcontext.Sample("t", "", "", "", ("123", "456"))
    assert longcontext.score(s, "the numbers are 123 and 456") == 1.0
    assert longcontext.score(s, "only 456") == 0.5
    assert longcontext.score(s, "none") == 0.0


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task"):
        longcontext.make("nope", 100, count, 0)


def test_completion_task_is_plain_text_with_the_needle_at_its_depth():
    for seed in range(longcontext.DEPTHS):
        s = longcontext.make(longcontext.COMPLETION, 2000, count, seed)
        assert s == longcontext.make(longcontext.COMPLETION, 2000, count, seed)
        assert 1500 <= count(s.context) <= 2000
        needle = f"{s.answer_prefix}: {s.answers[0]}."
        assert needle in s.context and "<|im_start|>" not in s.prompt()
        assert s.prompt() == f"{s.context}\n\n{s.answer_prefix}"
        paragraphs = s.context.split("\n\n")
        depth = paragraphs.index(needle) / (len(paragraphs) - 1)
        assert abs(depth - (seed + 0.5) / longcontext.DEPTHS) < 0.1  # seed s: between paragraphs at (s + 0.5) / 12


def test_prompts_are_the_same_bytes_on_every_machine():
    """Built from the pinned corpus alone: these digests hold wherever the repository is cloned."""
    import hashlib
    s = longcontext.make("niah-single", 1200, count, seed=0)
    c = longcontext.make(longcontext.COMPLETION, 1200, count, seed=0)
    assert len(longcontext.haystack_sentences()) == 56795
    assert hashlib.sha256(s.prompt().encode()).hexdigest()[:16] == SINGLE_PROMPT_SHA
    assert hashlib.sha256(c.prompt().encode()).hexdigest()[:16] == COMPLETION_PROMPT_SHA
