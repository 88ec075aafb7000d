import itertools
import math
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.masked_sparse_categorical_crossentropy import (
    MaskedSparseCategoricalCrossentropy,
)
from keras_attn.models.seq2seq_transformer import SEQ2SEQ_TRANSFORMER_PRESETS
from keras_attn.models.seq2seq_transformer import Seq2SeqTransformer
from keras_attn.models.seq2seq_transformer import make_teacher_forcing_batch

PAD, BOS, EOS = 0, 1, 2


def tiny_model(vocabulary_size=13, num_layers=1, **kwargs):
    kwargs = {
        "num_heads": 2, "hidden_dim": 16, "intermediate_dim": 32, "dropout": 0.0, **kwargs
    }
    return Seq2SeqTransformer(vocabulary_size=vocabulary_size, num_layers=num_layers, **kwargs)


def parameter_count(vocabulary_size, num_layers, hidden_dim, intermediate_dim, **unused):
    """Independent count: shared embedding, N encoder and N decoder post-LN blocks."""
    d, f = hidden_dim, intermediate_dim
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    feedforward = d * f + f + f * d + d
    layer_norm = 2 * d
    encoder_layer = attention + feedforward + 2 * layer_norm
    decoder_layer = 2 * attention + feedforward + 3 * layer_norm
    return vocabulary_size * d + num_layers * (encoder_layer + decoder_layer)


def sinusoids(length, dim):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), Vaswani §3.5."""
    pos = np.arange(length)[:, None]
    i = np.arange(dim)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / dim)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


def reverse_task(n, seed, max_length=5):
    """Digit strings (ids 3..12) of length 3..max_length; target = reversed + EOS."""
    rng = np.random.default_rng(seed)
    source = np.zeros((n, max_length), "int32")
    target = np.zeros((n, max_length + 1), "int32")
    for row in range(n):
        length = rng.integers(3, max_length + 1)
        digits = rng.integers(3, 13, length)
        source[row, :length] = digits
        target[row, :length] = digits[::-1]
        target[row, length] = EOS
    return source, target


def log_probs_of(model, source, decoder_tokens):
    """Teacher-forced log p(y_t | BOS, y_<t, x) of `decoder_tokens` (no padding mask on
    the decoder: generated pad tokens are ordinary inputs during decoding)."""
    decoder_tokens = np.asarray(decoder_tokens, "int32")
    decoder_in = np.concatenate(
        [np.full((len(decoder_tokens), 1), BOS, "int32"), decoder_tokens[:, :-1]], axis=1
    )
    logits = ops.convert_to_numpy(model({
        "encoder_token_ids": source,
        "encoder_padding_mask": (source != PAD).astype("int32"),
        "decoder_token_ids": decoder_in,
        "decoder_padding_mask": np.ones_like(decoder_in),
    })).astype("float64")
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return np.take_along_axis(log_probs, decoder_tokens[..., None], axis=-1)[..., 0]


def hypothesis_score(token_log_probs, tokens, length_penalty):
    """sum log p up to and including the first EOS, / L ** length_penalty."""
    stops = np.flatnonzero(tokens == EOS)
    length = stops[0] + 1 if len(stops) else len(tokens)
    return token_log_probs[:length].sum() / length**length_penalty


# === Construction, embeddings, parameter counts ===


def test_teacher_forcing_batch_shifts_target_behind_bos():
    inputs, labels = make_teacher_forcing_batch(
        np.array([[5, 6, 7, 0], [8, 0, 0, 0]]), np.array([[9, 10, 2, 0], [11, 2, 0, 0]]),
        bos_token_id=BOS,
    )
    numpy = {k: ops.convert_to_numpy(v).tolist() for k, v in inputs.items()}
    assert numpy["encoder_token_ids"] == [[5, 6, 7, 0], [8, 0, 0, 0]]
    assert numpy["encoder_padding_mask"] == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert numpy["decoder_token_ids"] == [[1, 9, 10, 2], [1, 11, 2, 0]]
    assert numpy["decoder_padding_mask"] == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert ops.convert_to_numpy(labels).tolist() == [[9, 10, 2, 0], [11, 2, 0, 0]]


def test_one_shared_embedding_scaled_with_sinusoids_and_tied_to_logits():
    model = tiny_model()
    tables = [w for w in model.weights if tuple(w.shape) == (13, 16)]
    assert len(tables) == 1  # source, target and pre-softmax share one matrix
    table = ops.convert_to_numpy(tables[0])
    inputs, _ = make_teacher_forcing_batch(
        np.array([[5, 6, 7, 0]]), np.array([[8, 9, 10, 2, 0]]), bos_token_id=BOS
    )
    probe = keras.Model(model.inputs, {
        "encoder_embedded": model.get_layer("encoder_embedding_dropout").output,
        "decoder_embedded": model.get_layer("decoder_embedding_dropout").output,
        "decoder_output": model.get_layer("decoder_layer_0").output,
        "logits": model.output,
    })
    out = {k: ops.convert_to_numpy(v) for k, v in probe(inputs).items()}
    for name, ids in (("encoder_embedded", [5, 6, 7, 0]), ("decoder_embedded", [1, 8, 9, 10, 2])):
        expected = math.sqrt(16) * table[ids] + sinusoids(len(ids), 16)
        np.testing.assert_allclose(out[name][0], expected, atol=1e-5)
    np.testing.assert_allclose(out["logits"], out["decoder_output"] @ table.T, atol=1e-5)


def test_parameter_count_matches_formula_on_a_built_model():
    model = tiny_model(vocabulary_size=37, num_layers=2, hidden_dim=24, num_heads=4,
                       intermediate_dim=40)
    assert model.count_params() == parameter_count(37, 2, 24, 40)


def test_transformer_base_has_65m_parameters():
    # Vaswani et al. (2017), Table 3: base 65M, big 213M parameters.
    base = SEQ2SEQ_TRANSFORMER_PRESETS["transformer_base"]
    expected = parameter_count(**base)
    assert expected == 63_082_496
    assert abs(expected - 65e6) / 65e6 < 0.03
    assert abs(parameter_count(**SEQ2SEQ_TRANSFORMER_PRESETS["transformer_big"]) - 213e6) < (
        0.03 * 213e6
    )
    model = Seq2SeqTransformer.from_preset("transformer_base")
    assert model.count_params() == expected
    assert len(model.encoder_layers) == len(model.decoder_layers) == 6
    assert model.decoder_layers[0].dropout == 0.1


def test_config_round_trip_and_keras_save_load(tmp_path):
    model = tiny_model(vocabulary_size=11, dropout=0.1, fused_qkv=True)
    restored = Seq2SeqTransformer.from_config(model.get_config())
    assert restored.get_config() == model.get_config()
    source = np.array([[5, 6, 7, 0]])
    inputs, _ = make_teacher_forcing_batch(source, np.array([[8, 9, 2]]), bos_token_id=BOS)
    path = os.path.join(tmp_path, "seq2seq.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, Seq2SeqTransformer)
    np.testing.assert_allclose(
        ops.convert_to_numpy(loaded(inputs)), ops.convert_to_numpy(model(inputs)), atol=1e-6
    )
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=4)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded.greedy_decode(source, **kwargs)),
        ops.convert_to_numpy(model.greedy_decode(source, **kwargs)),
    )


# === Incremental decoding ===


def padded_translation(model):
    """A padded source and target batch: `(source, inputs, teacher-forced logits, decoder
    ids)`."""
    source = np.array([[5, 6, 7, 8, 0, 0], [9, 4, 0, 0, 0, 0]], "int32")
    target = np.array([[8, 7, 6, 5, 2], [4, 9, 2, 0, 0]], "int32")
    inputs, _ = make_teacher_forcing_batch(source, target, bos_token_id=BOS)
    full = ops.convert_to_numpy(model(inputs))  # (B, T, V)
    return source, inputs, full, ops.convert_to_numpy(inputs["decoder_token_ids"])


def test_cached_steps_equal_teacher_forced_logits_with_padded_source():
    model = tiny_model(vocabulary_size=17, num_layers=2)
    source, inputs, full, decoder_in = padded_translation(model)
    cache = model.initial_decoding_cache(source, source != PAD, max_length=5)
    assert tuple(cache["self_attention_cache"].shape) == (2, 2, 2, 5, 2, 8)
    assert tuple(cache["cross_attention_cache"].shape) == (2, 2, 2, 6, 2, 8)
    # Prefill with two tokens, then one token per call.
    logits, cache = model.next_token_logits(decoder_in[:, :2], cache, 0)
    steps = [full[:, 0], ops.convert_to_numpy(logits)]
    for t in range(2, 5):
        logits, cache = model.next_token_logits(decoder_in[:, t : t + 1], cache, t)
        steps.append(ops.convert_to_numpy(logits))
    steps = np.stack(steps, axis=1)
    real = ops.convert_to_numpy(inputs["decoder_padding_mask"]).astype(bool)
    np.testing.assert_allclose(steps[:, 1:][real[:, 1:]], full[:, 1:][real[:, 1:]], atol=2e-5)


def test_greedy_decode_equals_argmax_of_full_forward_passes():
    model = tiny_model(vocabulary_size=9, num_layers=2)
    source = np.array([[5, 6, 7, 8], [3, 4, 0, 0]], "int32")
    decoded = ops.convert_to_numpy(
        model.greedy_decode(source, bos_token_id=BOS, max_new_tokens=5)
    )
    # Reference without any cache: re-run the whole decoder on the prefix every step.
    prefix = np.full((2, 1), BOS, "int32")
    for _ in range(5):
        logits = ops.convert_to_numpy(model({
            "encoder_token_ids": source,
            "encoder_padding_mask": (source != PAD).astype("int32"),
            "decoder_token_ids": prefix,
            "decoder_padding_mask": np.ones_like(prefix),
        }))
        prefix = np.concatenate([prefix, logits[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(decoded, prefix[:, 1:])


def test_the_encoder_and_decoder_step_models_decode_as_the_model_does():
    """`encoder_model` and `decoder_step_model` (the two halves a fixed-shape file runs,
    the caches as tensors in and out) give the model's teacher-forced logits step by
    step on a padded source; the step's blocks are copies with the model's weights."""
    model = tiny_model(vocabulary_size=17, num_layers=2)
    source, inputs, full, decoder_in = padded_translation(model)
    encoder = model.encoder_model()
    encoder_outputs = ops.convert_to_numpy(encoder(
        {"encoder_token_ids": source, "encoder_padding_mask": source != PAD}))
    np.testing.assert_allclose(encoder_outputs, ops.convert_to_numpy(
        model.encode(source, source != PAD)), atol=1e-6)
    step = model.decoder_step_model(max_length=6)
    assert not set(map(id, step.weights)) & set(map(id, model.decoder_layers[0].weights))
    cache, logits = np.zeros((2, 2, 2, 6, 2, 8), "float32"), []
    for t in range(5):
        out = step({"decoder_token_ids": decoder_in[:, t:t + 1],
                    "cache_update_index": np.full((2,), t, "int32"),
                    "self_attention_cache": cache, "encoder_outputs": encoder_outputs,
                    "encoder_padding_mask": (source != PAD).astype("int32")})
        cache = ops.convert_to_numpy(out["self_attention_cache"])
        logits.append(ops.convert_to_numpy(out["logits"]))
    real = ops.convert_to_numpy(inputs["decoder_padding_mask"]).astype(bool)
    np.testing.assert_allclose(np.stack(logits, axis=1)[real], full[real], atol=2e-5)
    with pytest.raises(ValueError, match="max_length"):
        model.decoder_step_model(max_length=0)


def test_exhaustive_beam_search_finds_the_best_hypothesis():
    vocabulary, new_tokens = 5, 3
    model = tiny_model(vocabulary_size=vocabulary, hidden_dim=8, intermediate_dim=16)
    source = np.array([[3, 4, 3]], "int32")
    tokens, scores = model.beam_search(
        source, bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=new_tokens,
        num_beams=vocabulary ** (new_tokens - 1), length_penalty=1.0,
    )
    candidates = np.array(list(itertools.product(range(vocabulary), repeat=new_tokens)))
    log_probs = log_probs_of(model, np.repeat(source, len(candidates), 0), candidates)
    brute = [hypothesis_score(lp, c, 1.0) for lp, c in zip(log_probs, candidates)]
    best = candidates[int(np.argmax(brute))].copy()
    stops = np.flatnonzero(best == EOS)
    if len(stops):
        best[stops[0] + 1 :] = PAD
    np.testing.assert_array_equal(ops.convert_to_numpy(tokens)[0], best)
    np.testing.assert_allclose(ops.convert_to_numpy(scores)[0], max(brute), atol=1e-4)


def test_source_padding_does_not_change_decoding():
    model = tiny_model(vocabulary_size=13, num_layers=2)
    source = np.array([[5, 6, 7], [8, 9, 0]], "int32")
    padded = np.concatenate([source, np.zeros((2, 4), "int32")], axis=1)
    logits = []
    for src in (source, padded):
        cache = model.initial_decoding_cache(src, src != PAD, max_length=2)
        step, cache = model.next_token_logits(np.full((2, 1), BOS), cache, 0)
        step_2, _ = model.next_token_logits(np.array([[4], [5]]), cache, 1)
        logits.append(np.stack([ops.convert_to_numpy(step), ops.convert_to_numpy(step_2)]))
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=6)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(model.greedy_decode(source, **kwargs)),
        ops.convert_to_numpy(model.greedy_decode(padded, **kwargs)),
    )


# === Learning a task ===


@pytest.fixture(scope="module")
def reverse_model():
    keras.utils.set_random_seed(0)
    source, target = reverse_task(1600, seed=0)
    inputs, labels = make_teacher_forcing_batch(source, target, bos_token_id=BOS)
    model = tiny_model(vocabulary_size=13, hidden_dim=32, intermediate_dim=64)
    model.compile(keras.optimizers.Adam(3e-3), loss=MaskedSparseCategoricalCrossentropy(
        ignore_class=PAD, label_smoothing=0.1))
    history = model.fit(inputs, labels, batch_size=64, epochs=14, verbose=0)
    return model, history.history["loss"]


def test_learns_to_reverse_and_decodes_held_out_strings(reverse_model):
    model, losses = reverse_model
    # With eps = 0.1 over V = 13 classes the loss cannot go below the entropy of q.
    q = np.full(13, 0.1 / 13)
    q[0] += 0.9
    floor = -(q * np.log(q)).sum()
    assert losses[0] > 1.5 and losses[-1] < floor + 0.15, (losses, floor)
    source, target = reverse_task(40, seed=1)  # held out (different seed)
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=6)
    greedy = ops.convert_to_numpy(model.greedy_decode(source, **kwargs))
    assert (greedy == target).all(axis=1).mean() >= 0.95
    beam, beam_scores = model.beam_search(source, num_beams=3, **kwargs)
    assert (ops.convert_to_numpy(beam) == target).all(axis=1).mean() >= 0.95
    one_beam, _ = model.beam_search(source, num_beams=1, **kwargs)
    np.testing.assert_array_equal(ops.convert_to_numpy(one_beam), greedy)
    # The beam's best hypothesis scores at least as well as the greedy one.
    greedy_scores = [
        hypothesis_score(lp, g, 1.0)
        for lp, g in zip(log_probs_of(model, source, greedy), greedy)
    ]
    assert np.all(ops.convert_to_numpy(beam_scores) >= np.array(greedy_scores) - 1e-4)


def test_trained_model_decoding_ignores_extra_source_padding(reverse_model):
    model, _ = reverse_model
    source, target = reverse_task(10, seed=2)
    padded = np.concatenate([source, np.zeros((10, 5), "int32")], axis=1)
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=6, num_beams=2)
    tokens, scores = model.beam_search(source, **kwargs)
    padded_tokens, padded_scores = model.beam_search(padded, **kwargs)
    np.testing.assert_array_equal(ops.convert_to_numpy(tokens), ops.convert_to_numpy(padded_tokens))
    np.testing.assert_allclose(
        ops.convert_to_numpy(scores), ops.convert_to_numpy(padded_scores), atol=1e-5
    )


def test_beam_search_with_the_cache_equals_beam_search_without_it(reverse_model):
    # Without the cache every step reruns the whole model on the source and the prefix
    # (`use_cache=False`): the same tokens, and scores equal up to rounding.
    model, _ = reverse_model
    source, _ = reverse_task(12, seed=3)
    source[::3, -2:] = PAD  # shorter sources, padded
    kwargs = dict(bos_token_id=BOS, eos_token_id=EOS, max_new_tokens=6)
    for num_beams in (1, 4):
        cached, cached_scores = model.beam_search(source, num_beams=num_beams, **kwargs)
        full, full_scores = model.beam_search(source, num_beams=num_beams, use_cache=False,
                                              **kwargs)
        np.testing.assert_array_equal(ops.convert_to_numpy(cached), ops.convert_to_numpy(full))
        np.testing.assert_allclose(ops.convert_to_numpy(cached_scores),
                                   ops.convert_to_numpy(full_scores), atol=1e-4)
    greedy = model.greedy_decode(source, use_cache=False, **kwargs)
    np.testing.assert_array_equal(ops.convert_to_numpy(greedy),
                                  ops.convert_to_numpy(model.greedy_decode(source, **kwargs)))


# === Errors ===


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="hidden_dim.*divisible by `num_heads`"):
        tiny_model(hidden_dim=10, num_heads=4)
    with pytest.raises(ValueError, match="num_layers"):
        tiny_model(num_layers=0)
    with pytest.raises(ValueError, match="Unknown Seq2SeqTransformer preset.*name='base'"):
        Seq2SeqTransformer.from_preset("base")
    with pytest.raises(ValueError, match="bos_token_id.*differ from `pad_token_id`"):
        make_teacher_forcing_batch(np.ones((1, 2)), np.ones((1, 2)), bos_token_id=0)
    model = tiny_model()
    with pytest.raises(ValueError, match=r"eos_token_id.*\[0, vocabulary_size\).*"
                                         r"Received: eos_token_id=13, vocabulary_size=13"):
        model.greedy_decode(np.array([[3]]), bos_token_id=BOS, eos_token_id=13,
                            max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.greedy_decode(np.array([[3]]), bos_token_id=BOS, max_new_tokens=0)
    with pytest.raises(ValueError, match="encoder_token_ids.*shape=\\(3,\\)"):
        model.beam_search(np.array([3, 4, 5]), bos_token_id=BOS, max_new_tokens=2)


def test_mixed_precision_matches_float32():
    model = tiny_model(vocabulary_size=12)
    half = tiny_model(vocabulary_size=12, dtype="mixed_bfloat16")
    half.set_weights(model.get_weights())
    inputs, _ = make_teacher_forcing_batch(
        np.array([[5, 6, 7, 0]]), np.array([[7, 6, 5, 2]]), bos_token_id=BOS
    )
    expected = ops.convert_to_numpy(model(inputs))
    actual = ops.convert_to_numpy(ops.cast(half(inputs), "float32"))
    assert np.abs(actual - expected).max() < 0.05 * np.abs(expected).max()
    tokens = half.greedy_decode(np.array([[5, 6, 7]]), bos_token_id=BOS, max_new_tokens=3)
    assert tuple(tokens.shape) == (1, 3)
