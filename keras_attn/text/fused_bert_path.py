"""The fast path of `WordPieceTokenizer`: tf-text's fused BERT kernels, for text on which they
give BERT's pieces.

tf-text's `FastBertNormalizer` applies compatibility mapping and case folding, so on most
scripts it is not BERT's normalizer; on the characters of `FUSED_SAFE_UNCASED` (cased:
`FUSED_SAFE_CASED`) each maps to the same single printable ASCII character (or a space) as
BERT's, checked on each code point by tests/test_tokenizer_parity.py. A text made only of them
is tokenized by two kernels instead of the table lookups of `bert_words`, and its normalized
text has one byte per character, so the kernels' byte offsets are code-point offsets.
"""

import tensorflow as tf
import tensorflow_text as tf_text

FUSED_SAFE_UNCASED = (
    r"\t\n\r -~\x{a0}\x{c0}-\x{c5}\x{c7}-\x{cf}\x{d1}-\x{d6}\x{d9}-\x{dd}\x{e0}-\x{e5}"
    r"\x{e7}-\x{ef}\x{f1}-\x{f6}\x{f9}-\x{fd}\x{ff}-\x{10f}\x{112}-\x{125}\x{128}-\x{130}"
    r"\x{134}-\x{137}\x{139}-\x{13e}\x{143}-\x{148}\x{14c}-\x{151}\x{154}-\x{165}"
    r"\x{168}-\x{17e}\x{1e00}-\x{1e99}\x{1ea0}-\x{1ef9}\x{2000}-\x{200a}\x{3000}"
)
FUSED_SAFE_CASED = r"\t\n\r -~"


class FusedBertPath:
    """tf-text's fused normalizer and WordPiece kernels for one vocabulary and mode.

    Args:
        vocabulary: list of tokens.
        unknown_token: str.
        lowercase: bool. BERT uncased (lower-case and strip accents) or cased.
        max_chars_per_word: int. BERT's word limit; in bytes here, one byte a character.

    Example:
    >>> path = FusedBertPath(["[UNK]", "cafe", "##s"], "[UNK]", lowercase=True,
    ...                      max_chars_per_word=100)
    >>> path.matches(tf.constant(["Cafés", "wait…"])).numpy().tolist()
    [True, False]
    >>> path.pieces(tf.constant(["Cafés"]), with_offsets=False)[0].to_list()
    [[1, 2]]
    """

    def __init__(self, vocabulary, unknown_token, lowercase, max_chars_per_word):
        self.pattern = f"[{FUSED_SAFE_UNCASED if lowercase else FUSED_SAFE_CASED}]*"
        self._normalizer = tf_text.FastBertNormalizer(lower_case_nfd_strip_accents=lowercase)
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=vocabulary, suffix_indicator="##", max_bytes_per_word=max_chars_per_word,
            token_out_type=tf.int32, unknown_token=unknown_token)

    def matches(self, texts):
        """bool `(B,)`: which texts are made only of the path's characters."""
        return tf.strings.regex_full_match(texts, self.pattern)

    def pieces(self, texts, with_offsets):
        """`(ids,)` or `(ids, starts, ends)`, int32 `tf.RaggedTensor`s `(B, None)` of texts
        that `matches`; offsets in code points."""
        normalized = self._normalizer.normalize(texts)  # (B,)
        if with_offsets:
            ids, starts, ends = self._wordpiece.tokenize_with_offsets(normalized)
            return ids, tf.cast(starts, tf.int32), tf.cast(ends, tf.int32)
        return (self._wordpiece.tokenize(normalized),)
