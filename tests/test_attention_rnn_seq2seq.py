"""AttentionRNNSeq2Seq: Bahdanau's additive attention recomputed in numpy from the layer's
weights, incremental decoding equal to the teacher-forced pass, beam search with the cache
equal to beam search without it, save/load, and learning a toy task."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.attention_rnn_seq2seq import AttentionRNNSeq2Seq
from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch

PAD, BOS, EOS = 0, 1, 2


def tiny_model(vocabulary_size=17, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    kwargs = {"embedding_dim": 8, "hidden_dim": 8, "attention_units": 6, "dropout": 0.0,
              **kwargs}
    return AttentionRNNSeq2Seq(vocabulary_size=vocabulary_size, **kwargs)


SOURCE = np.array([[5, 6, 7, 8, 0, 0], [9, 4, 3, 0, 0, 0]], "int32")
TARGET = np.array([[8, 7, 6, 5, 2], [4, 9, 2, 0, 0]], "int32")


def test_alignment_is_the_additive_score_of_bahdanau():
    model = tiny_model()
    cache = model.initial_decoding_cache(SOURCE, SOURCE != PAD, max_length=3)
    decoder = np.array([[BOS, 8, 7], [BOS, 4, 9]], "int32")
    alpha = ops.convert_to_numpy(model.alignment(decoder, cache))  # (B, T, S)
    states = ops.convert_to_numpy(model.get_layer("decoder")(
        model.get_layer("token_embedding")(decoder), initial_state=cache["state"])[0])
    h = ops.convert_to_numpy(cache["encoder_outputs"])  # (B, S, 2H)
    attention = model.get_layer("attention")
    w = ops.convert_to_numpy(attention.kernel)  # (H + 2H, units): rows [:H] act on s_t
    v = ops.convert_to_numpy(attention.score_vector)
    # e_ti = v^T tanh(W_s s_t + W_h h_i); softmax over the real source positions only.
    e = np.tanh((states @ w[:8])[:, :, None] + (h @ w[8:])[:, None]) @ v  # (B, T, S)
    e = np.where((SOURCE != PAD)[:, None], e, -np.inf)
    expected = np.exp(e - e.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(alpha, expected, atol=1e-5)
    assert np.all(alpha[0, :, 4:] == 0) and np.all(alpha[1, :, 3:] == 0)


def test_incremental_decoding_equals_the_teacher_forced_pass():
    model = tiny_model()
    inputs, _ = make_teacher_forcing_batch(SOURCE, TARGET, bos_token_id=BOS)
    full = ops.convert_to_numpy(model(inputs))  # (B, T, V)
    decoder = ops.convert_to_numpy(inputs["decoder_token_ids"])
    cache = model.initial_decoding_cache(SOURCE, SOURCE != PAD, max_length=5)
    steps = []
    for t in range(5):
        logits, cache = model.next_token_logits(decoder[:, t: t + 1], cache, t)
        steps.append(ops.convert_to_numpy(logits))
    real = ops.convert_to_numpy(inputs["decoder_padding_mask"]).astype(bool)
    np.testing.assert_allclose(np.stack(steps, 1)[real], full[real], atol=1e-5)


def test_beam_search_with_the_cache_equals_beam_search_without_it():
    model = tiny_model(vocabulary_size=23, seed=3)
    source = np.random.default_rng(0).integers(3, 23, size=(5, 7)).astype("int32")
    source[1, 4:] = PAD
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=8)
    for num_beams in (1, 4):
        cached, cached_scores = model.beam_search(source, num_beams=num_beams, **kwargs)
        full, full_scores = model.beam_search(source, num_beams=num_beams, use_cache=False,
                                              **kwargs)
        cached = ops.convert_to_numpy(cached)
        assert len(np.unique(cached)) >= 4  # varied hypotheses, not one repeated token
        np.testing.assert_array_equal(cached, ops.convert_to_numpy(full))
        np.testing.assert_allclose(ops.convert_to_numpy(cached_scores),
                                   ops.convert_to_numpy(full_scores), atol=1e-4)


def test_config_round_trip_and_keras_save_load(tmp_path):
    model = tiny_model()
    inputs, _ = make_teacher_forcing_batch(SOURCE, TARGET, bos_token_id=BOS)
    config = model.get_config()
    assert AttentionRNNSeq2Seq.from_config(config).get_config() == config
    model.save(tmp_path / "rnn.keras")
    loaded = keras.saving.load_model(tmp_path / "rnn.keras")
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(inputs)),
                               ops.convert_to_numpy(model(inputs)), atol=1e-6)
    # One embedding matrix for source, target and the output projection.
    assert [w.name for w in model.weights].count("embeddings") == 1


def test_learns_to_reverse_short_strings():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 5, size=800)
    source = np.zeros((800, 5), "int32")
    target = np.zeros((800, 6), "int32")
    for row, length in enumerate(lengths):
        tokens = rng.integers(3, 10, size=length)
        source[row, :length] = tokens
        target[row, : length + 1] = list(tokens[::-1]) + [EOS]
    inputs, labels = make_teacher_forcing_batch(source, target, bos_token_id=BOS)
    model = tiny_model(vocabulary_size=10, embedding_dim=32, hidden_dim=32, attention_units=32)
    model.compile(keras.optimizers.Adam(1e-2),
                  loss=MaskedSparseCategoricalCrossentropy(ignore_class=PAD))
    model.fit(inputs, labels, batch_size=32, epochs=12, verbose=0)
    decoded = ops.convert_to_numpy(model.beam_search(
        source[:50], bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=6, num_beams=3)[0])
    assert (decoded == target[:50]).all(axis=1).mean() >= 0.9


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="hidden_dim"):
        tiny_model(hidden_dim=0)
    with pytest.raises(ValueError, match="dropout"):
        tiny_model(dropout=1.5)
    with pytest.raises(ValueError, match="Unknown AttentionRNNSeq2Seq preset"):
        AttentionRNNSeq2Seq.from_preset("attention_rnn_huge")
