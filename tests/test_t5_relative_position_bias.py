import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.t5_relative_position_bias import T5RelativePositionBias
from keras_attn.layers.t5_relative_position_bias import relative_position_bucket
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 8)).astype("float32")


def reference_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """Port of mesh_tensorflow.transformer `_relative_position_bucket` (T5), one scalar."""
    ret = 0
    n = -relative_position
    if bidirectional:
        num_buckets //= 2
        ret += int(n < 0) * num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    # tf.to_float / tf.log / tf.to_int32 in the reference: float32, truncation toward 0.
    val_if_large = max_exact + int(
        np.float32(np.log(np.float32(n) / np.float32(max_exact)))
        / np.float32(math.log(max_distance / max_exact))
        * np.float32(num_buckets - max_exact)
    )
    return ret + min(val_if_large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_buckets_equal_t5_reference(bidirectional, num_buckets, max_distance):
    rel = np.arange(-300, 301)
    ours = ops.convert_to_numpy(
        relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    )
    expected = [reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    np.testing.assert_array_equal(ours, expected)
    assert ours.min() >= 0 and ours.max() == num_buckets - 1


def test_bucket_landmarks_t5_defaults():
    # Bidirectional: 16 buckets per direction, exact for n = 0..7, then
    # bucket = 8 + floor(8 * log(n / 8) / log(128 / 8)) = 8 + floor(2 log2(n / 8)).
    rel = np.array([0, -1, -7, -8, -11, -12, -16, -90, -91, -5000, 1, 7, 8, 5000])
    bi = ops.convert_to_numpy(relative_position_bucket(rel, True, 32, 128))
    np.testing.assert_array_equal(bi, [0, 1, 7, 8, 8, 9, 10, 14, 15, 15, 17, 23, 24, 31])
    # Causal: exact for n = 0..15, then 16 + floor((16 / 3) log2(n / 16)); keys after the
    # query all share bucket 0.
    rel = np.array([0, -15, -16, -32, -127, -128, -5000, 1, 50])
    uni = ops.convert_to_numpy(relative_position_bucket(rel, False, 32, 128))
    np.testing.assert_array_equal(uni, [0, 15, 16, 21, 31, 31, 31, 0, 0])


def test_bias_is_a_gather_of_the_weight_table():
    layer = T5RelativePositionBias(num_heads=3, num_buckets=8, max_distance=10)
    layer.build((None, None, 8))
    table = RNG.normal(size=(8, 3)).astype("float32")
    layer.set_weights([table])
    query, key = np.zeros((1, 4, 2)), np.zeros((1, 9, 2))
    for start in (None, 0, 2):
        bias = ops.convert_to_numpy(layer(query, key=key, query_start_index=start))
        assert bias.shape == (1, 3, 4, 9)
        pos0 = 9 - 4 if start is None else start
        for h in range(3):
            for i in range(4):
                for j in range(9):
                    bucket = reference_bucket(j - (pos0 + i), True, 8, 10)
                    assert bias[0, h, i, j] == table[bucket, h]


def test_weight_name_shape_and_default_initializer():
    layer = T5RelativePositionBias(num_heads=2)
    layer(X)
    assert [w.name for w in layer.weights] == ["relative_attention_bias"]
    assert tuple(layer.relative_attention_bias.shape) == (32, 2)
    assert isinstance(layer.embeddings_initializer, keras.initializers.GlorotUniform)


def numpy_mha_with_bias(layer, x, bias, causal):
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, "float64") for w in layer.get_weights()]
    _, T, _ = x.shape
    H, dk = wq.shape[1], wq.shape[2]
    heads = []
    for h in range(H):
        q, k, v = x @ wq[:, h] + bq[h], x @ wk[:, h] + bk[h], x @ wv[:, h] + bv[h]
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dk) + bias[:, h]  # (B, T, T)
        if causal:
            scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append(probs / probs.sum(-1, keepdims=True) @ v)  # (B, T, dv)
    return np.concatenate(heads, -1) @ wo.reshape(-1, wo.shape[-1]) + bo


@pytest.mark.parametrize("bidirectional", [True, False])
def test_multi_head_attention_with_t5_bias_equals_numpy(bidirectional):
    rel_bias = T5RelativePositionBias(
        num_heads=2, num_buckets=8, max_distance=16, bidirectional=bidirectional
    )
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    bias = rel_bias(X)
    out = mha(X, attention_bias=bias, use_causal_mask=not bidirectional)
    table = ops.convert_to_numpy(rel_bias.relative_attention_bias)
    expected_bias = np.zeros((1, 2, 5, 5))
    for i in range(5):
        for j in range(5):
            expected_bias[0, :, i, j] = table[reference_bucket(j - i, bidirectional, 8, 16)]
    expected = numpy_mha_with_bias(mha, X, expected_bias, causal=not bidirectional)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)


def test_kv_cache_decoding_equals_full_sequence():
    rel_bias = T5RelativePositionBias(num_heads=2, bidirectional=False)
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    full = ops.convert_to_numpy(mha(X, attention_bias=rel_bias(X), use_causal_mask=True))
    cache = ops.zeros((2, 2, 5, 2, 4))
    steps = []
    for t in range(5):
        bias = rel_bias(X[:, t:t + 1], key=cache[:, 0], query_start_index=t)
        out, cache = mha(X[:, t:t + 1], cache=cache, cache_update_index=t,
                         attention_bias=bias, use_causal_mask=True)
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="Received: num_heads=0"):
        T5RelativePositionBias(num_heads=0)
    with pytest.raises(ValueError, match="Received: num_buckets=2"):
        T5RelativePositionBias(num_heads=2, num_buckets=2)
    with pytest.raises(ValueError, match="Received: max_distance=8"):
        T5RelativePositionBias(num_heads=2, num_buckets=32, max_distance=8)


def test_layer_test_case():
    # Batch 1: the bias has a batch axis of 1, and the fit step pairs it with the inputs.
    run_layer_test(
        T5RelativePositionBias,
        {"num_heads": 2, "num_buckets": 8, "max_distance": 16},
        X[:1],
        expected_output_shape=(1, 2, 5, 5),
    )


def test_layer_test_case_causal_with_key():
    run_layer_test(
        T5RelativePositionBias,
        {"num_heads": 2, "num_buckets": 8, "max_distance": 16, "bidirectional": False},
        {"query": X[:1, :3], "key": X[:1]},
        expected_output_shape=(1, 2, 3, 5),
    )
