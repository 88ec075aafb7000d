import numpy as np
import pytest
from keras import ops

from keras_attn.layers.scaled_dot_product_attention import masked_softmax
from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention


def reference_attention(q, k, v, mask=None, bias=None):
    """softmax(q k^T / sqrt(d_k) + bias + M) v, one (batch, head) at a time with loops."""
    B, T, H, dk = q.shape
    S = k.shape[1]
    out = np.zeros((B, T, H, v.shape[-1]))
    probs = np.zeros((B, H, T, S))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                scores = np.array([q[b, i, h] @ k[b, j, h] / np.sqrt(dk) for j in range(S)])
                if bias is not None:
                    scores = scores + bias[b % bias.shape[0], h % bias.shape[1], i]
                allowed = np.ones(S, bool) if mask is None else mask[b, i]
                if not allowed.any():
                    continue  # a fully masked row attends to nothing
                e = np.where(allowed, np.exp(scores - scores[allowed].max()), 0.0)
                probs[b, h, i] = e / e.sum()
                out[b, i, h] = probs[b, h, i] @ v[b, :, h]
    return out, probs


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    k = rng.normal(size=(2, 5, 2, 4)).astype("float32")
    v = rng.normal(size=(2, 5, 2, 3)).astype("float32")
    return q, k, v


def test_matches_formula(qkv):
    q, k, v = qkv
    out, probs = scaled_dot_product_attention(q, k, v)
    ref_out, ref_probs = reference_attention(q, k, v)
    np.testing.assert_allclose(ops.convert_to_numpy(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), ref_probs, atol=1e-6)


def test_matches_formula_with_mask_and_bias(qkv):
    q, k, v = qkv
    rng = np.random.default_rng(1)
    mask = rng.random((2, 3, 5)) > 0.4
    mask[1, 2] = False  # one fully masked row
    bias = rng.normal(size=(1, 2, 3, 5)).astype("float32")
    out, probs = scaled_dot_product_attention(q, k, v, attention_mask=mask, attention_bias=bias)
    ref_out, ref_probs = reference_attention(q, k, v, mask=mask, bias=bias)
    np.testing.assert_allclose(ops.convert_to_numpy(out), ref_out, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), ref_probs, atol=1e-6)
    assert np.all(ops.convert_to_numpy(probs)[1, :, 2] == 0.0)


def test_custom_scale_and_dropout_callable(qkv):
    q, k, v = qkv
    out, _ = scaled_dot_product_attention(q, k, v, scale=1.0, dropout=lambda p: p * 0.0)
    np.testing.assert_array_equal(ops.convert_to_numpy(out), 0.0)
    _, probs = scaled_dot_product_attention(q, k, v, scale=1.0)
    ref = np.einsum("bthd,bshd->bhts", q, k)
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    np.testing.assert_allclose(
        ops.convert_to_numpy(probs), ref / ref.sum(-1, keepdims=True), atol=1e-6
    )


def test_masked_softmax_half_precision_sums_to_one():
    scores = ops.cast(np.linspace(-30, 30, 24).reshape(2, 12), "float16")
    mask = np.tile([True] * 10 + [False] * 2, (2, 1))
    probs = ops.convert_to_numpy(ops.cast(masked_softmax(scores, mask), "float32"))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-3)
    assert np.all(probs[:, 10:] == 0.0)


def test_single_key_gets_probability_one_without_a_softmax_warning(recwarn):
    scores = np.array([[[2.5], [-1.0]]], "float32")  # (1, T=2, S=1)
    probs = ops.convert_to_numpy(masked_softmax(scores, np.array([[[True], [False]]])))
    np.testing.assert_array_equal(probs, [[[1.0], [0.0]]])
    np.testing.assert_array_equal(ops.convert_to_numpy(masked_softmax(scores)), 1.0)
    assert not [w for w in recwarn if "softmax" in str(w.message)]
