import re
import zipfile

import h5py
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


# === Drop-in parity with keras.layers.MultiHeadAttention ===

X4 = RNG.normal(size=(2, 3, 4, 8)).astype("float32")  # (B, d1, d2, features)
ENC4 = RNG.normal(size=(2, 5, 4, 6)).astype("float32")
X5 = RNG.normal(size=(1, 2, 3, 2, 4)).astype("float32")


def keras_pair(query, value, key=None, **kwargs):
    """A Keras layer and ours built for these inputs, ours holding a copy of Keras' weights."""
    kwargs = {"num_heads": 2, "key_dim": 4, **kwargs}
    keras_kwargs = dict(kwargs)
    if "output_dim" in kwargs:  # our alias of an int `output_shape`
        keras_kwargs["output_shape"] = keras_kwargs.pop("output_dim")
    reference = keras.layers.MultiHeadAttention(**keras_kwargs)
    ours = MultiHeadAttention(**kwargs)
    # With scores Keras takes its einsum path, which also works for value_dim != key_dim
    # on JAX (see test_every_keras_argument_gives_keras_numbers).
    reference(query, value, key, return_attention_scores=True)
    ours(query, value, key)
    ours.set_weights(reference.get_weights())
    return reference, ours


def assert_same(actual, expected, atol=1e-5, rows=None):
    actual, expected = ops.convert_to_numpy(actual), ops.convert_to_numpy(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if rows is not None:  # only real query positions (see the documented differences)
        actual, expected = actual[rows], expected[rows]
    np.testing.assert_allclose(actual, expected, atol=atol, rtol=atol)


def test_signatures_accept_every_keras_parameter():
    # A new argument in a future Keras fails here, not in a user's program.
    import inspect

    reference = keras.layers.MultiHeadAttention
    for method in ("__init__", "call", "build", "compute_output_shape", "compute_output_spec"):
        theirs = inspect.signature(getattr(reference, method)).parameters
        ours = inspect.signature(getattr(MultiHeadAttention, method)).parameters
        missing = set(theirs) - set(ours)
        assert not missing, f"MultiHeadAttention.{method} lacks Keras' {sorted(missing)}"
        for name, parameter in theirs.items():
            if parameter.default is not inspect.Parameter.empty and name != "value":
                assert ours[name].default == parameter.default, (method, name)
    # The constructor's positional order is Keras' too.
    theirs = [n for n in inspect.signature(reference.__init__).parameters if n != "kwargs"]
    ours = list(inspect.signature(MultiHeadAttention.__init__).parameters)
    assert ours[: len(theirs)] == theirs


@pytest.mark.parametrize(
    "kwargs, inputs",
    [
        ({}, (X, X)),
        ({"value_dim": 3, "use_bias": False, "use_gate": True}, (X, ENC)),
        ({"output_shape": (2, 3)}, (X, ENC, ENC[..., :5])),
        ({"output_dim": 6, "attention_axes": 1}, (X, ENC)),
        ({"sliding_window": 2, "dropout": 0.3, "seed": 1}, (X, X)),
        ({}, (X4, X4)),  # attention over axes (1, 2)
        ({"attention_axes": (-2,), "output_shape": (2, 3)}, (X4, X4)),
        ({"attention_axes": (1,)}, (X4, ENC4)),
        ({"attention_axes": (3, 1), "use_gate": True}, (X5, X5)),
    ],
)
def test_every_keras_argument_gives_keras_numbers(kwargs, inputs):
    reference, ours = keras_pair(*inputs, **kwargs)
    expected, expected_scores = reference(*inputs, return_attention_scores=True)
    actual, scores = ours(*inputs, return_attention_scores=True)
    assert_same(actual, expected)
    assert_same(scores, expected_scores)
    if kwargs.get("value_dim", 4) == 4:
        # Without scores Keras calls `ops.dot_product_attention`, which on JAX (Keras 3.15)
        # fails for value_dim != key_dim ("value shape should be [2, 7, 2, 4]").
        assert_same(ours(*inputs), reference(*inputs))
    assert tuple(ours.compute_output_shape(*[x.shape for x in inputs])) == expected.shape
    symbolic = [keras.KerasTensor(x.shape) for x in inputs]
    spec, scores_spec = ours.compute_output_spec(*symbolic, return_attention_scores=True)
    assert (spec.shape, scores_spec.shape) == (expected.shape, expected_scores.shape)


def test_config_of_a_keras_layer_builds_ours():
    reference, _ = keras_pair(X4, X4, attention_axes=(2,), output_shape=(2, 3), use_gate=True)
    ours = MultiHeadAttention.from_config(reference.get_config())
    ours(X4, X4)
    ours.set_weights(reference.get_weights())
    assert_same(ours(X4, X4), reference(X4, X4))


def _masked(x, padding):
    return keras.layers.Masking(0.0)(np.where(padding[..., None], x, 0.0).astype("float32"))


VALUE_PADDING = np.array([[1] * 5 + [0] * 2, [1] * 7], bool)
KEY = RNG.normal(size=(2, 7, 3)).astype("float32")


MASK = RNG.random((2, 5, 7)) > 0.4
MASK[..., 0] = True
PER_HEAD_MASK = RNG.random((2, 2, 5, 7)) > 0.4
PER_HEAD_MASK[..., 0] = True
# form: (self-attention, Keras-masked inputs (query, value, key), Keras' call kwargs, ours)
MASK_FORMS = {
    "self_keras_mask": (True, "qvk", {}, {}),
    "value_keras_mask": (False, "v", {}, {}),
    "key_keras_mask": (False, "k", {}, {}),
    "value_key_masks_explicit": (
        False, "", {"value_mask": VALUE_PADDING, "key_mask": VALUE_PADDING[::-1]}, None),
    # Keras reads the query's mask from the tensor (it ignores an explicit `query_mask`);
    # ours takes either.
    "query_mask_explicit": (False, "q", {}, {"query_mask": PADDING}),
    "attention_mask": (False, "", {"attention_mask": MASK}, None),
    "attention_mask_2d": (False, "", {"attention_mask": MASK[0]}, None),
    "per_head_attention_mask": (False, "", {"attention_mask": PER_HEAD_MASK}, None),
    "causal": (True, "", {"use_causal_mask": True}, None),
    "causal_and_padding": (True, "qvk", {"use_causal_mask": True}, None),
    "causal_and_attention_mask": (
        True, "", {"use_causal_mask": True, "attention_mask": MASK[:, :, :5]}, None),
}


@pytest.mark.parametrize("form", sorted(MASK_FORMS))
def test_every_keras_mask_form_gives_keras_numbers(form):
    self_attention, masked, ref_kwargs, our_kwargs = MASK_FORMS[form]
    our_kwargs = ref_kwargs if our_kwargs is None else our_kwargs
    arrays = (X, X, X) if self_attention else (X, ENC, KEY)
    paddings = (PADDING,) * 3 if self_attention else (PADDING, VALUE_PADDING, VALUE_PADDING)
    reference, ours = keras_pair(*arrays)

    def inputs(keras_masks):
        # Fresh tensors per call: Keras' layer removes the masks from the tensors it gets.
        return [_masked(x, p) if name in keras_masks else ops.convert_to_tensor(x)
                for name, x, p in zip("qvk", arrays, paddings)]

    # Keras spreads a query that sees no key over all keys, ours gives zeros: compare the
    # real queries only (see the documented differences).
    rows = PADDING if "q" in masked or "query_mask" in our_kwargs else None
    our_masks = masked if "query_mask" not in our_kwargs else ""
    expected = reference(*inputs(masked), return_attention_scores=True, **ref_kwargs)
    actual = ours(*inputs(our_masks), return_attention_scores=True, **our_kwargs)
    assert_same(actual[0], expected[0], rows=rows)
    score_rows = None if rows is None else np.broadcast_to(rows[:, None], (2, 2, 5))
    assert_same(actual[1], expected[1], rows=score_rows)
    assert_same(ours(*inputs(our_masks), **our_kwargs),
                reference(*inputs(masked), **ref_kwargs), rows=rows)


def test_attention_masks_over_several_axes_give_keras_numbers():
    reference, ours = keras_pair(X4, X4)  # scores (B, H, d1, d2, d1, d2)
    mask = RNG.random((2, 3, 4, 3, 4)) > 0.3
    mask[..., 0, 0] = True
    per_head = RNG.random((2, 2, 3, 4, 3, 4)) > 0.3
    per_head[..., 0, 0] = True
    for attention_mask in (mask, per_head, mask[0]):
        expected = reference(X4, X4, attention_mask=attention_mask, return_attention_scores=True)
        actual = ours(X4, X4, attention_mask=attention_mask, return_attention_scores=True)
        for ours_out, theirs in zip(actual, expected):
            assert_same(ours_out, theirs)
    # One attention axis: a causal mask over it, as Keras (batch-like axis 2 untouched).
    reference, ours = keras_pair(X4, X4, attention_axes=(1,))
    assert_same(ours(X4, X4, use_causal_mask=True), reference(X4, X4, use_causal_mask=True))


def test_padding_over_several_axes_equals_the_attention_mask():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    padding = RNG.random((2, 3, 4)) > 0.3
    padding[:, 0, 0] = True
    explicit = np.broadcast_to(padding[:, None, None], (2, 3, 4, 3, 4))
    real = padding  # padded queries differ by design (zeros vs. Keras' uniform average)
    assert_same(layer(X4, padding_mask=padding), layer(X4, attention_mask=explicit), rows=real)
    assert_same(layer(_masked(X4, padding)), layer(X4, attention_mask=explicit), rows=real)


# Half precision: both layers round every intermediate to the compute dtype, in different
# orders (Keras' einsums and fused attention vs. our matmuls and float32 softmax), so they
# agree to a few units in the last place of that dtype, not to 1e-5: float16 keeps 11
# significant bits (ulp 2^-10 ~ 1e-3 at 1.0), bfloat16 8 bits (ulp 2^-7 ~ 8e-3 at 1.0,
# 1.6e-2 at 2.0). Measured max |ours - Keras| on these cases (outputs up to |2.6|):
# 2.0e-3 in float16, 3.1e-2 in bfloat16 (two ulps at 2.0). The bound is atol + rtol * |x|.
HALF_PRECISION_ATOL = {"mixed_float16": 4e-3, "mixed_bfloat16": 3e-2}


@pytest.mark.parametrize("policy", sorted(HALF_PRECISION_ATOL))
@pytest.mark.parametrize(
    "kwargs, inputs, call_kwargs",
    [
        ({"use_gate": True, "output_shape": (2, 3)}, (X, ENC),
         {"attention_mask": np.tril(np.ones((5, 7), bool))}),
        ({"attention_axes": (2,)}, (X4, X4), {}),
    ],
)
def test_half_precision_policies_give_keras_numbers(policy, kwargs, inputs, call_kwargs):
    reference, ours = keras_pair(*inputs, dtype=policy, **kwargs)
    expected = reference(*inputs, **call_kwargs)
    actual = ours(*inputs, **call_kwargs)
    assert keras.backend.standardize_dtype(actual.dtype) == policy.split("_")[1]
    assert_same(ops.cast(actual, "float32"), ops.cast(expected, "float32"),
                atol=HALF_PRECISION_ATOL[policy])


def test_regularizers_add_the_losses_keras_adds():
    kwargs = dict(kernel_regularizer="l2", bias_regularizer=keras.regularizers.L1(0.1),
                  activity_regularizer=keras.regularizers.L2(1e-3), use_gate=True,
                  bias_initializer="ones")
    reference, ours = keras_pair(X, ENC, **kwargs)
    reference(X, ENC)
    ours(X, ENC)
    assert len(ours.losses) == len(reference.losses) > 0
    np.testing.assert_allclose(
        sum(float(ops.convert_to_numpy(x)) for x in ours.losses),
        sum(float(ops.convert_to_numpy(x)) for x in reference.losses), rtol=1e-5,
    )
    # The fused kernel carries the same regularization as the three kernels it replaces.
    fused = MultiHeadAttention(num_heads=2, key_dim=4, fused_qkv=True, **kwargs)
    unfused = MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    unfused(X)
    fused(X)
    wq, bq, wk, bk, wg, bg, wv, bv, wo, bo = unfused.get_weights()
    fused.set_weights([np.stack([wq, wk, wv], 1), np.stack([bq, bk, bv]), wg, bg, wo, bo])
    fused(X)
    unfused(X)
    np.testing.assert_allclose(
        sum(float(ops.convert_to_numpy(x)) for x in fused.losses),
        sum(float(ops.convert_to_numpy(x)) for x in unfused.losses), rtol=1e-5,
    )


def test_constraints_apply_after_a_training_step_as_in_keras():
    kwargs = dict(kernel_constraint=keras.constraints.MaxNorm(0.5),
                  bias_constraint=keras.constraints.NonNeg(), bias_initializer="ones")
    trained = []
    for layer in keras_pair(X, ENC, **kwargs):
        query, value = keras.Input((5, 8)), keras.Input((7, 6))
        model = keras.Model([query, value], layer(query, value))
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
        model.fit([X, ENC], np.ones((2, 5, 8), "float32"), epochs=1, verbose=0, batch_size=2)
        trained.append(layer.get_weights())
    for theirs, ours in zip(*trained):
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
    query_kernel, query_bias = trained[1][:2]  # (d, H, dk), (H, dk)
    assert np.all(np.sqrt((query_kernel**2).sum(0)) <= 0.5 + 1e-6)
    assert np.all(query_bias >= 0)


@pytest.mark.parametrize(
    "kwargs, inputs",
    [
        ({"use_gate": True, "output_shape": (2, 4), "kernel_regularizer": "l2",
          "activity_regularizer": "l1", "kernel_constraint": "non_neg",
          "bias_constraint": "max_norm", "bias_regularizer": "l2"}, {"query": X, "value": ENC}),
        ({"attention_axes": (2,), "flash_attention": False}, {"query": X4}),
    ],
)
def test_shared_layer_checks_with_keras_arguments(kwargs, inputs):
    expected = inputs["query"].shape[:-1] + tuple(kwargs.get("output_shape", (8,)))
    run_layer_test(
        MultiHeadAttention, {"num_heads": 2, "key_dim": 4, **kwargs}, inputs,
        expected_output_shape=expected,
    )


def test_flash_attention_is_honoured_as_in_keras():
    # Where the backend has a flash kernel (JAX on a GPU with cuDNN) both layers run it and
    # agree; elsewhere (TensorFlow, CPUs) both refuse the same way at call time.
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    ours = MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)
    try:
        expected = reference(X, X)
    except Exception as error:  # noqa: BLE001 - the backend's own error type
        with pytest.raises(type(error), match=re.escape(str(error)[:30])):
            ours(X, X)
    else:
        ours(X, X)
        ours.set_weights(reference.get_weights())
        assert_same(ours(X, X), expected)
    with pytest.raises(ValueError, match="Received: dropout=0.1"):
        MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.1, flash_attention=True)
    with pytest.raises(ValueError, match="Received: return_attention_scores=True"):
        MultiHeadAttention(num_heads=2, key_dim=4, flash_attention=True)(
            X, return_attention_scores=True)


def test_documented_differences_and_how_to_get_keras_behaviour():
    reference, ours = keras_pair(X[:, :3], X)  # T = 3 queries, S = 5 keys
    # Causal and sliding-window masks with T != S: query i sits at key i, as in Keras.
    assert_same(ours(X[:, :3], X, use_causal_mask=True),
                reference(X[:, :3], X, use_causal_mask=True))
    keras_causal = np.tril(np.ones((3, 5), bool))  # query 0 sees key 0 only
    assert_same(ours(X[:, :3], X, use_causal_mask=True),
                reference(X[:, :3], X, attention_mask=keras_causal))
    # A query that may see no key: zero attention output (only the output bias) in ours.
    blind = np.ones((2, 3, 5), bool)
    blind[:, 1] = False
    bias = ops.convert_to_numpy(ours.output_dense.bias)
    out = ops.convert_to_numpy(ours(X[:, :3], X, attention_mask=blind))
    np.testing.assert_allclose(out[:, 1], np.broadcast_to(bias, (2, 8)), atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m(X, ENC, ENC[:, :6]), r"key.shape=\(2, 6, 6\), value.shape=\(2, 7, 6\)"),
        (lambda m: m(X[0], X[0]), "at least 3"),
        (lambda m: m(X, X4), "same rank"),
        (lambda m: m(X, ENC[:1]), r"pair each query with its keys"),
        (lambda m: m(X, attention_mask=np.ones((2, 5, 4), bool)), r"\(batch, 5, 5\)"),
        (lambda m: m(X[..., :6]), "built for 8"),
        (lambda m: m(X4, attention_bias=np.zeros((1, 2, 12, 12))), "`attention_bias` needs one"),
        (lambda m: m(X4, cache=ops.zeros((2, 2, 5, 2, 4)), cache_update_index=0), "`cache` n"),
        (lambda m: m.compute_output_shape((2, 5, 8), (2, 4, 6), (2, 3, 6)),
         "one key per value position"),
    ],
)
def test_inconsistent_inputs_fail_up_front(call, message):
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    if "built for" in message:
        layer(X)
    with pytest.raises(ValueError, match=message):
        call(layer)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"output_shape": "8"}, "Received: output_shape='8'"),
        ({"output_shape": (4, 0)}, "Received: output_shape=0"),
        ({"output_shape": 6, "output_dim": 5}, "output_shape=\\(6,\\), output_dim=5"),
        ({"attention_axes": "1"}, "Received: attention_axes='1'"),
        ({"attention_axes": ()}, "non-empty"),
    ],
)
def test_bad_keras_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(num_heads=2, key_dim=4, **kwargs)
    with pytest.raises(ValueError, match=r"in \[1, 2\] for inputs of rank 4"):
        MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(3,))(X4)


def test_output_shape_and_spec_with_cache_and_scores():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(2, 3))
    query, cache = keras.KerasTensor((None, 1, 8)), keras.KerasTensor((None, 2, 9, 2, 4))
    out, scores, new_cache = layer.compute_output_spec(
        query, cache=cache, cache_update_index=0, return_attention_scores=True)
    assert (out.shape, scores.shape, new_cache.shape) == (
        (None, 1, 2, 3), (None, 2, 1, 9), (None, 2, 9, 2, 4))
    symbolic = layer(keras.Input((None, 8)), keras.Input((6, 8)), return_attention_scores=True)
    assert [tuple(x.shape) for x in symbolic] == [(None, None, 2, 3), (None, 2, None, 6)]


def test_cross_attention_cache_with_other_encoder_width():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)  # d_dec = 8, d_enc = 6
    expected = layer(X, ENC, padding_mask=VALUE_PADDING)
    cache = layer.compute_cross_attention_cache(ENC)
    out, _ = layer(X, cache=cache, padding_mask=VALUE_PADDING)
    assert_same(out, expected)
    spec, _ = layer.compute_output_spec(keras.KerasTensor((None, 1, 8)),
                                        cache=keras.KerasTensor((None, 2, 7, 2, 4)))
    assert spec.shape == (None, 1, 8)


def keras_style_cached_attention(base):
    """keras-hub's `CachedMultiHeadAttention` pattern on `base`, written against Keras' private
    surface only: it overrides `call` (a key/value cache) and `_compute_attention` (scores at
    temperature 2 through `_masked_softmax` and Keras' einsum equations)."""

    class CachedAttention(base):
        def call(self, query, value, key=None, attention_mask=None, cache=None,
                 cache_update_index=None, training=None):
            key = value if key is None else key
            query = self._query_dense(query)
            key_update, value_update = self._key_dense(key), self._value_dense(value)
            start = [0, cache_update_index, 0, 0]
            key = ops.slice_update(cache[:, 0], start, key_update)
            value = ops.slice_update(cache[:, 1], start, value_update)
            cache = ops.stack((key, value), axis=1)
            output, _ = self._compute_attention(
                query=query, key=key, value=value, attention_mask=attention_mask,
                training=training,
            )
            return self._output_dense(output), cache

        def _compute_attention(self, query, key, value, attention_mask=None, training=None,
                               return_attention_scores=False):
            query = ops.multiply(query, ops.cast(self._inverse_sqrt_key_dim, query.dtype))
            scores = ops.einsum(self._dot_product_equation, key, query)
            scores = self._masked_softmax(scores / 2.0, attention_mask)
            dropped = self._dropout_layer(scores, training=training)
            return ops.einsum(self._combine_equation, dropped, value), scores

    return CachedAttention


def test_keras_style_subclass_runs_on_ours_with_keras_numbers():
    reference = keras_style_cached_attention(keras.layers.MultiHeadAttention)(2, 4)
    ours = keras_style_cached_attention(MultiHeadAttention)(2, 4)
    cache = np.zeros((2, 2, 5, 2, 4), "float32")
    step_mask = np.ones((2, 1, 5), bool)
    for layer in (reference, ours):
        layer(X[:, :1], X[:, :1], attention_mask=step_mask, cache=cache, cache_update_index=0)
    ours.set_weights(reference.get_weights())
    assert [w.path.split("/")[-2] for w in ours.weights] == [
        w.path.split("/")[-2] for w in reference.weights]  # query, key, value, attention_output
    caches = {id(reference): cache, id(ours): cache}
    for t in range(5):
        visible = np.broadcast_to(np.arange(5) <= t, (2, 1, 5))  # keys written so far
        outputs = []
        for layer in (reference, ours):
            y, caches[id(layer)] = layer(X[:, t:t + 1], X[:, t:t + 1], attention_mask=visible,
                                         cache=caches[id(layer)], cache_update_index=t)
            outputs.append(ops.convert_to_numpy(y))
        np.testing.assert_allclose(outputs[1], outputs[0], atol=1e-5)
    np.testing.assert_allclose(caches[id(ours)], caches[id(reference)], atol=1e-5)
    # Decoding step by step with the cache equals attending over the whole sequence at once.
    causal = np.tril(np.ones((5, 5), bool))[None]
    full, _ = ours(X, X, attention_mask=causal, cache=np.zeros_like(cache), cache_update_index=0)
    np.testing.assert_allclose(ops.convert_to_numpy(full)[:, -1:], outputs[1], atol=1e-5)


def test_keras_private_names_are_ours():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, use_gate=True, sliding_window=3)
    layer(X)
    for name in ("query", "key", "value", "gate", "output"):
        assert getattr(layer, f"_{name}_dense") is getattr(layer, f"{name}_dense")
    assert (layer._num_heads, layer._key_dim, layer._sliding_window) == (2, 4, 3)
    with pytest.raises(ValueError, match="argument `num_heads`.*positive integer"):
        MultiHeadAttention(num_heads=1.5, key_dim=4)


def test_keras_files_keep_the_public_sublayer_names(tmp_path):
    """Keras' saving visits public attributes first, so `.keras` files written before the
    sublayers moved to Keras' private names still load."""
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs))
    model.save(tmp_path / "model.keras")
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        archive.extract("model.weights.h5", tmp_path)
    with h5py.File(tmp_path / "model.weights.h5") as weights:
        paths = []
        weights.visit(paths.append)
    sublayers = {p.split("/")[-1] for p in paths if p.endswith("_dense")}
    assert sublayers == {"query_dense", "key_dense", "value_dense", "output_dense"}
