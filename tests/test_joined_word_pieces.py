"""JoinedWordPieces: word pieces with a joiner where the text had no space; the decoded
pieces give back the raw text (what sacreBLEU scores)."""

import pytest

from keras_attn.text.joined_word_pieces import JOINER_TOKEN
from keras_attn.text.joined_word_pieces import JoinedWordPieces
from keras_attn.text.parallel_corpus import read_parallel_files
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import DEFAULT_RESERVED_TOKENS
from keras_attn.text.vocabulary import train_wordpiece_vocabulary
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

SPECIALS = list(DEFAULT_RESERVED_TOKENS) + [JOINER_TOKEN]


def pieces_of(tokens, lowercase=False):
    return JoinedWordPieces(WordPieceTokenizer(SPECIALS + tokens, lowercase=lowercase))


def test_joiners_mark_exactly_the_missing_spaces():
    pieces = pieces_of(["A", "man", "'", "s", "T", "-", "shirt", ".", "##irt", "sh"])
    vocab = pieces.tokenizer.get_vocabulary()
    ids = pieces.encode(["A man's T-shirt."])[0]
    # "shirt" is one vocabulary word; a continuation piece never takes a joiner.
    assert [vocab[i] for i in ids] == ["A", "man", "[JOIN]", "'", "[JOIN]", "s", "T", "[JOIN]",
                                       "-", "[JOIN]", "shirt", "[JOIN]", "."]
    assert pieces.decode(ids) == "A man's T-shirt."
    assert pieces.decode([vocab.index(t) for t in ["sh", "##irt", "[JOIN]", "."]]) == "shirt."


def test_padding_is_skipped_and_spaces_are_normalized():
    pieces = pieces_of(["a", "bike", "."])
    ids = pieces.encode(["a   bike ."])[0].tolist()
    assert pieces.decode(ids + [0, 0]) == "a bike ."


def test_round_trip_on_multi30k_is_exact():
    pairs, _ = read_parallel_files(shared_data_file("multi30k/val.de"),
                                   shared_data_file("multi30k/val.en"))
    texts = [t for p in pairs[:300] for t in (p.source, p.target)]
    tokens = train_wordpiece_vocabulary(texts, 600, lowercase=False, min_count=2,
                                        reserved_tokens=SPECIALS)
    pieces = JoinedWordPieces(WordPieceTokenizer(tokens, lowercase=False))
    decoded = [pieces.decode(ids) for ids in pieces.encode(texts)]
    # One line has "120\u00a0cm": whitespace becomes one space, the only change.
    assert sum("\u00a0" in t for t in texts) == 1
    assert decoded == [" ".join(t.split()) for t in texts]


def test_a_vocabulary_without_the_joiner_is_refused():
    with pytest.raises(ValueError, match=r"no joiner token '\[JOIN\]'"):
        JoinedWordPieces(WordPieceTokenizer(list(DEFAULT_RESERVED_TOKENS) + ["a"]))
