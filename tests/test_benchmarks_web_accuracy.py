"""benchmarks/web_accuracy.py's scoring and int8 parity rules (the browser run itself is in
`make test-web`; apps/web_demo/test/parity.test.ts checks the page's copy of the rules)."""

import json

import numpy as np
import pytest

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
    assert not web_accuracy.same(results[0], results[1])
    tagged = {"entities": [{"type": "LOC", "start": 0, "end": 5, "text": "Paris"}],
              "words": [_word("Paris", 0, "B-LOC")], "num_truncated_words": 0}
    assert web_accuracy.score("conll2003", [tagged], [(["Paris"], ["B-LOC"])], {}) == \
        {"f1": 1.0}
    assert not web_accuracy.same(tagged, dict(tagged, words=[_word("Paris", 0, "O")]))


STEP = 0.5
# Round numbers for the hand-made cases; the rules in force are tested on their own.
RULES = {"min_bit_identical": 0.95, "max_steps": 4, "near_tie_steps": 4}


def _label(logits):
    return {"logits": logits, "result": {"label": "a" if logits[0] >= logits[1] else "b"}}


def _tags(rows, words):
    return {"logits": rows, "result": {"entities": [], "words": words,
                                       "num_truncated_words": 0}}


def test_the_rules_are_the_browser_tests_rules():
    # apps/web_demo/e2e/parity_rules.json, which the browser test reads too.
    assert web_accuracy.RULES.relative_to(web_accuracy.REPO).as_posix() == \
        "apps/web_demo/e2e/parity_rules.json"
    assert web_accuracy.load_rules() == {"min_bit_identical": 0.95, "max_steps": 3,
                                         "near_tie_steps": 4}
    assert json.loads(web_accuracy.RULES.read_text())["max_steps"] == 3


def test_probability_difference_per_label_and_per_token():
    # softmax([0, ln 4]) = (0.2, 0.8); softmax([0, ln 3]) = (0.25, 0.75).
    assert web_accuracy.probability_difference([0.0, np.log(4)], [0.0, np.log(3)]) == \
        pytest.approx(0.05)
    # A tagger: the largest difference over its tokens, not 0.
    tagger = web_accuracy.probability_difference([[0.0, 0.0], [0.0, np.log(4)]],
                                                 [[0.0, 0.0], [0.0, np.log(3)]])
    assert tagger == pytest.approx(0.05)
    assert web_accuracy.probability_difference([[0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]) == \
        float("inf")


def test_a_logit_may_move_up_to_the_cap():
    assert web_accuracy.text_parity("t", _label([5, 0]), _label([5 + 4 * STEP, 0]), STEP,
                                    RULES)["failures"] == []
    verdict = web_accuracy.text_parity("t", _label([5, 0]), _label([5 + 5 * STEP, 0]), STEP,
                                       RULES)
    assert verdict["steps"] == 5
    assert verdict["failures"] == ["'t': a logit moved 5.00 int8 steps (at most 4)"]


def test_an_answer_may_flip_at_a_near_tie_only():
    near = web_accuracy.text_parity("t", _label([1.5, 0]), _label([0.5, 1.5]), STEP, RULES)
    assert near["flips"] == [(0, 3.0)] and near["failures"] == []
    # Python's margin 4 steps: a flip fails though each logit moved within the cap (3 steps).
    wide = web_accuracy.text_parity("t", _label([2, 0]), _label([1, 1.5]), STEP, RULES)
    assert wide["steps"] == 3
    assert wide["failures"] == ["'t': row 0 changed its answer where Python's top two are "
                                "4.00 steps apart (a near-tie is below 4)"]


def test_a_tagger_is_judged_per_token():
    python = _tags([[9, 0], [0.5, 0], [0, 9]], ["O", "O", "B"])
    flipped = _tags([[9, 0], [0.5, 1], [0, 9]], ["O", "B", "B"])
    assert web_accuracy.text_parity("t", python, flipped, STEP, RULES)["failures"] == []
    # Another answer with the same argmax on every token.
    unexplained = _tags([[9, 0], [0.5, 0], [0, 9]], ["O", "B", "B"])
    assert web_accuracy.text_parity("t", python, unexplained, STEP, RULES)["failures"] == [
        "'t': another answer with the same argmax on every row (decoding or tokenization "
        "differs)"]


def test_a_page_that_drops_one_token_fails():
    python = _tags([[9, 0], [0.5, 0], [0, 9]], ["O", "O", "B"])
    dropped = _tags([[9, 0], [0, 9]], ["O", "B"])
    report = web_accuracy.int8_parity(["t"] * 20, [python] * 20, [python] * 19 + [dropped],
                                      STEP, RULES)
    assert report["identical"] == 19
    assert report["failures"] == ["'t': Python gave (3, 2) logits, the page (2, 2) (a token "
                                  "dropped or added)"]


def test_fewer_than_95_percent_bit_identical_fail():
    python = [_label([i, 0]) for i in range(20)]
    page = [_label([i + STEP, 0]) if i < 2 else o for i, o in enumerate(python)]
    report = web_accuracy.int8_parity([f"t{i}" for i in range(20)], python, page, STEP, RULES)
    assert (report["identical"], report["max_steps"]) == (18, 1.0)
    assert report["failures"] == ["bit-identical logits on 18 of 20 texts, below 95%"]
    same = web_accuracy.int8_parity(["t"] * 20, python, python, STEP, RULES)
    assert same["failures"] == [] and same["same_answer"] == 20


def test_bad_arguments_and_float_files():
    with pytest.raises(ValueError, match="one Python and one page output per text"):
        web_accuracy.int8_parity(["a"], [], [], STEP, RULES)
    with pytest.raises(ValueError, match="Received: step=None"):
        web_accuracy.int8_parity([], [], [], None, RULES)
    assert web_accuracy.float_parity(["t"], [_label([1, 0])], [_label([1, 0.5])]) == []
    assert len(web_accuracy.float_parity(["t"], [_label([1, 0])], [_label([0, 1])])) == 1


def test_the_docs_table_row_counts_what_the_rules_count():
    table = load_script("benchmarks/web_parity_table.py")
    python = [_label([i, 0]) for i in range(20)]
    page = [_label([0.5, 1.5]) if i == 1 else o for i, o in enumerate(python)]  # 3 steps, flip
    parity = web_accuracy.int8_parity([f"t{i}" for i in range(20)], python, page, STEP, RULES)
    outcome = {"python": python, "page": page, "parity": parity, "failures": parity["failures"]}
    assert table.table_row("x", "sentiment", "f.tflite", "golden", outcome) == \
        "| x, sentiment | `f.tflite` | 20 golden | 19 | 3 steps | 2.0 | 19 | kept |"
    outcome["parity"] = None
    outcome["failures"] = web_accuracy.float_parity([f"t{i}" for i in range(20)], python, page)
    assert table.table_row("x", "sentiment", "f.tflite", "golden", outcome) == \
        "| x, sentiment | `f.tflite` | 20 golden |  | 1.5e+00 |  | 19 | 1 broken |"


@pytest.mark.parametrize("task", ["classification", "ner"])
def test_the_recorded_browser_outputs_get_the_browser_tests_verdicts(task):
    # The outputs apps/web_demo/test/parity.test.ts replays (recorded by the browser test on
    # the test exports): the page's keep the rules, a nudged file's and a dropped token break
    # them, in Python as in e2e/parity.ts.
    recorded = json.loads((web_accuracy.WEB / "test" / "fixtures" / "int8_parity.json")
                          .read_text("utf-8"))[task]

    def outputs(items):  # the recording's shortest decimals, back to float32
        return [{"logits": np.asarray(o["logits"], np.float32).astype(float).tolist(),
                 "result": o["result"]} for o in items]

    texts = [r["text"] for r in recorded["records"]]
    python, page = outputs(recorded["records"]), outputs(recorded["page"])
    rules = web_accuracy.load_rules()
    kept = web_accuracy.int8_parity(texts, python, page, recorded["step"], rules)
    assert kept["failures"] == [] and kept["max_steps"] == (1 if task == "ner" else 0)
    nudged = web_accuracy.int8_parity(texts, python, outputs(recorded["nudged"]["page"]),
                                      recorded["step"], rules)
    assert nudged["identical"] < 0.5 * len(texts) and nudged["failures"]
    rows = web_accuracy.rows(page[-1]["logits"]).tolist()
    page[-1]["logits"] = rows[:-1] if task == "ner" else [rows[0][1:]]  # a token, a label
    dropped = web_accuracy.int8_parity(texts, python, page, recorded["step"], rules)
    assert "a token dropped or added" in dropped["failures"][0]
