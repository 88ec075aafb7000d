"""benchmarks/web_accuracy.py's scoring (the browser run itself is in `make test-web`)."""

from tests.scripts import load_script

web_accuracy = load_script("benchmarks/web_accuracy.py")


def _word(text, start, tag):
    return {"text": text, "start": start, "end": start + len(text), "tag": tag}


def test_conll_tokens_take_the_tag_of_the_word_that_starts_where_they_start():
    # "U.S." is one CoNLL token but four BERT words: the token takes the first word's tag.
    tokens = ["Visit", "U.S.", "now"]
    words = [_word("Visit", 0, "O"), _word("U", 6, "B-LOC"), _word(".", 7, "I-LOC"),
             _word("S", 8, "I-LOC"), _word(".", 9, "I-LOC"), _word("now", 11, "O")]
    assert web_accuracy.token_tags(tokens, words) == ["O", "B-LOC", "O"]
    # A token with no word starting at it (dropped by the tokenizer) is tagged O.
    assert web_accuracy.token_tags(["a", "\u00a0", "b"], [_word("a", 0, "B-PER"),
                                                          _word("b", 4, "B-ORG")]) == \
        ["B-PER", "O", "B-ORG"]


def test_scores_and_agreement():
    results = [{"label": "positive", "probabilities": {"negative": 0.2, "positive": 0.8}},
               {"label": "negative", "probabilities": {"negative": 0.6, "positive": 0.4}}]
    gold = ["1", "1"]
    assert web_accuracy.score("sst2", results, gold, {"1": "positive"}) == {"accuracy": 0.5}
    moved = {"label": "positive", "probabilities": {"negative": 0.21, "positive": 0.79}}
    assert web_accuracy.same(results[0], moved)
    assert abs(web_accuracy.probability_difference(results[0], moved) - 0.01) < 1e-12
    assert not web_accuracy.same(results[0], results[1])
    tagged = {"entities": [{"type": "LOC", "start": 0, "end": 5, "text": "Paris"}],
              "words": [_word("Paris", 0, "B-LOC")], "num_truncated_words": 0}
    assert web_accuracy.score("conll2003", [tagged], [(["Paris"], ["B-LOC"])], {}) == \
        {"f1": 1.0}
    assert not web_accuracy.same(tagged, dict(tagged, words=[_word("Paris", 0, "O")]))
