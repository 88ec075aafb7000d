"""Corpus BLEU (Papineni et al., 2002, "BLEU: a Method for Automatic Evaluation of Machine
Translation"), on already tokenized text.

    p_n  = sum_i sum_{g in ngrams_n(hyp_i)} min(count_hyp_i(g), max_r count_r(g))
           / sum_i max(0, |hyp_i| - n + 1)                          (clipped n-gram precision)
    BP   = 1 if c > r else exp(1 - r / c)    c = sum_i |hyp_i|, r = sum_i |closest ref_i|
    BLEU = BP * exp(sum_{n=1..N} (1/N) log p_n)

Counts are summed over the whole corpus before the precisions are taken (corpus BLEU, not
an average of sentence scores). `r` uses, for each sentence, the reference whose length is
closest to the hypothesis (ties: the shorter one), Papineni's "best match length"; with
one reference per sentence this is the reference length. `smooth=True` adds one to the
numerator and denominator of every `p_n` (Lin & Och, 2004), as tensorflow/nmt's `bleu.py`.
"""

import collections
import math

from keras_attn.layers.validation import check_positive_int

BleuScore = collections.namedtuple(
    "BleuScore",
    ["bleu", "precisions", "brevity_penalty", "length_ratio", "hypothesis_length",
     "reference_length"],
)
BleuScore.__doc__ = """`bleu` in [0, 1], the `precisions` p_1..p_N, the brevity penalty,
`hypothesis_length / reference_length` and both corpus lengths."""


def _ngram_counts(tokens, max_order):
    counts = collections.Counter()
    for order in range(1, max_order + 1):
        for start in range(len(tokens) - order + 1):
            counts[tuple(tokens[start: start + order])] += 1
    return counts


def _reference_list(item, index):
    """The references of one sentence: a list of tokens (one reference) or a list of such
    lists (several)."""
    if not isinstance(item, (list, tuple)):
        raise ValueError(
            f"`references[{index}]` must be a list of tokens or a list of token lists. "
            f"Received: references[{index}]={item!r}"
        )
    if all(isinstance(token, str) for token in item):
        return [list(item)]
    if not item or not all(isinstance(ref, (list, tuple)) for ref in item):
        raise ValueError(
            f"`references[{index}]` must be a list of tokens or a non-empty list of token "
            f"lists. Received: references[{index}]={item!r}"
        )
    return [list(ref) for ref in item]


def corpus_bleu(references, hypotheses, max_order=4, smooth=False):
    """Corpus BLEU of tokenized `hypotheses` against `references` (see the module
    docstring for the formula).

    Args:
        references: one item per hypothesis: a list of tokens (a single reference) or a
            list of token lists (several references).
        hypotheses: list of token lists.
        max_order: int >= 1, `N`, the longest n-gram. Defaults to `4`.
        smooth: bool, add-one smoothing of every precision. Defaults to `False`.

    Returns:
        A `BleuScore`; `.bleu` is in [0, 1] (multiply by 100 for the usual scale). An
        empty hypothesis corpus, or any `p_n = 0` without smoothing, gives `0.0`.

    Example:
    >>> hyp = "the cat sat on the mat".split()
    >>> round(corpus_bleu([hyp], [hyp]).bleu, 4)
    1.0
    >>> score = corpus_bleu([["the", "cat", "is", "on", "the", "mat"]],
    ...                     [["the", "cat", "the", "mat"]], max_order=2)
    >>> [round(p, 4) for p in score.precisions], round(score.brevity_penalty, 4)
    ([1.0, 0.6667], 0.6065)
    """
    check_positive_int("max_order", max_order)
    if len(references) != len(hypotheses):
        raise ValueError(
            "`references` and `hypotheses` must have one item per sentence. Received: "
            f"len(references)={len(references)}, len(hypotheses)={len(hypotheses)}"
        )
    matches = [0] * max_order
    possible = [0] * max_order
    hypothesis_length = reference_length = 0
    for index, (item, hypothesis) in enumerate(zip(references, hypotheses)):
        if not isinstance(hypothesis, (list, tuple)):
            raise ValueError(
                f"`hypotheses[{index}]` must be a list of tokens. "
                f"Received: hypotheses[{index}]={hypothesis!r}"
            )
        refs = _reference_list(item, index)
        hypothesis = list(hypothesis)
        hypothesis_length += len(hypothesis)
        reference_length += min((len(r) for r in refs),
                                key=lambda n: (abs(n - len(hypothesis)), n))
        max_reference_counts = collections.Counter()
        for reference in refs:
            max_reference_counts |= _ngram_counts(reference, max_order)
        overlap = _ngram_counts(hypothesis, max_order) & max_reference_counts
        for ngram, count in overlap.items():
            matches[len(ngram) - 1] += count
        for order in range(1, max_order + 1):
            possible[order - 1] += max(0, len(hypothesis) - order + 1)

    if smooth:
        precisions = [(m + 1.0) / (p + 1.0) for m, p in zip(matches, possible)]
    else:
        precisions = [m / p if p > 0 else 0.0 for m, p in zip(matches, possible)]
    if hypothesis_length == 0 or reference_length == 0:
        ratio = hypothesis_length / reference_length if reference_length else 0.0
        return BleuScore(0.0, precisions, 0.0, ratio, hypothesis_length, reference_length)
    if min(precisions) > 0:
        geometric_mean = math.exp(sum(math.log(p) for p in precisions) / max_order)
    else:
        geometric_mean = 0.0
    ratio = hypothesis_length / reference_length
    brevity_penalty = 1.0 if ratio > 1.0 else math.exp(1.0 - 1.0 / ratio)
    return BleuScore(geometric_mean * brevity_penalty, precisions, brevity_penalty, ratio,
                     hypothesis_length, reference_length)
