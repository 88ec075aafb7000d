"""Vocabulary files (load/save errors) and learning a WordPiece vocabulary from SST-2."""


import numpy as np
import pytest
import tensorflow as tf

from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import DEFAULT_RESERVED_TOKENS
from keras_attn.text.vocabulary import load_vocabulary
from keras_attn.text.vocabulary import save_vocabulary
from keras_attn.text.vocabulary import train_wordpiece_vocabulary
from tests.resources import shared_data_file

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

SPECIALS = list(DEFAULT_RESERVED_TOKENS)


def test_save_load_round_trip_keeps_order_and_unicode(tmp_path):
    tokens = SPECIALS + ["东京", "##é", "naïve", "a"]
    save_vocabulary(tokens, tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_bytes().count(b"\n") == len(tokens)
    assert load_vocabulary(tmp_path / "vocab.txt") == tokens


def test_windows_line_endings_are_accepted(tmp_path):
    (tmp_path / "vocab.txt").write_bytes("\r\n".join(SPECIALS + ["a"]).encode() + b"\r\n")
    assert load_vocabulary(tmp_path / "vocab.txt") == SPECIALS + ["a"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (
            "\n".join(SPECIALS + ["a", "b", "a"]).encode(),
            r"vocab.txt:8: duplicate token 'a', first seen at .*vocab.txt:6",
        ),
        ("\n".join(SPECIALS + ["a", "", "b"]).encode(), r"vocab.txt:7: empty token"),
        ("\n".join(SPECIALS + ["a", " b"]).encode(), r"vocab.txt:7: token ' b' has leading"),
        ("\n".join(SPECIALS[1:] + ["a"]).encode(), r"lacks the special token\(s\) \['\[PAD\]'\]"),
        (
            "\n".join(SPECIALS).encode() + b"\nok\ncaf\xe9\n",
            r"vocab.txt:7: the line is not valid UTF-8",
        ),
    ],
)
def test_load_errors_name_the_line(tmp_path, content, message):
    (tmp_path / "vocab.txt").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_vocabulary(tmp_path / "vocab.txt")


def test_missing_file_and_bad_tokens(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_vocabulary(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match=r"token id 6: token 'a\\nb' contains a line break"):
        save_vocabulary(SPECIALS + ["ok", "a\nb"], tmp_path / "v.txt")
    with pytest.raises(ValueError, match="Received: vocabulary_size=5"):
        train_wordpiece_vocabulary(["a b"], vocabulary_size=5)
    with pytest.raises(ValueError, match=r"Received: texts_or_dataset\[1\]=3"):
        train_wordpiece_vocabulary(["a", 3], vocabulary_size=50)
    with pytest.raises(ValueError, match="element_spec"):
        train_wordpiece_vocabulary(tf.data.Dataset.range(3), vocabulary_size=50)


@pytest.fixture(scope="module")
def sst2_train():
    lines = shared_data_file("sst2/train.tsv").read_text(encoding="utf-8").splitlines()[1:2001]
    return [line.split("\t")[0] for line in lines]


@pytest.fixture(scope="module")
def learned(sst2_train):
    return train_wordpiece_vocabulary(sst2_train, vocabulary_size=1000, min_count=2)


def test_learned_vocabulary_shape(learned, sst2_train):
    assert learned[:5] == SPECIALS
    assert len(set(learned)) == len(learned)
    # The size is a target the threshold search approaches (894 measured).
    assert 850 <= len(learned) <= 1150
    assert {"the", "film", "movie"} <= set(learned)
    # Every letter of the corpus exists alone and as a continuation.
    for char in set("".join(sst2_train).lower()) & set("abcdefghijklmnopqrstuvwxyz"):
        assert char in learned and "##" + char in learned


def test_learned_vocabulary_round_trips_and_covers_the_corpus(learned, sst2_train, tmp_path):
    save_vocabulary(learned, tmp_path / "vocab.txt")
    assert load_vocabulary(tmp_path / "vocab.txt") == learned
    tokenizer = WordPieceTokenizer(str(tmp_path / "vocab.txt"))
    ids = tokenizer.tokenize(sst2_train).flat_values.numpy()
    unknown_rate = float(np.mean(ids == tokenizer.unknown_token_id))
    pieces_per_word = len(ids) / sum(len(t.split()) for t in sst2_train)
    assert unknown_rate < 0.001, unknown_rate  # 0 measured: every character is kept
    assert pieces_per_word < 2.2, pieces_per_word  # 2.03 measured


def test_dataset_input_gives_the_same_vocabulary(sst2_train):
    texts = sst2_train[:300]
    dataset = tf.data.Dataset.from_tensor_slices(texts).batch(64)
    from_list = train_wordpiece_vocabulary(texts, vocabulary_size=300, min_count=2)
    assert train_wordpiece_vocabulary(dataset, vocabulary_size=300, min_count=2) == from_list
