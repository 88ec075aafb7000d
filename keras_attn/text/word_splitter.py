"""Raw text -> words with character offsets, by the rules of BERT's `BasicTokenizer`.

A NER model is trained on pre-split CoNLL words; at inference it gets raw text. The words of a
raw text are the pieces BERT's `BasicTokenizer` (Devlin et al., 2019, `tokenization.py`; HF
`tokenizers`' `BertNormalizer` + `BertPreTokenizer`) cuts before WordPiece. The rules, applied to
each character (a Unicode code point, general categories from Python's `unicodedata`, Unicode
14.0 on Python 3.11), in this order:

1. Whitespace separates words: TAB, LF, CR and every character of category `Zs`, `Zl`
   (U+2028) or `Zp` (U+2029).
2. Removed characters vanish without separating anything: U+0000, U+FFFD and every other
   character of a category starting with `C` (`Cc`, `Cf`, `Cn` unassigned, `Co` private use,
   `Cs`). With `strip_accents=True` (BERT uncased) the combining marks `Mn` are removed too.
   `"ab\\u200bcd"` is the one word `"abcd"` (U+200B is `Cf`).
3. Every punctuation character is a word of its own. Punctuation is ASCII 33-47, 58-64, 91-96,
   123-126 (so `$ + < = > ^ ` | ~` count) and every character of a category starting with `P`.
   With `strip_accents=True` also every character whose NFD decomposition without `Mn` marks
   holds punctuation (U+1FEF -> "`", U+2260 "≠" -> "=", U+226E "≮" -> "<", U+226F "≯" -> ">"),
   as BERT splits punctuation after stripping accents.
4. Every CJK ideograph is a word of its own: U+4E00-9FFF, U+3400-4DBF, U+20000-2A6DF,
   U+2A700-2B73F, U+2B740-2B81F, U+2B820-2CEAF, U+F900-FAFF, U+2F800-2FA1F (BERT's
   `_is_chinese_char`; Hiragana, Katakana and Hangul are ordinary letters).
5. Every other maximal run of characters is a word.

A word's text is its characters without the removed ones; its offsets `[start, end)` count code
points of the original string (Python `str` indices; on the JVM convert UTF-16 indices with
`String.offsetByCodePoints`), from its first to its last kept character, so removed characters
inside a word fall inside the span. Invalid UTF-8 bytes (only possible in the TF version) decode
to U+FFFD and are removed.

Versus tensorflow-text's `FastBertTokenizer` (our `WordPieceTokenizer`), measured on every code
point: it separates words at `Cc` characters other than TAB/LF/CR (BERT removes them) and keeps
private-use and unassigned characters inside words, and in uncased mode it also splits at some
compatibility characters (full-width forms, circled letters). The words here follow BERT; the
tokenizer then sees each word alone (`WordPieceTokenizer.tokenize_words`), so these differences
only change which pieces a rare word gets, never the word boundaries.

`split_words` is the plain-Python reference (and the specification the Kotlin app implements);
`split_words_tf` is the same in TensorFlow ops for `tf.function`, `tf.data` and SavedModels.
"""

import functools
import unicodedata

import numpy as np
import tensorflow as tf

# Character classes of the rules above.
WORD_CHARACTER = 0
WHITESPACE = 1
REMOVED = 2
SINGLE_CHARACTER_WORD = 3

_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_MAX_CODE_POINT = 0x10FFFF


def _is_punctuation(character):
    code = ord(character)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(character).startswith("P")


def character_class(character, strip_accents=False):
    """The class of one character under the rules of the module docstring.

    Returns:
        `WORD_CHARACTER`, `WHITESPACE`, `REMOVED` or `SINGLE_CHARACTER_WORD`.

    Example:
    >>> [character_class(c) for c in ("a", " ", "\\u200b", ",", "中")]
    [0, 1, 2, 3, 3]
    """
    code = ord(character)
    category = unicodedata.category(character)
    if character in "\t\n\r" or category in ("Zs", "Zl", "Zp"):
        return WHITESPACE
    if code == 0 or code == 0xFFFD or category.startswith("C"):
        return REMOVED
    if strip_accents and category == "Mn":
        return REMOVED
    if any(low <= code <= high for low, high in _CJK_RANGES) or _is_punctuation(character):
        return SINGLE_CHARACTER_WORD
    if strip_accents:
        decomposed = unicodedata.normalize("NFD", character)
        if any(_is_punctuation(c) for c in decomposed if unicodedata.category(c) != "Mn"):
            return SINGLE_CHARACTER_WORD
    return WORD_CHARACTER


def split_words(text, strip_accents=False):
    """Words of one text with code-point offsets (plain Python reference of `split_words_tf`).

    Args:
        text: str.
        strip_accents: bool. BERT uncased rules (`Mn` removed, see the module docstring);
            use the tokenizer's `strip_accents`.

    Returns:
        list of `(word, start, end)`: the word's kept characters and its `[start, end)`
        code-point span in `text`.

    Example:
    >>> split_words("Hi, J.R. Tolkien!")  # doctest: +NORMALIZE_WHITESPACE
    [('Hi', 0, 2), (',', 2, 3), ('J', 4, 5), ('.', 5, 6), ('R', 6, 7), ('.', 7, 8),
     ('Tolkien', 9, 16), ('!', 16, 17)]
    >>> split_words("北京 a\\u200bb")
    [('北', 0, 1), ('京', 1, 2), ('ab', 3, 6)]
    """
    if not isinstance(text, str):
        raise ValueError(f"`text` must be a str. Received: text={type(text).__name__}")
    words = []
    current = None  # [characters, start, end] of the word being read
    for position, character in enumerate(text):
        kind = character_class(character, strip_accents)
        if kind == REMOVED:
            continue
        if kind == WHITESPACE or kind == SINGLE_CHARACTER_WORD:
            if current is not None:
                words.append(("".join(current[0]), current[1], current[2]))
                current = None
            if kind == SINGLE_CHARACTER_WORD:
                words.append((character, position, position + 1))
            continue
        if current is None:
            current = [[], position, position + 1]
        current[0].append(character)
        current[2] = position + 1
    if current is not None:
        words.append(("".join(current[0]), current[1], current[2]))
    return words


@functools.lru_cache(maxsize=2)
def character_class_table(strip_accents=False):
    """The classes of all code points, run-length encoded.

    Returns:
        `(starts, classes)`: int32 numpy arrays; code points `starts[i]` to
        `starts[i + 1] - 1` have class `classes[i]` (surrogates U+D800-DFFF, which valid
        UTF-8 cannot hold, count as `REMOVED`).
    """
    codes = np.arange(_MAX_CODE_POINT + 1)
    classes = np.fromiter(
        (
            REMOVED if 0xD800 <= code <= 0xDFFF else character_class(chr(code), strip_accents)
            for code in range(_MAX_CODE_POINT + 1)
        ),
        dtype=np.int32,
        count=_MAX_CODE_POINT + 1,
    )
    changes = np.concatenate([[True], classes[1:] != classes[:-1]])
    return codes[changes].astype(np.int32), classes[changes]


def split_words_tf(texts, strip_accents=False):
    """Words of a batch of texts with code-point offsets, in TensorFlow ops.

    The same words and offsets as `split_words` (the rules are in the module docstring),
    usable in `tf.function`, `tf.data` and exported SavedModels. The class of every code
    point is looked up in `character_class_table`, frozen into the graph when it is traced.

    Args:
        texts: string tensor `(B,)` (UTF-8), or a list of str.
        strip_accents: bool. BERT uncased rules; use the tokenizer's `strip_accents`.

    Returns:
        `(words, starts, ends)`: string `tf.RaggedTensor` `(B, None)` and two int32
        `tf.RaggedTensor`s `(B, None)` of `[start, end)` code-point offsets.

    Example:
    >>> words, starts, ends = split_words_tf(["Hi, Tolkien!", ""])
    >>> [[w.decode() for w in row] for row in words.to_list()]
    [['Hi', ',', 'Tolkien', '!'], []]
    >>> starts.to_list(), ends.to_list()
    ([[0, 2, 4, 11], []], [[2, 3, 11, 12], []])
    """
    if isinstance(texts, (list, tuple)):
        texts = tf.constant(list(texts), dtype=tf.string, shape=[len(texts)])
    texts = tf.convert_to_tensor(texts)
    if texts.dtype != tf.string or texts.shape.rank != 1:
        raise ValueError(
            "`texts` must be a 1-D string tensor (a batch of texts). "
            f"Received: texts with dtype={texts.dtype.name}, shape={texts.shape}"
        )
    range_starts, range_classes = character_class_table(bool(strip_accents))
    codes = tf.strings.unicode_decode(
        texts, "UTF-8", errors="replace", replacement_char=0xFFFD
    )  # (B, C) int32 code points
    positions = tf.ragged.range(tf.cast(codes.row_lengths(), tf.int32))  # (B, C)
    flat_codes = codes.flat_values  # (N,)
    range_index = tf.searchsorted(
        tf.constant(range_starts), flat_codes, side="right", out_type=tf.int32
    ) - 1  # (N,)
    kinds = tf.gather(tf.constant(range_classes), range_index)  # (N,)

    # Removed characters first: what remains is whitespace, single-character words and word
    # characters, and a word starts at a non-space character that follows a non-word
    # character (or the start of the text), or that is a word of its own.
    kept = codes.with_flat_values(kinds != REMOVED)  # (B, C)
    kept_kinds = tf.ragged.boolean_mask(codes.with_flat_values(kinds), kept)  # (B, K)
    kept_codes = tf.ragged.boolean_mask(codes, kept)  # (B, K)
    kept_positions = tf.ragged.boolean_mask(positions, kept)  # (B, K)
    flat_kinds = kept_kinds.flat_values  # (M,)
    character_rows = kept_kinds.value_rowids()  # (M,) row of each kept character
    is_row_start = tf.equal(
        tf.range(tf.shape(flat_kinds, out_type=tf.int64)[0]),
        tf.gather(kept_kinds.row_starts(), character_rows),
    )  # (M,)
    previous_kinds = tf.concat([[WHITESPACE], flat_kinds[:-1]], axis=0)  # (M,)
    previous_ends_word = is_row_start | (previous_kinds != WORD_CHARACTER)  # (M,)
    in_word = flat_kinds != WHITESPACE  # (M,)
    starts_word = in_word & (previous_ends_word | (flat_kinds == SINGLE_CHARACTER_WORD))  # (M,)
    word_of_character = tf.cumsum(tf.cast(starts_word, tf.int32)) - 1  # (M,) flat word index

    word_codes = tf.boolean_mask(kept_codes.flat_values, in_word)  # (M',)
    word_index = tf.boolean_mask(word_of_character, in_word)  # (M',)
    word_positions = tf.boolean_mask(kept_positions.flat_values, in_word)  # (M',)
    num_words = tf.reduce_sum(tf.cast(starts_word, tf.int32))
    characters = tf.RaggedTensor.from_value_rowids(
        word_codes, word_index, nrows=num_words
    )  # (total_words, None) code points of each word
    flat_words = tf.strings.unicode_encode(characters, "UTF-8")  # (total_words,)
    flat_starts = tf.math.unsorted_segment_min(word_positions, word_index, num_words)
    flat_ends = tf.math.unsorted_segment_max(word_positions, word_index, num_words) + 1
    # Row of each word: the row of its first character.
    word_rows = tf.boolean_mask(character_rows, starts_word)  # (total_words,)
    batch_size = codes.nrows()
    words = tf.RaggedTensor.from_value_rowids(flat_words, word_rows, nrows=batch_size)
    starts = words.with_flat_values(flat_starts)
    ends = words.with_flat_values(flat_ends)
    return words, starts, ends
