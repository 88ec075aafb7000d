import math
import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.models.transformer_xl_lm import TRANSFORMER_XL_PRESETS
from keras_attn.models.transformer_xl_lm import TransformerXLLM


def tiny_model(vocabulary_size=20, num_layers=2, memory_length=4, **kwargs):
    kwargs = {"num_heads": 2, "hidden_dim": 16, "intermediate_dim": 32, "dropout": 0.0, **kwargs}
    return TransformerXLLM(
        vocabulary_size=vocabulary_size, num_layers=num_layers, memory_length=memory_length,
        **kwargs,
    )


def parameter_count(vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
                    tie_embeddings=True, **unused):
    """Independent count of the model: embedding (+ untied output), L XL layers."""
    d, f = hidden_dim, intermediate_dim
    attention = 4 * (d * d + d)  # W_q, W_{k,E}, W_v, W_o with biases
    relative = d * d + 2 * d  # W_{k,R} (no bias) and the biases u, v (heads x d_k)
    feedforward = d * f + f + f * d + d
    layer = attention + relative + feedforward + 2 * 2 * d  # two LayerNorms
    embeddings = vocabulary_size * d * (1 if tie_embeddings else 2)
    return embeddings + num_layers * layer


def run(model, token_ids, state):
    out = model({"token_ids": np.asarray(token_ids, "int32"), **state})
    return {k: ops.convert_to_numpy(v) for k, v in out.items()}


# === Memory bookkeeping and segment recurrence ===


def test_memory_outputs_are_the_last_states_each_layer_received():
    model = tiny_model(memory_length=3)
    tokens = np.array([[3, 4, 5, 6, 7]])
    out = run(model, tokens[:, :2], model.initial_memory(1))
    # Layer 0 remembers its input h^0 = sqrt(d) W_emb[x] (no dropout at inference).
    table = ops.convert_to_numpy(model.token_embedding.embeddings)
    np.testing.assert_allclose(out["memory"][0, 0, 1:], math.sqrt(16) * table[[3, 4]], atol=1e-5)
    np.testing.assert_array_equal(out["memory_padding_mask"], [[0, 1, 1]])
    out_2 = run(model, tokens[:, 2:], {k: out[k] for k in ("memory", "memory_padding_mask")})
    np.testing.assert_allclose(out_2["memory"][0, 0], math.sqrt(16) * table[[5, 6, 7]], atol=1e-5)
    np.testing.assert_array_equal(out_2["memory_padding_mask"], [[1, 1, 1]])
    # Layer 1 remembers layer 0's outputs: the same as a probe of the one-pass graph.
    probe = keras.Model(model.inputs, model.get_layer("transformer_xl_layer_0").output[0])
    hidden = ops.convert_to_numpy(probe({"token_ids": tokens, **model.initial_memory(1, 0)}))
    np.testing.assert_allclose(out_2["memory"][0, 1], hidden[0, 2:], atol=1e-5)


def test_segments_with_enough_memory_equal_one_pass():
    model = tiny_model(memory_length=4)  # trained memory length M = T = 4
    tokens = np.random.default_rng(0).integers(0, 20, (2, 12)).astype("int32")
    one_pass = model.predict_segments(tokens, segment_length=12, memory_length=0)
    # Evaluation with a longer memory than training: M = 8 covers the whole past.
    long_memory = model.predict_segments(tokens, segment_length=4, memory_length=8)
    np.testing.assert_allclose(long_memory, one_pass, atol=2e-5)
    np.testing.assert_allclose(
        model.predict_segments(tokens, segment_length=4, memory_length=20), one_pass, atol=2e-5
    )
    # With M = 4, segment 2 still sees all of its past, segment 3 only part of it.
    short = model.predict_segments(tokens, segment_length=4)
    np.testing.assert_allclose(short[:, :8], one_pass[:, :8], atol=2e-5)
    assert np.abs(short[:, 8:] - one_pass[:, 8:]).max() > 1e-2


def test_memory_changes_predictions_across_the_segment_boundary():
    model = tiny_model()
    tokens = np.random.default_rng(1).integers(0, 20, (2, 8)).astype("int32")
    with_memory = model.predict_segments(tokens, segment_length=4)
    without = model.predict_segments(tokens, segment_length=4, memory_length=0)
    np.testing.assert_allclose(with_memory[:, :4], without[:, :4], atol=1e-5)  # first segment
    assert np.abs(with_memory[:, 4:] - without[:, 4:]).min(axis=-1).max() > 1e-3
    # A masked memory is no memory: a fresh empty memory of any length changes nothing.
    fresh = run(model, tokens[:, 4:], model.initial_memory(2, memory_length=6))["logits"]
    np.testing.assert_allclose(fresh, without[:, 4:], atol=1e-5)


def copy_streams(rng, batch, examples, segment_length, vocabulary_size):
    """Streams of examples [a, a]: every second segment repeats the one before it."""
    a = rng.integers(0, vocabulary_size, (batch, examples, segment_length))
    streams = np.concatenate([a, a], axis=2).reshape(batch, -1)
    tail = rng.integers(0, vocabulary_size, (batch, 1))
    return np.concatenate([streams, tail], axis=1).astype("int32")


def test_memory_solves_a_copy_task_across_segments():
    keras.utils.set_random_seed(0)
    segment, vocabulary = 8, 16
    model = TransformerXLLM(
        vocabulary_size=vocabulary, num_layers=1, num_heads=2, hidden_dim=32,
        intermediate_dim=64, memory_length=segment, dropout=0.0,
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        loss={"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
    )
    rng = np.random.default_rng(0)
    for _ in range(18):
        losses = model.train_on_segments(copy_streams(rng, 32, 8, segment, vocabulary), segment)
    assert len(losses) == 16
    test = copy_streams(np.random.default_rng(7), 16, 4, segment, vocabulary)
    labels = test[:, 1:]
    # Positions of the repeating segments whose next token is a copy from the memory.
    copied = np.zeros(labels.shape, bool)
    for k in range(4):
        copied[:, 2 * k * segment + segment : 2 * k * segment + 2 * segment - 1] = True

    def accuracy(memory_length):
        logits = model.predict_segments(test[:, :-1], segment, memory_length=memory_length)
        return (logits.argmax(-1) == labels)[copied].mean()

    with_memory, without_memory = accuracy(segment), accuracy(0)
    assert with_memory > 0.9 and without_memory < 0.25, (with_memory, without_memory)
    assert accuracy(3 * segment) > 0.9  # a longer memory than in training still works
    assert np.mean(losses[1::2]) < 0.6 * np.mean(losses[0::2])


@pytest.mark.tensorflow
def test_train_on_segments_updates_weights_without_gradient_into_memory():
    import tensorflow as tf  # the gradient check needs a tape

    model = tiny_model(dropout=0.1)
    model.compile("sgd", loss={"logits": keras.losses.SparseCategoricalCrossentropy(True)})
    before = [ops.convert_to_numpy(w).copy() for w in model.trainable_weights]
    tokens = np.random.default_rng(2).integers(0, 20, (2, 10))
    losses = model.train_on_segments(tokens, segment_length=4)
    # 9 inputs = 4 + 4 + 1: the shorter last segment makes Keras retrace with an unknown
    # segment length and a known memory length.
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert any(
        not np.allclose(b, ops.convert_to_numpy(w)) for b, w in zip(before, model.trainable_weights)
    )
    memory = keras.ops.convert_to_tensor(np.ones((1, 2, 3, 16), "float32"))
    with tf.GradientTape() as tape:
        tape.watch(memory)
        out = model({"token_ids": ops.array([[3, 4]], "int32"), "memory": memory,
                     "memory_padding_mask": ops.ones((1, 3), "int32")})
        total = ops.sum(out["logits"]) + ops.sum(out["memory"])
    gradient = tape.gradient(total, memory)
    assert gradient is None or float(ops.max(ops.abs(gradient))) == 0.0


# === Sizes, options, saving ===


def test_parameter_counts():
    for kwargs in (dict(), dict(tie_embeddings=False), dict(num_layers=3, num_heads=4)):
        model = tiny_model(**kwargs)
        config = {**dict(vocabulary_size=20, num_layers=2, num_heads=2, hidden_dim=16,
                         intermediate_dim=32), **kwargs}
        assert model.count_params() == parameter_count(**config), kwargs
    # Dai et al. (2019), Table 2: the 12-layer enwik8 Transformer-XL has 41M parameters.
    enwik8 = parameter_count(**TRANSFORMER_XL_PRESETS["transformer_xl_enwik8_12l"])
    assert abs(enwik8 - 41e6) / 41e6 < 0.03


def test_untied_output_projection_and_pre_ln():
    tokens = np.array([[3, 4, 5]], "int32")
    tied = tiny_model()
    untied = tiny_model(tie_embeddings=False)
    assert len(untied.token_embedding.weights) == 2 and len(tied.token_embedding.weights) == 1
    pre_ln = tiny_model(norm_first=True)
    logits = run(pre_ln, tokens, pre_ln.initial_memory(1))["logits"]
    assert pre_ln.get_layer("final_layer_norm") is not None and np.isfinite(logits).all()
    one_pass = pre_ln.predict_segments(np.tile(tokens, (1, 2)), 6, memory_length=0)
    segments = pre_ln.predict_segments(np.tile(tokens, (1, 2)), 3, memory_length=3)
    np.testing.assert_allclose(segments, one_pass, atol=2e-5)


def test_config_round_trip_and_keras_save_load(tmp_path):
    model = tiny_model(dropout=0.1, tie_embeddings=False, memory_length=5)
    restored = TransformerXLLM.from_config(model.get_config())
    assert restored.get_config() == model.get_config()
    path = os.path.join(tmp_path, "xl.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded, TransformerXLLM) and loaded.memory_length == 5
    tokens = np.random.default_rng(3).integers(0, 20, (2, 6)).astype("int32")
    state = {"memory": np.random.default_rng(4).normal(size=(2, 2, 5, 16)).astype("float32"),
             "memory_padding_mask": np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], "int32")}
    expected, actual = run(model, tokens, state), run(loaded, tokens, state)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], atol=1e-6)


def test_invalid_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="memory_length"):
        tiny_model(memory_length=0)
    with pytest.raises(ValueError, match="hidden_dim.*even"):
        tiny_model(hidden_dim=9, num_heads=1)
    with pytest.raises(ValueError, match="divisible by `num_heads`"):
        tiny_model(hidden_dim=18, num_heads=4)
    with pytest.raises(ValueError, match="Unknown TransformerXLLM preset"):
        TransformerXLLM.from_preset("xl_large")
    model = tiny_model()
    with pytest.raises(ValueError, match="memory_length.*>= 0.*memory_length=-1"):
        model.initial_memory(1, memory_length=-1)
    with pytest.raises(ValueError, match=r"token_ids.*shape=\(5,\)"):
        model.predict_segments(np.arange(5), segment_length=2)
    with pytest.raises(ValueError, match="length >= 2"):
        model.train_on_segments(np.array([[3]]), segment_length=2)
    with pytest.raises(ValueError, match="segment_length"):
        model.predict_segments(np.array([[3, 4]]), segment_length=0)


def test_mixed_precision_matches_float32():
    model = tiny_model()
    half = tiny_model(dtype="mixed_bfloat16")
    half.set_weights(model.get_weights())
    tokens = np.random.default_rng(5).integers(0, 20, (1, 8))
    expected = model.predict_segments(tokens, 4)
    actual = half.predict_segments(tokens, 4).astype("float32")
    assert np.abs(actual - expected).max() < 0.05 * np.abs(expected).max()


@pytest.mark.tensorflow
def test_exports_with_memory_as_explicit_inputs_and_outputs(tmp_path):
    import tensorflow as tf

    model = tiny_model(num_layers=1)
    signature = {
        "token_ids": tf.TensorSpec((1, 4), tf.int32),
        "memory": tf.TensorSpec((1, 1, 4, 16), tf.float32),
        "memory_padding_mask": tf.TensorSpec((1, 4), tf.int32),
    }
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", lambda inputs: model(inputs), input_signature=[signature])
    archive.write_out(str(tmp_path / "xl"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "xl"))
    tokens = np.random.default_rng(6).integers(0, 20, (1, 8)).astype("int32")
    state = {k: tf.constant(v) for k, v in model.initial_memory(1).items()}
    logits = []
    for start in (0, 4):
        out = served.serve({"token_ids": tf.constant(tokens[:, start : start + 4]), **state})
        state = {"memory": out["memory"], "memory_padding_mask": out["memory_padding_mask"]}
        logits.append(out["logits"].numpy())
    np.testing.assert_allclose(
        np.concatenate(logits, axis=1), model.predict_segments(tokens, 4), atol=1e-5
    )
