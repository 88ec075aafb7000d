"""TextGenerator and TextCodec on a scripted model (its next token is a fixed table of the
last one): stop tokens end the text and are not in it, the streamed pieces add up to the
returned text, a UTF-8 character split over byte tokens is streamed whole, lengths that do
not fit are refused."""

import keras
import numpy as np
import pytest

from keras_attn.text.character_tokenizer import CharacterTokenizer
from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text_generation import GenerationError
from keras_attn.text_generation import TextCodec
from keras_attn.text_generation import TextGenerator

pytestmark = pytest.mark.tensorflow  # streaming reads each step eagerly; tf-text


class ScriptedModel:
    """`next(v) = table[v]` as one-hot logits; the cache counts the calls."""

    def __init__(self, table):
        self.table = keras.ops.one_hot(keras.ops.array(table), len(table))
        self.calls = []

    def build_cache(self, batch_size, max_length):
        return keras.ops.zeros((batch_size, 1))

    def next_token_logits(self, token_ids, cache, index):
        self.calls.append(int(token_ids.shape[1]))
        return keras.ops.take(self.table, token_ids[:, -1], axis=0), cache + 1


def bytes_generator(text, max_length=32):
    """A bytes model that spells `text` after its first byte, then repeats the last one."""
    codec = TextCodec(CharacterTokenizer("bytes"))
    ids = codec.encode(text).tolist()
    table = list(range(257))
    for a, b in zip(ids, ids[1:]):
        table[a] = b
    return TextGenerator(ScriptedModel(table), codec, max_length), ids


def test_streamed_pieces_add_up_and_keep_multibyte_characters_whole():
    generator, ids = bytes_generator("aé€ z")  # é: 2 bytes, €: 3 bytes
    pieces = []
    text = generator.generate("a", max_new_tokens=len(ids) - 1, on_text=pieces.append)
    assert text == "é€ z"
    assert "".join(pieces) == text
    assert pieces == ["é", "€", " ", "z"]  # never half a character
    assert generator.model.calls[0] == 1  # the prompt once, then one token a step


def test_wordpiece_text_stops_at_the_end_of_text_token():
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat"]
    codec = TextCodec(WordPieceTokenizer(vocabulary))
    table = list(range(len(vocabulary)))
    table[5], table[6], table[7], table[8], table[3] = 6, 7, 8, 3, 5  # the cats sat [SEP]
    generator = TextGenerator(ScriptedModel(table), codec, 16)
    pieces = []
    assert generator.generate("the", on_text=pieces.append) == "cats sat"
    assert "".join(pieces).strip() == "cats sat"
    assert generator.generate_ids(codec.encode("the"), 10) == [6, 7, 8]
    assert codec.stop_token_ids == (3,)


def test_codec_round_trips_its_vocabulary_file():
    tokenizer = CharacterTokenizer.from_texts(["naïve text\n"], "characters")
    codec = TextCodec(tokenizer)
    again = TextCodec.from_files({codec.vocabulary_file: codec.vocabulary_bytes()},
                                 "characters")
    assert again.tokenizer.get_vocabulary() == tokenizer.get_vocabulary()
    assert again.decode(again.encode("text naïve\n")) == "text naïve\n"
    assert codec.vocabulary_file == "characters.json"


@pytest.mark.parametrize("prompt, new, message", [
    ("", 1, "prompt is empty"),
    ("a" * 8, 1, "shorten the prompt"),
    ("a", 8, "ask for at most 7"),
    ("a", 0, "max_new_tokens"),
])
def test_lengths_that_do_not_fit_are_refused(prompt, new, message):
    generator, _ = bytes_generator("ab", max_length=8)
    with pytest.raises((GenerationError, ValueError), match=message):
        generator.generate(prompt, new)


def test_sampling_with_a_seed_repeats():
    rng = np.random.default_rng(0)
    codec = TextCodec(CharacterTokenizer.from_texts(["abcdef"], "characters"))
    logits = keras.ops.array(rng.normal(size=(8, 8)).astype("float32"))

    class Noisy(ScriptedModel):
        def next_token_logits(self, token_ids, cache, index):
            return keras.ops.take(logits, token_ids[:, -1], axis=0), cache

    generator = TextGenerator(Noisy(list(range(8))), codec, 32)
    first = generator.generate("ab", 20, sampler="sample", seed=4)
    assert generator.generate("ab", 20, sampler="sample", seed=4) == first
    assert len({generator.generate("ab", 20, sampler="sample", seed=s) for s in range(4)}) > 1
