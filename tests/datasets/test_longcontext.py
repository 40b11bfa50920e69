import pytest

from claimbench.datasets import longcontext as LC


def count(text):  # a stand-in tokenizer: words
    return len(text.split())


def have_text():
    try:
        LC.haystack_sentences()
        return True
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not have_text(), reason="no on-machine text (vim docs, license texts)")


@pytest.mark.parametrize("task", LC.TASKS)
def test_deterministic_sized_and_answer_present(task):
    if task == "doc-qa" and len(LC.command_descriptions()) < 50:
        pytest.skip("too few man pages on this machine")
    a, b = LC.make(task, 1500, count, seed=3), LC.make(task, 1500, count, seed=3)
    assert a == b
    assert LC.make(task, 1500, count, seed=4) != a
    assert 1000 <= count(a.context) <= 1500
    for answer in a.answers:
        assert answer in a.context
    if task == "doc-qa":
        assert a.question.split(": ", 1)[1].rstrip("?") in a.context
    assert a.prompt().endswith(a.answer_prefix)


def test_variable_chain_in_order():
    s = LC.make("variable-tracking", 1200, count, seed=1)
    spots = [s.context.index(f"VAR {name} =") for name in s.answers]
    assert spots == sorted(spots)


def test_score_is_string_match():
    s = LC.Sample("t", "", "", "", ("123", "456"))
    assert LC.score(s, "the numbers are 123 and 456") == 1.0
    assert LC.score(s, "only 456") == 0.5
    assert LC.score(s, "none") == 0.0


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task"):
        LC.make("nope", 100, count, 0)
