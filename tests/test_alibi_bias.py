import math

import numpy as np
import pytest
from keras import ops

from keras_attn.layers.alibi_bias import AlibiBias
from keras_attn.layers.alibi_bias import alibi_slopes
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 8)).astype("float32")


def official_get_slopes(n):
    """Port of `get_slopes` from the ALiBi release (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + official_get_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


def reference_bias(slopes, T, S, start):
    bias = np.zeros((1, len(slopes), T, S))
    for h, m in enumerate(slopes):
        for i in range(T):
            for j in range(S):
                bias[0, h, i, j] = -m * abs(start + i - j)
    return bias


def numpy_causal_mha_with_bias(layer, x, bias):
    """softmax(Q_h K_h^T / sqrt(d_k) + bias_h + M_causal) V_h, heads concatenated, W^O."""
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w, "float64") for w in layer.get_weights()]
    _, T, _ = x.shape
    H, dk = wq.shape[1], wq.shape[2]
    heads = []
    for h in range(H):
        q, k, v = x @ wq[:, h] + bq[h], x @ wk[:, h] + bk[h], x @ wv[:, h] + bv[h]
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dk) + bias[:, h]  # (B, T, T)
        for i in range(T):
            for j in range(i + 1, T):
                scores[:, i, j] = -np.inf
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append(probs / probs.sum(-1, keepdims=True) @ v)  # (B, T, dv)
    return np.concatenate(heads, -1) @ wo.reshape(-1, wo.shape[-1]) + bo


def test_slopes_for_eight_heads():
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-k for k in range(1, 9)], rtol=1e-12)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 6, 12, 16, 24])
def test_slopes_equal_the_official_get_slopes(num_heads):
    np.testing.assert_allclose(alibi_slopes(num_heads), official_get_slopes(num_heads),
                               rtol=1e-12)


def test_slopes_for_six_and_twelve_heads_by_value():
    # 4 heads: 2^-2, 2^-4, 2^-6, 2^-8; then every other slope of 8 heads: 2^-1, 2^-3.
    np.testing.assert_allclose(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])
    eight = [2.0**-k for k in range(1, 9)]
    sixteen = [2.0 ** (-k / 2) for k in range(1, 17)]
    np.testing.assert_allclose(alibi_slopes(12), eight + sixteen[0::2][:4])


def test_bias_equals_loops_self_attention():
    bias = ops.convert_to_numpy(AlibiBias(num_heads=4)(X))
    assert bias.shape == (1, 4, 5, 5)
    np.testing.assert_allclose(bias, reference_bias(official_get_slopes(4), 5, 5, 0), atol=1e-6)


def test_bias_default_aligns_queries_with_the_end_of_the_keys():
    query, key = np.zeros((1, 3, 2)), np.zeros((1, 7, 2))
    bias = ops.convert_to_numpy(AlibiBias(num_heads=3)(query, key=key))
    np.testing.assert_allclose(bias, reference_bias(official_get_slopes(3), 3, 7, 4), atol=1e-6)
    bias = AlibiBias(num_heads=3)(query, key=key, query_start_index=1)
    np.testing.assert_allclose(
        ops.convert_to_numpy(bias), reference_bias(official_get_slopes(3), 3, 7, 1), atol=1e-6
    )


def test_causal_alibi_multi_head_attention_equals_numpy():
    for num_heads in (1, 2):
        mha = MultiHeadAttention(num_heads=num_heads, key_dim=4)
        bias = AlibiBias(num_heads=num_heads)(X)
        out = mha(X, attention_bias=bias, use_causal_mask=True)
        expected = numpy_causal_mha_with_bias(mha, X, reference_bias(
            official_get_slopes(num_heads), 5, 5, 0))
        np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-5)


def test_bias_changes_the_output():
    # Guards the test above against a bias that is silently ignored.
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    with_bias = mha(X, attention_bias=AlibiBias(num_heads=2)(X), use_causal_mask=True)
    without = mha(X, use_causal_mask=True)
    assert np.max(np.abs(ops.convert_to_numpy(with_bias) - ops.convert_to_numpy(without))) > 1e-3


def test_kv_cache_decoding_equals_full_sequence():
    mha = MultiHeadAttention(num_heads=2, key_dim=4)
    alibi = AlibiBias(num_heads=2)
    full = ops.convert_to_numpy(mha(X, attention_bias=alibi(X), use_causal_mask=True))
    cache = ops.zeros((2, 2, 5, 2, 4))  # (B, 2, S_max, H, dk)
    steps = []
    for t in range(5):
        q_step = X[:, t:t + 1]
        bias = alibi(q_step, key=cache[:, 0], query_start_index=t)  # (1, H, 1, S_max)
        out, cache = mha(
            q_step, cache=cache, cache_update_index=t, attention_bias=bias,
            use_causal_mask=True,
        )
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_invalid_num_heads():
    with pytest.raises(ValueError, match="Received: num_heads=0"):
        AlibiBias(num_heads=0)


def test_layer_test_case():
    out = run_layer_test(
        AlibiBias, {"num_heads": 4}, X, expected_output_shape=(1, 4, 5, 5), run_fit=False,
    )
    np.testing.assert_allclose(out, reference_bias(official_get_slopes(4), 5, 5, 0), atol=1e-6)


def test_layer_test_case_with_key():
    run_layer_test(
        AlibiBias, {"num_heads": 2},
        {"query": X[:, :3], "key": X},
        expected_output_shape=(1, 2, 3, 5), run_fit=False,
    )
