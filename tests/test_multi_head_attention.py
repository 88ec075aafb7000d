import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from tests.layer_test_case import assert_implicit_mask_matches_explicit
from tests.layer_test_case import run_layer_test

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 8)).astype("float32")
ENC = RNG.normal(size=(2, 7, 6)).astype("float32")
PADDING = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)


def numpy_mha(layer, query, value, mask=None):
    """Z = concat(head_1..head_H) W^O with head_h = softmax(Q_h K_h^T / sqrt(d_k) + M) V_h."""
    wq, bq, wk, bk, wv, bv, wo, bo = [np.asarray(w) for w in layer.get_weights()]
    H, dk = wq.shape[1], wq.shape[2]
    heads = []
    for h in range(H):
        q = query @ wq[:, h] + bq[h]  # (B, T, dk)
        k = value @ wk[:, h] + bk[h]  # (B, S, dk)
        v = value @ wv[:, h] + bv[h]  # (B, S, dv)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dk)  # (B, T, S)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        heads.append((probs / probs.sum(-1, keepdims=True)) @ v)  # (B, T, dv)
    concat = np.concatenate(heads, axis=-1)  # (B, T, H*dv)
    return concat @ wo.reshape(H * wo.shape[1], -1) + bo


def copy_from_keras(**kwargs):
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    ours = MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    return reference, ours


def test_equals_numpy_formula_self_and_cross_attention():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)
    np.testing.assert_allclose(layer(X), numpy_mha(layer, X, X), atol=1e-5)
    cross = MultiHeadAttention(num_heads=2, key_dim=4)
    np.testing.assert_allclose(cross(X, ENC), numpy_mha(cross, X, ENC), atol=1e-5)
    causal = np.tril(np.ones((5, 5), bool))[None]
    np.testing.assert_allclose(
        layer(X, use_causal_mask=True), numpy_mha(layer, X, X, causal), atol=1e-5
    )


@pytest.mark.parametrize(
    "case",
    ["self", "cross", "causal", "padding", "explicit", "sliding_window", "no_bias"],
)
def test_equals_keras_multi_head_attention_with_copied_weights(case):
    kwargs = {"sliding_window": 3} if case == "sliding_window" else {}
    kwargs.update({"use_bias": False} if case == "no_bias" else {})
    reference, ours = copy_from_keras(**kwargs)
    value = ENC if case == "cross" else X
    reference(X, value)
    ours(X, value)
    ours.set_weights(reference.get_weights())
    ref_kwargs, our_kwargs = {}, {}
    if case == "causal":
        ref_kwargs = our_kwargs = {"use_causal_mask": True}
    if case == "padding":
        ref_kwargs = {"attention_mask": np.broadcast_to(PADDING[:, None, :], (2, 5, 5))}
        our_kwargs = {"padding_mask": PADDING}
    if case == "explicit":
        mask = RNG.random((2, 5, 5)) > 0.5
        mask[..., 0] = True
        ref_kwargs = our_kwargs = {"attention_mask": mask}
    expected = reference(X, value, **ref_kwargs)
    actual = ours(X, value, **our_kwargs)
    np.testing.assert_allclose(ops.convert_to_numpy(actual), expected, atol=1e-5)


def test_fused_qkv_equals_unfused_with_the_same_weights():
    unfused = MultiHeadAttention(num_heads=2, key_dim=4)
    fused = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True)
    unfused(X)
    fused(X)
    wq, bq, wk, bk, wv, bv, wo, bo = unfused.get_weights()
    fused.set_weights([np.stack([wq, wk, wv], 1), np.stack([bq, bk, bv]), wo, bo])
    for kwargs in ({}, {"use_causal_mask": True}, {"padding_mask": PADDING}):
        np.testing.assert_allclose(fused(X, **kwargs), unfused(X, **kwargs), atol=1e-5)
    other = RNG.normal(size=(2, 4, 8)).astype("float32")
    np.testing.assert_allclose(fused(X, other), unfused(X, other), atol=1e-5)
    np.testing.assert_allclose(fused(X, other, X[:, :4]), unfused(X, other, X[:, :4]), atol=1e-5)


def test_fused_projection_with_unknown_batch_and_length_equals_numpy():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True)
    layer(X)
    kernel, bias = [np.asarray(w) for w in layer.get_weights()[:2]]  # (d, 3, H, dk), (3, H, dk)
    expected = np.einsum("btd,dnhk->btnhk", X, kernel) + bias  # (B, T, 3, H, dk)
    q, k, v = layer._project(X, X, X, self_attention=True)
    np.testing.assert_allclose(np.stack([q, k, v], axis=2), expected, atol=1e-5)
    memory = X[:, :3]
    q, k, v = layer._project(X, memory, memory, self_attention=False)
    np.testing.assert_allclose(q, expected[:, :, 0], atol=1e-5)
    np.testing.assert_allclose(np.stack([k, v], axis=2), expected[:, :3, 1:], atol=1e-5)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        traced = tf.function(
            lambda x: tf.stack(layer._project(x, x, x, self_attention=True), axis=2),
            input_signature=[tf.TensorSpec((None, None, 8), tf.float32)])
        np.testing.assert_allclose(traced(X), expected, atol=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TF graph ops")
def test_fused_projection_traces_to_matmul_not_einsum_in_bfloat16():
    # TF's CPU Einsum kernel has no fast bfloat16 path (15x slower than MatMul, which made
    # mixed_bfloat16 training 3x slower than float32), so the projection must be a MatMul.
    import tensorflow as tf

    layer = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True, dtype="mixed_bfloat16")
    layer(X)
    project = tf.function(lambda x: layer._project(x, x, x, self_attention=True))
    graph = project.get_concrete_function(tf.TensorSpec((None, None, 8), tf.bfloat16)).graph
    op_types = {op.type for op in graph.get_operations()}
    assert "MatMul" in op_types and "Einsum" not in op_types, sorted(op_types)


def test_causal_mask_never_leaks_the_future():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    base = ops.convert_to_numpy(layer(X, use_causal_mask=True))
    for t in range(4):
        changed = X.copy()
        changed[:, t + 1:] = RNG.normal(size=changed[:, t + 1:].shape)
        out = ops.convert_to_numpy(layer(changed, use_causal_mask=True))
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6)
        assert not np.allclose(out[:, t + 1:], base[:, t + 1:])


def test_padding_never_changes_unpadded_outputs():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    base = ops.convert_to_numpy(layer(X, padding_mask=PADDING))
    changed = X.copy()
    changed[0, 3:] = 100.0 * RNG.normal(size=(2, 8))
    out = ops.convert_to_numpy(layer(changed, padding_mask=PADDING))
    np.testing.assert_allclose(out[PADDING], base[PADDING], atol=1e-5)
    # The same sentence without the padding at all gives the same outputs.
    short = ops.convert_to_numpy(layer(X[:1, :3]))
    np.testing.assert_allclose(short[0], base[0, :3], atol=1e-5)


def test_implicit_keras_mask_matches_padding_mask():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    assert_implicit_mask_matches_explicit(layer, X, PADDING)
    assert_implicit_mask_matches_explicit(layer, X, PADDING, {"use_causal_mask": True})


def test_keras_mask_reaches_the_output():
    masked = keras.layers.Masking(0.0)(np.where(PADDING[..., None], X, 0.0))
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    for output in (layer(masked), layer(masked, masked)):
        np.testing.assert_array_equal(ops.convert_to_numpy(output._keras_mask), PADDING)
    symbolic = keras.Input((None, 8))
    out = layer(keras.layers.Masking(0.0)(symbolic))
    pooled = keras.layers.GlobalAveragePooling1D()(out)  # averages real steps only
    model = keras.Model(symbolic, pooled)
    x = np.where(PADDING[..., None], X, 0.0).astype("float32")
    expected = ops.convert_to_numpy(layer(x, padding_mask=PADDING))[0, :3].mean(0)
    np.testing.assert_allclose(model.predict(x, verbose=0)[0], expected, atol=1e-5)


@pytest.mark.parametrize("fused_qkv", [False, True])
@pytest.mark.parametrize("rotary", [None, 10000])
def test_kv_cache_step_by_step_equals_full_decoding(fused_qkv, rotary):
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, fused_qkv=fused_qkv, rotary_max_wavelength=rotary
    )
    full = ops.convert_to_numpy(layer(X, use_causal_mask=True))
    cache = ops.zeros((2, 2, 5, 2, 4))
    # Prefill two tokens at once, then decode one at a time.
    out, cache = layer(X[:, :2], cache=cache, cache_update_index=0, use_causal_mask=True)
    steps = [ops.convert_to_numpy(out)]
    for t in range(2, 5):
        out, cache = layer(
            X[:, t : t + 1], cache=cache, cache_update_index=t, use_causal_mask=True
        )
        steps.append(ops.convert_to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_cache_masks_unwritten_slots_even_without_causal_flag():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    cache = ops.ones((2, 2, 9, 2, 4)) * 50.0  # garbage in unwritten slots
    out, _ = layer(X, cache=cache, cache_update_index=0)
    np.testing.assert_allclose(out, layer(X), atol=1e-5)


def test_cross_attention_cache_equals_recomputing_keys_and_values():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True)
    padding = np.array([[1] * 5 + [0] * 2, [1] * 7], bool)
    encoder = np.pad(ENC, ((0, 0), (0, 0), (0, 2)))  # fused QKV needs d_enc == d_dec = 8
    expected = layer(X, encoder, padding_mask=padding)
    cache = layer.compute_cross_attention_cache(encoder)
    out, same_cache = layer(X, cache=cache, padding_mask=padding)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert same_cache is cache


def test_attention_scores_are_probabilities():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    out, scores = layer(X, padding_mask=PADDING, return_attention_scores=True)
    scores = ops.convert_to_numpy(scores)
    assert scores.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    assert np.all(scores[0, :, :, 3:] == 0.0)


def test_attention_dropout_only_in_training():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=1)
    inference = ops.convert_to_numpy(layer(X, training=False))
    np.testing.assert_allclose(inference, ops.convert_to_numpy(layer(X)), atol=1e-6)
    assert not np.allclose(ops.convert_to_numpy(layer(X, training=True)), inference)


def test_sliding_window_limits_the_receptive_field():
    layer = MultiHeadAttention(num_heads=1, key_dim=4, sliding_window=2)
    _, scores = layer(X, use_causal_mask=True, return_attention_scores=True)
    scores = ops.convert_to_numpy(scores)[0, 0]
    i, j = np.arange(5)[:, None], np.arange(5)[None]
    assert np.all(scores[(j > i) | (i - j >= 2)] == 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"fused_qkv": True, "use_causal": True},
        {"rotary_max_wavelength": 10000, "use_causal": True},
        {"dropout": 0.1, "value_dim": 3, "output_dim": 6, "sliding_window": 2},
    ],
)
def test_shared_layer_checks(kwargs):
    kwargs = dict(kwargs)
    call_kwargs = {"use_causal_mask": kwargs.pop("use_causal", False)}
    run_layer_test(
        MultiHeadAttention, {"num_heads": 2, "key_dim": 4, **kwargs},
        {"query": X, "padding_mask": PADDING}, call_kwargs=call_kwargs,
        expected_output_shape=(2, 5, kwargs.get("output_dim", 8)),
    )


def test_shared_layer_checks_cross_attention():
    run_layer_test(
        MultiHeadAttention, {"num_heads": 2, "key_dim": 4},
        {"query": X, "value": ENC}, expected_output_shape=(2, 5, 8),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0, "key_dim": 4}, "Received: num_heads=0"),
        ({"num_heads": -2, "key_dim": 4}, "Received: num_heads=-2"),
        ({"num_heads": 2, "key_dim": 0}, "Received: key_dim=0"),
        ({"num_heads": 2, "key_dim": 4, "dropout": 1.0}, "Received: dropout=1.0"),
        ({"num_heads": 2, "key_dim": 4, "value_dim": 3, "fused_qkv": True},
         "key_dim=4, value_dim=3"),
        ({"num_heads": 2, "key_dim": 3, "rotary_max_wavelength": 1e4}, "Received: key_dim=3"),
        ({"num_heads": 2, "key_dim": 4, "sliding_window": 0}, "Received: sliding_window=0"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_bad_call_arguments():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match=r"`attention_mask` must have rank 2 or 3 or 4"):
        layer(X, attention_mask=np.ones((2, 1, 1, 5, 5), bool))
    with pytest.raises(ValueError, match="num_heads mismatch.*cache.shape=\\(2, 2, 5, 2, 3\\)"):
        layer(X, cache=ops.zeros((2, 2, 5, 2, 3)), cache_update_index=0)
    fused = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True)
    with pytest.raises(ValueError, match="same feature size"):
        fused(X, ENC)
