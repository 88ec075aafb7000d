import numpy as np
import pytest
from keras import ops

from keras_attn.layers.shaw_relative_attention import ShawRelativeAttention
from keras_attn.layers.shaw_relative_attention import clipped_relative_positions
from tests.layer_test_case import assert_implicit_mask_matches_explicit
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 6, 8)).astype("float32")
ENC = RNG.normal(size=(2, 7, 8)).astype("float32")
PADDING = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
CAUSAL = np.tril(np.ones((6, 6), bool))[None]


def numpy_shaw(layer, query, value=None, mask=None, query_start_index=None):
    """Shaw et al. (2018) eqs. (3)-(4) per batch, head, i and j, with the layer's weights."""
    value = query if value is None else value
    w = lambda v: np.asarray(v).astype("float64")  # noqa: E731
    wq, bq = w(layer.query_dense.kernel), w(layer.query_dense.bias)  # (d, H, dk), (H, dk)
    wk, bk = w(layer.key_dense.kernel), w(layer.key_dense.bias)
    wv, bv = w(layer.value_dense.kernel), w(layer.value_dense.bias)
    wo, bo = w(layer.output_dense.kernel), w(layer.output_dense.bias)  # (H, dv, d_out)
    table_k = w(layer.relative_key_embeddings)  # (2k+1, dk)
    table_v = w(layer.relative_value_embeddings)  # (2k+1, dv)
    k_max = layer.max_relative_position
    B, T, _ = query.shape
    S = value.shape[1]
    start = S - T if query_start_index is None else query_start_index
    H, dk = wq.shape[1], wq.shape[2]
    out = np.zeros((B, T, wo.shape[-1]))
    for b in range(B):
        for h in range(H):
            q = query[b] @ wq[:, h] + bq[h]  # (T, dk)
            k = value[b] @ wk[:, h] + bk[h]  # (S, dk)
            v = value[b] @ wv[:, h] + bv[h]  # (S, dv)
            for i in range(T):
                e = np.full(S, -np.inf)
                for j in range(S):
                    if mask is not None and not mask[b, i, j]:
                        continue
                    r = max(-k_max, min(k_max, j - (start + i)))  # clip(j - i, k)
                    e[j] = q[i] @ (k[j] + table_k[r + k_max]) / np.sqrt(dk)
                alpha = np.exp(e - e.max())
                alpha /= alpha.sum()
                z = np.zeros(v.shape[-1])
                for j in range(S):
                    r = max(-k_max, min(k_max, j - (start + i)))
                    z += alpha[j] * (v[j] + table_v[r + k_max])
                out[b, i] += z @ wo[h]
    return out + bo


def built_layer(**kwargs):
    layer = ShawRelativeAttention(
        **{"num_heads": 2, "key_dim": 4, "max_relative_position": 2, **kwargs}
    )
    layer(X)
    # Random (not initial) values everywhere, so every term of the formula matters.
    layer.set_weights([RNG.normal(size=w.shape).astype("float32") * 0.5 for w in layer.weights])
    return layer


def test_equals_numpy_formula_self_attention():
    layer = built_layer(value_dim=3)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(X)), numpy_shaw(layer, X), atol=1e-5)


def test_equals_numpy_formula_with_padding_mask():
    layer = built_layer()
    expected = numpy_shaw(layer, X, mask=np.broadcast_to(PADDING[:, None, :], (2, 6, 6)))
    actual = layer(X, padding_mask=PADDING)
    np.testing.assert_allclose(ops.convert_to_numpy(actual), expected, atol=1e-5)


def test_equals_numpy_formula_with_causal_mask():
    layer = built_layer()
    expected = numpy_shaw(layer, X, mask=np.broadcast_to(CAUSAL, (2, 6, 6)))
    actual = layer(X, use_causal_mask=True)
    np.testing.assert_allclose(ops.convert_to_numpy(actual), expected, atol=1e-5)


def test_equals_numpy_formula_cross_attention_aligned_to_the_end():
    layer = built_layer()
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(X, ENC)), numpy_shaw(layer, X, ENC), atol=1e-5
    )


def test_clipping_with_k_1_uses_three_distinct_rows():
    layer = built_layer(max_relative_position=1)
    indices = ops.convert_to_numpy(clipped_relative_positions(6, 6, 1))
    i, j = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    np.testing.assert_array_equal(indices, np.clip(j - i, -1, 1) + 1)
    relative_keys, relative_values = layer.relative_embeddings(6, 6)
    for table, weights in [
        (relative_keys, layer.relative_key_embeddings),
        (relative_values, layer.relative_value_embeddings),
    ]:
        table, weights = ops.convert_to_numpy(table), ops.convert_to_numpy(weights)
        assert table.shape[:2] == (6, 6)
        assert len(np.unique(table.reshape(36, -1), axis=0)) == 3
        np.testing.assert_array_equal(table[0, 5], weights[2])  # j - i = 5 -> +k
        np.testing.assert_array_equal(table[5, 0], weights[0])  # j - i = -5 -> -k
        np.testing.assert_array_equal(table[3, 3], weights[1])
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(X)), numpy_shaw(layer, X), atol=1e-5
    )


def test_shifting_the_sequence_does_not_change_its_outputs():
    # Only distances j - i enter the formula: the same 4 tokens placed after 2 masked-out
    # junk tokens (absolute positions 2..5 instead of 0..3) give the same outputs.
    layer = built_layer()
    junk = RNG.normal(size=(2, 2, 8)).astype("float32")
    shifted = np.concatenate([junk, X[:, :4]], axis=1)  # (B, 6, d)
    window = np.ones((2, 6, 6), bool)
    window[:, :, :2] = False
    expected = ops.convert_to_numpy(layer(X[:, :4]))
    actual = ops.convert_to_numpy(layer(shifted, attention_mask=window))[:, 2:]
    np.testing.assert_allclose(actual, expected, atol=1e-5)


@pytest.mark.parametrize("prefill", [1, 3])
def test_cached_decoding_equals_full_causal_pass(prefill):
    layer = built_layer()
    full = ops.convert_to_numpy(layer(X, use_causal_mask=True))
    cache = np.zeros((2, 2, 6, 2, 4), "float32")
    outputs = []
    out, cache = layer(X[:, :prefill], cache=cache, cache_update_index=0, use_causal_mask=True)
    outputs.append(ops.convert_to_numpy(out))
    for t in range(prefill, 6):
        out, cache = layer(X[:, t : t + 1], cache=cache, cache_update_index=t)
        outputs.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


def test_dropout_is_applied_to_both_value_terms_only_in_training():
    layer = built_layer(dropout=0.5, seed=1)
    inference = ops.convert_to_numpy(layer(X, training=False))
    np.testing.assert_allclose(inference, numpy_shaw(layer, X), atol=1e-5)
    assert not np.allclose(ops.convert_to_numpy(layer(X, training=True)), inference)


def test_shared_layer_checks():
    init = {"num_heads": 2, "key_dim": 4, "max_relative_position": 2}
    run_layer_test(
        ShawRelativeAttention, init, X, call_kwargs={"use_causal_mask": True},
        expected_output_shape=(2, 6, 8),
    )
    run_layer_test(
        ShawRelativeAttention, {**init, "value_dim": 3, "output_dim": 5},
        {"query": X, "padding_mask": PADDING}, expected_output_shape=(2, 6, 5),
    )
    assert_implicit_mask_matches_explicit(ShawRelativeAttention(**init), X, PADDING)


def test_weights_and_config():
    layer = built_layer(value_dim=3)
    assert tuple(layer.relative_key_embeddings.shape) == (5, 4)
    assert tuple(layer.relative_value_embeddings.shape) == (5, 3)
    assert "relative_key_embeddings" in layer.relative_key_embeddings.path
    config = layer.get_config()
    assert config["max_relative_position"] == 2 and config["value_dim"] == 3
    assert ShawRelativeAttention.from_config(config).get_config() == config


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_max_relative_position_must_be_positive_int(bad):
    with pytest.raises(ValueError, match=f"Received: max_relative_position={bad}"):
        ShawRelativeAttention(num_heads=2, key_dim=4, max_relative_position=bad)
