"""corpus_bleu against numbers worked out by hand and against tensorflow/nmt's compute_bleu."""

import collections
import math
import random

import numpy as np
import pytest
import sacrebleu

from keras_attn.training.bleu import corpus_bleu


def nmt_compute_bleu(reference_corpus, translation_corpus, max_order=4, smooth=False):
    """tensorflow/nmt `nmt/scripts/bleu.py` `compute_bleu`, ported verbatim (Apache 2.0):
    the reference implementation. It takes the SHORTEST reference length, which equals
    Papineni's closest length when there is one reference per sentence."""

    def get_ngrams(segment, max_order):
        ngram_counts = collections.Counter()
        for order in range(1, max_order + 1):
            for i in range(0, len(segment) - order + 1):
                ngram = tuple(segment[i:i + order])
                ngram_counts[ngram] += 1
        return ngram_counts

    matches_by_order = [0] * max_order
    possible_matches_by_order = [0] * max_order
    reference_length = 0
    translation_length = 0
    for (references, translation) in zip(reference_corpus, translation_corpus):
        reference_length += min(len(r) for r in references)
        translation_length += len(translation)
        merged_ref_ngram_counts = collections.Counter()
        for reference in references:
            merged_ref_ngram_counts |= get_ngrams(reference, max_order)
        translation_ngram_counts = get_ngrams(translation, max_order)
        overlap = translation_ngram_counts & merged_ref_ngram_counts
        for ngram in overlap:
            matches_by_order[len(ngram) - 1] += overlap[ngram]
        for order in range(1, max_order + 1):
            possible_matches = len(translation) - order + 1
            if possible_matches > 0:
                possible_matches_by_order[order - 1] += possible_matches
    precisions = [0] * max_order
    for i in range(0, max_order):
        if smooth:
            precisions[i] = ((matches_by_order[i] + 1.) / (possible_matches_by_order[i] + 1.))
        else:
            if possible_matches_by_order[i] > 0:
                precisions[i] = (float(matches_by_order[i]) / possible_matches_by_order[i])
            else:
                precisions[i] = 0.0
    if min(precisions) > 0:
        p_log_sum = sum((1. / max_order) * math.log(p) for p in precisions)
        geo_mean = math.exp(p_log_sum)
    else:
        geo_mean = 0
    ratio = float(translation_length) / reference_length
    if ratio > 1.0:
        bp = 1.
    else:
        bp = math.exp(1 - 1. / ratio)
    return geo_mean * bp, precisions, bp, ratio


def test_identical_is_one():
    tokens = "a b c d e f".split()
    score = corpus_bleu([tokens], [tokens])
    assert score.bleu == pytest.approx(1.0)
    assert score.precisions == [1.0, 1.0, 1.0, 1.0]
    assert score.brevity_penalty == 1.0


def test_hand_computed_clipping_and_brevity():
    # Papineni et al.'s clipping example: "the the the the the the the" vs a reference
    # with two "the": unigram precision 2/7.
    score = corpus_bleu([["the", "cat", "is", "on", "the", "mat"]], [["the"] * 7], max_order=1)
    assert score.precisions == [pytest.approx(2 / 7)]
    assert score.brevity_penalty == 1.0  # 7 > 6
    assert score.bleu == pytest.approx(2 / 7)
    # Hypothesis "the cat sat on mat" (5) vs "the cat sat on the mat" (6):
    # p1 = 5/5, p2 = 3/4 (the cat, cat sat, sat on), p3 = 2/3, p4 = 1/2,
    # BP = exp(1 - 6/5); BLEU = BP * (1 * 3/4 * 2/3 * 1/2) ** (1/4) = BP * 0.25 ** 0.25.
    score = corpus_bleu([["the", "cat", "sat", "on", "the", "mat"]],
                        [["the", "cat", "sat", "on", "mat"]])
    assert score.precisions == pytest.approx([1.0, 0.75, 2 / 3, 0.5])
    assert score.brevity_penalty == pytest.approx(math.exp(1 - 6 / 5))
    assert score.bleu == pytest.approx(math.exp(1 - 6 / 5) * 0.25 ** 0.25)
    assert score.bleu == pytest.approx(0.578930, abs=1e-6)


def test_hand_computed_corpus_level_counts_and_multiple_references():
    # Two sentences; counts are summed before dividing (corpus BLEU).
    # s1: hyp "a b c" vs "a b d": p1 2/3, p2 1/2;  s2: hyp "x y" vs "x y": p1 2/2, p2 1/1.
    # corpus p1 = 4/5, p2 = 2/3, c = r = 5, BLEU-2 = sqrt(4/5 * 2/3).
    score = corpus_bleu([["a", "b", "d"], ["x", "y"]], [["a", "b", "c"], ["x", "y"]],
                        max_order=2)
    assert score.precisions == pytest.approx([0.8, 2 / 3])
    assert score.bleu == pytest.approx(math.sqrt(0.8 * 2 / 3))
    # Several references: n-gram counts clip against the max over references, and the
    # length is the closest reference (4, not the shortest 2).
    score = corpus_bleu([[["a", "b"], ["a", "c", "d", "e"]]], [["a", "c", "d", "b"]],
                        max_order=2)
    # unigrams a, c, d, b all found: 4/4; bigrams a c, c d found, d b not: 2/3.
    assert score.precisions == pytest.approx([1.0, 2 / 3])
    assert score.reference_length == 4 and score.brevity_penalty == 1.0
    assert score.bleu == pytest.approx(math.sqrt(2 / 3))


def test_zero_precision_and_smoothing():
    score = corpus_bleu([["a", "b", "c", "d"]], [["a", "x", "b", "y"]])
    assert score.precisions[1] == 0.0 and score.bleu == 0.0
    smoothed = corpus_bleu([["a", "b", "c", "d"]], [["a", "x", "b", "y"]], smooth=True)
    # (2+1)/(4+1), (0+1)/(3+1), (0+1)/(2+1), (0+1)/(1+1); BP = 1.
    expected = (3 / 5 * 1 / 4 * 1 / 3 * 1 / 2) ** 0.25
    assert smoothed.bleu == pytest.approx(expected)
    assert corpus_bleu([["a"]], [[]]).bleu == 0.0


@pytest.mark.parametrize("smooth", [False, True])
def test_matches_tensorflow_nmt_on_random_corpora(smooth):
    rng = random.Random(7)
    words = list("abcdefg")
    for _ in range(20):
        references, hypotheses = [], []
        for _ in range(rng.randint(1, 6)):
            ref = [rng.choice(words) for _ in range(rng.randint(1, 12))]
            hyp = [t if rng.random() < 0.7 else rng.choice(words) for t in ref]
            hyp = hyp[: rng.randint(1, len(hyp))] + [rng.choice(words)] * rng.randint(0, 3)
            references.append(ref)
            hypotheses.append(hyp)
        ours = corpus_bleu(references, hypotheses, smooth=smooth)
        bleu, precisions, bp, ratio = nmt_compute_bleu(
            [[r] for r in references], hypotheses, smooth=smooth)
        assert ours.bleu == pytest.approx(bleu, abs=1e-12)
        assert ours.precisions == pytest.approx(precisions, abs=1e-12)
        assert ours.brevity_penalty == pytest.approx(bp)
        assert ours.length_ratio == pytest.approx(ratio)


def test_errors():
    with pytest.raises(ValueError, match="one item per sentence"):
        corpus_bleu([["a"]], [["a"], ["b"]])
    with pytest.raises(ValueError, match="max_order"):
        corpus_bleu([["a"]], [["a"]], max_order=0)
    with pytest.raises(ValueError, match=r"references\[0\]"):
        corpus_bleu(["a b"], [["a"]])
    with pytest.raises(ValueError, match=r"hypotheses\[0\]"):
        corpus_bleu([["a"]], ["a"])


def test_matches_sacrebleu_on_its_13a_tokens():
    # keras_attn.training.corpus_bleu scores pre-tokenized text; on sacreBLEU's own 13a
    # tokens (no smoothing needed: every order has matches) it is sacreBLEU's number.
    tokenize = sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a()
    references = ["A man in an orange hat, starring at something.",
                  "Two young, White males are outside near many bushes.",
                  "A little girl climbing into a wooden playhouse."]
    hypotheses = ["A man in an orange hat is looking at something.",
                  "Two young white men are outside near bushes.",
                  "A little girl is climbing into a wooden playhouse."]
    expected = sacrebleu.corpus_bleu(hypotheses, [references])
    ours = corpus_bleu([[tokenize(r).split()] for r in references],
                       [tokenize(h).split() for h in hypotheses])
    assert 100 * ours.bleu == pytest.approx(expected.score, abs=1e-9)
    np.testing.assert_allclose([100 * p for p in ours.precisions], expected.precisions)
