"""BERT WordPiece tokenizer: BERT's normalizer and pre-tokenizer as table lookups in TensorFlow
ops (`bert_words`), then tensorflow-text's `FastWordpieceTokenizer` on each word.

One tokenizer serves training (`tf.data`) and the exported SavedModel, and is the
specification the Kotlin and JS tokenizers re-implement with the same tables; ids and offsets
equal HF `tokenizers`' BERT tokenizer on any text (docs/text.md).
"""

import os

import keras
import tensorflow as tf

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_int
from keras_attn.text.fused_bert_path import FusedBertPath
from keras_attn.text.segment_packing import TRUNCATION_STRATEGIES
from keras_attn.text.segment_packing import keep_first
from keras_attn.text.segment_packing import pack_segments
from keras_attn.text.segment_packing import truncated_lengths
from keras_attn.text.table_bert_path import MAX_CHARS_PER_WORD
from keras_attn.text.table_bert_path import TableBertPath
from keras_attn.text.vocabulary import check_vocabulary
from keras_attn.text.vocabulary import load_vocabulary

__all__ = ["MAX_CHARS_PER_WORD", "TRUNCATION_STRATEGIES", "WordPieceTokenizer"]


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

        self._table = TableBertPath(tokens, unknown_token, self.lowercase, self.strip_accents)
        # The table path's WordPiece, also `detokenize`'s (an attribute of the layer, as
        # before the path had a module of its own).
        self._wordpiece = self._table.wordpiece
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
            return self._table.pieces(texts, with_offsets)
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
        slow = self._table.pieces(tf.gather(texts, table_rows), with_offsets)
        order = tf.argsort(tf.concat([fused_rows, table_rows], 0))  # (B,)
        return tuple(tf.gather(tf.concat([a, b], 0), order) for a, b in zip(fast, slow))

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
            segments = [keep_first(first, kept_first)]
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
            kept_first, kept_second = truncated_lengths(
                first_lengths, second_lengths, tf.constant(self.sequence_length - 3, tf.int64),
                self.truncation, self.sequence_length,
            )
            num_truncated = first_lengths - kept_first + second_lengths - kept_second  # (B,)
            segments = [keep_first(first, kept_first), keep_first(second, kept_second)]
        outputs = pack_segments(segments, self.cls_token_id, self.sep_token_id,
                                self.pad_token_id, self.sequence_length)  # (B, L) each
        if return_num_truncated:
            outputs["num_truncated"] = tf.cast(num_truncated, tf.int32)
        if scalar:
            outputs = {key: value[0] for key, value in outputs.items()}
        return outputs

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

