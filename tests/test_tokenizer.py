"""WordPieceTokenizer on tiny vocabularies: ids against a brute-force Python WordPiece,
offsets, packing and truncation by hand, saving/export without the vocab file."""

import os
import random

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401 - registers the tf-text ops a loaded SavedModel needs

from keras_attn.text.tokenizer import WordPieceTokenizer
from keras_attn.text.vocabulary import save_vocabulary

# keras_attn.text is TensorFlow code (tf-text, tf.data) whatever the Keras backend.
pytestmark = pytest.mark.tensorflow

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + [
    "the",
    "cat",
    "sat",
    "##s",
    "on",
    "mat",
    ".",
    ",",
    "un",
    "##aff",
    "##able",
    "##affable",
    "cafe",
    "café",
    "Café",
    "Cafe",
    "The",
    "東",
    "京",
    "ca",
    "##t",
]
ID = {token: index for index, token in enumerate(VOCAB)}


def ids(*tokens):
    return [ID[token] for token in tokens]


def test_greedy_longest_match_first():
    tokenizer = WordPieceTokenizer(VOCAB)
    got = tokenizer.tokenize(["The cats sat on the mat.", "unaffable", "unaff", "dog"]).to_list()
    assert got == [
        ids("the", "cat", "##s", "sat", "on", "the", "mat", "."),
        ids("un", "##affable"),  # "##affable" wins over "##aff" "##able": longest first
        ids("un", "##aff"),
        ids("[UNK]"),
    ]


def reference_wordpiece(text, vocab):
    """BERT's algorithm for ASCII text, written from the paper's description."""
    words = []
    for chunk in text.split():
        word = ""
        for char in chunk:
            if char in ".,!":
                words += [word, char] if word else [char]
                word = ""
            else:
                word += char
        if word:
            words.append(word)
    output = []
    for word in words:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = ("##" if start else "") + word[start:end]
                if piece in vocab:
                    break
                end -= 1
            if end == start:
                pieces = ["[UNK]"]
                break
            pieces.append(piece)
            start = end
        output += pieces
    return [vocab[piece] for piece in output]


def test_matches_brute_force_wordpiece_on_random_text():
    rng = random.Random(0)
    letters = "abc"
    pieces = {"".join(rng.choice(letters) for _ in range(rng.randint(1, 3))) for _ in range(12)}
    tokens = SPECIALS + sorted(pieces) + sorted("##" + p for p in pieces if rng.random() < 0.7)
    tokens += [".", ",", "!"]
    tokens = list(dict.fromkeys(tokens))
    vocab = {token: index for index, token in enumerate(tokens)}
    texts = [
        "".join(rng.choice("abc   .,!") for _ in range(rng.randint(0, 30))) for _ in range(300)
    ]
    got = WordPieceTokenizer(tokens).tokenize(texts).to_list()
    for text, row in zip(texts, got):
        assert row == reference_wordpiece(text, vocab), text


@pytest.mark.parametrize(
    "lowercase, strip_accents, expected",
    [
        (True, None, ["cafe", "the", "cafe"]),  # BERT uncased
        (False, None, ["Café", "The", "cafe"]),  # BERT cased: nothing changes
        (True, False, ["café", "the", "cafe"]),
        (False, True, ["Cafe", "The", "cafe"]),
    ],
)
def test_cased_and_uncased_modes(lowercase, strip_accents, expected):
    tokenizer = WordPieceTokenizer(VOCAB, lowercase=lowercase, strip_accents=strip_accents)
    assert tokenizer.tokenize(["Café The cafe"]).to_list() == [ids(*expected)]
    assert tokenizer.get_config()["strip_accents"] == strip_accents


def test_offsets_are_characters_of_the_original_text():
    tokenizer = WordPieceTokenizer(VOCAB)
    text = "Çà CAFÉ 東京, the cats"
    token_ids, starts, ends = tokenizer.tokenize_with_offsets([text])
    spans = [text[s:e] for s, e in zip(starts[0].numpy(), ends[0].numpy())]
    tokens = [VOCAB[i] for i in token_ids[0].numpy()]
    assert tokens == ["ca", "cafe", "東", "京", ",", "the", "cat", "##s"]
    assert spans == ["Çà", "CAFÉ", "東", "京", ",", "the", "cat", "s"]


def test_offsets_in_mixed_modes_and_decomposed_input():
    # Lowercase-only lowers character by character, NFD-strip removes marks: the spans still
    # point at the original characters. As in HF `tokenizers`, a removed mark belongs to no
    # piece: the decomposed "e\u0301" spans "e" once the accent is stripped, while the
    # precomposed "É" is one character and stays whole.
    text = "CAFÉ e\u0301 The"
    expected = {(True, False): "e\u0301", (False, True): "e", (True, True): "e"}
    for (lowercase, strip_accents), accented in expected.items():
        tokenizer = WordPieceTokenizer(VOCAB, lowercase=lowercase, strip_accents=strip_accents)
        _, starts, ends = tokenizer.tokenize_with_offsets(text)
        spans = [text[s:e] for s, e in zip(starts.numpy(), ends.numpy())]
        assert spans[0] == "CAFÉ" and spans[-1] == "The", (lowercase, strip_accents)
        assert "".join(spans[1:-1]) == accented, (lowercase, strip_accents, spans)


def test_tokenize_words_per_word_pieces():
    tokenizer = WordPieceTokenizer(VOCAB)
    words = tf.ragged.constant([["The", "cats", "sat."], ["\u200b", "mat"], []])
    got = tokenizer.tokenize_words(words)
    assert got.shape.rank == 3
    assert got.to_list() == [
        [ids("the"), ids("cat", "##s"), ids("sat", ".")],
        [[], ids("mat")],  # a zero-width space is removed: the word has no pieces
        [],
    ]
    assert tokenizer.tokenize_words([["the", "mat"]]).to_list() == [[ids("the"), ids("mat")]]
    dense = tokenizer.tokenize_words(tf.constant([["the", "mat"], ["cat", ""]]))
    assert dense.to_list() == [[ids("the"), ids("mat")], [ids("cat"), []]]


def test_pack_single_and_pair_by_hand():
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=8)
    out = tokenizer(["the cats", "the cats sat on the mat ."], return_num_truncated=True)
    cls, sep = ID["[CLS]"], ID["[SEP]"]
    np.testing.assert_array_equal(
        out["token_ids"],
        [
            [cls] + ids("the", "cat", "##s") + [sep, 0, 0, 0],
            [cls] + ids("the", "cat", "##s", "sat", "on", "the") + [sep],
        ],
    )
    np.testing.assert_array_equal(out["segment_ids"], np.zeros((2, 8)))
    np.testing.assert_array_equal(out["padding_mask"], [[1] * 5 + [0] * 3, [1] * 8])
    np.testing.assert_array_equal(out["num_truncated"], [0, 2])
    assert out["token_ids"].dtype == tf.int32 and out["padding_mask"].dtype == tf.bool

    pair = tokenizer(["the cat"], text_pairs=["on the mat"])
    np.testing.assert_array_equal(
        pair["token_ids"], [[cls] + ids("the", "cat") + [sep] + ids("on", "the", "mat") + [sep]]
    )
    np.testing.assert_array_equal(pair["segment_ids"], [[0, 0, 0, 0, 1, 1, 1, 1]])
    assert "num_truncated" not in pair


@pytest.mark.parametrize(
    "truncation, first_lengths, second_lengths, expected",
    [
        # budget 9 - 3 = 6. longest_first: cut the longer until both fit; if both exceed
        # half, 3 and 3 (odd budgets give the extra to the longer, or to the second on ties).
        ("longest_first", [5, 2, 7, 4], [3, 7, 7, 2], [(3, 3), (2, 4), (3, 3), (4, 2)]),
        ("only_first", [5, 6], [3, 1], [(3, 3), (5, 1)]),
        ("only_second", [1, 3], [7, 4], [(1, 5), (3, 3)]),
    ],
)
def test_truncation_strategies(truncation, first_lengths, second_lengths, expected):
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=9, truncation=truncation)
    firsts = [" ".join(["cat"] * n) for n in first_lengths]
    seconds = [" ".join(["mat"] * n) for n in second_lengths]
    out = tokenizer(firsts, seconds, return_num_truncated=True)
    kept = [
        (int(np.sum(row == ID["cat"])), int(np.sum(row == ID["mat"])))
        for row in out["token_ids"].numpy()
    ]
    assert kept == expected
    want_cut = [a + b - ka - kb for a, b, (ka, kb) in zip(first_lengths, second_lengths, expected)]
    np.testing.assert_array_equal(out["num_truncated"], want_cut)


def test_odd_budget_longest_first_gives_extra_token_to_longer_segment():
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=8)  # budget 5
    out = tokenizer(["cat cat cat cat", "cat cat cat"], ["mat mat mat", "mat mat mat"])
    kept = [(int(np.sum(r == ID["cat"])), int(np.sum(r == ID["mat"]))) for r in out["token_ids"]]
    assert kept == [(3, 2), (2, 3)]


def test_only_second_that_cannot_fit_raises():
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=6, truncation="only_second")
    with pytest.raises(ValueError, match=r"second segment is too short.*Examples \[1\]"):
        tokenizer(["cat", "cat cat cat cat"], ["mat", "mat"])
    traced = tf.function(lambda a, b: tokenizer(a, b))
    with pytest.raises(tf.errors.InvalidArgumentError, match="second segment is too short"):
        traced(tf.constant(["cat cat cat cat"]), tf.constant(["mat"]))


def test_scalar_input_and_vocabulary_api(tmp_path):
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=5)
    out = tokenizer("the cat")
    assert tuple(out["token_ids"].shape) == (5,)
    assert tokenizer.tokenize("the cats").numpy().tolist() == ids("the", "cat", "##s")
    assert tokenizer.vocabulary_size() == len(VOCAB)
    assert tokenizer.id_to_token(ID["##s"]) == "##s"
    assert tokenizer.token_to_id("mat") == ID["mat"]
    assert (tokenizer.pad_token_id, tokenizer.unknown_token_id, tokenizer.cls_token_id) == (0, 1, 2)
    assert (tokenizer.sep_token_id, tokenizer.mask_token_id) == (3, 4)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tokenizer.token_to_id("dog")
    with pytest.raises(ValueError, match="Received: id=999"):
        tokenizer.id_to_token(999)


def test_detokenize():
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=10)
    packed = tokenizer(["The cats sat on the mat.", "unaffable"])["token_ids"]
    assert tokenizer.detokenize(packed).numpy().tolist() == [
        b"[CLS] the cats sat on the mat . [SEP]",
        b"[CLS] unaffable [SEP]",
    ]
    assert tokenizer.detokenize(ids("cat", "##s")).numpy() == b"cats"


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="Received: truncation='longest'"):
        WordPieceTokenizer(VOCAB, truncation="longest")
    with pytest.raises(ValueError, match="Received: sequence_length=1"):
        WordPieceTokenizer(VOCAB, sequence_length=1)
    with pytest.raises(ValueError, match="Received: lowercase='yes'"):
        WordPieceTokenizer(VOCAB, lowercase="yes")
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \['\[MASK\]'\]"):
        WordPieceTokenizer([t for t in VOCAB if t != "[MASK]"])
    with pytest.raises(ValueError, match="Received: vocabulary=dict"):
        WordPieceTokenizer({"a": 0})
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        WordPieceTokenizer(str(tmp_path / "missing.txt"))
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=2)
    with pytest.raises(ValueError, match="sequence_length` >= 3"):
        tokenizer(["cat"], ["mat"])
    with pytest.raises(ValueError, match="scalar or 1-D string tensor"):
        tokenizer.tokenize(tf.constant([["cat"]]))
    with pytest.raises(ValueError, match="tokenize_words"):
        tokenizer.tokenize(tf.ragged.constant([["cat"], []]))


def test_tf_function_and_tf_data_match_eager():
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=8)
    texts = ["the cats sat", "on the mat .", "", "unaffable cat"]
    pairs = ["mat", "cat", "the", "sat on"]
    eager = tokenizer(texts, pairs)
    traced = tf.function(lambda a, b: tokenizer(a, b))(tf.constant(texts), tf.constant(pairs))
    dataset = tf.data.Dataset.from_tensor_slices((texts, pairs)).batch(3).map(tokenizer)
    batches = list(dataset)
    for key in eager:
        np.testing.assert_array_equal(traced[key], eager[key])
        np.testing.assert_array_equal(np.concatenate([b[key] for b in batches]), eager[key])
    unbatched = list(tf.data.Dataset.from_tensor_slices(texts).map(tokenizer))
    np.testing.assert_array_equal(
        np.stack([u["token_ids"] for u in unbatched]), tokenizer(texts)["token_ids"]
    )


def test_config_round_trip():
    tokenizer = WordPieceTokenizer(
        VOCAB, lowercase=False, sequence_length=6, truncation="only_first"
    )
    clone = WordPieceTokenizer.from_config(tokenizer.get_config())
    texts = ["The Café cats", "cafe"]
    np.testing.assert_array_equal(clone(texts)["token_ids"], tokenizer(texts)["token_ids"])
    assert clone.get_config() == tokenizer.get_config()


def _string_model(vocab_path):
    tokenizer = WordPieceTokenizer(vocab_path, sequence_length=8)
    texts = keras.Input(shape=(), dtype="string")
    packed = tokenizer(texts)
    hidden = keras.layers.Embedding(len(VOCAB) + 1, 4)(packed["token_ids"])  # (B, 8, 4)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden, mask=packed["padding_mask"])  # (B, 4)
    return keras.Model(texts, pooled)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="string Keras inputs need TF")
def test_keras_file_and_export_work_without_the_vocab_file(tmp_path):
    vocab_path = tmp_path / "vocab.txt"
    save_vocabulary(VOCAB + ["zyzzyvaword"], vocab_path)
    model = _string_model(str(vocab_path))
    texts = tf.constant(["the cats sat", "zyzzyvaword mat"])
    expected = model(texts).numpy()
    model.save(tmp_path / "model.keras")
    model.export(str(tmp_path / "saved_model"), verbose=False)
    os.remove(vocab_path)

    restored = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(restored(texts).numpy(), expected, atol=1e-6)
    served = tf.saved_model.load(str(tmp_path / "saved_model"))
    np.testing.assert_allclose(served.serve(texts).numpy(), expected, atol=1e-6)
    # The vocabulary travels inside the graph (the tf-text model buffers are constants).
    assert b"zyzzyvaword" in (tmp_path / "saved_model" / "saved_model.pb").read_bytes()


def test_tf_module_saved_model(tmp_path):
    tokenizer = WordPieceTokenizer(VOCAB, sequence_length=8)

    class Preprocessor(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = tokenizer

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def __call__(self, texts):
            return tokenizer(texts)

    texts = tf.constant(["the cats", "café on the mat"])
    tf.saved_model.save(Preprocessor(), str(tmp_path / "pre"))
    loaded = tf.saved_model.load(str(tmp_path / "pre"))
    out = loaded(texts)
    for key, value in tokenizer(texts).items():
        np.testing.assert_array_equal(out[key], value)
