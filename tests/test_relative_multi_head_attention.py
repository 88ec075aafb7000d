import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.relative_multi_head_attention import RelativeMultiHeadAttention
from keras_attn.layers.relative_multi_head_attention import relative_shift
from tests.layer_test_case import assert_implicit_mask_matches_explicit
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
B, T, M, D, H, DK = 2, 4, 3, 8, 2, 4
X = RNG.normal(size=(B, T, D)).astype("float32")
MEMORY = RNG.normal(size=(B, M, D)).astype("float32")
PADDING = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)  # (B, T)


def sinusoid(distance, dim):
    """R_r = [sin(r f_0..f_{d/2-1}), cos(r f_0..)] with f_k = 1 / 10000^(2k/d)."""
    inv_freq = 1.0 / 10000 ** (np.arange(0, dim, 2) / dim)
    return np.concatenate([np.sin(distance * inv_freq), np.cos(distance * inv_freq)])


def naive_relative_attention(layer, x, memory=None, mask=None):
    """Dai et al. (2019), eq. in §3.3, one (b, h, i, j) at a time.

    A_ij = q_i.k_j + q_i.W_{k,R} R_{i-j} + u.k_j + v.W_{k,R} R_{i-j}, divided by
    sqrt(d_k); `mask` is a boolean (B, T, M + T) array. Returns (output, probs).
    """
    w = lambda v: ops.convert_to_numpy(v).astype("float64")  # noqa: E731
    wq, bq = w(layer.query_dense.kernel), w(layer.query_dense.bias)
    wk, bk = w(layer.key_dense.kernel), w(layer.key_dense.bias)
    wv, bv = w(layer.value_dense.kernel), w(layer.value_dense.bias)
    wo, bo = w(layer.output_dense.kernel), w(layer.output_dense.bias)
    wr, u, v = w(layer.position_dense.kernel), w(layer.content_bias), w(layer.position_bias)
    mem_len = 0 if memory is None else memory.shape[1]
    h_tilde = x if memory is None else np.concatenate([memory, x], axis=1)
    batch, seg, dim = x.shape
    keys = h_tilde.shape[1]
    heads, dk = wq.shape[1], wq.shape[2]
    out = np.zeros((batch, seg, wo.shape[-1]))
    probs = np.zeros((batch, heads, seg, keys))
    for b in range(batch):
        for h in range(heads):
            for i in range(seg):
                q_i = x[b, i] @ wq[:, h] + bq[h]
                scores = np.full(keys, -np.inf)
                for j in range(keys):
                    if mask is not None and not mask[b, i, j]:
                        continue
                    k_j = h_tilde[b, j] @ wk[:, h] + bk[h]
                    r_ij = sinusoid(mem_len + i - j, dim) @ wr[:, h]  # W_{k,R} R_{i-j}
                    a, bb, c, d = q_i @ k_j, q_i @ r_ij, u[h] @ k_j, v[h] @ r_ij
                    scores[j] = (a + bb + c + d) / np.sqrt(dk)
                p = np.exp(scores - scores.max())
                probs[b, h, i] = p / p.sum()
                a_i = sum(probs[b, h, i, j] * (h_tilde[b, j] @ wv[:, h] + bv[h])
                          for j in range(keys))
                out[b, i] += a_i @ wo[h]
    return out + bo, probs


def random_layer(**kwargs):
    layer = RelativeMultiHeadAttention(num_heads=H, key_dim=DK, **kwargs)
    layer(X, memory=MEMORY)
    rng = np.random.default_rng(1)
    layer.set_weights([0.5 * rng.normal(size=w.shape) for w in layer.get_weights()])
    return layer


def causal(seg, keys):
    return np.tril(np.ones((seg, keys), bool), k=keys - seg)[None].repeat(B, 0)


@pytest.mark.parametrize("with_memory", [False, True])
@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_equals_naive_four_term_formula(with_memory, use_causal_mask):
    layer = random_layer()
    memory = MEMORY if with_memory else None
    keys = T + (M if with_memory else 0)
    mask = causal(T, keys) if use_causal_mask else None
    out, probs = layer(
        X, memory=memory, use_causal_mask=use_causal_mask, return_attention_scores=True
    )
    expected_out, expected_probs = naive_relative_attention(layer, X, memory, mask)
    np.testing.assert_allclose(ops.convert_to_numpy(probs), expected_probs, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected_out, atol=1e-4)


@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_padding_mask_over_segment_or_over_memory_and_segment(use_causal_mask):
    layer = random_layer()
    key_padding = np.concatenate([np.array([[0, 1, 1], [1, 1, 1]], bool), PADDING], axis=1)
    mask = key_padding[:, None, :].repeat(T, 1)  # (B, T, M + T)
    if use_causal_mask:
        mask &= causal(T, M + T)
    expected, _ = naive_relative_attention(layer, X, MEMORY, mask)
    out = layer(X, memory=MEMORY, padding_mask=key_padding, use_causal_mask=use_causal_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-4)

    # A (B, T) mask covers the current segment only; the memory counts as real.
    segment_only = np.concatenate([np.ones((B, M), bool), PADDING], axis=1)
    mask = segment_only[:, None, :].repeat(T, 1)
    if use_causal_mask:
        mask &= causal(T, M + T)
    expected, _ = naive_relative_attention(layer, X, MEMORY, mask)
    out = layer(X, memory=MEMORY, padding_mask=PADDING, use_causal_mask=use_causal_mask)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-4)


@pytest.mark.tensorflow
def test_segment_length_unknown_while_tracing():
    # Segments of varying length (a shorter last segment) retrace with T unknown while the
    # memory length is static: the (B, T) mask must still be extended over the memory.
    import tensorflow as tf

    layer = random_layer()
    step = tf.function(
        lambda x, memory, mask: layer(x, memory=memory, padding_mask=mask, use_causal_mask=True),
        input_signature=[
            tf.TensorSpec((B, None, D)), tf.TensorSpec((B, M, D)), tf.TensorSpec((B, None), tf.bool)
        ],
    )
    for length in (T, 2):
        eager = layer(X[:, :length], memory=MEMORY, padding_mask=PADDING[:, :length],
                      use_causal_mask=True)
        traced = step(X[:, :length], MEMORY, PADDING[:, :length])
        np.testing.assert_allclose(ops.convert_to_numpy(traced), eager, atol=1e-5)


def test_explicit_attention_mask_is_merged_with_causal():
    layer = random_layer()
    explicit = RNG.random((B, T, M + T)) > 0.3
    explicit[:, :, -1] = True  # no query without any visible key after the causal AND
    explicit[:, :, 0] = True
    mask = explicit & causal(T, M + T)
    expected, _ = naive_relative_attention(layer, X, MEMORY, mask)
    out = layer(X, memory=MEMORY, attention_mask=explicit, use_causal_mask=True)
    np.testing.assert_allclose(ops.convert_to_numpy(out), expected, atol=1e-4)


def gather_shift(x, key_length):
    """out[..., i, j] = x[..., i, j + T - 1 - i], NaN where that column does not exist."""
    seg, positions = x.shape[-2], x.shape[-1]
    out = np.full(x.shape[:-2] + (seg, key_length), np.nan)
    for i in range(seg):
        for j in range(key_length):
            if j + seg - 1 - i < positions:
                out[..., i, j] = x[..., i, j + seg - 1 - i]
    return out


@pytest.mark.parametrize("memory_length", [0, 3])
@pytest.mark.parametrize("layout", ["causal", "bidirectional"])
def test_relative_shift_equals_gather(memory_length, layout):
    keys = memory_length + T
    positions = keys if layout == "causal" else keys + T - 1
    x = RNG.normal(size=(2, 3, T, positions)).astype("float32")
    expected = gather_shift(x, keys)
    out = ops.convert_to_numpy(relative_shift(ops.convert_to_tensor(x), key_length=keys))
    assert out.shape == (2, 3, T, keys)
    valid = ~np.isnan(expected)
    np.testing.assert_array_equal(out[valid], expected[valid])
    if layout == "bidirectional":
        assert valid.all()
    else:
        # Exactly the future keys (j > M + i) have no distance in the causal table.
        np.testing.assert_array_equal(valid[0, 0], causal(T, keys)[0])


def test_no_gradient_flows_into_memory():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("uses tf.GradientTape")
    import tensorflow as tf

    layer = random_layer()
    memory, x = tf.constant(MEMORY), tf.constant(X)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([memory, x])
        loss = tf.reduce_sum(layer(x, memory=memory, use_causal_mask=True) ** 2)
    memory_grad = tape.gradient(loss, memory)
    assert memory_grad is None or not np.any(memory_grad.numpy())
    assert np.any(tape.gradient(loss, x).numpy())


def test_causal_attention_never_sees_future_tokens():
    layer = random_layer()
    base = ops.convert_to_numpy(layer(X, memory=MEMORY, use_causal_mask=True))
    changed = X.copy()
    changed[:, 2:] += 10.0
    out = ops.convert_to_numpy(layer(changed, memory=MEMORY, use_causal_mask=True))
    np.testing.assert_allclose(out[:, :2], base[:, :2], atol=1e-5)
    assert not np.allclose(out[:, 2:], base[:, 2:])


@pytest.mark.parametrize("with_memory", [False, True])
def test_layer_test_case(with_memory):
    inputs = {"query": X, "padding_mask": PADDING}
    if with_memory:
        inputs["memory"] = MEMORY
    run_layer_test(
        RelativeMultiHeadAttention,
        {"num_heads": H, "key_dim": DK, "value_dim": 3, "dropout": 0.1},
        inputs,
        call_kwargs={"use_causal_mask": True},
        expected_output_shape=(B, T, D),
    )


def test_implicit_keras_mask_matches_padding_mask():
    layer = random_layer()
    assert_implicit_mask_matches_explicit(layer, X, PADDING)
    assert_implicit_mask_matches_explicit(
        layer, X, PADDING, {"memory": MEMORY, "use_causal_mask": True}
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"fused_qkv": True}, "fused_qkv"),
        ({"rotary_max_wavelength": 10000}, "rotary_max_wavelength"),
        ({"num_heads": 0}, "num_heads"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelativeMultiHeadAttention(**{"num_heads": H, "key_dim": DK, **kwargs})


def test_call_errors():
    with pytest.raises(ValueError, match="even"):
        RelativeMultiHeadAttention(num_heads=H, key_dim=DK)(np.zeros((1, 2, 7), "float32"))
    layer = random_layer()
    with pytest.raises(ValueError, match="memory"):
        layer(X, memory=np.zeros((B, M, D + 2), "float32"))
    with pytest.raises(ValueError, match="padding_mask"):
        layer(X, memory=MEMORY, padding_mask=np.ones((B, M), bool))


def test_symbolic_call_with_memory_and_scores():
    layer = RelativeMultiHeadAttention(num_heads=2, key_dim=4, output_shape=6)
    segment, memory = keras.Input((3, 8)), keras.Input((5, 8))
    output, scores = layer(segment, memory=memory, return_attention_scores=True)
    assert (tuple(output.shape), tuple(scores.shape)) == ((None, 3, 6), (None, 2, 3, 8))
    model = keras.Model([segment, memory], [output, scores])
    x, m = np.ones((1, 3, 8), "float32"), np.ones((1, 5, 8), "float32")
    eager_output, eager_scores = layer(x, memory=m, return_attention_scores=True)
    predicted = model.predict([x, m], verbose=0)
    np.testing.assert_allclose(predicted[0], eager_output, atol=1e-6)
    np.testing.assert_allclose(predicted[1], eager_scores, atol=1e-6)
