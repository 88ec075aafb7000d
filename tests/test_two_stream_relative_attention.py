import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.layers.two_stream_relative_attention import TwoStreamRelativeAttention
from keras_attn.layers.xlnet_block import XLNetBlock
from tests.layer_test_case import run_layer_test

B, T, M, D, H = 2, 4, 3, 8, 2


def _data(seed=0):
    rng = np.random.default_rng(seed)
    order = [rng.permutation(T) for _ in range(B)]
    rank = np.argsort(np.stack(order), axis=-1)  # (B, T)
    return dict(
        h=rng.normal(size=(B, T, D)).astype("float32"),
        g=rng.normal(size=(B, 2, D)).astype("float32"),
        memory=rng.normal(size=(B, M, D)).astype("float32"),
        mask=rank[:, None, :] < rank[:, :, None],  # (B, T, T): j before i
        segments=np.array([[0, 0, 1, 1], [1, 0, 0, 1]], "int32"),
        mapping=np.eye(T, dtype="float32")[np.stack(order)[:, -2:]],  # (B, 2, T)
    )


def _sinusoid(r, d):
    inv_freq = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    return np.concatenate([np.sin(r * inv_freq), np.cos(r * inv_freq)])


def _naive(layer, x, keys, visible, segments, position):
    """One query `x` (d,) at sequence position `position`, looping over its visible
    keys only: no mask, no relative shift (Yang et al., 2019, §2.3, §2.5)."""
    w = {v.path.split("/")[-2] + "/" + v.path.split("/")[-1]: keras.ops.convert_to_numpy(v)
         for v in layer.weights}
    att = {v.name: keras.ops.convert_to_numpy(v) for v in layer.weights}
    q = np.einsum("d,dhk->hk", x, w["query/kernel"])
    k = np.einsum("sd,dhk->shk", keys, w["key/kernel"])
    v = np.einsum("sd,dhk->shk", keys, w["value/kernel"])
    memory_length = keys.shape[0] - T
    key_segments = np.concatenate([np.zeros(memory_length, int), segments])
    scores, values = [], []
    for j in np.flatnonzero(visible):
        rel = np.einsum("d,dhk->hk", _sinusoid(memory_length + position - j, D),
                        w["position/kernel"])
        seg = att["segment_embedding"][int(key_segments[j] != segments[position])]
        score = ((q + att["content_bias"]) * k[j]).sum(-1) + (
            (q + att["position_bias"]) * rel).sum(-1) + ((q + att["segment_bias"]) * seg).sum(-1)
        scores.append(score / np.sqrt(layer.key_dim))
        values.append(v[j])
    scores = np.stack(scores)  # (n, H)
    p = np.exp(scores - scores.max(0)) / np.exp(scores - scores.max(0)).sum(0)
    out = np.einsum("nh,nhk->hk", p, np.stack(values))
    return np.einsum("hk,hkd->d", out, w["attention_output/kernel"])


def test_both_streams_equal_a_naive_loop_over_visible_keys():
    data = _data()
    layer = TwoStreamRelativeAttention(num_heads=H, key_dim=4, use_bias=False,
                                       bias_initializer="random_normal")
    content, query = layer(data["h"], query_stream=data["g"], memory=data["memory"],
                           attention_mask=data["mask"], segment_ids=data["segments"],
                           target_mapping=data["mapping"])
    for b in range(B):
        keys = np.concatenate([data["memory"][b], data["h"][b]])
        for i in range(T):
            visible = np.concatenate([np.ones(M, bool), data["mask"][b, i]])
            visible_self = visible.copy()
            visible_self[M + i] = True
            expected = _naive(layer, data["h"][b, i], keys, visible_self,
                              data["segments"][b], i)
            np.testing.assert_allclose(content[b, i], expected, atol=1e-5)
        for p in range(2):
            i = int(np.argmax(data["mapping"][b, p]))
            visible = np.concatenate([np.ones(M, bool), data["mask"][b, i]])
            expected = _naive(layer, data["g"][b, p], keys, visible, data["segments"][b], i)
            np.testing.assert_allclose(query[b, p], expected, atol=1e-5)


def test_layer_test_case_content_stream():
    data = _data()
    run_layer_test(
        TwoStreamRelativeAttention, dict(num_heads=H, key_dim=4, use_bias=False),
        {"inputs": data["h"], "memory": data["memory"],
         "attention_mask": data["mask"], "segment_ids": data["segments"]},
        expected_output_shape=(B, T, D),
    )


def test_layer_test_case_block_with_query_stream():
    data = _data()
    run_layer_test(
        XLNetBlock, dict(num_heads=H, intermediate_dim=16),
        {"inputs": data["h"], "query_stream": data["g"], "memory": data["memory"],
         "attention_mask": data["mask"], "segment_ids": data["segments"],
         "target_mapping": data["mapping"]},
        expected_output_shape=(B, T, D),
    )


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="uses tf.GradientTape")
def test_memory_gets_no_gradient():
    data = _data()
    layer = TwoStreamRelativeAttention(num_heads=H, key_dim=4)
    memory = tf.constant(data["memory"])
    with tf.GradientTape() as tape:
        tape.watch(memory)
        out = layer(data["h"], memory=memory)
    assert tape.gradient(out, memory) is None


@pytest.mark.parametrize("memory_shape", [(B, M), (B, M, D + 2)])
def test_bad_memory_is_named(memory_shape):
    layer = TwoStreamRelativeAttention(num_heads=H, key_dim=4)
    with pytest.raises(ValueError, match="memory.shape"):
        layer(np.zeros((B, T, D), "float32"), memory=np.zeros(memory_shape, "float32"))


def test_bad_attention_mask_is_named():
    layer = TwoStreamRelativeAttention(num_heads=H, key_dim=4)
    with pytest.raises(ValueError, match="attention_mask.shape"):
        layer(np.zeros((B, T, D), "float32"), attention_mask=np.ones((B, T), bool))
