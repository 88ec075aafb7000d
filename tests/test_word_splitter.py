"""Raw-text word splitting: TF graph vs the Python reference vs BERT's own BasicTokenizer."""

import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.text.hard_cases import WORD_SPLITTER_HARD_CASES
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.word_splitter import REMOVED
from keras_attn.text.word_splitter import SINGLE_CHARACTER_WORD
from keras_attn.text.word_splitter import WHITESPACE
from keras_attn.text.word_splitter import WORD_CHARACTER
from keras_attn.text.word_splitter import character_class
from keras_attn.text.word_splitter import character_class_table
from keras_attn.text.word_splitter import split_words
from keras_attn.text.word_splitter import split_words_tf
from tests.resources import minilm_directory
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

HARD_CASES = WORD_SPLITTER_HARD_CASES


# --- An independent reference: BERT's BasicTokenizer (google-research/bert tokenization.py,
# Apache 2.0), copied as published minus vocabulary handling. ---------------------------------


def _bert_is_whitespace(char):
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _bert_is_control(char):
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char).startswith("C")


def _bert_is_punctuation(char):
    cp = ord(char)
    if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
        return True
    return unicodedata.category(char).startswith("P")


def _bert_is_chinese_char(cp):
    return (
        (0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or (0x20000 <= cp <= 0x2A6DF)
        or (0x2A700 <= cp <= 0x2B73F) or (0x2B740 <= cp <= 0x2B81F)
        or (0x2B820 <= cp <= 0x2CEAF) or (0xF900 <= cp <= 0xFAFF)
        or (0x2F800 <= cp <= 0x2FA1F)
    )


def bert_basic_tokenize(text, do_lower_case):
    output = []
    for char in text:
        cp = ord(char)
        if cp == 0 or cp == 0xFFFD or _bert_is_control(char):
            continue
        output.append(" " if _bert_is_whitespace(char) else char)
    text = "".join(output)
    output = []
    for char in text:
        if _bert_is_chinese_char(ord(char)):
            output.extend([" ", char, " "])
        else:
            output.append(char)
    text = "".join(output)
    split_tokens = []
    for token in text.strip().split():
        if do_lower_case:
            token = unicodedata.normalize("NFD", token.lower())
            token = "".join(c for c in token if unicodedata.category(c) != "Mn")
        words, start_new_word = [], True
        for char in token:
            if _bert_is_punctuation(char):
                words.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    words.append([])
                start_new_word = False
                words[-1].append(char)
        split_tokens.extend("".join(word) for word in words)
    return " ".join(split_tokens).strip().split()


def _bert_view(words, strip_accents):
    """Our words as BERT prints them (lower-cased and accent-stripped when uncased)."""
    if not strip_accents:
        return [word for word, _, _ in words]
    result = []
    for word, _, _ in words:
        word = unicodedata.normalize("NFD", word.lower())
        result.append("".join(c for c in word if unicodedata.category(c) != "Mn"))
    return result


def _tf_words(texts, strip_accents=False):
    words, starts, ends = split_words_tf(tf.constant(texts), strip_accents=strip_accents)
    return [
        [(w.decode("utf-8"), s, e) for w, s, e in zip(row_w, row_s, row_e)]
        for row_w, row_s, row_e in zip(words.to_list(), starts.to_list(), ends.to_list())
    ]


# --- Python reference ---------------------------------------------------------------------------


def test_reference_known_words_and_offsets():
    text = "Mr. O'Neil\u200b-Smith paid $5,000 in 北京\t😀!"
    assert split_words(text) == [
        ("Mr", 0, 2), (".", 2, 3), ("O", 4, 5), ("'", 5, 6), ("Neil", 6, 10), ("-", 11, 12),
        ("Smith", 12, 17), ("paid", 18, 22), ("$", 23, 24), ("5", 24, 25), (",", 25, 26),
        ("000", 26, 29), ("in", 30, 32), ("北", 33, 34), ("京", 34, 35), ("😀", 36, 37),
        ("!", 37, 38),
    ]
    # A removed character inside a word stays inside its span; the word text drops it.
    assert split_words("ab\u200bcd") == [("abcd", 0, 5)]
    assert split_words("\u200b ab") == [("ab", 2, 4)]


def test_reference_strip_accents_rules():
    # Uncased: combining marks are removed (a lone one is no word), and characters whose
    # accent-stripped decomposition is punctuation split like punctuation.
    assert split_words("a \u0301 b", strip_accents=True) == [("a", 0, 1), ("b", 4, 5)]
    assert split_words("a \u0301 b") == [("a", 0, 1), ("\u0301", 2, 3), ("b", 4, 5)]
    assert split_words("x≠y", strip_accents=True) == [("x", 0, 1), ("≠", 1, 2), ("y", 2, 3)]
    assert split_words("x≠y") == [("x≠y", 0, 3)]


def test_reference_equals_bert_basic_tokenizer_on_hard_cases():
    for strip_accents in (False, True):
        for text in HARD_CASES:
            ours = _bert_view(split_words(text, strip_accents), strip_accents)
            assert ours == bert_basic_tokenize(text, strip_accents), (text, strip_accents)


def test_offsets_point_at_the_words():
    for text in HARD_CASES:
        for word, start, end in split_words(text):
            kept = "".join(c for c in text[start:end] if character_class(c) != REMOVED)
            assert kept == word, (text, word, start, end)
            assert character_class(text[start]) != REMOVED
            assert character_class(text[end - 1]) != REMOVED


def _check_code_points(codes, strip_accents):
    # Each code point between two letters and between spaces: "a<c>b <c> ".
    chunks = [codes[i:i + 20000] for i in range(0, len(codes), 20000)]
    texts = ["".join(f"a{chr(c)}b <{chr(c)}> " for c in chunk) for chunk in chunks]
    graph = _tf_words(texts, strip_accents)
    for text, tf_words in zip(texts, graph):
        reference = split_words(text, strip_accents)
        assert tf_words == reference
        assert _bert_view(reference, strip_accents) == bert_basic_tokenize(text, strip_accents)


@pytest.mark.parametrize("strip_accents", [False, True])
def test_sampled_code_points_match_bert_and_the_graph(strip_accents):
    rng = np.random.default_rng(1)
    sample = set(range(0x3000)) | set(range(0xF900, 0x10000)) | {0x2260, 0x226E, 0x226F}
    sample |= set(rng.integers(0, 0x110000, size=10000).tolist())
    _check_code_points(sorted(c for c in sample if not 0xD800 <= c <= 0xDFFF), strip_accents)


@pytest.mark.slow
@pytest.mark.parametrize("strip_accents", [False, True])
def test_every_code_point_matches_bert_and_the_graph(strip_accents):
    _check_code_points([c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF], strip_accents)


def test_class_table_is_the_character_classes():
    starts, classes = character_class_table(False)
    assert starts[0] == 0 and np.all(np.diff(starts) > 0)
    assert set(classes.tolist()) == {WORD_CHARACTER, WHITESPACE, REMOVED, SINGLE_CHARACTER_WORD}
    rng = np.random.default_rng(0)
    for code in rng.integers(0, 0x110000, size=2000).tolist() + [0, 0x10FFFF, 0x4E00, 0x9FFF]:
        if 0xD800 <= code <= 0xDFFF:
            continue
        expected = character_class(chr(code))
        assert classes[np.searchsorted(starts, code, side="right") - 1] == expected, hex(code)


# --- TF graph ------------------------------------------------------------------------------------


@pytest.mark.parametrize("strip_accents", [False, True])
def test_graph_equals_reference_on_hard_cases(strip_accents):
    expected = [split_words(text, strip_accents) for text in HARD_CASES]
    assert _tf_words(HARD_CASES, strip_accents) == expected


def test_graph_in_tf_function_and_empty_batch():
    fn = tf.function(split_words_tf, input_signature=[tf.TensorSpec([None], tf.string)])
    words, starts, ends = fn(tf.constant(["a, b", "", "c"]))
    assert words.to_list() == [[b"a", b",", b"b"], [], [b"c"]]
    assert starts.to_list() == [[0, 1, 3], [], [0]]
    assert ends.to_list() == [[1, 2, 4], [], [1]]
    words, starts, _ = fn(tf.zeros([0], tf.string))
    assert words.to_list() == [] and starts.to_list() == []
    assert starts.dtype == tf.int32


def test_graph_invalid_utf8_is_removed():
    # 0xFF cannot occur in UTF-8: it decodes to U+FFFD, which is removed like BERT does.
    words, starts, ends = split_words_tf(tf.constant([b"ab\xffcd ef"]))
    assert words.to_list() == [[b"abcd", b"ef"]]
    assert starts.to_list() == [[0, 6]] and ends.to_list() == [[5, 8]]


def test_bad_input_errors():
    with pytest.raises(ValueError, match="1-D string tensor"):
        split_words_tf(tf.constant([1, 2]))
    with pytest.raises(ValueError, match="1-D string tensor"):
        split_words_tf(tf.constant("one text"))
    with pytest.raises(ValueError, match="must be a str"):
        split_words(b"bytes")


# --- Real data -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sst2_dev():
    lines = shared_data_file("sst2/dev.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines[1:]]


def test_sst2_dev_graph_equals_reference_and_bert(sst2_dev):
    assert len(sst2_dev) == 872
    graph = _tf_words(sst2_dev, strip_accents=True)
    for text, words in zip(sst2_dev, graph):
        assert words == split_words(text, strip_accents=True), text
        assert _bert_view(words, True) == bert_basic_tokenize(text, True), text


def test_sst2_dev_word_pieces_concatenate_to_the_text_pieces(sst2_dev):
    # The NER path tokenizes each word alone: its pieces must be the text's pieces.
    tokenizer = WordPieceTokenizer(str(minilm_directory() / "vocab.txt"))
    words, _, _ = split_words_tf(tf.constant(sst2_dev), strip_accents=tokenizer.strip_accents)
    per_word = tokenizer.tokenize_words(words).merge_dims(1, 2).to_list()
    assert per_word == tokenizer.tokenize(sst2_dev).to_list()
