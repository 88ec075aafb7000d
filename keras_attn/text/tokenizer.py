"""BERT WordPiece tokenizer: BERT's normalizer and pre-tokenizer as table lookups in TensorFlow
ops (`bert_words`), then tensorflow-text's `FastWordpieceTokenizer` on each word.

One tokenizer serves training (`tf.data`) and the exported SavedModel, and is the
specification the Kotlin and JS tokenizers re-implement with the same tables; ids and offsets
equal HF `tokenizers`' BERT tokenizer on any text (docs/text.md).
"""

import os

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_int
from keras_attn.text.bert_words import bert_words
from keras_attn.text.fused_bert_path import FusedBertPath
from keras_attn.text.vocabulary import check_vocabulary
from keras_attn.text.vocabulary import load_vocabulary

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")

# BERT's word-length limit (HF `max_input_chars_per_word`), in characters of the normalized
# word: a longer word becomes one unknown token.
MAX_CHARS_PER_WORD = 100
# Room for tf-text's byte limit: at most 4 UTF-8 bytes a character.
_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD
# What a word over the limit is replaced with before WordPiece (one character, so one piece,
# made the unknown token afterwards): a private-use character, which normalization removes,
# so no word of a text holds it.
_LONG_WORD = "\U0010fffd"


@keras.saving.register_keras_serializable(package="keras_attn")
class WordPieceTokenizer(keras.layers.Layer):
    """BERT WordPiece tokenizer and `[CLS] A [SEP] B [SEP]` packer (Devlin et al., 2019).

    Text is normalized character by character (control and private-use characters removed,
    whitespace unified, optionally NFD-decomposed with nonspacing marks removed and
    lower-cased), split on whitespace, punctuation and around CJK ideographs (`bert_words`),
    and each word is split greedily into the longest vocabulary pieces from the left (`##`
    marks a continuation); a word with no spelling, or longer than 100 characters, becomes
    `unknown_token`. Ids and offsets equal HF `tokenizers`' BERT tokenizer
    (`BertWordPieceTokenizer`) on any text: the normalizer's answers for every code point
    are tables measured from it (`text_tables`).

    The vocabulary is stored in the layer config, so a saved `.keras` model or an exported
    SavedModel needs no `vocab.txt` beside it.

    Args:
        vocabulary: path to a BERT `vocab.txt` (one token per line, line = id) or a list
            of tokens.
        lowercase: bool. Lower-case the text (BERT "uncased"). Defaults to `True`.
        strip_accents: bool or `None`. NFD-decompose and drop nonspacing marks (Unicode
            category Mn). `None` follows `lowercase`, as BERT does.
        sequence_length: int >= 2, length of the packed `token_ids` (3 for pairs).
            Defaults to `128`.
        truncation: how a pair that is too long is cut, the same rules as HF `tokenizers`:
            `"longest_first"` cuts the longer segment until both fit, and splits the
            budget evenly (extra token to the longer, or to the second when equal) when
            both exceed half; `"only_first"` / `"only_second"` cut only that segment and
            raise if it cannot absorb the excess and keep one token (`ValueError` when
            called eagerly, `InvalidArgumentError` inside `tf.function` / `tf.data`).
            A single segment is always cut at its end. Truncation is counted: call
            with `return_num_truncated=True`.
        unknown_token, cls_token, sep_token, pad_token, mask_token: str, the special
            tokens; each must be in the vocabulary.

    Call arguments:
        texts: string tensor `(B,)` or scalar, or Python str / list of str.
        text_pairs: optional, like `texts`: the second segment.
        return_num_truncated: bool; if true the output also holds `"num_truncated"`,
            `(B,)` int32, the number of word pieces cut from each example.

    Returns:
        dict of `"token_ids"` (int32), `"segment_ids"` (int32: 0 for `[CLS] A [SEP]`, 1
        for `B [SEP]`) and `"padding_mask"` (bool), each `(B, sequence_length)` (or
        `(sequence_length,)` for a scalar input), padded with the pad id.

    Example:
    >>> vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "##s"]
    >>> tokenizer = WordPieceTokenizer(vocab, sequence_length=8)
    >>> tokenizer.tokenize(["The cats sat"]).to_list()
    [[5, 6, 8, 7]]
    >>> out = tokenizer(["The cats sat"], ["the dog"], return_num_truncated=True)
    >>> out["token_ids"].numpy().tolist()  # "sat" was cut to fit 8
    [[2, 5, 6, 8, 3, 5, 1, 3]]
    >>> out["segment_ids"].numpy().tolist()
    [[0, 0, 0, 0, 0, 1, 1, 1]]
    >>> out["num_truncated"].numpy().tolist()
    [1]
    """

    def __init__(
        self,
        vocabulary,
        lowercase=True,
        strip_accents=None,
        sequence_length=128,
        truncation="longest_first",
        unknown_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        **kwargs,
    ):
        special_tokens = {
            "unknown_token": unknown_token,
            "cls_token": cls_token,
            "sep_token": sep_token,
            "pad_token": pad_token,
            "mask_token": mask_token,
        }
        for name, token in special_tokens.items():
            if not isinstance(token, str) or not token:
                raise ValueError(f"`{name}` must be a non-empty str. Received: {name}={token!r}")
        if isinstance(vocabulary, (str, os.PathLike)):
            tokens = load_vocabulary(vocabulary, special_tokens=tuple(special_tokens.values()))
        elif isinstance(vocabulary, (list, tuple)):
            tokens = list(vocabulary)
            check_vocabulary(tokens, special_tokens=tuple(special_tokens.values()))
        else:
            raise ValueError(
                "`vocabulary` must be the path of a vocab.txt or a list of tokens. "
                f"Received: vocabulary={type(vocabulary).__name__}"
            )
        check_bool("lowercase", lowercase)
        check_bool("strip_accents", strip_accents, optional=True)
        check_int("sequence_length", sequence_length, low=2,
                  meaning="room for [CLS] and [SEP]")
        if truncation not in TRUNCATION_STRATEGIES:
            raise ValueError(
                f"`truncation` must be one of {TRUNCATION_STRATEGIES}. "
                f"Received: truncation={truncation!r}"
            )
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        # Strings in, ids out: Keras must neither convert nor cast the inputs.
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        self.built = True

        self.vocabulary = tokens
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self._strip_accents_argument = strip_accents
        self.sequence_length = sequence_length
        self.truncation = truncation
        self.unknown_token = unknown_token
        self.cls_token = cls_token
        self.sep_token = sep_token
        self.pad_token = pad_token
        self.mask_token = mask_token
        self._token_to_id = {token: index for index, token in enumerate(tokens)}

        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=tokens, suffix_indicator="##", max_bytes_per_word=_MAX_BYTES_PER_WORD,
            token_out_type=tf.int32, unknown_token=unknown_token, no_pretokenization=True,
            support_detokenization=True)
        # The fast path exists for BERT's two usual modes (uncased and cased).
        self._fused = None
        if self.lowercase == self.strip_accents:
            self._fused = FusedBertPath(tokens, unknown_token, self.lowercase, MAX_CHARS_PER_WORD)

    # --- Vocabulary -----------------------------------------------------------------

    def vocabulary_size(self):
        """Number of tokens (ids run from 0 to `vocabulary_size() - 1`)."""
        return len(self.vocabulary)

    def get_vocabulary(self):
        """A copy of the token list (index = id)."""
        return list(self.vocabulary)

    def id_to_token(self, id):
        """The token of one id (a Python int)."""
        check_int("id", id, 0, len(self.vocabulary), meaning="a token id")
        return self.vocabulary[id]

    def token_to_id(self, token):
        """The id of one token (a Python str in the vocabulary)."""
        if token not in self._token_to_id:
            raise ValueError(
                f"Token {token!r} is not in the vocabulary ({len(self.vocabulary)} tokens). "
                f"Received: token={token!r}"
            )
        return self._token_to_id[token]

    @property
    def unknown_token_id(self):
        return self._token_to_id[self.unknown_token]

    @property
    def cls_token_id(self):
        return self._token_to_id[self.cls_token]

    @property
    def sep_token_id(self):
        return self._token_to_id[self.sep_token]

    @property
    def pad_token_id(self):
        return self._token_to_id[self.pad_token]

    @property
    def mask_token_id(self):
        return self._token_to_id[self.mask_token]

    # --- Tokenization ---------------------------------------------------------------

    def tokenize(self, texts):
        """Word-piece ids without special tokens.

        Args:
            texts: string tensor `(B,)` or scalar (or Python str / list of str).

        Returns:
            int32 `tf.RaggedTensor` `(B, None)`, or a 1-D tensor for a scalar input.
        """
        texts, scalar = _as_string_vector(texts, "texts")
        ids = self._pieces(texts, with_offsets=False)[0]  # (B, None)
        return ids[0] if scalar else ids

    def tokenize_with_offsets(self, texts):
        """Word-piece ids with the character span of each piece in the input.

        Offsets count Unicode code points of the original (unnormalized) string, so in
        Python `text[start:end]` is the source of the piece (e.g. "Café" for "cafe"), as HF
        `tokenizers` reports them: a piece spans the characters its normalized letters came
        from, so characters that normalization removed after its last letter (a combining
        accent, a zero-width space) fall outside it, and every piece made from one character
        ("한" -> "ᄒ", "##ᅡ", "##ᆫ") spans all of it.

        Returns:
            `(ids, starts, ends)`, int32 `tf.RaggedTensor`s `(B, None)` (1-D for a scalar).
        """
        texts, scalar = _as_string_vector(texts, "texts")
        ids, starts, ends = self._pieces(texts, with_offsets=True)  # (B, None)
        if scalar:
            return ids[0], starts[0], ends[0]
        return ids, starts, ends

    def _pieces(self, texts, with_offsets):
        """Ids (and offsets) of `(B,)` texts: the fused kernels for texts made only of
        `fused_bert_path.FUSED_SAFE_*` characters, the tables for the others, in order."""
        if self._fused is None:
            return self._table_pieces(texts, with_offsets)
        fused = self._fused.matches(texts)  # (B,)
        # All fused (the usual batch of ASCII or Latin text): no table ops at all.
        return tf.cond(
            tf.reduce_all(fused),
            lambda: self._fused.pieces(texts, with_offsets),
            lambda: self._mixed_pieces(texts, fused, with_offsets),
        )

    def _mixed_pieces(self, texts, fused, with_offsets):
        fused_rows = tf.where(fused)[:, 0]  # (B_f,)
        table_rows = tf.where(~fused)[:, 0]  # (B_t,)
        fast = self._fused.pieces(tf.gather(texts, fused_rows), with_offsets)
        slow = self._table_pieces(tf.gather(texts, table_rows), with_offsets)
        order = tf.argsort(tf.concat([fused_rows, table_rows], 0))  # (B,)
        return tuple(tf.gather(tf.concat([a, b], 0), order) for a, b in zip(fast, slow))

    def _table_pieces(self, texts, with_offsets):
        """Ids (and offsets) of `(B,)` texts by BERT's tables (`bert_words`)."""
        words = bert_words(texts, self.lowercase, self.strip_accents)
        ids, first_char, last_char = self._word_pieces(words)  # (W, None)
        splits = tf.gather(ids.row_splits, words.row_splits)  # (B + 1,)
        ids = tf.RaggedTensor.from_row_splits(ids.values, splits)  # (B, None)
        if not with_offsets:
            return (ids,)
        starts = ids.with_flat_values(tf.gather(words.char_starts, first_char))
        ends = ids.with_flat_values(tf.gather(words.char_ends, last_char))
        return ids, starts, ends

    def _word_pieces(self, words):
        """WordPiece of each word of a `BertWords`.

        Returns:
            `(ids, first_char, last_char)`: int32 `tf.RaggedTensor` `(W, None)` of piece ids,
            and per piece (flat, `(P,)`) the index of its first and last character in the
            `BertWords` character arrays.
        """
        num_chars = words.char_splits[1:] - words.char_splits[:-1]  # (W,)
        too_long = num_chars > MAX_CHARS_PER_WORD  # (W,)
        ids, byte_starts, byte_ends = self._wordpiece.tokenize_with_offsets(
            tf.where(too_long, _LONG_WORD, words.words))  # (W, None)
        piece_words = ids.value_rowids()  # (P,)
        word_first = tf.gather(words.char_splits, piece_words)  # (P,)
        word_last = tf.gather(words.char_splits[1:], piece_words) - 1  # (P,)
        # Pieces' byte offsets within their word, then within all words concatenated.
        char_bytes = tf.concat([words.char_bytes, tf.zeros([1], tf.int64)], 0)  # (M + 1,)
        word_bytes = tf.gather(char_bytes, word_first)  # (P,)
        piece_start = word_bytes + byte_starts.flat_values  # (P,)
        piece_end = word_bytes + byte_ends.flat_values  # (P,)
        char_bytes = words.char_bytes[tf.newaxis]  # (1, M)
        first = tf.searchsorted(char_bytes, piece_start[tf.newaxis], side="right")[0] - 1
        last = tf.searchsorted(char_bytes, piece_end[tf.newaxis], side="left")[0] - 1
        long_piece = tf.gather(too_long, piece_words)  # (P,)
        ids = ids.with_flat_values(
            tf.where(long_piece, self.unknown_token_id, ids.flat_values))
        first = tf.where(long_piece, word_first, tf.cast(first, tf.int64))
        last = tf.where(long_piece, word_last, tf.cast(last, tf.int64))
        return ids, first, last

    def tokenize_words(self, words):
        """Word-piece ids of pre-split words, e.g. the tokens of a CoNLL sentence.

        Each word is tokenized as if it were a text of its own, so punctuation inside a
        word ("U.S.") still splits into several pieces, all belonging to that word; a word
        made only of removed characters (control characters, zero-width marks) yields no
        pieces. Concatenating a sentence's pieces gives `tokenize(" ".join(words))`.

        Args:
            words: string `tf.RaggedTensor` or dense tensor `(B, W)`, or a list of lists
                of str. Every entry of a dense tensor counts as a word.

        Returns:
            int32 `tf.RaggedTensor` `(B, W, None)`.
        """
        if isinstance(words, (list, tuple)):
            words = tf.ragged.constant(list(words), dtype=tf.string, ragged_rank=1)
        elif not isinstance(words, tf.RaggedTensor):
            words = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(words))
        if words.dtype != tf.string or words.shape.rank != 2 or words.ragged_rank != 1:
            raise ValueError(
                "`words` must be a (batch, words) string tensor. "
                f"Received: words with dtype={words.dtype.name}, shape={words.shape}"
            )
        pieces = self.tokenize(words.flat_values)  # (N_words, None)
        return tf.RaggedTensor.from_row_splits(pieces, words.row_splits)  # (B, W, None)

    def detokenize(self, ids):
        """Text from ids: pieces joined, `##` continuations glued, words space-separated.

        Padding ids are removed (they are not text); other special tokens are kept by
        name. Normalization is not undone (uncased text comes back lower-case).

        Args:
            ids: int tensor or `tf.RaggedTensor` `(B, None)`, a 1-D tensor, or lists.

        Returns:
            string tensor `(B,)` (a scalar for 1-D ids).
        """
        if isinstance(ids, (list, tuple)):
            ids = tf.ragged.constant(ids, dtype=tf.int32)
        elif not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(ids)
        ids = tf.cast(ids, tf.int32)
        scalar = ids.shape.rank == 1
        if scalar:
            ids = ids[tf.newaxis]
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        ids = tf.ragged.boolean_mask(ids, ids != self.pad_token_id)
        texts = self._wordpiece.detokenize(ids)  # (B,)
        return texts[0] if scalar else texts

    # --- Packing --------------------------------------------------------------------

    def call(self, texts, text_pairs=None, return_num_truncated=False):
        texts, scalar = _as_string_vector(texts, "texts")
        first = self.tokenize(texts)  # (B, None)
        first_lengths = first.row_lengths()  # (B,)
        if text_pairs is None:
            budget = tf.constant(self.sequence_length - 2, tf.int64)
            kept_first = tf.minimum(first_lengths, budget)  # (B,)
            num_truncated = first_lengths - kept_first  # (B,)
            first = _keep_first(first, kept_first)
            pieces = [
                self._column(first, self.cls_token_id),
                first,
                self._column(first, self.sep_token_id),
            ]
            segments = [0, 0, 0]
        else:
            if self.sequence_length < 3:
                raise ValueError(
                    "Packing a pair needs `sequence_length` >= 3 ([CLS] A [SEP] B [SEP]). "
                    f"Received: sequence_length={self.sequence_length}"
                )
            text_pairs, pair_scalar = _as_string_vector(text_pairs, "text_pairs")
            if pair_scalar != scalar:
                raise ValueError(
                    "`texts` and `text_pairs` must both be scalars or both be batches. "
                    f"Received: texts rank {0 if scalar else 1}, text_pairs rank "
                    f"{0 if pair_scalar else 1}"
                )
            second = self.tokenize(text_pairs)  # (B, None)
            second_lengths = second.row_lengths()  # (B,)
            kept_first, kept_second = self._truncated_lengths(
                first_lengths, second_lengths, tf.constant(self.sequence_length - 3, tf.int64)
            )
            num_truncated = first_lengths - kept_first + second_lengths - kept_second  # (B,)
            first = _keep_first(first, kept_first)
            second = _keep_first(second, kept_second)
            pieces = [
                self._column(first, self.cls_token_id),
                first,
                self._column(first, self.sep_token_id),
                second,
                self._column(first, self.sep_token_id),
            ]
            segments = [0, 0, 0, 1, 1]
        token_ids = tf.concat(pieces, axis=1)  # (B, None), at most sequence_length
        segment_ids = tf.concat(
            [tf.ones_like(piece) * segment for piece, segment in zip(pieces, segments)], axis=1
        )  # (B, None)
        shape = [None, self.sequence_length]
        outputs = {
            "token_ids": token_ids.to_tensor(self.pad_token_id, shape=shape),  # (B, L)
            "segment_ids": segment_ids.to_tensor(0, shape=shape),  # (B, L)
            "padding_mask": tf.sequence_mask(
                token_ids.row_lengths(), self.sequence_length
            ),  # (B, L)
        }
        if return_num_truncated:
            outputs["num_truncated"] = tf.cast(num_truncated, tf.int32)
        if scalar:
            outputs = {key: value[0] for key, value in outputs.items()}
        return outputs

    def _truncated_lengths(self, first_lengths, second_lengths, budget):
        """Kept lengths of both segments, following HF `tokenizers`' truncation rules."""
        excess = tf.maximum(first_lengths + second_lengths - budget, 0)  # (B,)
        if self.truncation == "longest_first":
            # HF: with n1 <= n2, keep n1 and fill the rest with n2; if n1 alone takes more
            # than half, give each half (the odd token to the longer, or to the second).
            swap = first_lengths > second_lengths
            short = tf.minimum(first_lengths, second_lengths)
            long = tf.maximum(first_lengths, second_lengths)
            kept_long = tf.where(short > budget, short, tf.maximum(short, budget - short))
            kept_short = short
            halve = kept_short + kept_long > budget
            kept_short = tf.where(halve, budget // 2, kept_short)
            kept_long = tf.where(halve, budget // 2 + budget % 2, kept_long)
            kept_short = tf.minimum(kept_short, short)
            kept_long = tf.minimum(kept_long, long)
            kept_first = tf.where(swap, kept_long, kept_short)
            kept_second = tf.where(swap, kept_short, kept_long)
            fits = excess == 0
            return (
                tf.where(fits, first_lengths, kept_first),
                tf.where(fits, second_lengths, kept_second),
            )
        cut_first = self.truncation == "only_first"
        target = first_lengths if cut_first else second_lengths
        name = "first" if cut_first else "second"
        fits = (excess == 0) | (target > excess)  # (B,)
        message = (
            f"truncation='{self.truncation}' cannot fit an example into "
            f"sequence_length={self.sequence_length}: the {name} segment is too short to "
            "absorb the excess. Use truncation='longest_first' or a longer sequence_length."
        )
        if tf.executing_eagerly():
            bad = tf.where(~fits)[:, 0].numpy().tolist()
            if bad:
                raise ValueError(
                    f"{message} Examples {bad[:8]}: excess tokens "
                    f"{tf.gather(excess, bad[:8]).numpy().tolist()}, {name} segment lengths "
                    f"{tf.gather(target, bad[:8]).numpy().tolist()}."
                )
        check = tf.debugging.Assert(
            tf.reduce_all(fits),
            [message, "Excess tokens per example:", excess, f"{name} segment lengths:", target],
            summarize=8,
        )
        with tf.control_dependencies([check]):
            kept = tf.identity(target - excess)
        if cut_first:
            return kept, second_lengths
        return first_lengths, kept

    def _column(self, like, token_id):
        batch_size = like.nrows()
        return tf.RaggedTensor.from_tensor(
            tf.fill([batch_size, 1], tf.constant(token_id, tf.int32))
        )

    def compute_output_spec(self, texts, text_pairs=None, return_num_truncated=False):
        batch_shape = tuple(texts.shape)
        shape = batch_shape + (self.sequence_length,)
        outputs = {
            "token_ids": keras.KerasTensor(shape, dtype="int32"),
            "segment_ids": keras.KerasTensor(shape, dtype="int32"),
            "padding_mask": keras.KerasTensor(shape, dtype="bool"),
        }
        if return_num_truncated:
            outputs["num_truncated"] = keras.KerasTensor(batch_shape, dtype="int32")
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary": list(self.vocabulary),
                "lowercase": self.lowercase,
                "strip_accents": self._strip_accents_argument,
                "sequence_length": self.sequence_length,
                "truncation": self.truncation,
                "unknown_token": self.unknown_token,
                "cls_token": self.cls_token,
                "sep_token": self.sep_token,
                "pad_token": self.pad_token,
                "mask_token": self.mask_token,
            }
        )
        return config


def _as_string_vector(texts, name):
    """`(B,)` string tensor from str / list / numpy / tensor, and whether it was a scalar."""
    if isinstance(texts, tf.RaggedTensor):
        raise ValueError(
            f"`{name}` must be a scalar or 1-D string tensor, not ragged (for pre-split "
            f"words use `tokenize_words`). Received: {name} with shape={texts.shape}"
        )
    if isinstance(texts, (list, tuple)) and not texts:
        texts = tf.zeros([0], tf.string)
    texts = tf.convert_to_tensor(texts)
    if texts.dtype != tf.string or texts.shape.rank not in (0, 1):
        raise ValueError(
            f"`{name}` must be a scalar or 1-D string tensor. Received: {name} with "
            f"dtype={texts.dtype.name}, shape={texts.shape}"
        )
    if texts.shape.rank == 0:
        return texts[tf.newaxis], True
    return texts, False


def _keep_first(ragged, lengths):
    """The first `lengths[b]` items of each row of `ragged` `(B, None)`."""
    positions = tf.ragged.range(ragged.row_lengths())  # (B, None)
    return tf.ragged.boolean_mask(ragged, positions < lengths[:, tf.newaxis])
