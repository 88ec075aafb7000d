"""CharacterTokenizer: ids of characters and UTF-8 bytes, unknowns, saving, errors."""

import numpy as np
import pytest

from keras_attn.text.character_tokenizer import CharacterTokenizer
from keras_attn.text.errors import DataError
from keras_attn.training.tasks.causal_lm_task import read_character_text

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow


def test_characters_sorted_after_pad_and_unknown():
    tokenizer = CharacterTokenizer.from_texts(["to be\n", "or not"], "characters")
    assert tokenizer.get_vocabulary()[:3] == ["[PAD]", "[UNK]", "\n"]
    symbols = tokenizer.get_vocabulary()
    ids = tokenizer.encode("not to be?\n")
    expected = [symbols.index(c) if c in symbols else 1 for c in "not to be?\n"]
    assert ids.tolist() == expected
    assert ids[-2] == 1  # "?" is not in the training text
    assert tokenizer.decode(ids) == "not to be\ufffd\n"


def test_characters_beyond_the_basic_plane():
    tokenizer = CharacterTokenizer.from_texts(["a\U0001F600é"], "characters")
    ids = tokenizer.encode("é\U0001F600a\U0001F601")
    assert tokenizer.decode(ids[:3]) == "é\U0001F600a"
    assert ids[3] == 1


def test_bytes_are_utf8_plus_one():
    tokenizer = CharacterTokenizer("bytes")
    assert tokenizer.vocabulary_size() == 257
    text = "Hamlet: é!"
    ids = tokenizer.encode(text)
    np.testing.assert_array_equal(ids, np.frombuffer(text.encode("utf-8"), np.uint8) + 1)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("kind", ["characters", "bytes"])
def test_save_and_load(tmp_path, kind):
    tokenizer = CharacterTokenizer.from_texts(["line one\nline two\n"], kind)
    tokenizer.save(tmp_path)
    loaded = CharacterTokenizer.load(tmp_path)
    assert loaded.get_vocabulary() == tokenizer.get_vocabulary()
    assert loaded.encode("one\ntwo").tolist() == tokenizer.encode("one\ntwo").tolist()


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="kind=.words"):
        CharacterTokenizer("words")
    with pytest.raises(ValueError, match="distinct one-character"):
        CharacterTokenizer("characters", ["a", "a"])
    (tmp_path / "characters.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="not a character vocabulary"):
        CharacterTokenizer.load(tmp_path)


def test_character_text_keeps_layout_and_reports_bad_files(tmp_path):
    path = tmp_path / "play.txt"
    path.write_bytes(b"ACT I.\n\n  Enter Ghost.   \r\n")
    assert read_character_text(path) == "ACT I.\n\n  Enter Ghost.\n"
    path.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DataError, match=r"play.txt:1: the file holds no text"):
        read_character_text(path)
    path.write_bytes(b"fine\n\xff bad\n")  # the WordPiece path's reader and error
    with pytest.raises(DataError, match=r"play.txt:2: invalid UTF-8"):
        read_character_text(path)
