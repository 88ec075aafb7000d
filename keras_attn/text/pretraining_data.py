"""BERT pretraining data: masked-language-model masking (in-graph) and next-sentence pairs.

MLM (Devlin et al., 2019, §3.1 and appendix A.1): in each sequence 15% of the tokens are selected
(`num_to_predict = min(max_predictions, max(1, round(0.15 * n)))` of the `n` maskable tokens,
as in BERT's `create_pretraining_data.py`); a selected token becomes `[MASK]` with probability
0.8, a random token with probability 0.1, and stays unchanged with probability 0.1. The model
predicts the original tokens at `mask_positions`.

NSP (§3.1, "Task #2"): sentence B follows sentence A in the document for half of the pairs
(`next_sentence_label = 0`) and is a random sentence of another document for the other half
(`next_sentence_label = 1`, BERT's convention: 1 means "random next").
"""

import collections
import pathlib
import random

import numpy as np
import tensorflow as tf

from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_int_sequence
from keras_attn.layers.validation import check_number
from keras_attn.layers.validation import check_positive_int
from keras_attn.text.errors import DataError
from keras_attn.text.text_lines import ReadReport


class MaskedLMMasker:
    """Selects and corrupts tokens for masked-language-model pretraining, with TensorFlow ops.

    Deterministic: the random draws are stateless (`tf.random.stateless_*`), so the same
    `(token_ids, seed)` always gives the same output, and `map` gives every element of a dataset
    its own seed `(seed, element index)`, so a pipeline is reproducible from `seed` alone.

    Tokens in `unselectable_token_ids` (`[CLS]`, `[SEP]`, padding, ...) and positions where an
    input `padding_mask` is false are never selected. With `whole_word_masking=True` a word (a
    token and the continuation tokens that follow it, `##` pieces for WordPiece) is selected or
    not as a whole: words are taken in random order while the number of selected tokens stays
    within `num_to_predict` (a word that does not fit ends the selection, so the selected fraction
    is at most `selection_rate`, slightly below it on average); the 80/10/10 replacement is then
    drawn per token, as in BERT.

    Args:
        vocabulary_size: int. Size of the token vocabulary.
        mask_token_id: int. Id of `[MASK]`.
        unselectable_token_ids: sequence of int. Ids never selected (and never used as random
            replacements), e.g. the ids of `[CLS]`, `[SEP]`, `[PAD]`.
        selection_rate: float. Fraction of maskable tokens to select. Defaults to `0.15`.
        mask_token_rate: float. Probability a selected token becomes `[MASK]`. Defaults to `0.8`.
        random_token_rate: float. Probability a selected token becomes a random token. Defaults
            to `0.1`; the remaining `1 - 0.8 - 0.1` stay unchanged.
        max_predictions: int. `P`, the fixed number of prediction slots per sequence. Defaults
            to `20` (BERT's value for sequences of 128).
        whole_word_masking: bool. Select whole words. Needs `continuation_token_ids`.
        continuation_token_ids: sequence of int or `None`. Ids of tokens that continue the
            previous token's word (WordPiece `##` pieces). `from_vocabulary` finds them.
        random_token_ids: sequence of int or `None`. Ids a token may be replaced with; defaults
            to every id except the unselectable ones and `[MASK]`.
        seed: int. Seed of `map`. Defaults to `0`.

    Call arguments:
        inputs: dict with `"token_ids"` (B, S) or (S,) int (other keys, e.g. `"segment_ids"`,
            `"padding_mask"`, are passed through), or the token id tensor itself.
        seed: int tensor (2,). The stateless seed of this call.

    Returns:
        dict of the inputs with `"token_ids"` corrupted, plus `"mask_positions"` (B, P) int32
        (selected positions in increasing order, padded with 0), `"mask_ids"` (B, P) (the
        original ids there, padded with 0) and `"mask_weights"` (B, P) float32 (1 for a real
        prediction, 0 for a padded slot). Rank-1 inputs give rank-1 outputs.

    Example:
    >>> masker = MaskedLMMasker(vocabulary_size=50, mask_token_id=4,
    ...                         unselectable_token_ids=[0, 2, 3], max_predictions=4)
    >>> ids = tf.constant([[2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 3, 0]])
    >>> out = masker({"token_ids": ids}, seed=tf.constant([1, 2]))
    >>> int(out["mask_weights"].numpy().sum())  # round(0.15 * 9 maskable tokens)
    1
    >>> p = int(out["mask_positions"][0, 0])
    >>> int(out["mask_ids"][0, 0]) == int(ids[0, p]), 1 <= p <= 9
    (True, True)
    """

    def __init__(
        self,
        vocabulary_size,
        mask_token_id,
        unselectable_token_ids,
        *,
        selection_rate=0.15,
        mask_token_rate=0.8,
        random_token_rate=0.1,
        max_predictions=20,
        whole_word_masking=False,
        continuation_token_ids=None,
        random_token_ids=None,
        seed=0,
    ):
        check_positive_int("vocabulary_size", vocabulary_size)
        check_positive_int("max_predictions", max_predictions)
        for name, value in (("selection_rate", selection_rate),
                            ("mask_token_rate", mask_token_rate),
                            ("random_token_rate", random_token_rate)):
            check_number(name, value, 0, 1)
        if mask_token_rate + random_token_rate > 1:
            raise ValueError(
                "`mask_token_rate + random_token_rate` must be at most 1. Received: "
                f"mask_token_rate={mask_token_rate}, random_token_rate={random_token_rate}"
            )
        check_int("mask_token_id", mask_token_id, 0, vocabulary_size, meaning="a token id",
                  high_name="vocabulary_size")
        for name, values in (("unselectable_token_ids", unselectable_token_ids),
                             ("continuation_token_ids", continuation_token_ids or []),
                             ("random_token_ids", random_token_ids or [])):
            check_int_sequence(name, list(values), 0, vocabulary_size, meaning="token ids",
                               high_name="vocabulary_size")
        if whole_word_masking and not continuation_token_ids:
            raise ValueError(
                "`whole_word_masking=True` needs `continuation_token_ids` (the `##` pieces); "
                "`MaskedLMMasker.from_vocabulary` finds them. Received: continuation_token_ids="
                f"{continuation_token_ids!r}"
            )
        check_int("seed", seed)
        self.vocabulary_size = vocabulary_size
        self.mask_token_id = int(mask_token_id)
        self.unselectable_token_ids = sorted({int(i) for i in unselectable_token_ids})
        self.selection_rate = float(selection_rate)
        self.mask_token_rate = float(mask_token_rate)
        self.random_token_rate = float(random_token_rate)
        self.max_predictions = max_predictions
        self.whole_word_masking = bool(whole_word_masking)
        self.continuation_token_ids = sorted({int(i) for i in continuation_token_ids or []})
        excluded = set(self.unselectable_token_ids) | {self.mask_token_id}
        if random_token_ids is None:
            random_token_ids = [i for i in range(vocabulary_size) if i not in excluded]
        self.random_token_ids = sorted({int(i) for i in random_token_ids})
        if not self.random_token_ids:
            raise ValueError("No id is left for random replacement; pass `random_token_ids`.")
        self.seed = seed
        unselectable = np.zeros([vocabulary_size], bool)
        unselectable[self.unselectable_token_ids] = True
        continuation = np.zeros([vocabulary_size], bool)
        continuation[self.continuation_token_ids] = True
        self._unselectable = tf.constant(unselectable)  # (V,)
        self._continuation = tf.constant(continuation)  # (V,)
        self._random_pool = tf.constant(self.random_token_ids, tf.int32)  # (R,)

    @classmethod
    def from_vocabulary(cls, vocabulary, **kwargs):
        """Builds a masker from a WordPiece vocabulary (a list of tokens or a `vocab.txt` path).

        `[MASK]` is the mask token; `[CLS]`, `[SEP]`, `[PAD]` are unselectable; tokens starting
        with `##` are continuations; random replacements are never bracketed specials
        (`[UNK]`, `[unused0]`, ...). Keyword arguments go to the constructor.
        """
        if isinstance(vocabulary, (str, pathlib.Path)):
            vocabulary = pathlib.Path(vocabulary).read_text(encoding="utf-8").splitlines()
        vocabulary = list(vocabulary)
        index = {token: i for i, token in enumerate(vocabulary)}
        for token in ("[MASK]", "[CLS]", "[SEP]", "[PAD]"):
            if token not in index:
                raise ValueError(f"The vocabulary has no {token} token.")
        special = [i for i, t in enumerate(vocabulary) if t.startswith("[") and t.endswith("]")]
        kwargs.setdefault("unselectable_token_ids",
                          [index["[CLS]"], index["[SEP]"], index["[PAD]"]])
        kwargs.setdefault("continuation_token_ids",
                          [i for i, t in enumerate(vocabulary) if t.startswith("##")])
        kwargs.setdefault("random_token_ids",
                          sorted(set(range(len(vocabulary))) - set(special)))
        return cls(len(vocabulary), index["[MASK]"], **kwargs)

    def __call__(self, inputs, seed):
        features = dict(inputs) if isinstance(inputs, dict) else {"token_ids": inputs}
        token_ids = tf.convert_to_tensor(features["token_ids"])
        rank_one = token_ids.shape.rank == 1
        if token_ids.shape.rank not in (1, 2):
            raise ValueError(
                "`token_ids` must be (B, S) or (S,). Received: shape="
                f"{tuple(token_ids.shape)}"
            )
        padding_mask = features.get("padding_mask")
        if rank_one:
            token_ids = token_ids[None]
            padding_mask = None if padding_mask is None else padding_mask[None]
        result = self._mask(token_ids, padding_mask, tf.cast(seed, tf.int64))
        if rank_one:
            result = {key: value[0] for key, value in result.items()}
        features.update(result)
        return features

    def _mask(self, token_ids, padding_mask, seed):
        dtype = token_ids.dtype
        ids = tf.cast(token_ids, tf.int32)  # (B, S)
        batch_size, length = tf.shape(ids)[0], tf.shape(ids)[1]
        selection_seed, action_seed, random_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3)
        )
        candidate = ~tf.gather(self._unselectable, ids)  # (B, S)
        if padding_mask is not None:
            candidate &= tf.cast(padding_mask, tf.bool)
        num_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1)  # (B,)
        # float64 and round-half-to-even: the same count as BERT's Python `int(round(n * rate))`.
        num_to_predict = tf.cast(
            tf.round(tf.cast(num_candidates, tf.float64) * self.selection_rate), tf.int32
        )
        num_to_predict = tf.minimum(self.max_predictions, tf.maximum(1, num_to_predict))
        num_to_predict = tf.where(num_candidates > 0, num_to_predict, 0)  # (B,)

        # A "word" is a run of candidate tokens starting at a non-continuation token; without
        # whole-word masking every candidate token is its own word.
        if self.whole_word_masking:
            previous_candidate = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])  # (B, S)
            continuation = tf.gather(self._continuation, ids) & previous_candidate
            word_start = candidate & ~continuation  # (B, S)
        else:
            word_start = candidate
        word_id = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1  # (B, S)
        # Each word draws one score (at its first token); the tokens of a word share it.
        uniform = tf.random.stateless_uniform([batch_size, length], selection_seed)  # (B, S)
        positions = tf.range(length)[None, :]  # (1, S)
        start_order = tf.argsort(tf.where(word_start, positions, length + positions), axis=1)
        token_start = tf.gather(start_order, tf.maximum(word_id, 0), batch_dims=1)  # (B, S)
        score = tf.where(candidate, tf.gather(uniform, token_start, batch_dims=1), -1.0)
        # Tokens in decreasing score order (a stable sort keeps a word's tokens together and in
        # order); a word is selected when the running token count at its last token fits.
        order = tf.argsort(score, axis=1, direction="DESCENDING", stable=True)  # (B, S)
        sorted_count = tf.cumsum(
            tf.cast(tf.gather(candidate, order, batch_dims=1), tf.int32), axis=1
        )  # (B, S)
        rank = tf.argsort(order, axis=1)  # (B, S) position -> place in `order`
        running_count = tf.gather(sorted_count, rank, batch_dims=1)  # (B, S)
        segment = tf.range(batch_size)[:, None] * length + tf.maximum(word_id, 0)  # (B, S)
        word_count = tf.math.unsorted_segment_max(
            tf.where(candidate, running_count, 0), segment, batch_size * length
        )  # (B * S,)
        word_fits = tf.gather(word_count, segment) <= num_to_predict[:, None]  # (B, S)
        selected = candidate & word_fits  # (B, S)

        action = tf.random.stateless_uniform([batch_size, length], action_seed)  # (B, S)
        to_mask = selected & (action < self.mask_token_rate)
        to_random = selected & (action >= self.mask_token_rate) & (
            action < self.mask_token_rate + self.random_token_rate
        )
        random_index = tf.random.stateless_uniform(
            [batch_size, length], random_seed, minval=0,
            maxval=len(self.random_token_ids), dtype=tf.int32,
        )  # (B, S)
        corrupted = tf.where(to_mask, self.mask_token_id, ids)
        corrupted = tf.where(to_random, tf.gather(self._random_pool, random_index), corrupted)

        first_selected = tf.argsort(
            tf.where(selected, positions, length + positions), axis=1
        )  # (B, S): selected positions first, in increasing order
        slots = first_selected[:, : self.max_predictions]  # (B, min(S, P))
        pad = tf.maximum(0, self.max_predictions - tf.shape(slots)[1])
        slots = tf.pad(slots, [[0, 0], [0, pad]])  # (B, P)
        valid = tf.gather(selected, slots, batch_dims=1)  # (B, P)
        valid &= tf.range(self.max_predictions)[None, :] < tf.shape(first_selected)[1]
        mask_positions = tf.where(valid, slots, 0)  # (B, P)
        mask_ids = tf.where(valid, tf.gather(ids, slots, batch_dims=1), 0)  # (B, P)
        return {
            "token_ids": tf.cast(corrupted, dtype),
            "mask_positions": mask_positions,
            "mask_ids": tf.cast(mask_ids, dtype),
            "mask_weights": tf.cast(valid, tf.float32),
        }

    def map(self, dataset, num_parallel_calls=None):
        """`dataset.map(self)` with the per-element seed `(self.seed, index)`; elements are
        dicts with `"token_ids"` (batched or not)."""
        return dataset.enumerate().map(
            lambda index, features: self(features, tf.stack([tf.cast(self.seed, tf.int64), index])),
            num_parallel_calls=num_parallel_calls,
            deterministic=None if num_parallel_calls is None else True,
        )


class NextSentencePairs:
    """Next-sentence-prediction pairs from a stream of documents, deterministic given `seed`.

    For every sentence that has a next sentence in its document, a pair `(A, B)` is made: with
    probability `1 - random_next_rate` B is the actual next sentence (`next_sentence_label=0`),
    otherwise B is a random sentence of ANOTHER document (`next_sentence_label=1`). Random
    sentences come from a window of up to `buffer_size` documents around the current one (the
    next ones, and the previous ones near the end of the stream), so memory stays bounded on
    corpora larger than memory. Each pass fills `report` with `pairs`, `actual_next`,
    `random_next` and `documents_without_pairs` (one-sentence documents: no pair, counted).

    Args:
        documents: an iterable of documents, iterated once per pass: a `RawTextReader` or any
            re-iterable of lists of sentences (or of `Document`s).
        seed: int. Seed of the pair choices.
        random_next_rate: float. Probability of a random B. Defaults to `0.5`.
        buffer_size: int >= 2. Documents held for drawing random sentences. Defaults to `1000`.

    Example:
    >>> documents = [["a1", "a2", "a3"], ["b1", "b2"], ["c1"]]
    >>> pairs = NextSentencePairs(documents, seed=3)
    >>> [(p["text"], p["text_pair"], p["next_sentence_label"]) for p in pairs]
    [('a1', 'b2', 1), ('a2', 'a3', 0), ('b1', 'a3', 1)]
    >>> pairs.report.as_dict()
    {'random_next': 2, 'pairs': 3, 'actual_next': 1, 'documents_without_pairs': 1}
    """

    def __init__(self, documents, seed, random_next_rate=0.5, buffer_size=1000):
        check_number("random_next_rate", random_next_rate, 0, 1)
        check_int("buffer_size", buffer_size, low=2)
        check_int("seed", seed)
        self.documents = documents
        self.seed = seed
        self.random_next_rate = float(random_next_rate)
        self.buffer_size = buffer_size
        self.report = ReadReport(getattr(documents, "path", "<documents>"))

    def __iter__(self):
        self.report = ReadReport(getattr(self.documents, "path", "<documents>"))
        return self._pairs()

    def _pairs(self):
        report = self.report
        rng = random.Random(self.seed)

        def documents():
            for document in self.documents:
                sentences = list(getattr(document, "sentences", document))
                if sentences:
                    yield sentences
                else:
                    report.add("empty_documents_skipped")

        stream = documents()
        window = collections.deque()
        for document in stream:
            window.append(document)
            if len(window) == self.buffer_size:
                break
        upcoming = next(stream, None)
        if len(window) < 2:
            raise DataError(report.path, 1, "next-sentence pairs need at least 2 documents "
                            f"(random sentences come from another document); found {len(window)}.")
        current = 0
        while current < len(window):
            sentences = window[current]
            if len(sentences) < 2:
                report.add("documents_without_pairs")
            for index in range(len(sentences) - 1):
                if rng.random() < self.random_next_rate:
                    other = rng.randrange(len(window) - 1)
                    other += other >= current  # any document of the window but this one
                    pool = window[other]
                    text_pair = pool[rng.randrange(len(pool))]
                    label = 1
                    report.add("random_next")
                else:
                    text_pair = sentences[index + 1]
                    label = 0
                    report.add("actual_next")
                report.add("pairs")
                yield {"text": sentences[index], "text_pair": text_pair,
                       "next_sentence_label": label}
            current += 1
            if upcoming is not None:
                window.popleft()
                current -= 1
                window.append(upcoming)
                upcoming = next(stream, None)

    def as_dataset(self):
        """A `tf.data.Dataset` of `{"text": (), "text_pair": () string,
        "next_sentence_label": () int32}`, for `WordPieceTokenizer(texts, text_pairs)`."""
        signature = {"text": tf.TensorSpec((), tf.string),
                     "text_pair": tf.TensorSpec((), tf.string),
                     "next_sentence_label": tf.TensorSpec((), tf.int32)}
        return tf.data.Dataset.from_generator(self.__iter__, output_signature=signature)
